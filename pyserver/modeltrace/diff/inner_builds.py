"""Modules left unaligned inside the first divergence, compared by how they were built (issue 30, items 2 and 5).

The alignment pairs modules by what they compute; a module whose output has another shape on the other side (a
bottleneck's 1x1 convolution given the stride that the reference gives its 3x3 one) stays unaligned, and its build
is never compared. Inside the diverging pair such modules are still modules the other side builds too: the
unaligned modules of each side (those inside the pair and not inside an aligned child, and those never called as
modules: Mistral's one-file block calls `self.attention.forward(x)`) are paired by class and parameter shapes, in
construction order, then by kind where one of a kind is left on each side, and their settings compared as aligned
pairs' are.

A differing setting is named at the line that passes it: the keyword argument of that name in the call that built
the module (`nn.Conv2d(…, stride=stride)`), followed up to the call that built its parent while the value is a
parameter of the parent's `__init__` passed on unchanged, directly or through its local variables (`for kernel_size,
dilation in zip(kernel_sizes, dilations)`), there passed by keyword (`ResNetConvLayer(…, stride=stride if … else
1)`) or in the parameter's place (`EncodecResnetBlock(config, dim, [base**j, 1])`): the last such line is where the
port decides the value.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from modeltrace.diff.kinds import NO_OP, UNKNOWN, kind_of_class
from modeltrace.diff.lines import unaligned_descendants
from modeltrace.diff.result import DiffResult, Divergence, ModuleResult
from modeltrace.diff.settings import SettingDifference, class_of, compare_settings
from modeltrace.trace.records import ModuleBuild, SourceLocation
from modeltrace.trace.source_files import UnreadableSource, read_source_text

# How many parents' `__init__` a setting is followed up through (a conv inside a conv layer inside a block).
_FOLLOW_UP = 4
# How many aligned modules inside the divergence give their differing settings (the first, in call order): a
# setting wrong in every layer is said by the first few
_ALIGNED_INSIDE = 8


def inner_setting_differences(result: DiffResult, divergence: Divergence) -> list[SettingDifference]:
    """Settings that differ between the unaligned modules of the diverging pair, paired by class and parameter
    shapes in construction order, then the rest by kind where one of a kind is left on each side, then those of
    its aligned modules inside it; each with `assigned_at` at the line that assigns or passes it where the source
    says."""
    reference, candidate = divergence.module.reference, divergence.module.candidate
    if reference is None:
        return []
    ref_builds = {build.path: build for build in result.reference.trace.builds}
    cand_builds = {build.path: build for build in result.candidate.trace.builds}
    if not ref_builds or not cand_builds:
        return []
    aligned_ref = {module.reference.index for module in result.modules if module.reference is not None}
    aligned_cand = {module.candidate.index for module in result.modules if module.reference is not None}
    ref_inner = _builds_of(result.reference.trace.modules, reference.index, aligned_ref, ref_builds)
    cand_inner = _builds_of(result.candidate.trace.modules, candidate.index, aligned_cand, cand_builds)
    pairs: list[tuple[ModuleBuild, ModuleBuild]] = []
    unused = [build for build in ref_inner if build.parameters]
    left = []
    for cand_build in cand_inner:
        ref_build = next((build for build in unused if _shape_key(build) == _shape_key(cand_build)), None)
        if ref_build is None or not cand_build.parameters:
            left.append(cand_build)
            continue
        unused.remove(ref_build)
        pairs.append((ref_build, cand_build))
    pairs.extend(_by_kind([build for build in ref_inner if build in unused or not build.parameters], left))
    found = [(cand_build, compare_settings(ref_build, cand_build)) for ref_build, cand_build in pairs]
    # NOTE: and the aligned modules inside, built differently (their inputs differ: a dilation passed down to a
    # convolution also sets the padding its parent computes before calling it)
    found += [
        (cand_builds[module.candidate.path], module.settings)
        for module in _aligned_inside(result, candidate.index)
        if module.settings and module.candidate.path in cand_builds
    ][:_ALIGNED_INSIDE]
    differences: list[SettingDifference] = []
    for cand_build, settings in found:
        for difference in settings:
            if difference.assigned_at is None:
                where = passed_at(cand_builds, cand_build, difference.name)
                if where is not None:
                    difference = SettingDifference(
                        difference.name,
                        difference.reference,
                        difference.candidate,
                        difference.path,
                        difference.note,
                        where,
                    )
            differences.append(difference)
    return differences


def _aligned_inside(result: DiffResult, call: int) -> list[ModuleResult]:
    """The aligned module results inside the candidate's call `call` (not it), in call order, one per path."""
    inside = {call}
    found: dict[str, ModuleResult] = {}
    for module in sorted(result.modules, key=lambda item: item.candidate.index):
        if module.candidate.parent in inside:
            inside.add(module.candidate.index)
            if module.reference is not None:
                found.setdefault(module.candidate.path, module)
    return list(found.values())


def _by_kind(ref_left: list[ModuleBuild], cand_left: list[ModuleBuild]) -> list[tuple[ModuleBuild, ModuleBuild]]:
    """The modules left, paired by kind (`diff/kinds.py`: attention, MLP, norm…) where one of that kind is left
    on each side: their classes differ, so only the settings the synonym table names are compared (`scale` in
    Mistral's one-file `Attention`, which its block calls through `forward`, against `scaling`)."""
    pairs = []
    for kind in dict.fromkeys(kind_of_class(class_of(build)) for build in cand_left):
        if kind in (UNKNOWN, NO_OP):
            continue
        cand_kind = [build for build in cand_left if kind_of_class(class_of(build)) == kind]
        ref_kind = [build for build in ref_left if kind_of_class(class_of(build)) == kind]
        if len(cand_kind) == 1 and len(ref_kind) == 1:
            pairs.append((ref_kind[0], cand_kind[0]))
    return pairs


def _builds_of(records: list, call: int, aligned: set[int], builds: dict[str, ModuleBuild]) -> list[ModuleBuild]:
    """The builds of the unaligned modules inside `call` (not `call` itself), in the order of the trace's builds
    (construction order): those called inside it and not inside an aligned call, and those under its path that were
    never called as modules (a child whose `forward` its parent calls directly)."""
    inside = unaligned_descendants(records, call, aligned)
    paths = {record.path for record in records if record.index in inside}
    called = {record.path for record in records}
    own = next((record.path for record in records if record.index == call), None)
    prefix = f"{own}." if own else ""
    return [
        build
        for path, build in builds.items()
        if path != own and (path in paths or (path.startswith(prefix) and path not in called))
    ]


def _shape_key(build: ModuleBuild) -> tuple:
    return class_of(build), tuple((parameter.name, tuple(parameter.summary.shape)) for parameter in build.parameters)


def passed_at(builds: dict[str, ModuleBuild], build: ModuleBuild, name: str) -> SourceLocation | None:
    """The line of the argument that passes `name` in the call that built `build` (its keyword `name=`), followed
    up to the parent's construction while the value is a parameter of the `__init__` that made the call passed on
    unchanged (there passed by keyword or in the parameter's place); None where the source does not say (no
    keyword of that name, a class called under another name)."""
    found: SourceLocation | None = None
    current, position = build, None
    for _ in range(_FOLLOW_UP):
        location = current.built_at
        if location is None:
            return found
        call = _construction_call(location, current, builds)
        argument = _argument(call, name, position) if call is not None else None
        if argument is None:
            return found
        found = SourceLocation(location.file, argument.lineno, argument.col_offset)
        function = _enclosing_init(location)
        parent = _owner(builds, current.path)
        if function is None or parent is None:
            return found
        parameter = _parameter_behind(function, argument, location.line)
        if parameter is None:
            return found
        name = parameter
        position = _positional_index(function, name)
        current = parent
    return found


def _argument(call: ast.Call, name: str, position: int | None) -> ast.expr | None:
    """The argument of `call` for the parameter `name`: its keyword, else the positional argument at `position`
    (the parameter's place after `self`; none after a `*args`)."""
    keyword = next((item for item in call.keywords if item.arg == name), None)
    if keyword is not None:
        return keyword.value
    if position is None or position >= len(call.args):
        return None
    if any(isinstance(argument, ast.Starred) for argument in call.args[: position + 1]):
        return None
    return call.args[position]


def _positional_index(function: ast.FunctionDef, name: str) -> int | None:
    """Where the parameter `name` of an `__init__` is passed positionally in a call of its class (`self` left out)."""
    positional = [argument.arg for argument in (*function.args.posonlyargs, *function.args.args)]
    return positional.index(name) - 1 if name in positional[1:] else None


# How many local variables a value is followed back through to the `__init__`'s parameters.
_LOCAL_DEPTH = 4


def _parameter_behind(function: ast.FunctionDef, value: ast.expr, line: int) -> str | None:
    """The parameter of `function` (not `self`) that `value`, an expression on `line`, passes on unchanged: the
    parameter itself, or a local variable that holds it or an element of it (`for i, (k, d) in
    enumerate(zip(sizes, dilations))` takes `d` from `dilations`); None for a value computed here (that line
    decides it) or from several."""
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    parameters = {argument.arg for argument in every[1:]}
    bindings = _bindings(function, line)

    def origin(expression: ast.expr, depth: int, seen: frozenset[str]) -> str | None:
        if not isinstance(expression, ast.Name) or expression.id in seen:
            return None
        sources = bindings.get(expression.id)
        if not sources:
            return expression.id if expression.id in parameters else None
        if depth == 0:
            return None
        found = {origin(source, depth - 1, seen | {expression.id}) for source in sources}
        return found.pop() if len(found) == 1 and None not in found else None

    return origin(value, _LOCAL_DEPTH, frozenset())


def _bindings(function: ast.FunctionDef, line: int) -> dict[str, list[ast.expr]]:
    """`{local name: the expressions assigned to it}` in `function` before `line` (statements that start before it,
    loops around it, and the comprehensions on it), not inside nested functions or classes."""
    bound: dict[str, list[ast.expr]] = {}
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.stmt) and node.lineno > line:
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                _bind(target, node.value, bound, elementwise=False)
        elif isinstance(node, ast.AugAssign):  # `x += y` computes x + y: no value passed on unchanged
            _bind(node.target, ast.BinOp(node.target, node.op, node.value), bound, elementwise=False)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            _bind(node.target, node.value, bound, elementwise=False)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            _bind(node.target, node.iter, bound, elementwise=True)
        elif isinstance(node, ast.comprehension) and isinstance(node.target, (ast.Name, ast.Tuple, ast.List)):
            _bind(node.target, node.iter, bound, elementwise=True)
        pending.extend(ast.iter_child_nodes(node))
    return bound


def _bind(target: ast.expr, value: ast.expr, bound: dict[str, list[ast.expr]], elementwise: bool) -> None:
    """Record what `target` takes from `value` (an element of `value` when `elementwise`: a loop's target)."""
    if isinstance(target, ast.Name):
        bound.setdefault(target.id, []).append(value)
        return
    if not isinstance(target, (ast.Tuple, ast.List)):
        return
    items = target.elts
    if elementwise and isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.keywords:
        if value.func.id == "zip" and len(value.args) == len(items):
            for item, source in zip(items, value.args):
                _bind(item, source, bound, elementwise=True)
            return
        if value.func.id == "enumerate" and len(items) == 2 and len(value.args) == 1:
            _bind(items[1], value.args[0], bound, elementwise=True)  # the first is a counter
            return
    if not elementwise and isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(items):
        for item, source in zip(items, value.elts):
            _bind(item, source, bound, elementwise=False)
        return
    for item in items:
        _bind(item, value, bound, elementwise)


# NOTE: containers are built in their owner's `__init__` (`self.layer = nn.Sequential(A(…), …)`): the module whose
# `__init__` made a call is the nearest ancestor that is not one
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _owner(builds: dict[str, ModuleBuild], path: str) -> ModuleBuild | None:
    """The nearest ancestor of `path` that is not a container: the module whose `__init__` built it."""
    while "." in path:
        path = _parent(path)
        build = builds.get(path)
        if build is None or build.class_name not in _CONTAINERS:
            return build
    return None


@dataclass(frozen=True)
class _Source:
    """A parsed file's simple statements (compound ones' headers left out) and its functions, walked once."""

    statements: tuple[ast.stmt, ...]
    functions: tuple[ast.FunctionDef, ...]


def _source(file: str) -> _Source | None:
    try:
        return _parsed(read_source_text(file))
    except UnreadableSource:
        return None


# NOTE: cached by the text, not the path: a file edited between two diffs (the language server's) is parsed again;
# a setting followed up several parents reads the same file at every step
@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> _Source | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes = list(ast.walk(tree))
    compound = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.With)
    return _Source(
        tuple(node for node in nodes if isinstance(node, ast.stmt) and not isinstance(node, compound)),
        tuple(node for node in nodes if isinstance(node, ast.FunctionDef)),
    )


def _construction_call(
    location: SourceLocation, build: ModuleBuild, builds: dict[str, ModuleBuild]
) -> ast.Call | None:
    """The call of `build`'s class in the statement at `location`; where the statement holds several (an
    `nn.Sequential(A(…), A(…))`), the one at the position `build` holds among the modules of its class that
    statement built (in construction order)."""
    source = _source(location.file)
    if source is None:
        return None
    statements = [
        node for node in source.statements if node.lineno <= location.line <= (node.end_lineno or node.lineno)
    ]
    if not statements:
        return None
    statement = min(statements, key=lambda node: (node.end_lineno or node.lineno) - node.lineno)
    class_name = class_of(build)
    calls = sorted(
        (node for node in ast.walk(statement) if isinstance(node, ast.Call) and _called(node) == class_name),
        key=lambda node: (node.lineno, node.col_offset),
    )
    # NOTE: a construction line is where the class was called: the calls that start on it, when some do (the
    # second `ConvLayer(...)` of a multi-line `nn.Sequential(...)`); one call there built every module of the
    # class the statement built (a comprehension's)
    calls = [node for node in calls if node.lineno == location.line] or calls
    if len(calls) == 1:
        return calls[0]
    parent = _parent(build.path)
    siblings = [
        other.path
        for other in builds.values()
        if class_of(other) == class_name
        and other.built_at is not None
        and (other.built_at.file, other.built_at.line) == (location.file, location.line)
        and _parent(other.path) == parent
    ]
    position = siblings.index(build.path) if build.path in siblings else 0
    return calls[position] if position < len(calls) else None


def _called(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Name):
        return function.id
    if isinstance(function, ast.Attribute):
        return function.attr
    return None


def _enclosing_init(location: SourceLocation) -> ast.FunctionDef | None:
    """The `__init__` holding `location`'s line, when the innermost function holding it is one."""
    source = _source(location.file)
    functions = [
        node
        for node in (source.functions if source is not None else ())
        if node.lineno <= location.line <= (node.end_lineno or node.lineno)
    ]
    if not functions:
        return None
    function = max(functions, key=lambda node: node.lineno)
    return function if function.name == "__init__" else None
