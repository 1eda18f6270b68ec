"""The evidence a diff adds to its first divergence: how the module was built (`settings`) and which line of
its forward first computes a different value (`lines`).

`explain(result)` runs at the end of `compare.decide`, so a verdict recomputed after a replay is explained too.
"""

from __future__ import annotations

from dataclasses import replace

from modeltrace.diff.divergence import bounded, enclosing_function, source_range
from modeltrace.diff.inner_builds import inner_setting_differences
from modeltrace.diff.lines import LineDivergence, drill_down
from modeltrace.diff.missing_calls import missing_call
from modeltrace.diff.result import DIVERGENCE, MATCH, MISMATCH, DiffResult, Divergence, ModuleResult, finish_key
from modeltrace.diff.settings import ModuleEvidence, module_evidence
from modeltrace.diff.unaligned import into_line_owner
from modeltrace.diff.unpaired import settings_read, unpaired_inputs
from modeltrace.trace.records import SourceLocation, SourceRange


def explain(result: DiffResult) -> None:
    """Fill per-module settings/parameter differences and the divergence's `built_at`, `settings`,
    `parameters` and `line`; move the divergence into the module that was built differently where that one
    is the cause (see `diff/settings.py`)."""
    evidence = module_evidence(result)
    divergence = result.first_divergence
    if divergence is None:
        return
    own = evidence.get(divergence.module.candidate.path)
    if own is None or not (own.settings or own.parameters):
        inner = _built_differently_inside(result, divergence, evidence)
        if inner is not None:
            divergence.module.status = MISMATCH
            inner.status = DIVERGENCE
            kids = [
                kid
                for kid in result.modules
                if kid.candidate.parent == inner.candidate.index and kid.reference is not None
            ]
            divergence = bounded(Divergence(inner, inputs_match=True), kids)
            divergence.lines = source_range(divergence)
            result.first_divergence = divergence
            own = evidence.get(inner.candidate.path)
    _built(result, divergence, own)
    divergence.line = _with_reads(drill_down(result, divergence))
    owner = into_line_owner(divergence, result.modules)
    if owner is not None:  # the first differing line ran in a call without counterpart inside it
        divergence = owner
        divergence.lines = source_range(divergence)
        result.first_divergence = divergence
        _built(result, divergence, evidence.get(divergence.module.candidate.path))
        divergence.line = _with_reads(drill_down(result, divergence))
    swapped = missing_call(result, divergence)
    if swapped is not None and (divergence.line is None or _before(swapped, divergence.line)):
        divergence.line = swapped
    divergence.lines = _from_child(divergence)
    divergence.unpaired_inputs = unpaired_inputs(result, divergence)


def _built(result: DiffResult, divergence: Divergence, own: ModuleEvidence | None) -> None:
    """The divergence's construction line, and its settings and parameters that differ (`own`)."""
    divergence.built_at = own.built_at if own is not None else _built_at(result, divergence.module.candidate.path)
    if own is not None:
        divergence.settings = list(own.settings)
        divergence.parameters = list(own.parameters)
    if not divergence.settings and not divergence.parameters:
        divergence.settings = inner_setting_differences(result, divergence)


def _built_differently_inside(
    result: DiffResult, divergence: Divergence, evidence: dict[str, ModuleEvidence]
) -> ModuleResult | None:
    """The first module (in finish order) inside the diverging call whose inputs match, whose outputs differ at
    all (within tolerance counts: a small difference amplified later is still this module's) and that was built
    differently (settings or parameters)."""
    if not evidence:
        return None
    inside: set[int] = {divergence.module.candidate.index}
    found = None
    for module in sorted(result.modules, key=lambda item: item.candidate.index):
        if module.candidate.parent in inside:
            inside.add(module.candidate.index)
    for module in sorted(result.modules, key=finish_key):
        if module is divergence.module or module.candidate.index not in inside or module.reference is None:
            continue
        differences = evidence.get(module.candidate.path)
        if differences is None or not (differences.settings or differences.parameters):
            continue
        if module.inputs != MATCH or (module.replay is not None and module.replay.status == MATCH):
            continue  # a replay on the reference's inputs that matches clears it, as it clears any module
        if module.status == MISMATCH or (module.max_abs_diff is not None and module.max_abs_diff > 0):
            found = module
            break
    return found


def _before(first: LineDivergence, second: LineDivergence) -> bool:
    """Whether `first` is an earlier line than `second` of one file."""
    return first.file == second.file and first.line < second.line


def _from_child(divergence: Divergence) -> SourceRange | None:
    """The divergence's range, narrowed when the first differing value comes out of a child that has no
    counterpart, called from the forward at line C: the cause is in that child (its line is `line`) or in the
    forward from C to the call that receives the value (the range's end), not before C (Gemma's embedder returns
    the embedding unscaled, and the scale the reference applies inside its embedding is missing from 593-600)."""
    found, lines = divergence.line, divergence.lines
    if found is None or lines is None or found.called_from is None:
        return lines
    if found.module_call in (None, -1, divergence.module.candidate.index):
        return lines  # a helper function of the forward's own call: its arguments may come from before
    function = enclosing_function(found.file, found.line)
    if function is None or function[0] == found.line:
        return lines  # the child's parameters already differ: computed before the call, possibly before C
    file, at = found.called_from
    if file != lines.file or not lines.start < at <= lines.end:
        return lines
    return SourceRange(file, at, lines.end)


def _built_at(result: DiffResult, path: str) -> SourceLocation | None:
    for build in result.candidate.trace.builds:
        if build.path == path:
            return build.built_at
    return None


def _with_reads(line: LineDivergence | None) -> LineDivergence | None:
    """The first differing line with the `__init__` settings it reads (`self.scale`), said in its reason too."""
    if line is None:
        return None
    reads = settings_read(line.file, line.line)
    if not reads:
        return line
    said = ", ".join(
        f"self.{name} (assigned at {where.file.rsplit('/', 1)[-1]}:{where.line}"
        + (f"-{where.end_line}" if where.end_line not in (None, where.line) else "")
        + ")"
        for name, where in reads
    )
    return replace(
        line,
        reason=f"{line.reason}; the line reads {said}",
        reads=tuple((name, where.file, where.line, where.end_line or where.line) for name, where in reads),
    )
