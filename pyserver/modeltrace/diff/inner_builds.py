"""Modules left unaligned inside the first divergence, compared by how they were built (issue 30, items 2 and 5).

The alignment pairs modules by what they compute; a module whose output has another shape on the other side (a
bottleneck's 1x1 convolution given the stride that the reference gives its 3x3 one) stays unaligned, and its build
is never compared. Inside the diverging pair such modules are still modules the other side builds too: the
unaligned modules of each side (those inside the pair and not inside an aligned child, and those never called as
modules: Mistral's one-file block calls `self.attention.forward(x)`) are paired by class and parameter shapes, in
construction order, then by kind where one of a kind is left on each side, and their settings compared as aligned
pairs' are.

A differing setting is named at the line that passes it: the keyword argument of that name in the call that built
the module (`nn.Conv2d(…, stride=stride)`), followed up to the call that built its parent when the value is a
parameter of the parent's `__init__` (`ResNetConvLayer(in_channels, …, stride=stride if … else 1)`): that line is
where the port decides the value.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from modeltrace.diff.kinds import NO_OP, UNKNOWN, kind_of_class
from modeltrace.diff.lines import unaligned_descendants
from modeltrace.diff.result import DiffResult, Divergence
from modeltrace.diff.settings import SettingDifference, compare_settings
from modeltrace.trace.records import ModuleBuild, SourceLocation
from modeltrace.trace.source_files import UnreadableSource, read_source_text

# How many parents' `__init__` a setting is followed up through (a conv inside a conv layer inside a block).
_FOLLOW_UP = 4


def inner_setting_differences(result: DiffResult, divergence: Divergence) -> list[SettingDifference]:
    """Settings that differ between the unaligned modules of the diverging pair, paired by class and parameter
    shapes in construction order, then the rest by kind where one of a kind is left on each side; each with
    `assigned_at` at the line that assigns or passes it where the source says."""
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
    differences: list[SettingDifference] = []
    for ref_build, cand_build in pairs:
        for difference in compare_settings(ref_build, cand_build):
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


def _by_kind(ref_left: list[ModuleBuild], cand_left: list[ModuleBuild]) -> list[tuple[ModuleBuild, ModuleBuild]]:
    """The modules left, paired by kind (`diff/kinds.py`: attention, MLP, norm…) where one of that kind is left
    on each side: their classes differ, so only the settings the synonym table names are compared (`scale` in
    Mistral's one-file `Attention`, which its block calls through `forward`, against `scaling`)."""
    pairs = []
    for kind in dict.fromkeys(kind_of_class(build.class_name) for build in cand_left):
        if kind in (UNKNOWN, NO_OP):
            continue
        cand_kind = [build for build in cand_left if kind_of_class(build.class_name) == kind]
        ref_kind = [build for build in ref_left if kind_of_class(build.class_name) == kind]
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
    return build.class_name, tuple((parameter.name, tuple(parameter.summary.shape)) for parameter in build.parameters)


def passed_at(builds: dict[str, ModuleBuild], build: ModuleBuild, name: str) -> SourceLocation | None:
    """The line of the keyword argument `name=` in the call that built `build`, followed up to the parent's
    construction while the value is a parameter of the `__init__` that made the call; None where the source
    does not say (no keyword of that name, a class called under another name)."""
    found: SourceLocation | None = None
    current = build
    for _ in range(_FOLLOW_UP):
        location = current.built_at
        if location is None:
            return found
        call = _construction_call(location, current, builds)
        keyword = next((item for item in call.keywords if item.arg == name), None) if call is not None else None
        if keyword is None:
            return found
        found = SourceLocation(location.file, keyword.value.lineno, keyword.value.col_offset)
        parameter = keyword.value.id if isinstance(keyword.value, ast.Name) else None
        parent = _owner(builds, current.path)
        if parameter is None or parent is None or parameter not in _init_parameters(location):
            return found
        current, name = parent, parameter
    return found


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


def _tree(file: str) -> ast.Module | None:
    try:
        return ast.parse(read_source_text(file), file)
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _construction_call(
    location: SourceLocation, build: ModuleBuild, builds: dict[str, ModuleBuild]
) -> ast.Call | None:
    """The call of `build`'s class in the statement at `location`; where the statement holds several (an
    `nn.Sequential(A(…), A(…))`), the one at the position `build` holds among the modules of its class that
    statement built (in construction order)."""
    tree = _tree(location.file)
    if tree is None:
        return None
    statements = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
        and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.With))
        and node.lineno <= location.line <= (node.end_lineno or node.lineno)
    ]
    if not statements:
        return None
    statement = min(statements, key=lambda node: (node.end_lineno or node.lineno) - node.lineno)
    calls = sorted(
        (node for node in ast.walk(statement) if isinstance(node, ast.Call) and _called(node) == build.class_name),
        key=lambda node: (node.lineno, node.col_offset),
    )
    parent = _parent(build.path)
    siblings = [
        other.path
        for other in builds.values()
        if other.class_name == build.class_name
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


def _init_parameters(location: SourceLocation) -> Iterable[str]:
    """The parameter names of the `__init__` holding `location`'s line (empty when it is in no `__init__`)."""
    tree = _tree(location.file)
    functions = [
        node
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, ast.FunctionDef) and node.lineno <= location.line <= (node.end_lineno or node.lineno)
    ]
    if not functions:
        return ()
    function = max(functions, key=lambda node: node.lineno)
    if function.name != "__init__":
        return ()
    arguments = function.args
    return [argument.arg for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
