"""Line-level drill-down: the first line inside the diverging module whose value differs from the reference.

When both traces have line records (`modeltrace trace --lines`), each record names the module call it ran in
(`LineRecord.module_call`), so the lines of the diverging call (its forward and the helper functions it calls,
not its children's) are known on both sides. They are paired:

- same file on both sides (a trace of the same modeling file, before and after an edit): by line, variable name
  and occurrence within the call;
- different files (a port against its original): in execution order, each candidate value is first looked for
  among the reference's values of the call (same statistics over as many elements, whatever the layout): a
  value the reference also computed is right, and moves the reference's position past it. The first candidate
  value that the reference never computed and that has a counterpart there (among the reference's values new
  in the call past that position: the first of the same variable name, else one of the next three of a shape
  holding the same numbers) is the first differing line. Intermediates only one side has (a fused qkv
  projection) have no counterpart and are passed over. Masks compare by how many entries they mask, whether
  written with -inf or the dtype's minimum; a mask built in several lines is compared as it is passed on and
  named where its masked entries are decided. A name assigned again right after is compared by its last value.

Line records hold statistics (and, where a record's tensor is also a module's input or output or is small, a full
tensor), so values are compared as the diff compares statistics: a statistic further apart than the tolerance proves
a difference; values of the same shape whose full tensors both traces stored are compared element by element too
(an order the statistics do not see: a shift rolled the wrong way; a small value only a line stored, only inside a
call without counterpart, `FullValues`). The tolerance is relative to the values' scale,
and no tighter than ten times the difference already present in the call's own inputs (parameters are recorded
on the `def` line), so that error accumulated upstream is not mistaken for this module's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from modeltrace.diff.arranged import arranged_inputs
from modeltrace.diff.divergence import enclosing_function, function_spans
from modeltrace.diff.result import DiffResult, Divergence
from modeltrace.diff.stretch import narrowed_since
from modeltrace.trace.records import LineRecord, TensorSummary


@dataclass(frozen=True, slots=True)
class LineDivergence:
    """The first line of the diverging module whose value differs: candidate `file` and `line`, the variable
    `name`, the largest statistic difference (a lower bound of the true max abs diff), and `reason` in words."""

    file: str
    line: int
    name: str | None
    max_abs_diff: float | None
    reason: str
    # where the value first differs inside a helper function the forward calls: the forward's line that called
    # it (an edited argument of that call is there), else None
    called_from: tuple[str, int] | None = None
    # the attributes the line reads that its class's `__init__` assigns: (name, file, first line, last line)
    reads: tuple[tuple[str, str, int, int], ...] = ()
    # the first line of the stretch that holds the cause: after the last line of the same function whose value
    # the reference also computed (values no line compares, a complex intermediate, lie in between), else the
    # function's first line; None where unknown
    since: int | None = None
    # values the line reads that were made of repeated copies earlier in the call (`diff/arranged.py`): (name read,
    # file, line that made the copies); their arrangement is invisible to statistics
    arranged: tuple[tuple[str, str, int], ...] = ()
    # the candidate module call that ran the line (`LineRecord.module_call`): a call inside the divergence that
    # has no counterpart, where the difference arises (`unaligned.into_line_owner`), or the divergence's own
    module_call: int = -1
    # the candidate's value on that line (statistics)
    value: TensorSummary | None = None
    # whether the full tensors showed the difference, element by element (the statistics agree)
    elements: bool = False

    def to_json(self) -> dict[str, Any]:
        value = self.max_abs_diff
        return {
            "since": self.since,
            "reads": [
                {"attribute": name, "assigned_at": {"file": file, "line": start, "end_line": end}}
                for name, file, start, end in self.reads
            ],
            "file": self.file,
            "line": self.line,
            "name": self.name,
            "max_abs_diff": value if value is None or math.isfinite(value) else None,
            "reason": self.reason,
            "called_from": None
            if self.called_from is None
            else {"file": self.called_from[0], "line": self.called_from[1]},
            "arranged": [{"name": name, "file": file, "line": line} for name, file, line in self.arranged],
        }


# Relative tolerance of a statistic per dtype (the lower precision of the two sides decides), before widening
# by the inputs' own difference.
_RELATIVE = {"bfloat16": 2e-2, "float16": 4e-3}
_RELATIVE_DEFAULT = 1e-4
_INPUT_WIDENING = 10.0
# How far past the candidate's progress a reference value of the same shape may be its counterpart.
_NEARBY = 3
# NOTE: masks hold -inf in one code base and the dtype's minimum in another: beyond this both are "masked".
_MASKED = 1e30
_STATISTICS = ("mean", "std", "min", "max")


def drill_down(result: DiffResult, divergence: Divergence) -> LineDivergence | None:
    """The first differing line of `divergence`'s module call, or None (no line records on either side, no
    records linked to module calls, or no line found that differs)."""
    reference, candidate = divergence.module.reference, divergence.module.candidate
    moved_into = divergence.compared_in is not None
    if moved_into:
        # a module without counterpart, or compared in part (`diff/unaligned.py`): its lines against those of the
        # reference call that showed the difference, inline code included
        reference = divergence.compared_in.reference
    if reference is None:
        return None
    aligned_ref = {module.reference.index for module in result.modules if module.reference is not None}
    aligned_cand = {module.candidate.index for module in result.modules if module.reference is not None}
    ref_calls = unaligned_descendants(result.reference.trace.modules, reference.index, aligned_ref)
    cand_calls = unaligned_descendants(result.candidate.trace.modules, candidate.index, aligned_cand)
    ref_lines = [record for record in result.reference.trace.lines if record.module_call in ref_calls]
    cand_lines = [record for record in result.candidate.trace.lines if record.module_call in cand_calls]
    if not ref_lines or not cand_lines:
        return None
    ref_body, ref_inputs = _split_prologue(ref_lines)
    cand_body, cand_inputs = _split_prologue(cand_lines)
    # NOTE: a module moved into has other parameters than the reference call (the root's `x` is not its `x`), and
    # its inputs are the very tensors found matching: no upstream error to widen the tolerance by
    tolerance = _tolerance(ref_lines, cand_lines, [] if moved_into else ref_inputs, cand_inputs)
    if {record.file for record in ref_lines} == {record.file for record in cand_lines}:
        found = _same_file(ref_body, cand_body, tolerance)
    else:
        computed = _module_values(result.reference.trace.modules, reference.index)
        # NOTE: the small values lines assigned are stored too (`worker/lines.py`); element by element they say
        # something only inside calls without counterpart (below)
        open_calls = {call for call in cand_calls if call not in aligned_cand}
        full = FullValues(
            result.reference.tensors,
            result.candidate.tensors,
            tolerance,
            (_module_tensors(result.reference.trace.modules), _module_tensors(result.candidate.trace.modules)),
            open_calls,
        )
        found = _by_order(ref_lines, ref_body, cand_body, tolerance, computed, full)
    if found is None or not cand_inputs:
        return found
    return _in_forward(found, cand_body, cand_inputs[0])


def unaligned_descendants(records: list, call: int, aligned: set[int]) -> set[int]:
    """The call and the calls inside it that have no counterpart on the other side (and are not inside an
    aligned one): their lines are inline code as far as the other side can tell (a module on one side only:
    Mistral's one-file reference calls `self.attention.forward(x)` directly, so transformers' attention
    module has no counterpart call, and its lines belong to the decoder layer's comparison)."""
    children: dict[int, list[int]] = {}
    for record in records:
        children.setdefault(record.parent, []).append(record.index)
    found = {call}
    pending = list(children.get(call, []))
    while pending:
        index = pending.pop()
        if index in aligned or index in found:
            continue
        found.add(index)
        pending.extend(children.get(index, []))
    return found


def _in_forward(found: LineDivergence, cand_body: list[LineRecord], definition: LineRecord) -> LineDivergence:
    """`found`, with the line of the module's own forward that leads to it when it lies in a helper function the
    forward calls (`eager_attention_forward`, `apply_rotary_pos_emb`): that call (`attn_output, attn_weights =
    attention_interface(...)`) is what the user wrote in the module, and where an edited argument (`scaling=...`)
    sits; the helper's line is where the values first differ. The forward's lines come from its `def` line
    (where the parameters are recorded) and the source file; where that cannot be read, `found` stands."""
    span = _function_span(definition.file, definition.line)
    if span is None or (found.file == definition.file and span[0] <= found.line <= span[1]):
        return found
    start = next(
        (
            position
            for position, record in enumerate(cand_body)
            if (record.file, record.line, record.name) == (found.file, found.line, found.name)
        ),
        None,
    )
    if start is None:
        return found
    caller = next(
        (
            record
            for record in cand_body[start:]
            if record.file == definition.file and span[0] <= record.line <= span[1]
        ),
        None,
    )
    if caller is None:
        return found
    return replace(
        found,
        reason=f"{found.reason}; in a function called from {_short(caller.file)}:{caller.line}",
        called_from=(caller.file, caller.line),
    )


def _function_span(file: str, def_line: int) -> tuple[int, int] | None:
    """First and last line of the function defined on `def_line` of `file` (its decorators' lines included in
    neither), or None where the file cannot be read or parsed."""
    import ast

    from modeltrace.trace.source_files import UnreadableSource, read_source_text

    try:
        tree = ast.parse(read_source_text(file))
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= def_line <= (
            node.body[0].lineno if node.body else node.lineno
        ):
            return node.lineno, node.end_lineno or node.lineno
    return None


def _split_prologue(records: list[LineRecord]) -> tuple[list[LineRecord], list[LineRecord]]:
    """(body records, parameter records): parameters are recorded first, on the `def` line."""
    first = records[0]
    prologue = [record for record in records if record.file == first.file and record.line == first.line]
    body = [record for record in records if not (record.file == first.file and record.line == first.line)]
    return (body, prologue) if body else (records, [])


def _tolerance(
    ref_lines: list[LineRecord],
    cand_lines: list[LineRecord],
    ref_inputs: list[LineRecord],
    cand_inputs: list[LineRecord],
) -> float:
    dtypes = {record.tensor.dtype for record in (*ref_lines[:1], *cand_lines[:1])}
    relative = max((_RELATIVE.get(dtype, _RELATIVE_DEFAULT) for dtype in dtypes), default=_RELATIVE_DEFAULT)
    ref_by_name = {record.name: record for record in ref_inputs}
    for cand_record in cand_inputs:
        ref_record = ref_by_name.get(cand_record.name)
        if ref_record is not None and _comparable(ref_record.tensor, cand_record.tensor):
            gap, scale = _gap(ref_record.tensor, cand_record.tensor)
            if scale > 0:
                relative = max(relative, _INPUT_WIDENING * gap / scale)
    return relative


def _same_file(ref_body: list[LineRecord], cand_body: list[LineRecord], tolerance: float) -> LineDivergence | None:
    ref_by_key = {key: record for key, record in _occurrences(ref_body)}
    for key, cand_record in _occurrences(cand_body):
        ref_record = ref_by_key.get(key)
        if ref_record is None:
            continue
        found = _differs(ref_record, cand_record, tolerance)
        if found is not None:
            return found
    return None


def _occurrences(records: Iterable[LineRecord]) -> Iterable[tuple[tuple[int, str, int], LineRecord]]:
    counts: dict[tuple[int, str], int] = {}
    for record in records:
        key = (record.line, record.name)
        occurrence = counts.get(key, 0)
        counts[key] = occurrence + 1
        yield (record.line, record.name, occurrence), record


def _module_values(records: list, call: int) -> list[TensorSummary]:
    """The inputs and outputs of the reference's calls inside `call` (its aligned children's too): values the
    reference computed that no line of its own assigns (`self.norm(hidden + self.pos)` computes the sum inline,
    as the norm's input)."""
    inside = {call}
    for record in records:  # stored in the order calls started: a parent before its children
        if record.parent in inside:
            inside.add(record.index)
    return [
        summary
        for record in records
        if record.index in inside and record.index != call
        for summary in (*record.inputs, *record.outputs)
        if summary.mean is not None
    ]


def _module_tensors(records: list) -> set[str]:
    """The stored tensors' names of a trace's module inputs and outputs."""
    return {summary.tensor for record in records for summary in (*record.inputs, *record.outputs) if summary.tensor}


class FullValues:
    """Whether two line values of the same shape (up to leading 1s) hold the same numbers element by element, read
    from the traces' full tensors: True, False, or None where either was not stored or the shapes differ.
    Statistics do not see an order (a cyclic shift rolled the wrong way, patches concatenated in another order);
    values of the same shape in both implementations are laid out alike, so their elements compare one by one.

    That holds at module boundaries (hidden states `[B, T, C]`), not for every intermediate of an aligned call: its
    own comparison covers it, and inside it the two may lay a value out otherwise on purpose (Meta's query heads
    interleaved where transformers' converted weights put them in halves; windows in another order). So a value
    stored only because a line assigned it (`worker/lines.py` stores small ones) is compared element by element
    only on a line that ran in a candidate call without counterpart (`open_calls`): such a call has no comparison
    of its own, and its small values are where an order is decided (a position bias looked up from its table, a
    class token joined to the patches)."""

    def __init__(
        self,
        reference: Any,
        candidate: Any,
        tolerance: float,
        module_tensors: tuple[set[str], set[str]] | None = None,
        open_calls: set[int] | None = None,
    ) -> None:
        self.stores = (reference, candidate)
        self.tolerance = tolerance
        self._arrays: dict[tuple[int, str], Any] = {}
        self.module_tensors = module_tensors
        self.open_calls = open_calls or set()

    def _usable(self, ref: TensorSummary, cand: TensorSummary, call: int) -> bool:
        if self.module_tensors is None or call in self.open_calls:
            return True
        return ref.tensor in self.module_tensors[0] and cand.tensor in self.module_tensors[1]

    def _array(self, side: int, summary: TensorSummary) -> Any:
        key = (side, summary.tensor or "")
        if key not in self._arrays:
            store = self.stores[side]
            try:
                self._arrays[key] = None if store is None or not summary.tensor else store.get(summary.tensor)
            except Exception:  # noqa: BLE001 - a damaged tensors file: no evidence either way
                self._arrays[key] = None
        return self._arrays[key]

    def gap(self, ref: TensorSummary, cand: TensorSummary, call: int = -1) -> float | None:
        """The largest element difference of two same-shape values when it exceeds the tolerance, 0.0 when they
        agree, None when unknown; `call`: the candidate call whose line assigned `cand`."""
        if not _same_grid(ref.shape, cand.shape) or ref.dtype.startswith("complex") or ref.dtype != cand.dtype:
            return None
        if not self._usable(ref, cand, call):
            return None
        first, second = self._array(0, ref), self._array(1, cand)
        if first is None or second is None or first.size != second.size or first.size == 0:
            return None
        import numpy as np

        first = np.asarray(first, dtype=np.float64).reshape(-1)
        second = np.asarray(second, dtype=np.float64).reshape(-1)
        finite = np.isfinite(first) & np.isfinite(second)
        if not finite.all():
            return None  # masks: compared by their statistics
        largest = float(np.abs(first - second).max())
        scale = float(np.abs(first).max())
        return largest if largest > self.tolerance * scale + 1e-12 else 0.0


def _by_order(
    ref_lines: list[LineRecord],
    ref_body: list[LineRecord],
    cand_body: list[LineRecord],
    tolerance: float,
    computed: list[TensorSummary] = (),
    full: FullValues | None = None,
) -> LineDivergence | None:
    """The first differing candidate line in execution order (see the module's docstring); `full` compares values
    of the same shape element by element where both traces stored them."""

    def same(ref_record: LineRecord, cand_record: LineRecord) -> bool:
        if not _same_values(ref_record.tensor, cand_record.tensor, tolerance):
            return False
        return full is None or not full.gap(ref_record.tensor, cand_record.tensor, cand_record.module_call)

    position = 0  # reference records before this one are behind the candidate's progress
    fresh = _fresh(ref_lines, ref_body)
    last_right: LineRecord | None = None
    skip_to = 0  # the records of a mask built right, passed over as one value
    for index, cand_record in enumerate(cand_body):
        if index < skip_to:
            continue
        if cand_record.tensor.dtype.startswith("complex"):
            continue  # statistics of a complex tensor (a rotary table) have no real counterpart to compare with
        # NOTE: any reference value of the call explains it, its parameters included (a mask the candidate
        # builds itself is the reference's `attention_mask`): equal statistics over as many elements are the
        # same values whatever the layout (`[1, 7, 64]` against `[1, 4, 7, 16]`, permuted heads)
        twins = [record for record in ref_lines if _same_values(record.tensor, cand_record.tensor, tolerance)]
        gaps = (
            [full.gap(twin.tensor, cand_record.tensor, cand_record.module_call) for twin in twins]
            if full is not None
            else []
        )
        if gaps and 0.0 not in gaps and any(gaps):
            # the same statistics, other elements where the full tensors say (the same numbers in another order,
            # and none of the values compared element by element agrees): that value is the counterpart
            twin = twins[next(position for position, gap in enumerate(gaps) if gap)]
            found = _differs(twin, cand_record, tolerance, full)
            if found is not None:
                return replace(found, since=_since(last_right, found, cand_body, index))
        if twins:
            # progress: the first such value at or after the current position (the same tensor is often
            # recorded on several lines: the q of a projection, then the `query` parameter of a helper)
            explained = next(
                (index for index in range(position, len(ref_body)) if same(ref_body[index], cand_record)),
                None,
            )
            # NOTE: a mask is built once and passed down (the attention's `mask` parameter): where the reference
            # happens to record it says nothing of the computation's progress
            if explained is not None and not _masked_count(cand_record.tensor):
                position = explained + 1
            # NOTE: a line that only lays the last right value out again (`permute`, `view`) computes nothing: the
            # stretch of the cause starts after the line that computed it (a scale skipped before a permute that
            # the reference applies after it)
            if not _relaid(last_right, cand_record, tolerance):
                last_right = cand_record
            continue
        if any(_same_values(summary, cand_record.tensor, tolerance) for summary in computed):
            last_right = cand_record  # a value the reference computed inline, as a call's argument or result
            continue
        if _is_parameter(cand_record):
            continue  # an argument its caller computed inline: what the callee computes from it is compared
        # NOTE: counterparts are values the reference computed there, not re-bindings of earlier ones (the
        # `query` parameter of a helper is the projection's output again)
        later = [record for index, record in enumerate(ref_body[position:], position) if fresh[index]]
        counterpart = next(
            (
                record
                for record in later
                if record.name == cand_record.name and _comparable(record.tensor, cand_record.tensor)
            ),
            None,
        )
        if counterpart is None:
            counterpart = next(
                (record for record in later[:_NEARBY] if _comparable(record.tensor, cand_record.tensor)), None
            )
        if counterpart is None:
            continue  # an intermediate the reference does not have
        if _masked_count(counterpart.tensor):
            run = _mask_run(cand_body, index)
            found = _differs(counterpart, run[-1], tolerance, full)
            if found is None:
                skip_to, last_right = index + len(run), run[-1]
                continue
            return _mask_decided(found, run)
        found = _differs(counterpart, cand_record, tolerance, full)
        if found is not None and any(same(counterpart, record) for record in _reassigned(cand_body, index)):
            continue  # an intermediate of the name, whose next assignment is the reference's value
        if found is not None:
            since = _since(last_right, found, cand_body, index)
            return _with_arranged(replace(found, since=since), cand_body, index)
    return None


def _with_arranged(found: LineDivergence, cand_body: list[LineRecord], position: int) -> LineDivergence:
    arranged = arranged_inputs(cand_body, position)
    if not arranged:
        return found
    said = ", ".join(f"{name} at {_short(file)}:{line}" for name, file, line in arranged)
    reason = f"{found.reason}; made of repeated copies, whose order statistics cannot see: {said}"
    return replace(found, arranged=arranged, reason=reason)


def _is_parameter(record: LineRecord) -> bool:
    """Whether the record is a parameter of a function (recorded on its `def` line), not a computed value."""
    return any(start == record.line for start, _ in function_spans(record.file))


def _relaid(earlier: LineRecord | None, record: LineRecord, tolerance: float) -> bool:
    """Whether `record` holds `earlier`'s values again, further down the same function (a `permute`, a `view`)."""
    if earlier is None or earlier.file != record.file or earlier.line >= record.line:
        return False
    if not _same_values(earlier.tensor, record.tensor, tolerance):
        return False
    function = enclosing_function(record.file, record.line)
    return function is not None and function == enclosing_function(earlier.file, earlier.line)


def _reassigned(cand_body: list[LineRecord], start: int) -> list[LineRecord]:
    """The records right after `start` that assign the same name again in the same file (`attn_mask = a - b`,
    then `attn_mask = attn_mask.masked_fill(…)`): its value at `start` is an intermediate of theirs."""
    first = cand_body[start]
    found = []
    for record in cand_body[start + 1 :]:
        if record.name != first.name or record.file != first.file:
            break
        found.append(record)
    return found


def _mask_run(cand_body: list[LineRecord], start: int) -> list[LineRecord]:
    """The records from `start` that build one mask: the following mask-like records (`_split`) of the same file
    and as many elements (`mask = torch.full(…, -inf)`, `mask = torch.triu(mask, diagonal=1)`, `mask =
    torch.hstack([…, mask])`, or a 0/1 matrix turned into an additive mask by `torch.log`), up to the first other
    value; only the record at `start` when it is not mask-like."""
    first = cand_body[start]
    size = math.prod(first.tensor.shape)
    run = [first]
    if _split(first.tensor) is None:
        return run  # not a mask being built (scores that a mask was added to): compared as it is
    for record in cand_body[start + 1 :]:
        if record.file != first.file or math.prod(record.tensor.shape) != size or _split(record.tensor) is None:
            break
        run.append(record)
    return run


def _mask_decided(found: LineDivergence, run: list[LineRecord]) -> LineDivergence:
    """A mask the candidate builds in several lines, compared with the reference's mask as it is passed on (the
    run's last value): the intermediates (a matrix filled with -inf, a 0/1 matrix) have no counterpart. The line
    named is the first of the run that splits the entries as the final mask does (as many masked, or zero, as
    there end up masked): the line that decided which entries are masked (`torch.triu(mask, diagonal=2)`); the
    stretch starts at the run's first line."""
    last = run[-1]
    split = _split(last.tensor)
    decided = next((record for record in run if split is not None and _split(record.tensor) == split), last)
    reason = found.reason
    if decided is not last:
        reason += f"; {decided.name} at {_short(decided.file)}:{decided.line} already splits the entries so"
    since = run[0].line if run[0].file == decided.file and run[0].line <= decided.line else None
    return replace(found, line=decided.line, name=decided.name, reason=reason, since=since)


def _since(
    last_right: LineRecord | None, found: LineDivergence, cand_body: list[LineRecord], index: int
) -> int | None:
    """The first line of the stretch of `found`'s function where the difference arises: after the last line of
    that function whose value was right, else after its `def` line; then the first statement of that stretch
    that computes something the line depends on (`diff/stretch.py`)."""
    function = enclosing_function(found.file, found.line)
    if function is None:
        return None
    start = function[0] + 1
    if last_right is not None and last_right.file == found.file and function[0] <= last_right.line < found.line:
        start = max(start, last_right.line + 1)
    if start > found.line:
        return None
    return narrowed_since(found.file, found.line, start, function, cand_body, index)


def _fresh(ref_lines: list[LineRecord], ref_body: list[LineRecord]) -> list[bool]:
    """For each body record, whether its value is new in the call (no earlier record holds the same statistics)."""
    seen: set[tuple] = set()
    body_ids = {id(record) for record in ref_body}
    fresh = []
    for record in ref_lines:
        summary = record.tensor
        key = (math.prod(summary.shape), summary.dtype, summary.mean, summary.std, summary.min, summary.max)
        if id(record) in body_ids:
            fresh.append(key not in seen)
        seen.add(key)
    return fresh


def same_values(ref: TensorSummary, cand: TensorSummary) -> bool:
    """Whether two tensors hold the same values, as far as their statistics tell (over as many elements, whatever
    the layout), at the lower precision of their two dtypes."""
    tolerance = max(_RELATIVE.get(ref.dtype, _RELATIVE_DEFAULT), _RELATIVE.get(cand.dtype, _RELATIVE_DEFAULT))
    return _same_values(ref, cand, tolerance)


def _same_values(ref: TensorSummary, cand: TensorSummary, tolerance: float) -> bool:
    return math.prod(ref.shape) == math.prod(cand.shape) and _within(ref, cand, tolerance)


def _differs(
    ref_record: LineRecord, cand_record: LineRecord, tolerance: float, full: FullValues | None = None
) -> LineDivergence | None:
    ref, cand = ref_record.tensor, cand_record.tensor
    where = f"{ref_record.name} at {_short(ref_record.file)}:{ref_record.line}"
    element_gap = (
        full.gap(ref, cand, cand_record.module_call) if full is not None and _within(ref, cand, tolerance) else None
    )
    if element_gap:
        return LineDivergence(
            cand_record.file,
            cand_record.line,
            cand_record.name,
            element_gap,
            f"{cand_record.name}: the same statistics, other values element by element (max abs diff "
            f"{element_gap:.5g}, full tensors: the elements in another order) ({where} in the reference)",
            module_call=cand_record.module_call,
            value=cand,
            elements=True,
        )
    if not _comparable(ref, cand):
        return LineDivergence(
            cand_record.file,
            cand_record.line,
            cand_record.name,
            None,
            f"shape {cand.shape} vs {ref.shape} ({where} in the reference)",
            module_call=cand_record.module_call,
            value=cand,
        )
    if _within(ref, cand, tolerance):
        return None
    gap, _ = _gap(ref, cand)
    ref_masked, cand_masked = _masked_count(ref), _masked_count(cand)
    if (ref_masked or cand_masked) and None not in (ref_masked, cand_masked) and ref_masked != cand_masked:
        return LineDivergence(
            cand_record.file,
            cand_record.line,
            cand_record.name,
            None,
            f"{cand_record.name} masks {cand_masked} of {math.prod(cand.shape)} entries vs {ref_masked} "
            f"({where} in the reference)",
            module_call=cand_record.module_call,
            value=cand,
        )
    statistic = max(_STATISTICS, key=lambda name: _difference(getattr(ref, name), getattr(cand, name)))
    return LineDivergence(
        cand_record.file,
        cand_record.line,
        cand_record.name,
        gap,
        f"{cand_record.name} {statistic} {getattr(ref, statistic):.5g} vs {getattr(cand, statistic):.5g} "
        f"({where} in the reference)",
        module_call=cand_record.module_call,
        value=cand,
    )


def _same_grid(first: list[int], second: list[int]) -> bool:
    """The same shape up to leading 1s, or the same rows in another grid (`[1, 64, 64]` against `[1, 8, 8, 64]`:
    the same last dimension and as many elements): both hold their elements in the same order."""
    if _core(first) == _core(second):
        return True
    return bool(first and second) and first[-1] == second[-1] and math.prod(first) == math.prod(second)


def _core(shape: list[int]) -> tuple[int, ...]:
    """The shape without leading 1s: `[7, 64]` and `[1, 7, 64]` hold the same numbers."""
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def _comparable(ref: TensorSummary, cand: TensorSummary) -> bool:
    """Same elements up to broadcasting, or a view of them (`[1, 7, 4, 16]` and `[1, 4, 7, 16]`: statistics do not
    depend on the order of the elements)."""
    if _core(ref.shape) == _core(cand.shape):
        return True
    return math.prod(ref.shape) == math.prod(cand.shape) and sorted(_core(ref.shape)) == sorted(_core(cand.shape))


def _scale(summary: TensorSummary) -> float:
    values = [
        abs(value)
        for value in (summary.min, summary.max, summary.std)
        if value is not None and value == value and abs(value) < _MASKED
    ]
    return max(values, default=0.0)


def _difference(first: float | None, second: float | None) -> float:
    """|first - second|, -1 where either is missing or NaN; values beyond ±1e30 (masks) count as infinite, and
    two infinite values of one sign are equal."""
    if first is None or second is None or first != first or second != second:
        return -1.0
    first_masked, second_masked = abs(first) >= _MASKED, abs(second) >= _MASKED
    if first_masked or second_masked:
        return 0.0 if first_masked and second_masked and (first > 0) == (second > 0) else math.inf
    return abs(first - second)


def _masked_count(summary: TensorSummary) -> int | None:
    """How many entries of an additive mask are masked: infinite ones (statistics leave them out and count them),
    plus those at the dtype's minimum (-3.4e38: they dominate the mean, so mean × count / min counts them, the
    unmasked values adding far less than one); 0 for a tensor without such values, None where unknown."""
    size = math.prod(summary.shape)
    if summary.min is None or summary.mean is None:
        return size if size and summary.inf_count == size else None
    count = summary.inf_count
    if summary.min <= -_MASKED:
        count += round(summary.mean * (size - summary.inf_count) / summary.min)
    return count


def _split(summary: TensorSummary) -> tuple[int, int] | None:
    """How a mask-like tensor splits its entries, as (smaller, larger) class sizes: masked against unmasked for an
    additive mask, the entries at the minimum against those at the maximum for a two-valued one (a 0/1 matrix:
    the mean says how many are at the maximum, the std confirms there are no others), (0, size) for a constant;
    None for any other tensor."""
    size = math.prod(summary.shape)
    masked = _masked_count(summary)
    if masked:
        return tuple(sorted((masked, size - masked)))  # type: ignore[return-value]
    if masked is None or None in (summary.min, summary.max, summary.mean, summary.std) or size < 2:
        return None
    low, high = summary.min, summary.max
    if high == low:
        return (0, size)
    at_high = round((summary.mean - low) / (high - low) * size)
    share = at_high / size
    spread = share * (1 - share) * (high - low) ** 2
    # NOTE: biased or unbiased, as the recorder computed it: either says two values only
    if not any(math.isclose(summary.std**2, spread * factor, rel_tol=1e-3) for factor in (1.0, size / (size - 1))):
        return None
    return tuple(sorted((at_high, size - at_high)))  # type: ignore[return-value]


def _gap(ref: TensorSummary, cand: TensorSummary) -> tuple[float, float]:
    """(largest statistic difference, the reference's scale). Masks compare by how many entries they mask first
    (infinitely far apart when that differs); where a side writes the masked entries as the dtype's minimum,
    its min, mean and std say how they were written down, not what they compute: only max is compared then
    (statistics leave -inf out, so a side written with -inf keeps all four)."""
    names = _STATISTICS
    ref_masked, cand_masked = _masked_count(ref), _masked_count(cand)
    if ref_masked or cand_masked:
        if ref_masked is not None and cand_masked is not None and ref_masked != cand_masked:
            return math.inf, _scale(ref)
        if any(value is not None and value <= -_MASKED for value in (ref.min, cand.min)):
            names = ("max",)
    elif any(value is not None and abs(value) >= _MASKED for value in (ref.min, ref.max, cand.min, cand.max)):
        names = ("min", "max")
    gap = max((_difference(getattr(ref, name), getattr(cand, name)) for name in names), default=-1.0)
    return max(gap, 0.0), _scale(ref)


def _within(ref: TensorSummary, cand: TensorSummary, tolerance: float) -> bool:
    if (ref.nan_count > 0) != (cand.nan_count > 0):
        return False
    gap, scale = _gap(ref, cand)
    return gap <= tolerance * scale + 1e-12


def _short(file: str) -> str:
    return file.rsplit("/", 1)[-1]
