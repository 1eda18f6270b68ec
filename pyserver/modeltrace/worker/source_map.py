"""Which source line made a module call (`called_at`) and where a module class is defined (`defined_at`).

The capture's wrapper of a module's `_call_impl` runs a few frames below the user's
`self.mlp(hidden_states)`: torch's `nn.Module.__call__`, transformers' `GradientCheckpointingLayer.__call__`,
decorator wrappers. We walk up past those frames to the first one of model code. Children of `nn.Sequential`
(whose loop lives inside torch) map to the line that called the Sequential. Decisions are cached per file and per code object, since this runs on every call.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import sys
from types import CodeType, FrameType, FunctionType

import importlib.util

import torch

from modeltrace.trace.records import SourceLocation


_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


def _package_dir(name: str) -> str | None:
    """Where a package is installed, found without importing it (transformers is optional for the library)."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.realpath(locations[0]) + os.sep if locations else None


_TRANSFORMERS_DIR = _package_dir("transformers") or "\0no transformers\0"
# NOTE: the modeltrace package's folder, two levels above this file (`worker/source_map.py`), found without
# importing the package's top (it offers the library, which imports this module)
_MODELTRACE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
# NOTE: transformers wraps modules and forwards in generic helpers (`GradientCheckpointingLayer.__call__`,
# `capture_outputs`'s `wrapper`, `deprecate_kwarg`'s `wrapped_func`): those frames are plumbing, not the call
# the user wrote, while real model code in transformers (modeling_*.py, `GenericFor*` heads) must stay visible.
_TRANSFORMERS_WRAPPER_NAMES = frozenset({"__call__", "wrapper", "wrapped_func", "inner", "_inner", "decorator"})

_realpath_cache: dict[str, str] = {}
_file_kind_cache: dict[str, str] = {}
_column_cache: dict[CodeType, list[int | None]] = {}
_defined_at_cache: dict[type, SourceLocation | None] = {}
# NOTE: keyed by the code object's identity (held in the value, so the id stays unique): code objects compare
# equal across files (co_filename is not compared), and a port and its original are the same code in two files.
_plumbing_cache: dict[int, tuple[CodeType, bool]] = {}
# Records share these location objects (one per call site), like they share class locations.
_location_cache: dict[tuple[int, int], tuple[CodeType, SourceLocation]] = {}
# NOTE: every class and function definition of a file, from one parse of it, while linecache holds the same lines
# (see `_FileIndex`)
_file_index_cache: dict[str, _FileIndex] = {}
_read_in_part: dict[str, None] = {}


def real_path(filename: str) -> str:
    """Absolute, symlink-free path, cached (the editor and the trace must agree on file names)."""
    cached = _realpath_cache.get(filename)
    if cached is None:
        cached = _realpath_cache[filename] = os.path.realpath(filename)
    return cached


def is_torch_file(path: str) -> bool:
    """A file of torch or of modeltrace itself (a real path): no line there is the user's model code."""
    return path.startswith(_TORCH_DIR) or path.startswith(_MODELTRACE_DIR)


def _is_plumbing(code: CodeType) -> bool:
    filename = code.co_filename
    kind = _file_kind_cache.get(filename)
    if kind is None:
        path = real_path(filename)
        if path.startswith(_TORCH_DIR) or path.startswith(_MODELTRACE_DIR) or filename.startswith("<"):
            kind = "plumbing"
        elif path.startswith(_TRANSFORMERS_DIR):
            kind = "transformers"
        else:
            kind = "model"
        _file_kind_cache[filename] = kind
    if kind == "transformers":
        return code.co_name in _TRANSFORMERS_WRAPPER_NAMES
    return kind == "plumbing"


def _plumbing(code: CodeType) -> bool:
    """`_is_plumbing`, decided once per code object."""
    known = _plumbing_cache.get(id(code))
    if known is None or known[0] is not code:
        known = _plumbing_cache[id(code)] = (code, _is_plumbing(code))
    return known[1]


def _column(code: CodeType, instruction_offset: int) -> int | None:
    columns = _column_cache.get(code)
    if columns is None:
        columns = _column_cache[code] = [position[2] for position in code.co_positions()]
    index = instruction_offset // 2
    return columns[index] if 0 <= index < len(columns) else None


def caller_location(start_depth: int = 2) -> tuple[SourceLocation | None, int | None]:
    """The first non-plumbing frame above the hook: its location and the bytecode offset of the call."""
    frame: FrameType | None = sys._getframe(start_depth)
    while frame is not None:
        if not _plumbing(frame.f_code):
            return frame_location(frame)
        frame = frame.f_back
    return None, None


def frame_location(frame: FrameType) -> tuple[SourceLocation, int]:
    """Where `frame` is now, and its bytecode offset (the capture's call path in C asks this of a frame of model
    code whose location it has not cached: `native/capture_core.c`)."""
    code = frame.f_code
    offset = frame.f_lasti
    # NOTE: a frame with a local tracer (line capture) reports the line of its last line event, so only
    # untraced frames, whose line follows from the offset, share the cached location.
    if frame.f_trace is not None:
        return SourceLocation(real_path(code.co_filename), frame.f_lineno, _column(code, offset)), offset
    cached = _location_cache.get((id(code), offset))
    if cached is None or cached[0] is not code:
        location = SourceLocation(real_path(code.co_filename), frame.f_lineno, _column(code, offset))
        cached = _location_cache[(id(code), offset)] = (code, location)
    return cached[1], offset


def model_locations(frame: FrameType | None, limit: int) -> tuple[SourceLocation, ...]:
    """The locations of the first `limit` non-plumbing frames from `frame` outward (innermost first): the stack of
    model code that made a call, as `caller_location` finds its first frame."""
    found: list[SourceLocation] = []
    while frame is not None and len(found) < limit:
        code = frame.f_code
        if not _plumbing(code):
            found.append(SourceLocation(real_path(code.co_filename), frame.f_lineno, _column(code, frame.f_lasti)))
        frame = frame.f_back
    return tuple(found)


class _FileIndex:
    """Where each class and function of one source file is defined, from one `ast` parse of the lines linecache
    holds for it. `inspect.getsourcelines(cls)` parses the whole file again for every class it is asked about,
    and tokenizes the body it returns: in the worker's child process, where nothing is cached yet, that was
    ~100 ms of a tiny Llama's first (and, in the editor, every) trace. Lines as `inspect` gives them: a class or
    function's first decorator when it has one, the qualified names of classes found as `inspect` finds them
    (functions add `<locals>`; the first definition of a name wins)."""

    def __init__(self, lines: list[str], tree: ast.Module) -> None:
        self.lines = lines
        self.classes: dict[str, int] = {}
        self.functions: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self._visit(tree.body, [])

    def _visit(self, body: list[ast.stmt], stack: list[str]) -> None:
        # NOTE: statements only (a class or a `def` is never inside an expression): a walk over every node of a
        # modeling file cost more than parsing it
        for node in body:
            if isinstance(node, ast.ClassDef):
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                self.classes.setdefault(".".join([*stack, node.name]), first)
                self._visit(node.body, [*stack, node.name])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                self.functions.setdefault(first, node)
                self._visit(node.body, [*stack, node.name, "<locals>"])
            else:
                # NOTE: the compound statement's blocks in the order of its fields, as `inspect` visits them (the
                # first definition of a name wins: `try` body, handlers, `else`, `finally`)
                for field in node._fields:
                    value = getattr(node, field, None)
                    for item in value if isinstance(value, list) else ():
                        if isinstance(item, ast.stmt):
                            self._visit([item], stack)
                        elif isinstance(item, (ast.excepthandler, ast.match_case)):
                            self._visit(item.body, stack)


def _file_index(filename: str, module_globals: dict | None, build: bool = True) -> _FileIndex | None:
    """The index of `filename` while linecache holds the lines it was made from; made now when `build`."""
    index = _file_index_cache.get(filename)
    if index is None and not build:
        return None
    linecache.checkcache(filename)  # NOTE: as `inspect.findsource`: a file changed on disk is read again
    lines = linecache.getlines(filename, module_globals)
    if not lines:
        return None
    if index is None or index.lines is not lines:
        if not build:
            return None
        try:
            index = _file_index_cache[filename] = _FileIndex(lines, ast.parse("".join(lines)))
        except (SyntaxError, ValueError):
            return None
    return index


def indexed_files() -> list[str]:
    """The files parsed so far (each module class's, under the name its module was loaded from), then those read
    in part for one function (`read_in_part`)."""
    return [*_file_index_cache, *(name for name in _read_in_part if name not in _file_index_cache)]


def read_in_part(filename: str) -> None:
    """Note a file one function of which was read without parsing the file (a base class's `__init__` in
    `modeling_utils.py`): the zygote parses it whole ahead of the next trace (`indexed_files`)."""
    _read_in_part[filename] = None


def forget_files_except(filenames: set[str]) -> None:
    """Drop the parse (and linecache's lines) of every indexed file not in `filenames`: the zygote keeps those of
    the last trace only, not of every model a long editor session traced."""
    for filename in [name for name in _file_index_cache if name not in filenames]:
        del _file_index_cache[filename]
        linecache.cache.pop(filename, None)


def index_file(filename: str) -> None:
    """Parse `filename` ahead of a trace that will ask where its classes are (the zygote, for the children it
    forks: `zygote._warm`); what linecache holds is checked against the file when used, so an edit since is read
    again. Anything unreadable is left for the trace to meet."""
    try:
        _file_index(filename, None)
    except (OSError, UnicodeDecodeError):
        pass


def function_node(function: FunctionType) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The `def` of `function` in its file's one parse (lines and columns as in the file), or None where the
    file has not been parsed for its classes (`defined_at`), or no definition starts at its first line (the file
    changed since it was imported). NOTE: never parsed for one function: a base class's `__init__` in a file of
    thousands of lines (`modeling_utils.py`) costs less alone (`inspect.getsourcelines`) than the whole file."""
    code = function.__code__
    try:
        index = _file_index(code.co_filename, function.__globals__, build=False)
    except (OSError, UnicodeDecodeError):
        return None
    return index.functions.get(code.co_firstlineno) if index is not None else None


def defined_at(module_class: type) -> SourceLocation | None:
    """File and line of `class X(...)`, or None for classes without source (built-ins, dynamic classes)."""
    if module_class in _defined_at_cache:
        return _defined_at_cache[module_class]
    location = None
    try:
        filename = inspect.getsourcefile(module_class)
        if filename is not None:
            module = sys.modules.get(module_class.__module__)
            index = _file_index(filename, getattr(module, "__dict__", None))
            line = index.classes.get(module_class.__qualname__) if index is not None else None
            if line is None:
                _, line = inspect.getsourcelines(module_class)  # NOTE: what the index cannot say, `inspect` tries
            location = SourceLocation(real_path(filename), line)
    except (OSError, TypeError, UnicodeDecodeError):
        location = None
    _defined_at_cache[module_class] = location
    return location
