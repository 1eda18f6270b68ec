"""Line-level capture: the tensors each executed line of the selected files assigned to local variables.

Module hooks see what enters and leaves a module; the lines authors debug are the ones in between
(`query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)`).

Why not `sys.settrace`: on Python 3.11 merely having a trace function set de-optimises every frame of every
call, library code included (+10 ms on a 60 ms medium Llama forward before a single line is recorded), and
diffing `frame.f_locals` at each line costs more still. Instead the functions of the selected files run
instrumented code while the capture is active:

- Each selected file is parsed with `ast`; inside every function body (not module level, not class bodies),
  each statement that binds names (`=`, annotated and augmented assignment, `for` and `with ... as` targets,
  walrus targets, tuple/list/starred unpacking, `x[...] = v` and `x.attr = v` on a local `x`) and each
  expression statement calling an in-place method (`x.add_(...)`, `torch.relu_(x)`, `out=x`) is followed by a
  call to one injected global, `__modeltrace_line__(line, name, value)`, with the statement's first line (so
  multi-line statements and unpacking land on the line the reader sees); parameters are recorded on the
  `def` line, and `return EXPR` becomes `return __modeltrace_line__(line, "return", EXPR)`. Comprehensions,
  generator expressions and lambdas are not instrumented: what they build is recorded on the statement that
  assigns it. Every inserted node carries the location of the statement it belongs to, so line numbers,
  `co_firstlineno` and tracebacks are those of the original code. Both the original and the instrumented
  module are compiled (cached per file while its mtime and size are unchanged).
- On enter, the live functions of each file are found (module globals, classes defined there with their
  methods, static/class methods, properties and nested classes, through `__wrapped__` chains and the closure
  cells of decorator wrappers; closures of nested functions made earlier, through the garbage collector) and
  `function.__code__` is swapped for the instrumented code, but only where the live code equals the freshly
  compiled original (a file edited on disk after import keeps its code). Functions that instrumented code
  creates during the capture (nested functions) are instrumented already. The recorder is put into the
  swapped functions' module globals; it returns at once for values that hold no tensors, and records only on
  the thread that entered the capture.
- On exit, also after a forward that raised, or when entering fails half-way, every swapped `__code__` is
  restored and the injected global removed (or the one an enclosing capture had put there put back). A
  function made by instrumented code during the capture and run after it finds a pass-through of the same
  name in `builtins` (put there once per process), so it runs as before and records nothing.

Code of a selected file that could not be instrumented (source unreadable or no longer parseable, code that
does not match the file on disk) keeps the former mechanism as a fallback: a `sys.settrace` tracer restricted
to exactly those code objects (installed only when there are any) diffs their tensor locals at each line.
Since the source on disk is not the source that code was compiled from, it attributes to the lines the
running code reports rather than to statement starts of the file.

Every executed binding is recorded, also a re-binding of the same unchanged tensor (`x = x.contiguous()` on a
contiguous `x`, `dropout` in eval mode): the line ran and bound that tensor, and its summary is a cache hit.
Tensor summaries are shared with module capture: a tensor a module returned is summarised once.
"""

from __future__ import annotations

import ast
import builtins
import functools
import gc
import itertools
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import CodeType, FrameType, FunctionType, MethodType, ModuleType
from typing import Any

import torch

from modeltrace.trace.records import LineRecord, TensorSummary
from modeltrace.worker.capture import SummaryCache, iter_tensor_leaves, tensor_version
from modeltrace.worker.source_map import real_path
from modeltrace.worker.stats import PendingStats, without_storage


# NOTE: a bound on what one trace records, so a long loop in model code cannot grow a trace without limit.
MAX_LINE_RECORDS = 200_000
MAX_LEAVES_PER_VARIABLE = 8
# NOTE: with full tensors, a line value of at most this many elements is stored too (a module's inputs and outputs
# always are): statistics do not see the order of the numbers (a bias laid out key-by-query, a class token
# concatenated last hold the reference's numbers), and values this small are where an order is decided (position
# biases, tokens joined, masks); the diff compares them element by element. Within a budget per capture, so that
# line values never crowd the module tensors out of the trace's limit.
SMALL_LINE_VALUE = 16_384
LINE_VALUES_BUDGET_BYTES = 256 * 2**20
# The one global name instrumented code calls; put into the module's globals only while a capture is active.
RECORDER_NAME = "__modeltrace_line__"

_MISSING = object()
# Parameters and assignment bases that never hold a tensor: not worth a recorder call per execution.
_NEVER_TENSORS = frozenset({"self", "cls"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NOT_INSTRUMENTED_EXPRESSIONS = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_STATEMENT_LISTS = ("body", "orelse", "finalbody")


# --- the instrumented source ------------------------------------------------------------------------------


def _located(node: ast.AST, where: tuple[int, int, int, int]) -> ast.AST:
    node.lineno, node.col_offset, node.end_lineno, node.end_col_offset = where
    return node


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    """The location of a node, for nodes inserted on its behalf."""
    line = node.lineno
    return line, node.col_offset, node.end_lineno or line, node.end_col_offset or node.col_offset


def _header(node: ast.stmt) -> tuple[int, int, int, int]:
    """The location of the first line of a compound statement (`def`, `for`, `with`), for its prologue."""
    return node.lineno, node.col_offset, node.lineno, node.col_offset


def _record_call(line: int, name: str, value: ast.expr, where: tuple[int, int, int, int]) -> ast.Call:
    """`__modeltrace_line__(line, name, value)`, every new node at `where` (`value` keeps its own location)."""
    function = _located(ast.Name(RECORDER_NAME, ast.Load()), where)
    arguments = [_located(ast.Constant(line), where), _located(ast.Constant(name), where), value]
    return _located(ast.Call(function, arguments, []), where)


def _record_statements(line: int, names: Iterable[str], where: tuple[int, int, int, int]) -> list[ast.stmt]:
    return [
        _located(ast.Expr(_record_call(line, name, _located(ast.Name(name, ast.Load()), where), where)), where)
        for name in dict.fromkeys(names)
    ]


def _target_names(target: ast.expr, names: list[str]) -> None:
    """The local names an assignment target binds or modifies (`x[...] = v` and `x.a = v` modify `x`)."""
    if isinstance(target, ast.Name):
        names.append(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            _target_names(element, names)
    elif isinstance(target, ast.Starred):
        _target_names(target.value, names)
    elif isinstance(target, (ast.Subscript, ast.Attribute)):
        base = target.value
        while isinstance(base, (ast.Subscript, ast.Attribute)):
            base = base.value
        if isinstance(base, ast.Name) and base.id not in _NEVER_TENSORS:
            names.append(base.id)


def _in_place_names(call: ast.expr, local_names: set[str]) -> list[str]:
    """The locals an expression statement modifies in place: `x.add_(...)` (a method ending in `_` called on a
    local), `torch.relu_(x)` / `nn.init.normal_(x)` (such a function reached through a global), `f(..., out=x)`."""
    names: list[str] = []
    if not isinstance(call, ast.Call):
        return names
    function = call.func
    method = ""
    if isinstance(function, ast.Attribute):
        method = function.attr
    elif isinstance(function, ast.Name):
        method = function.id
    if method.endswith("_") and not method.startswith("__"):
        root = function.value if isinstance(function, ast.Attribute) else function
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if not isinstance(root, ast.Name):
            pass
        elif root.id in local_names:
            # A method of a local (`x.add_`), not of something a local holds (`self.buffer.copy_(x)` changes
            # the buffer, not its argument).
            if isinstance(function, ast.Attribute) and function.value is root:
                names.append(root.id)
        elif call.args and isinstance(call.args[0], ast.Name) and call.args[0].id in local_names:
            names.append(call.args[0].id)
    for keyword in call.keywords:
        if keyword.arg == "out" and isinstance(keyword.value, ast.Name) and keyword.value.id in local_names:
            names.append(keyword.value.id)
    return names


def _bound_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Parameters and names stored anywhere in the function's own scope (nested scopes left out)."""
    arguments = function.args
    names = {argument.arg for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    names.update(argument.arg for argument in (arguments.vararg, arguments.kwarg) if argument is not None)
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef, *_NOT_INSTRUMENTED_EXPRESSIONS)):
            continue
        pending.extend(ast.iter_child_nodes(node))
    return names


class _WalrusRecorder(ast.NodeTransformer):
    """`(x := value)` becomes `(x := __modeltrace_line__(line, "x", value))`: the target may stay unbound (a
    short-circuited `and`), so it is recorded where it is bound. Comprehensions and lambdas are left alone."""

    def __init__(self, line: int) -> None:
        self.line = line

    def visit_NamedExpr(self, node: ast.NamedExpr) -> ast.AST:
        self.generic_visit(node)
        node.value = _record_call(self.line, node.target.id, node.value, _span(node.value))
        return node

    def _leave(self, node: ast.AST) -> ast.AST:
        return node

    visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _leave


class _Instrumenter:
    """Rewrites the function bodies of a module's AST in place (see the module docstring)."""

    def __init__(self, walrus: bool = True) -> None:
        self._locals: list[set[str]] = []
        # NOTE: looking for `:=` in every expression is a third of the time: skipped when the source has none.
        self._walrus = walrus

    def module(self, tree: ast.Module) -> ast.Module:
        self._definitions(tree.body)
        return tree

    def _definitions(self, statements: list[ast.stmt]) -> None:
        """Instrument the functions defined in module-level or class-level code, not that code itself."""
        for statement in statements:
            if isinstance(statement, _FUNCTIONS):
                self._function(statement)
            else:
                for block in _blocks(statement):
                    self._definitions(block)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._locals.append(_bound_names(node))
        try:
            body = self._block(node.body)
        finally:
            self._locals.pop()
        arguments = node.args
        parameters = [
            argument.arg
            for argument in (
                *arguments.posonlyargs,
                *arguments.args,
                arguments.vararg,
                *arguments.kwonlyargs,
                arguments.kwarg,
            )
            if argument is not None and argument.arg not in _NEVER_TENSORS
        ]
        prologue = _record_statements(node.lineno, parameters, _header(node))
        # The docstring stays first (it is the code's first constant and the function's __doc__).
        first = node.body[0]
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        start = 1 if docstring and isinstance(first.value.value, str) else 0
        node.body = body[:start] + prologue + body[start:]

    def _block(self, statements: list[ast.stmt]) -> list[ast.stmt]:
        instrumented: list[ast.stmt] = []
        for statement in statements:
            instrumented.extend(self._statement(statement))
        return instrumented

    def _statement(self, statement: ast.stmt) -> list[ast.stmt]:
        if isinstance(statement, _FUNCTIONS):
            self._function(statement)
            return [statement]
        if isinstance(statement, ast.ClassDef):
            for block in _blocks(statement):
                self._definitions(block)
            return [statement]
        line = statement.lineno
        if self._walrus:
            walrus = _WalrusRecorder(line)
            for field, value in ast.iter_fields(statement):
                if field in _STATEMENT_LISTS or field in ("handlers", "cases"):
                    continue
                if isinstance(value, list):
                    value = [walrus.visit(item) if isinstance(item, ast.AST) else item for item in value]
                    setattr(statement, field, value)
                elif isinstance(value, ast.AST):
                    setattr(statement, field, walrus.visit(value))
        for field in _STATEMENT_LISTS:
            block = getattr(statement, field, None)
            if isinstance(block, list):
                setattr(statement, field, self._block(block))
        for part in (*getattr(statement, "handlers", ()), *getattr(statement, "cases", ())):
            part.body = self._block(part.body)

        names: list[str] = []
        if isinstance(statement, ast.Return):
            value = statement.value
            if value is not None and not isinstance(value, ast.Constant):
                statement.value = _record_call(line, "return", value, _span(value))
            return [statement]
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                _target_names(target, names)
        elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
            if statement.value is not None:
                _target_names(statement.target, names)
        elif isinstance(statement, ast.Expr):
            names = _in_place_names(statement.value, self._locals[-1])
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            _target_names(statement.target, names)
            statement.body = _record_statements(line, names, _header(statement)) + statement.body
            return [statement]
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                if item.optional_vars is not None:
                    _target_names(item.optional_vars, names)
            statement.body = _record_statements(line, names, _header(statement)) + statement.body
            return [statement]
        return [statement, *_record_statements(line, names, _span(statement))] if names else [statement]


def _blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists directly inside a statement (bodies, `else`, `finally`, handlers, match cases)."""
    for field in _STATEMENT_LISTS:
        block = getattr(statement, field, None)
        if isinstance(block, list):
            yield block
    for part in (*getattr(statement, "handlers", ()), *getattr(statement, "cases", ())):
        yield part.body


def instrument_source(source: str | bytes, path: str) -> ast.Module:
    """The instrumented AST of a module's source (exposed for tests and for reading what is recorded)."""
    walrus = (b":=" if isinstance(source, bytes) else ":=") in source
    return _Instrumenter(walrus).module(ast.parse(source, filename=path))


# --- the compiled file ------------------------------------------------------------------------------------


def _code_key(code: CodeType) -> tuple[str, int]:
    return getattr(code, "co_qualname", code.co_name), code.co_firstlineno


_CodeIndex = dict[tuple[str, int], list[CodeType]]


def _index_codes(code: CodeType, index: _CodeIndex) -> _CodeIndex:
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            if not constant.co_name.startswith("<"):
                index.setdefault(_code_key(constant), []).append(constant)
            _index_codes(constant, index)
    return index


def nested_codes(code: CodeType) -> Iterator[CodeType]:
    """`code` and the code objects of the functions defined inside it (comprehensions and lambdas left out)."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, CodeType) and not constant.co_name.startswith("<"):
            yield from nested_codes(constant)


class _CompiledFile:
    """A selected file compiled twice, as it is and instrumented: the instrumented code of each function,
    paired with the original code that a live function must equal to be given it."""

    def __init__(self, path: str, source: bytes) -> None:
        with warnings.catch_warnings():  # the import already showed the file's SyntaxWarnings
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
            original = compile(tree, path, "exec", dont_inherit=True)  # compiling leaves the tree as it was
            instrumented = compile(_Instrumenter(b":=" in source).module(tree), path, "exec", dont_inherit=True)
        originals = _index_codes(original, {})
        replacements = _index_codes(instrumented, {})
        self.pairs: dict[tuple[str, int], list[tuple[CodeType, CodeType]]] = {}
        for key, codes in originals.items():
            others = replacements.get(key, [])
            if len(others) != len(codes):
                continue
            self.pairs[key] = [
                (code, other)
                for code, other in zip(codes, others)
                if (code.co_freevars, code.co_cellvars, code.co_varnames, code.co_argcount, code.co_flags)
                == (other.co_freevars, other.co_cellvars, other.co_varnames, other.co_argcount, other.co_flags)
            ]
        # Instrumented code objects by identity: a function an enclosing capture already swapped.
        self.instrumented = {id(other): other for pairs in self.pairs.values() for _, other in pairs}

    def replacement(self, code: CodeType) -> CodeType | None:
        """The instrumented code for a live function's code, or None when the file does not hold that code."""
        for original, instrumented in self.pairs.get(_code_key(code), ()):
            # NOTE: code equality compares the bytecode, constants (nested functions included), names and line
            # table, not the file name: a file edited after import no longer equals the code that runs.
            if original == code:
                return instrumented
        return None


# NOTE: parsing, instrumenting and compiling a modeling file takes 10-35 ms: kept per process while the file is
# unchanged (the bench's repeated captures; in the worker each trace is a fresh fork and compiles once).
_compile_cache: dict[str, tuple[tuple[int, int], _CompiledFile | None]] = {}


def _compiled_file(path: str) -> _CompiledFile | None:
    """The file compiled both ways, or None when it cannot be read, parsed or instrumented."""
    try:
        status = os.stat(path)
        stamp = (status.st_mtime_ns, status.st_size)
    except OSError:
        return None
    cached = _compile_cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        compiled: _CompiledFile | None = _CompiledFile(path, source)
    except Exception:  # unreadable, no longer valid Python, or a construct the instrumenter cannot handle
        compiled = None
    _compile_cache[path] = (stamp, compiled)
    return compiled


# --- the live functions of a file -------------------------------------------------------------------------


# NOTE: per selected file, the modules found by the last scan of `sys.modules` (~2,500 modules with torch and
# transformers, ~5 ms), reused while `sys.modules` has as many entries and still holds those modules under
# those names. Only files with the selected file's name are resolved (`realpath` costs ~50 us each): a module
# imported through a symlink of another name is not found.
_module_scans: dict[str, tuple[int, list[tuple[str, weakref.ref]]]] = {}


def modules_of_file(path: str) -> list[ModuleType]:
    """The imported modules whose file is `path` (a real path)."""
    cached = _module_scans.get(path)
    if cached is not None and cached[0] == len(sys.modules):
        modules = [(name, reference()) for name, reference in cached[1]]
        if all(module is not None and sys.modules.get(name) is module for name, module in modules):
            return [module for _, module in modules]
    base_name = os.path.basename(path)
    found: list[ModuleType] = []
    references: list[tuple[str, weakref.ref]] = []
    for name, module in list(sys.modules.items()):
        try:
            file = vars(module).get("__file__")
            if isinstance(file, str) and os.path.basename(file) == base_name and real_path(file) == path:
                references.append((name, weakref.ref(module)))
                found.append(module)
        except TypeError:  # not a module (a placeholder some packages put into sys.modules)
            continue
    _module_scans[path] = (len(sys.modules), references)
    return found


# Decorator chains are short; the bound keeps a cycle of odd objects from running away.
_MAX_WRAPPER_DEPTH = 12
_MAX_CONTAINER_ITEMS = 256
_FOLLOWED_IN_CLOSURES = (FunctionType, type, staticmethod, classmethod, MethodType, property, functools.partial)


def live_functions(path: str, modules: Iterable[ModuleType]) -> list[FunctionType]:
    """The function objects whose code comes from `path`, reachable from its modules: module globals, classes
    defined there (methods, static and class methods, properties, nested classes), module-level containers,
    and through `__wrapped__`, bound methods, partials and the closure cells of decorator wrappers; and the
    closures made from the nested functions of those."""
    modules = list(modules)
    module_names = {vars(module).get("__name__") for module in modules}
    found: dict[int, FunctionType] = {}
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if depth > _MAX_WRAPPER_DEPTH or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, FunctionType):
            if real_path(value.__code__.co_filename) == path:
                found[id(value)] = value
            wrapped = value.__dict__.get("__wrapped__")  # functools.wraps stores it in the function's __dict__
            if wrapped is not None:
                visit(wrapped, depth + 1)
            for cell in value.__closure__ or ():
                try:
                    content = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if isinstance(content, _FOLLOWED_IN_CLOSURES):
                    visit(content, depth + 1)
        elif isinstance(value, (staticmethod, classmethod, MethodType)):
            visit(value.__func__, depth + 1)
        elif isinstance(value, property):
            for accessor in (value.fget, value.fset, value.fdel):
                if accessor is not None:
                    visit(accessor, depth + 1)
        elif isinstance(value, (functools.partial, functools.cached_property)):
            visit(value.func, depth + 1)
        elif isinstance(value, type):
            if value.__dict__.get("__module__") in module_names:
                for item in list(value.__dict__.values()):
                    visit(item, depth + 1)
        elif depth <= 1 and type(value) in (dict, list, tuple) and len(value) <= _MAX_CONTAINER_ITEMS:
            for item in list(value.values() if isinstance(value, dict) else value):
                visit(item, depth + 1)

    for module in modules:
        for value in list(vars(module).values()):
            visit(value, 0)
    # Closures of nested functions made before the capture and held where the walk does not look (an
    # `nn.Module` instance's attribute, a registry): found through their code, the nested code objects of the
    # functions found. Asking the garbage collector scans the heap (~30 ms with torch and transformers
    # loaded), so only for files that define functions inside functions.
    nested = {
        id(code): code
        for function in found.values()
        for code in itertools.islice(nested_codes(function.__code__), 1, None)
    }
    if nested:
        for referrer in gc.get_referrers(*nested.values()):
            if isinstance(referrer, FunctionType) and nested.get(id(referrer.__code__)) is referrer.__code__:
                found[id(referrer)] = referrer
    return list(found.values())


# --- the capture ------------------------------------------------------------------------------------------


class _FrameState:
    """What the fallback tracer of one running frame carries: the line running now, the identity of each
    tensor local when last seen, and the file's real path."""

    __slots__ = ("statement", "seen", "file")

    def __init__(self, statement: int, file: str) -> None:
        self.statement = statement
        self.seen: dict[str, tuple[int, int]] = {}
        self.file = file


def _identity(value: Any) -> tuple[int, int] | None:
    """What tells a rebound or modified variable apart (object identity, plus the version for tensors), or
    None for values that hold no tensors."""
    if isinstance(value, torch.Tensor):
        try:
            return id(value), value._version
        except RuntimeError:  # inference tensors track no version
            return id(value), -1
    if _holds_tensors(value):
        return id(value), 0
    return None


def _holds_tensors(value: Any) -> bool:
    """A tuple, list or dict with a tensor among its first items (a tensor itself is checked by the caller)."""
    if isinstance(value, (tuple, list)):
        items: Iterable[Any] = value[:MAX_LEAVES_PER_VARIABLE]
    elif isinstance(value, dict):
        items = itertools.islice(value.values(), MAX_LEAVES_PER_VARIABLE)
    else:
        return False
    for item in items:
        if isinstance(item, torch.Tensor):
            return True
    return False


def _pass_through(line: int, name: str, value: Any) -> Any:
    return value


class LineCapture:
    """Context manager recording `LineRecord`s for the selected files while active (current thread)."""

    def __init__(
        self,
        files: Iterable[str],
        cache: SummaryCache | None = None,
        pending: PendingStats | None = None,
        module_stack: list[int] | None = None,
        keep: Callable[[torch.Tensor, TensorSummary, str], None] | None = None,
    ) -> None:
        self.files = {real_path(file) for file in files}
        # NOTE: with full tensors, the module capture's `_keep`: a small value a line assigns is stored too (see
        # `SMALL_LINE_VALUE`)
        self._keep = keep
        self._keep_budget = LINE_VALUES_BUDGET_BYTES
        # NOTE: the module capture's stack of running calls (record indices), read at each record: a line record
        # names the innermost module call it ran in, which the diff's line drill-down needs.
        self._module_stack = module_stack if module_stack is not None else []
        self.records: list[LineRecord] = []
        # NOTE: while active, what each record will hold: (file, line, name, summary, possibly under another
        # key, module call); exit makes the `LineRecord`s, counting calls and copying summaries to their keys in one tight
        # loop, where each costs a fraction of what it costs between a forward pass's tensor ops.
        self._pending_records: list[tuple[str, int, str, TensorSummary, int]] = []
        self.truncated = False
        self._cache = cache if cache is not None else SummaryCache()
        self._pending = pending
        self._counts: dict[tuple[str, int, str], int] = {}
        self._thread = threading.get_ident()
        # What enter changed, for exit to undo: swapped functions with their original code, and the globals
        # the recorder was put into with what they held under that name before.
        self._swapped: list[tuple[FunctionType, CodeType]] = []
        self._injected: dict[int, tuple[dict[str, Any], object]] = {}
        # Code that could not be instrumented, left to the fallback tracer: id -> (code, real path of its file).
        self._fallback: dict[int, tuple[CodeType, str]] = {}
        self._tracing = False
        self._previous_tracer = None

    def __enter__(self) -> LineCapture:
        self._thread = threading.get_ident()
        if not hasattr(builtins, RECORDER_NAME):
            # NOTE: a function made by instrumented code during a capture (a closure, a generator) may run after
            # it, when the module global is gone: the name then resolves to this builtin, which records nothing.
            setattr(builtins, RECORDER_NAME, _pass_through)
        try:
            for path in sorted(self.files):
                self._instrument_file(path)
            if self._fallback:
                self._previous_tracer = sys.gettrace()
                sys.settrace(self._global_tracer)
                self._tracing = True
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()
        self._make_records()

    def _make_records(self) -> None:
        counts = self._counts
        copy = self._cache.copy
        records = self.records
        for file, line, name, summary, module_call in self._pending_records:
            if summary.key != name:
                summary = copy(summary, name)
            count_key = (file, line, name)
            call_index = counts.get(count_key, 0)
            counts[count_key] = call_index + 1
            records.append(LineRecord(file, line, name, call_index, summary, module_call))
        self._pending_records.clear()

    @property
    def instrumented_functions(self) -> list[FunctionType]:
        """The functions running instrumented code while the capture is active."""
        return [function for function, _ in self._swapped]

    @property
    def fallback_codes(self) -> list[CodeType]:
        """The code objects left to the `sys.settrace` fallback."""
        return [code for code, _ in self._fallback.values()]

    def _instrument_file(self, path: str) -> None:
        compiled = _compiled_file(path)
        recorder = None
        for function in live_functions(path, modules_of_file(path)):
            code = function.__code__
            if code.co_name.startswith("<"):  # a lambda: not instrumented, what it makes is recorded where assigned
                continue
            replacement = None
            if compiled is not None:
                if compiled.instrumented.get(id(code)) is code:  # swapped by an enclosing capture
                    replacement = code
                else:
                    replacement = compiled.replacement(code)
            if replacement is None:
                for nested in nested_codes(code):
                    self._fallback[id(nested)] = (nested, path)
                continue
            if recorder is None:
                recorder = self._recorder(path)
            self._inject(function.__globals__, recorder)
            if replacement is not code:
                function.__code__ = replacement
                self._swapped.append((function, code))

    def _inject(self, namespace: dict[str, Any], recorder: Callable[[int, str, Any], Any]) -> None:
        if id(namespace) not in self._injected:
            self._injected[id(namespace)] = (namespace, namespace.get(RECORDER_NAME, _MISSING))
            namespace[RECORDER_NAME] = recorder

    def _restore(self) -> None:
        if self._tracing:
            sys.settrace(self._previous_tracer)
            self._tracing = False
            self._previous_tracer = None
        while self._swapped:
            function, code = self._swapped.pop()
            function.__code__ = code
        for namespace, previous in self._injected.values():
            if previous is _MISSING:
                namespace.pop(RECORDER_NAME, None)
            else:
                namespace[RECORDER_NAME] = previous
        self._injected.clear()
        self._fallback.clear()

    def _recorder(self, file: str) -> Callable[[int, str, Any], Any]:
        """The function instrumented code of `file` calls after each binding; returns the value it was given."""
        record = self._record
        get_ident = threading.get_ident
        thread = self._thread
        tensor_type = torch.Tensor
        containers = (tuple, list, dict)
        pending_records = self._pending_records
        entries = self._cache._entries
        record_tensor = self._record_tensor
        module_stack = self._module_stack

        def __modeltrace_line__(line: int, name: str, value: Any) -> Any:
            # NOTE: runs after every binding statement of the selected files: values without tensors (most of
            # them: shapes, flags, configs) must leave after a type check or two. A tensor this pass has
            # summarised already (a module's output or input, a re-binding) is recorded here: `_record_tensor`
            # and `SummaryCache.get` inlined for their commonest case.
            if isinstance(value, tensor_type):
                if get_ident() != thread:
                    return value
                entry = entries.get(id(value))
                if entry is not None and entry[0]() is value and len(pending_records) < MAX_LINE_RECORDS:
                    try:
                        unchanged = entry[1] == value._version
                    except RuntimeError:
                        unchanged = False
                    if unchanged:
                        pending_records.append((file, line, name, entry[2], module_stack[-1] if module_stack else -1))
                        return value
                record_tensor(file, line, name, value)
            elif isinstance(value, containers) and _holds_tensors(value) and get_ident() == thread:
                record(file, line, name, value)
            return value

        return __modeltrace_line__

    def _global_tracer(self, frame: FrameType, event: str, argument: Any):
        # NOTE: only installed when some code could not be instrumented; every other frame leaves at once.
        code = frame.f_code
        fallback = self._fallback.get(id(code))
        if fallback is None or fallback[0] is not code:
            return None
        state = _FrameState(frame.f_lineno, fallback[1])
        frame_locals = frame.f_locals
        seen = state.seen
        for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            value = frame_locals.get(name)
            identity = _identity(value)
            if identity is not None:
                seen[name] = identity
                self._record(state.file, code.co_firstlineno, name, value)
        for name, value in frame_locals.items():
            if name not in seen:
                identity = _identity(value)
                if identity is not None:
                    seen[name] = identity
        return self._local_tracer_for(state)

    def _local_tracer_for(self, state: _FrameState):
        """The local tracer of one fallback frame, with its state bound (no lookup per line event)."""
        diff = self._diff
        record = self._record

        def local_tracer(frame: FrameType, event: str, argument: Any):
            if event == "line":
                line = frame.f_lineno
                if line != state.statement:
                    diff(frame, state)
                    state.statement = line
            elif event == "return":
                diff(frame, state)
                if argument is not None and _identity(argument) is not None:
                    record(state.file, state.statement, "return", argument)
            return local_tracer

        return local_tracer

    def _diff(self, frame: FrameType, state: _FrameState) -> None:
        """Record the tensor locals that the line just run bound or modified (fallback tracer)."""
        seen = state.seen
        for name, value in frame.f_locals.items():
            identity = _identity(value)
            if identity is not None and seen.get(name) != identity:
                seen[name] = identity
                self._record(state.file, state.statement, name, value)

    def _record(self, file: str, line: int, name: str, value: Any) -> None:
        if len(self._pending_records) >= MAX_LINE_RECORDS:
            self.truncated = True
            return
        if isinstance(value, torch.Tensor):
            self._record_tensor(file, line, name, value)
            return
        for key, tensor in itertools.islice(iter_tensor_leaves(value, name), MAX_LEAVES_PER_VARIABLE):
            self._record_tensor(file, line, key, tensor)

    def _keep_small(self, tensor: torch.Tensor, summary: TensorSummary, key: str) -> None:
        """Store a small line value (`SMALL_LINE_VALUE`) through the module capture, within the budget."""
        count = tensor.numel()
        if count > SMALL_LINE_VALUE or tensor.device.type == "meta":
            return
        if without_storage(tensor) is not None:
            return  # sparse, nested or quantized: summarised densely, nothing to store as one block
        size = count * tensor.element_size()
        if size > self._keep_budget:
            return
        self._keep_budget -= size
        self._keep(tensor, summary, f"lines/{len(self._pending_records)}/{key}")

    def _record_tensor(self, file: str, line: int, key: str, tensor: torch.Tensor) -> None:
        if len(self._pending_records) >= MAX_LINE_RECORDS:
            self.truncated = True
            return
        cache = self._cache
        version = tensor_version(tensor)
        entry = cache._entries.get(id(tensor))
        if entry is not None and entry[1] == version and entry[0]() is tensor:
            summary = entry[2]  # under its own key: `_make_records` copies it to this one
        else:
            summary = cache.summarize_new(tensor, key, version, self._pending)
        if self._keep is not None and summary.tensor is None and summary.not_stored is None:
            self._keep_small(tensor, summary, key)
        stack = self._module_stack
        self._pending_records.append((file, line, key, summary, stack[-1] if stack else -1))
