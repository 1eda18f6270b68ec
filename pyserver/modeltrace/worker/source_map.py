"""Which source line made a module call (`called_at`) and where a module class is defined (`defined_at`).

The capture's wrapper of a module's `_call_impl` runs a few frames below the user's
`self.mlp(hidden_states)`: torch's `nn.Module.__call__`, transformers' `GradientCheckpointingLayer.__call__`,
decorator wrappers. We walk up past those frames to the first one of model code. Children of `nn.Sequential`
(whose loop lives inside torch) map to the line that called the Sequential. Decisions are cached per file and per code object, since this runs on every call.
"""

from __future__ import annotations

import inspect
import os
import sys
from types import CodeType, FrameType

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
        code = frame.f_code
        known = _plumbing_cache.get(id(code))
        if known is None or known[0] is not code:
            known = _plumbing_cache[id(code)] = (code, _is_plumbing(code))
        if not known[1]:
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
        frame = frame.f_back
    return None, None


def model_locations(frame: FrameType | None, limit: int) -> tuple[SourceLocation, ...]:
    """The locations of the first `limit` non-plumbing frames from `frame` outward (innermost first): the stack of
    model code that made a call, as `caller_location` finds its first frame."""
    found: list[SourceLocation] = []
    while frame is not None and len(found) < limit:
        code = frame.f_code
        known = _plumbing_cache.get(id(code))
        if known is None or known[0] is not code:
            known = _plumbing_cache[id(code)] = (code, _is_plumbing(code))
        if not known[1]:
            found.append(SourceLocation(real_path(code.co_filename), frame.f_lineno, _column(code, frame.f_lasti)))
        frame = frame.f_back
    return tuple(found)


def defined_at(module_class: type) -> SourceLocation | None:
    """File and line of `class X(...)`, or None for classes without source (built-ins, dynamic classes)."""
    if module_class in _defined_at_cache:
        return _defined_at_cache[module_class]
    location = None
    try:
        filename = inspect.getsourcefile(module_class)
        if filename is not None:
            _, line = inspect.getsourcelines(module_class)
            location = SourceLocation(real_path(filename), line)
    except (OSError, TypeError):
        location = None
    _defined_at_cache[module_class] = location
    return location
