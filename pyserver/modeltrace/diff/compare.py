"""The comparison of two traces, from alignment to verdict: `diff_traces(reference, candidate, options)`.

It aligns the module calls (`align`), compares each side of every aligned call (`sides`, by the rule of
`verdict` on full tensors, by statistics otherwise, within the `tolerances` of their dtypes), then decides the
first divergence (`divergence`) and adds its evidence (`evidence`). A verdict rests on what was aligned: too
little aligned or compared makes it "not comparable", not a match (`MIN_ALIGNED_FRACTION`). The records it
fills are `result`'s; `SuspectWatch` names the first differing calls while the comparison runs, so that the
replay (`replay`) can start on them early.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from modeltrace.collector import collector_paused
from modeltrace.diff.align import align_traces, map_notes
from modeltrace.diff.divergence import comparison_stopped, find_divergence, source_range
from modeltrace.diff.unaligned import forget_moved_into, into_unaligned
from modeltrace.diff.evidence import explain
from modeltrace.diff.gradients import gradient_diff
from modeltrace.diff.kinds import is_no_op
from modeltrace.diff.mapping import ConcatenatedTensors
from modeltrace.diff.result import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NONE,
    NOT_COMPARED,
    UNKNOWN,
    DiffError,
    DiffOptions,
    DiffResult,
    ModuleResult,
    record_finish_key,
)
from modeltrace.diff.sides import SideComparer
from modeltrace.diff.steps import restrict_to_common_steps, step_report
from modeltrace.diff.tolerances import dtype_tolerances
from modeltrace.diff.verdict import permuted_weight_modules
from modeltrace.trace.records import ModuleCall
from modeltrace.trace.tensors import LoadedTrace


class SuspectWatch:
    """Names the first `limit` aligned calls, in the order they finished, whose outputs differ, while the
    comparison is still running (in call order), and hands them to `found` once: the replay can then start
    while the rest is compared.

    A call finishes after every call it made, so its place among the finished calls is decided once every call
    before it in finishing order has been compared: the calls it made come right after it in call order, the
    others that finished before it started before it. A call whose outputs are compared by statistics only is
    decided after the whole comparison (`SideComparer.run_statistics`): the watch stops there, and the suspects are
    named after the diff as usual (`replay.suspects`, which gives the same list where the watch gave one)."""

    def __init__(self, records: list[ModuleCall], results: list[ModuleResult], limit: int, found: Any) -> None:
        """`results`: the diff's results, one per record in call order, appended as the records are compared."""
        self.order = sorted(range(len(records)), key=lambda position: record_finish_key(records[position]))
        # the last call-order position among the first k calls in finishing order
        self.needed = list(itertools.accumulate(self.order, max))
        self.results = results
        self.limit = limit
        self.found = found
        self.differs: list[bool | None] = [None] * len(records)
        self.cursor = 0
        self.named: list[ModuleResult] = []
        self.active = limit > 0 and bool(records)

    def compared(self, position: int, differs: bool | None) -> None:
        """Call `position` is compared: its outputs differ (True), do not (False), or are not decided yet (None)."""
        if not self.active:
            return
        self.differs[position] = differs
        order, needed = self.order, self.needed
        while self.cursor < len(order) and needed[self.cursor] <= position:
            known = order[self.cursor]
            differs = self.differs[known]
            if differs is None:
                self.active = False
                return
            self.cursor += 1
            if differs:
                self.named.append(self.results[known])
                if len(self.named) >= self.limit:
                    self.active = False
                    self.found(list(self.named))
                    return


def diff_traces(
    reference: LoadedTrace,
    candidate: LoadedTrace,
    options: DiffOptions | None = None,
    watch: tuple[int, Any] | None = None,
) -> DiffResult:
    """Align and compare `candidate` against `reference`; raises `DiffError` when nothing aligns. `watch`:
    (limit, found): `found(modules)` is called during the comparison with the first `limit` calls, in finishing
    order, whose outputs differ, as soon as they are known (`SuspectWatch`; the replay starts on them)."""
    # NOTE: a diff makes a few objects per module call (results, lists) and no reference cycles; on a trace of
    # thousands of calls the collector's passes over both traces cost ~10% of a statistics-only diff
    with collector_paused():
        return _diff_traces(reference, candidate, options or DiffOptions(), watch)


def _diff_traces(
    reference: LoadedTrace, candidate: LoadedTrace, options: DiffOptions, watch: tuple[int, Any] | None
) -> DiffResult:
    step_notes = restrict_to_common_steps(reference, candidate)
    alignment = align_traces(reference.trace, candidate.trace, list(options.maps), options.mapping, options.automatic)
    if alignment.groups:  # fused pairs compare concatenations of the run's tensors
        for loaded in (reference, candidate):
            if loaded.tensors is not None and not isinstance(loaded.tensors, ConcatenatedTensors):
                loaded.tensors = ConcatenatedTensors(loaded.tensors)
    cand_records = candidate.trace.modules
    ref_records = reference.trace.modules
    reference_for = alignment.reference_for
    if not any(reference_for[position] >= 0 for position, record in enumerate(cand_records) if record.path):
        if any(record.path for record in cand_records) or any(record.path for record in ref_records):
            raise DiffError(_nothing_aligns(reference, candidate))

    comparer = SideComparer(reference, candidate, options, 2 * len(cand_records))
    # NOTE: only full tensors decide a call as it is compared; statistics are compared all at once at the end
    results: list[ModuleResult] = []
    suspect_watch = SuspectWatch(cand_records, results, *watch) if watch is not None and comparer.full else None
    watched = suspect_watch.compared if suspect_watch is not None else None
    queued_sides = comparer.queued_sides
    if comparer.full:  # a reordering of features is only seen (and allowed) on full tensors
        comparer.permuted_positions = permuted_weight_modules(reference.trace, candidate.trace, alignment)
    compare_side = comparer.side
    missing_outputs: dict[int, str] = {}
    ref_lacks_outputs = reference.kind == "hf-debugger"
    cand_lacks_outputs = candidate.kind == "hf-debugger"
    pruned = alignment.pruned
    how = alignment.how
    for position, record in enumerate(cand_records):
        ref_position = reference_for[position]
        if ref_position < 0:
            result = ModuleResult(record, None)
            result.reason = (
                "pruned from the reference (do_prune_layers)"
                if position in pruned
                else "no counterpart in the reference"
            )
            results.append(result)
            if watched is not None:
                watched(position, False)
            continue
        ref = ref_records[ref_position]
        result = ModuleResult(record, ref, aligned_by=how[position], pair=alignment.pair_of.get(position))
        results.append(result)
        result.input_pairing = compare_side(ref.inputs, record.inputs, 2 * position)
        if ref.outputs and record.outputs:
            result.output_pairing = compare_side(ref.outputs, record.outputs, 2 * position + 1)
            if watched is not None:
                side = 2 * position + 1
                leaves = comparer.special.get(side, ())
                if any(leaf.status == MISMATCH for leaf in leaves):
                    watched(position, True)
                else:  # rows queued for the statistics are decided at the end
                    watched(position, None if queued_sides and queued_sides[-1] == side else False)
        elif ref.outputs or record.outputs:
            if ref_lacks_outputs if not ref.outputs else cand_lacks_outputs:
                side_name = "reference" if not ref.outputs else "candidate"
                missing_outputs[position] = (
                    f"the {side_name} (a debugger output) records no outputs for modules with submodules"
                )
            else:
                comparer.structure[2 * position + 1] = (
                    "the candidate returns no tensors" if not record.outputs else "the reference returns no tensors"
                )
        else:
            missing_outputs[position] = ""
        if watched is not None and not (ref.outputs and record.outputs):
            # no outputs on one side: a mismatch by structure when the candidate returns tensors (a suspect)
            watched(position, bool(record.outputs) and 2 * position + 1 in comparer.structure)

    comparer.run_statistics()

    side_status = comparer.side_status
    side_summary = comparer.side_summary
    special = comparer.special
    tolerances = comparer.tolerances
    totals, bad, compared, maxima = comparer.totals, comparer.bad, comparer.compared, comparer.maxima
    structure = comparer.structure
    for position, result in enumerate(results):
        if result.reference is None:
            continue
        side = 2 * position
        if side in special or side in structure:
            result.inputs = side_status(side, "input")[0]
            result.input_leaves = special.get(side, [])
        else:  # statistics only: straight from the counts
            result.inputs = MISMATCH if bad[side] else (MATCH if totals[side] else NONE)
        if position in missing_outputs:
            reason = missing_outputs[position]
            result.outputs = UNKNOWN if reason else NONE
            result.status, result.reason = NOT_COMPARED, reason or "no tensor outputs"
            continue
        side += 1
        if side in structure or (side in special and not (bad[side] and len(special[side]) == 1)):
            result.outputs, reason = side_status(side, "output")
            result.output_leaves = special.get(side, [])
            result.check, result.max_abs_diff, result.max_rel_diff = side_summary(side)
        else:  # statistics only (with at most the description of its first differing leaf)
            total = totals[side]
            leaves = special.get(side)
            if leaves:
                leaf = leaves[0]
                result.output_leaves = leaves
                result.outputs = MISMATCH
                reason = f"output {leaf.key}: {leaf.reason}" if leaf.key else leaf.reason
            else:
                result.outputs = MATCH if total else NONE
                reason = None
            if total:
                result.check = "statistics" if compared[side] == total else "shape"
                maximum = maxima[side]
                result.max_abs_diff = maximum if maximum != -math.inf else None
        ref_outputs, cand_outputs = result.reference.outputs, result.candidate.outputs
        if ref_outputs and cand_outputs:
            result.atol, result.rtol, result.rel_tol, _ = dtype_tolerances(
                ref_outputs[0].dtype, cand_outputs[0].dtype, options, tolerances
            )
        _scale_measures(result)
        if result.outputs == MISMATCH:
            result.status, result.reason = MISMATCH, reason
        elif result.outputs == MATCH:
            result.status = MATCH
        else:
            result.status, result.reason = NOT_COMPARED, "no comparable tensor outputs"

    notes = [*reference.notes, *candidate.notes]
    if alignment.prefix:
        notes.append(
            f"aligned by stripping the prefix {alignment.prefix!r} from the {alignment.prefix_side}'s module paths"
        )
    notes.extend(map_notes(alignment))
    notes.extend(step_notes)
    result = DiffResult(reference, candidate, options, alignment, results, None, notes)
    decide(result)
    result.steps = step_report(result)
    result.gradients = gradient_diff(result)
    result.not_comparable = not_comparable(result)
    if "parallel" in reference.trace.model or "parallel" in candidate.trace.model:
        from modeltrace.diff.ranks import rank_findings

        result.ranks = rank_findings(result)
    return result


def decide(result: DiffResult) -> None:
    """(Re)compute the first divergence from the module results (and their replays, when there are some)."""
    for module in result.modules:
        if (module.status == DIVERGENCE and module.reference is None) or module.compared_before is not None:
            forget_moved_into(module)  # an earlier decision moved into it (`into_unaligned`)
        elif module.status == DIVERGENCE:
            module.status = MISMATCH
    for module in result.modules:
        module.boundary, module.absorbed_by = False, None
    divergence, boundaries = find_divergence(result.modules)
    divergence = into_unaligned(divergence, result.modules, result.reference.trace)
    for module in boundaries:
        module.boundary = True
    if divergence is not None:
        divergence.module.status = DIVERGENCE
        divergence.lines = source_range(divergence)
    result.first_divergence = divergence
    explain(result)
    result.not_comparable = not_comparable(result)


def not_comparable(result: DiffResult) -> str | None:
    """Why the diff's verdict is "not_comparable" (exit 2), or None: a match that rests on too little
    (`_coverage_problem`), or differences for which no module can be named as the first divergence
    (`comparison_stopped`: every differing module's inputs already differ). A rank or gradient divergence is a
    finding of its own."""
    if result.match:
        return _coverage_problem(result)
    if result.first_divergence is not None:
        return None
    if any(finding.get("kind") == "rank_divergence" for finding in result.ranks):
        return None
    if result.gradients is not None and not result.gradients.match:
        return None
    return comparison_stopped(result.modules)


def _scale_measures(result: ModuleResult) -> None:
    """The module's relative error (the largest over its compared outputs) and cosine (the smallest)."""
    if not result.output_leaves:
        return
    rel_errs = [leaf.rel_err for leaf in result.output_leaves if leaf.rel_err is not None]
    cosines = [leaf.cosine for leaf in result.output_leaves if leaf.cosine is not None and leaf.cosine == leaf.cosine]
    if rel_errs:
        result.rel_err = max(rel_errs)
    if cosines:
        result.cosine = min(cosines)


# NOTE: a verdict rests on what was aligned: under half of the smaller trace's module calls (or a single one)
# is too little to call the two a match.
MIN_ALIGNED_FRACTION = 0.5


def _coverage_problem(result: DiffResult) -> str | None:
    """Why a diff in which no module differs still cannot be called a match, or None."""
    if not result.match:
        return None
    # NOTE: a no-op (Identity, Dropout, DropPath, Flatten) has no counterpart to find: it is left out of the count
    cand_calls = [module for module in result.modules if module.candidate.path and not is_no_op(module.candidate)]
    ref_calls = [record for record in result.reference.trace.modules if record.path and not is_no_op(record)]
    pruned = len(result.alignment.pruned)
    aligned = sum(1 for module in cand_calls if module.reference is not None)
    smaller = min(len(cand_calls) - pruned, len(ref_calls))
    compared = sum(1 for module in result.modules if module.status == MATCH)
    if smaller and aligned < MIN_ALIGNED_FRACTION * smaller:
        return (
            f"only {aligned} of {smaller} module calls aligned ({100 * aligned / smaller:.0f}%, under "
            f"{100 * MIN_ALIGNED_FRACTION:.0f}%): too little to call the traces a match; map names with "
            "--map 'REGEX=>REPLACEMENT'"
        )
    if not compared and (cand_calls or ref_calls):
        return "no module's outputs could be compared: nothing supports a match"
    return None


def _nothing_aligns(reference: LoadedTrace, candidate: LoadedTrace) -> str:
    def sample(loaded: LoadedTrace) -> str:
        paths = [record.path for record in loaded.trace.modules if record.path][:2]
        return ", ".join(paths) or "no submodules"

    ref_class = reference.trace.model.get("class") or "?"
    cand_class = candidate.trace.model.get("class") or "?"
    return (
        f"nothing aligns: the reference ({ref_class}: {sample(reference)}, …) and the candidate "
        f"({cand_class}: {sample(candidate)}, …) share no module path; are they traces of the same model? "
        "the automatic alignment found no pair above its confidence threshold either (`modeltrace align` lists "
        "the best candidates); map names with --map 'REGEX=>REPLACEMENT' or give a --mapping file"
    )
