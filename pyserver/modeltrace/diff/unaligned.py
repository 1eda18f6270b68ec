"""The first divergence moved into a module on one side only (issue 30, item 2).

Two implementations rarely cut a model into the same modules: transformers' `ConvNextModel` pools inside a module
where timm's head pools inline, `CLIPVisionEmbeddings` builds the tokens where open_clip's `forward` does. Such a
candidate module has no counterpart, so the first-divergence search (`divergence.find_divergence`) cannot name it:
the difference is first seen at the enclosing aligned call (the root, often), and the verdict names lines far from
the bug. Here the unaligned module is searched, not skipped: it is compared through the tensors crossing its
boundary, which are often tensors some aligned call has compared.

Within one trace, two calls that hold one tensor (the same stored tensor, or without full tensors the same shape,
dtype and statistics) see the same values, so a comparison made at one call holds at the other. A candidate
module M without counterpart, a child of the divergence D (or of a module already moved into), becomes the
divergence when

- its inputs match: each of its floating-point inputs is a tensor an aligned call compared and found matching
  (none was found differing), and there is at least one: a module without compared inputs (a bias computed from
  its own parameters alone) has no evidence on that side and is not moved into;
- its difference arises inside it: an aligned call inside it receives differing inputs (transformers'
  `ConvNextModel` pools before its `layernorm`, aligned with timm's head norm, which then receives a differing
  tensor); or, where the reference has line records there, one of its outputs is a tensor an aligned call
  compared and found differing and that the reference never computes (its inline values included: the
  embeddings `vision_model.pre_layrnorm` receives). An output the reference computes too, in another role, clears
  the module: its caller's code passes it where something else belongs (a residual it leaves out). Without line
  records that cannot be told apart, and the output is no evidence.

A tensor compared both ways (matching at one call, differing at another) and a comparison of shapes alone (unless
both hold as many elements, in another grid: a regrid refused because the values disagree) are no evidence; a library class (a torch `nn.Sequential`) is not moved into: its caller built and called it.

An aligned call compared in part is searched the same way: one whose compared outputs match while outputs of its
own were left out, having no counterpart in its reference call (a chain, `diff/chains.py`, pairs transformers'
`ConvNextModel` with timm's `stem -> stages`; the pooling and the norm after the stages stay out of the run, and its
pooled output is compared nowhere). Its comparison covers its run only; what it computes past it has no counterpart,
and the difference that arises there is its own (its `layernorm`, aligned with timm's head norm, receives a
differing tensor). Moving into it keeps its own comparison, restored when the verdict is recomputed.

The search repeats inside M (a module on one side only inside another: open_clip has neither CLIP's
`vision_model` nor its `embeddings`), and M's range of lines is bounded by its aligned children as any
divergence's is. M's comparison is the one that shows the difference (`max_abs_diff` and the like of the
differing tensor), `Divergence.compared_in` names D, whose reference call the line drill-down reads.
"""

from __future__ import annotations

import math

from modeltrace.diff.divergence import bounded, is_library_class
from modeltrace.diff.kinds import is_no_op
from modeltrace.diff.lines import same_values
from modeltrace.diff.pairing import dtype_kind
from modeltrace.diff.result import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    UNKNOWN,
    Divergence,
    LeafResult,
    ModuleResult,
)
from modeltrace.trace.records import TensorSummary, Trace

# how a tensor is known within one trace: its stored tensor's name, else its shape, dtype and statistics
TensorIdentity = tuple


def tensor_identity(summary: TensorSummary) -> TensorIdentity | None:
    """What identifies one tensor within a trace: the name of its stored tensor (the trace stores a tensor held by
    several calls once), else its shape, dtype and statistics (None where they are unknown)."""
    if summary.tensor:
        return ("stored", summary.tensor)
    if summary.mean is None or summary.std is None or summary.min is None or summary.max is None:
        return None
    return ("statistics", tuple(summary.shape), summary.dtype, summary.mean, summary.std, summary.min, summary.max)


# the checks that compare values (full tensors, statistics), not only shapes
_VALUES_COMPARED = ("full", "statistics")
# a tensor compared at several calls, with both outcomes: it holds the right values in one role and not in another
# (fc2's output matches, and is norm2's differing input where the reference adds the residual first): the code
# between those calls differs, not the tensor; no evidence either way
AMBIGUOUS = "ambiguous"


def _compared_tensors(results: list[ModuleResult]) -> dict[TensorIdentity, tuple[str, LeafResult, ModuleResult]]:
    """{identity: (status, leaf, call)} of every candidate tensor an aligned call compared: MATCH, MISMATCH, or
    AMBIGUOUS where it matched at one call and differed at another."""
    known: dict[TensorIdentity, tuple[str, LeafResult, ModuleResult]] = {}
    for result in results:
        if result.reference is None:
            continue
        for leaves, summaries, references in (
            (result.input_leaves, result.candidate.inputs, result.reference.inputs),
            (result.output_leaves, result.candidate.outputs, result.reference.outputs),
        ):
            by_key = {summary.key: summary for summary in summaries}
            ref_by_key = {summary.key: summary for summary in references}
            for leaf in leaves:
                if leaf.status not in (MATCH, MISMATCH) or leaf.key not in by_key:
                    continue
                if leaf.check not in _VALUES_COMPARED and not _regrid(
                    by_key[leaf.key], ref_by_key.get(leaf.reference_key)
                ):
                    continue  # shapes that differ say the roles were not paired, not which values differ
                identity = tensor_identity(by_key[leaf.key])
                if identity is None:
                    continue
                if identity not in known:
                    known[identity] = (leaf.status, leaf, result)
                elif known[identity][0] != leaf.status:
                    known[identity] = (AMBIGUOUS, leaf, result)
    return known


def _regrid(candidate: TensorSummary, reference: TensorSummary | None) -> bool:
    """Whether a comparison of shapes alone was between the same number of elements in another grid (`[1, 32]`
    against `[1, 32, 1, 1]`): the same role, not paired as a regrid only because the values disagree."""
    return reference is not None and math.prod(candidate.shape) == math.prod(reference.shape) > 0


def into_unaligned(divergence: Divergence | None, results: list[ModuleResult], reference: Trace) -> Divergence | None:
    """`divergence`, moved into the candidate module without counterpart that holds the difference (see the module
    docstring), repeatedly; unchanged where no such module qualifies. `reference`: the reference trace, whose
    values inside the divergence's reference call clear an output that the reference computes too."""
    if divergence is None:
        return None
    known = _compared_tensors(results)
    children: dict[int, list[ModuleResult]] = {}
    for result in results:
        children.setdefault(result.candidate.parent, []).append(result)
    compared_in = divergence.compared_in or divergence.module
    if compared_in.reference is None:
        return divergence
    computed = _reference_values(reference, compared_in.reference.index)
    while True:
        inner = next(
            (
                found
                for kid in _unaligned_inside(divergence.module, children)
                if _searchable(kid)
                for found in [_difference_inside(kid, children, known, computed)]
                if found is not None
            ),
            None,
        )
        if inner is None:
            return divergence
        module, reason, leaf, where = inner
        enclosing = divergence.module
        if enclosing.status == DIVERGENCE:
            enclosing.status = MISMATCH
        if module.reference is not None:  # compared in part: its own comparison comes back on a recomputed verdict
            module.compared_before = _comparison_of(module)
        module.status, module.inputs, module.outputs = DIVERGENCE, MATCH, MISMATCH
        module.check, module.max_abs_diff, module.max_rel_diff = leaf.check, leaf.max_abs_diff, leaf.max_rel_diff
        module.rel_err, module.cosine = leaf.rel_err, leaf.cosine
        module.atol, module.rtol = where.atol, where.rtol
        module.reason = reason
        kids = [kid for kid in children.get(module.candidate.index, []) if kid.reference is not None]
        divergence = bounded(Divergence(module, inputs_match=True, compared_in=compared_in), kids)


def _reference_values(reference: Trace, call: int) -> list[TensorSummary] | None:
    """Every value the reference computed inside its call `call`: its descendants' inputs and outputs and the
    values its lines assigned; None without line records there (its inline values are not known)."""
    inside = {call}
    for record in reference.modules:  # calls are stored in the order they started: parents first
        if record.parent in inside:
            inside.add(record.index)
    lines = [line.tensor for line in reference.lines if line.module_call in inside and line.tensor.mean is not None]
    if not lines:
        return None
    values = [
        summary
        for record in reference.modules
        if record.index in inside
        for summary in (*record.inputs, *record.outputs)
        if summary.mean is not None
    ]
    return values + lines


# NOTE: the fields of a module's own comparison, kept aside when the search moves into a call compared in part
_COMPARISON_FIELDS = (
    "status",
    "inputs",
    "outputs",
    "check",
    "max_abs_diff",
    "max_rel_diff",
    "rel_err",
    "cosine",
    "atol",
    "rtol",
    "reason",
)


def _comparison_of(module: ModuleResult) -> tuple:
    return tuple(getattr(module, field) for field in _COMPARISON_FIELDS)


def forget_moved_into(module: ModuleResult) -> None:
    """Undo what `into_unaligned` set on a module without counterpart, or compared in part (a verdict recomputed
    after a replay)."""
    if module.compared_before is not None:
        for field, value in zip(_COMPARISON_FIELDS, module.compared_before, strict=True):
            setattr(module, field, value)
        module.compared_before = None
        return
    module.status, module.inputs, module.outputs = NOT_COMPARED, UNKNOWN, UNKNOWN
    module.check = module.max_abs_diff = module.max_rel_diff = module.rel_err = module.cosine = None
    module.atol = module.rtol = None
    module.reason = "no counterpart in the reference"


def _searchable(module: ModuleResult) -> bool:
    """Whether a call without counterpart can be the divergence: not a no-op, and a class of the candidate's own
    code. A library class (an `nn.Sequential` of convolutions built with another stride) computes what its
    construction and its arguments say: those are its caller's code, which stays the divergence (an aligned
    library module is judged by its build comparison; one without counterpart has none)."""
    return not is_no_op(module.candidate) and not is_library_class(module.candidate)


def _unaligned_inside(module: ModuleResult, children: dict[int, list[ModuleResult]]) -> list[ModuleResult]:
    """The calls without counterpart (or compared in part) directly inside `module`, in call order, looking
    through the library containers without counterpart between (an `nn.Sequential` holding the port's own
    blocks)."""
    found = []
    for kid in sorted(children.get(module.candidate.index, []), key=_call_order):
        if _compared_in_part(kid):
            found.append(kid)
            continue
        if kid.reference is not None or is_no_op(kid.candidate):
            continue
        found.append(kid)
        if is_library_class(kid.candidate):
            found.extend(_unaligned_inside(kid, children))
    return found


def _compared_in_part(module: ModuleResult) -> bool:
    """Whether an aligned call matched on what its comparison covers while outputs of its own were left out (no
    counterpart in the reference call): it computes more than its counterpart (a chain, `diff/chains.py`, pairs
    transformers' `ConvNextModel` with timm's `stem -> stages`; its pooler after the stages stays out of the run),
    and what it computes beyond it is searched as a module without counterpart is."""
    if module.reference is None or module.status != MATCH or module.output_pairing is None:
        return False
    return any(left.owner == "candidate" for left in module.output_pairing.left_out)


def _call_order(result: ModuleResult) -> int:
    return result.candidate.index


def _difference_inside(
    module: ModuleResult,
    children: dict[int, list[ModuleResult]],
    known: dict[TensorIdentity, tuple[str, LeafResult, ModuleResult]],
    computed: list[TensorSummary] | None,
) -> tuple[ModuleResult, str, LeafResult, ModuleResult] | None:
    """(module, reason, the differing leaf, the call that compared it) when `module` (no counterpart) has
    matching inputs and a difference that arises inside it; else None."""
    record = module.candidate
    where = _matching_inputs(module, known)
    if where is None:
        return None
    found = _first_receiving_difference(module, children, known)
    if found is not None:
        inner, leaf = found
        reason = (
            f"{_unmatched(module)}: compared through the tensors crossing its boundary; its inputs {where} "
            f"match, and {_name(inner)} inside it receives differing inputs ({leaf.key or 'input'}: "
            + (f"max abs diff {_number(leaf.max_abs_diff)})" if leaf.max_abs_diff is not None else f"{leaf.reason})")
        )
        # NOTE: the figures shown are those of a differing output of its own, where one was compared by values
        for summary in record.outputs:
            status = known.get(tensor_identity(summary) or ())
            if status is not None and status[0] == MISMATCH and status[1].max_abs_diff is not None:
                return module, reason, status[1], status[2]
        return module, reason, leaf, inner
    # NOTE: an output that an aligned call receives as a differing input says the values differ where they are
    # received; whether this module computed them wrong, or its caller should have passed something else (a
    # residual it leaves out), only the reference's own inline values tell: without its line records, no evidence
    for summary in record.outputs if computed is not None else ():
        identity = tensor_identity(summary)
        status = known.get(identity) if identity is not None else None
        if status is not None and status[0] == MISMATCH:
            _, leaf, call = status
            if any(same_values(value, summary) for value in computed):
                # NOTE: the reference computes these values too, in another role: what differs is the code
                # between this module and the call that receives it (a residual its caller leaves out)
                continue
            reason = (
                f"{_unmatched(module)}: compared through the tensors crossing its boundary; its inputs "
                f"{where} match, its output {summary.key or '(output)'} is {_name(call)}'s "
                f"{_role(leaf, call)}, which differs (max abs diff {_number(leaf.max_abs_diff)})"
            )
            return module, reason, leaf, call
    return None


def _matching_inputs(
    module: ModuleResult, known: dict[TensorIdentity, tuple[str, LeafResult, ModuleResult]]
) -> str | None:
    """Its inputs in words ("pixel_values (as (root)'s)") when each floating-point input of `module` is a tensor an
    aligned call compared and found matching (at least one, and none of its inputs found differing); else None."""
    matching: list[tuple[str, ModuleResult]] = []
    for summary in module.candidate.inputs:
        identity = tensor_identity(summary)
        status = known.get(identity) if identity is not None else None
        if status is not None and status[0] == MISMATCH:
            return None  # it receives a differing tensor: the difference arose before it
        if dtype_kind(summary.dtype) != "f":
            continue  # ids and masks are compared where they are paired, not evidence of values here
        if status is None or status[0] != MATCH:
            return None  # a floating-point input nobody compared (or compared both ways): not known to match
        matching.append((summary.key or "input", status[2]))
    if not matching:
        return None
    return ", ".join(f"{key} (as {_name(call)}'s)" for key, call in matching)


def _first_receiving_difference(
    module: ModuleResult,
    children: dict[int, list[ModuleResult]],
    known: dict[TensorIdentity, tuple[str, LeafResult, ModuleResult]],
) -> tuple[ModuleResult, LeafResult] | None:
    """The first aligned call inside `module` (any depth, in call order) that receives a differing tensor (one no
    other call found matching), with that tensor's comparison."""
    pending = sorted(children.get(module.candidate.index, []), key=_call_order, reverse=True)
    while pending:
        kid = pending.pop()
        if kid.reference is not None and kid.inputs == MISMATCH:
            by_key = {summary.key: summary for summary in kid.candidate.inputs}
            for leaf in kid.input_leaves:
                identity = tensor_identity(by_key[leaf.key]) if leaf.key in by_key else None
                status = known.get(identity) if identity is not None else None
                if leaf.status == MISMATCH and status is not None and status[0] == MISMATCH:
                    return kid, leaf
        pending.extend(sorted(children.get(kid.candidate.index, []), key=_call_order, reverse=True))
    return None


def _unmatched(module: ModuleResult) -> str:
    """What of `module` the reference has no counterpart of, in words."""
    if module.reference is None or module.output_pairing is None:
        return "no counterpart in the reference"
    left = [left.key or "(output)" for left in module.output_pairing.left_out if left.owner == "candidate"]
    return f"compared in part: its output {', '.join(left)} has no counterpart in {module.reference.path}'s"


def _role(leaf: LeafResult, call: ModuleResult) -> str:
    """Which tensor of `call` a comparison was: "input hidden_states", "output", "output 0"."""
    side = "input" if any(other is leaf for other in call.input_leaves) else "output"
    return f"{side} {leaf.key}" if leaf.key else side


def _name(result: ModuleResult) -> str:
    return result.candidate.path or "(root)"


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def into_line_owner(divergence: Divergence, results: list[ModuleResult]) -> Divergence | None:
    """The divergence moved into the candidate call, without counterpart, that ran its first differing line, or
    None where that line ran in the divergence's own call (or no line was found).

    With line records (`--lines`), the line drill-down pairs each candidate value inside the divergence, its calls
    without counterpart included, with the reference's values: every value before the first differing line was
    computed by the reference too. When that line ran in a call without counterpart (open_clip pools inline in
    `forward`, transformers' `CLIPVisionModel` pools in its own), the difference arises there, on a line's
    assigned tensor, not a module's output, so that call is the divergence; among the calls from it up to the
    divergence, the innermost one whose inputs are known to match (as `into_unaligned` decides), or that takes no
    tensor at all (transformers' `SwinRelativePositionBias` computes from its own table and index: what its line
    shows differing arises there)."""
    line = divergence.line
    if line is None or line.module_call < 0 or line.module_call == divergence.module.candidate.index:
        return None
    by_index = {result.candidate.index: result for result in results}
    chain: list[ModuleResult] = []
    current = by_index.get(line.module_call)
    while current is not None and current is not divergence.module:
        if current.reference is not None:
            return None  # an aligned call ran it: its own comparison decides, not this one
        chain.append(current)
        current = by_index.get(current.candidate.parent)
    if current is None:
        return None  # not inside the divergence
    known = _compared_tensors(results)
    for module in chain:
        if line.value is not None and any(same_values(summary, line.value) for summary in module.candidate.inputs):
            # NOTE: the line holds one of its inputs (a parameter, recorded on its `def` line), which the tensor
            # comparison found matching: the drill-down compared it with a value of another role, no evidence
            return None
        where = _matching_inputs(module, known)
        inputs = f"its inputs {where} match"
        if where is None and not module.candidate.inputs:
            # NOTE: a call that takes no tensor computes from its own parameters and buffers alone (a position
            # bias looked up in its table): nothing it receives can carry the difference its line shows
            where, inputs = "", "it takes no tensor"
        if where is None or not _searchable(module):
            continue
        enclosing = divergence.module
        if enclosing.status == DIVERGENCE:
            enclosing.status = MISMATCH
        module.status, module.inputs, module.outputs = DIVERGENCE, MATCH, MISMATCH
        module.check, module.max_abs_diff = ("full" if line.elements else "statistics"), line.max_abs_diff
        module.reason = (
            f"no counterpart in the reference: compared through the tensors crossing its boundary and its lines; "
            f"{inputs}, and its line {line.line} computes a value the reference never computed "
            f"({line.reason})"
        )
        kids = [kid for kid in results if kid.candidate.parent == module.candidate.index and kid.reference is not None]
        compared_in = divergence.compared_in or divergence.module
        return bounded(Divergence(module, inputs_match=True, compared_in=compared_in), kids)
    return None
