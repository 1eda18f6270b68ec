"""Chains: a module on one side that computes, in one call, what a run of modules on the other side computes in
sequence.

transformers' `ResNetConvLayer` calls its convolution, norm and activation as children; timm's `Bottleneck`
calls `conv1`, `bn1`, `act1` itself. Each child aligns one to one, but the layer has no module counterpart: its
input is `conv1`'s input and its output `act1`'s output. It pairs with the run `conv1 -> bn1 -> act1`, compared
on the run's first inputs and last outputs, so that the first-divergence search can judge it as any module
(inputs match, outputs differ) and its aligned children bound the lines inside it. A module built of such
modules builds on their runs (a Sequential of three such layers pairs with `conv1 -> … -> bn3`). The alignment
looks for chains of candidate modules against reference runs (`auto_align._chain_pairs` says why not the other
way).

The rule reads the module's own side only for what makes it a chain, so that a bug downstream changes nothing:
the module takes one tensor and passes it to its first child (the same statistics) and returns its output kid's
output (the same statistics: the last child whose output it is; children after it, a pooler beside the hidden
states, stay out of the run). Its aligned children, in call order, align with calls that follow each other on
the other side (none inside another); on both sides the stages take one tensor each, not their predecessor's
(a pipeline, not parallel branches), and the input and output hold as many numbers as the run's first input
and last output.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from modeltrace.diff.kinds import is_no_op
from modeltrace.trace.records import ModuleCall, TensorSummary, Trace

# NOTE: a child's input or output is the parent's own tensor (not a copy computed again): their statistics are
# equal to rounding of the reduction only
_SAME_TENSOR = 1e-6
SEPARATOR = " -> "


@dataclass(frozen=True)
class Chain:
    """`module` (one side) computes what `run` (the other side, in call order) computes in sequence."""

    module: str
    run: tuple[str, ...]
    confidence: float
    evidence: str


def chain_runs(
    own: Trace, other: Trace, partners: dict[str, tuple[tuple[str, ...], float]], taken: set[str]
) -> list[Chain]:
    """The chains of `own`'s modules not in `taken`, innermost first. `partners` maps an own path to the other
    side's paths it is compared with (one, or a chain's run) and the pair's confidence; each chain found is added
    to it, so that its parent can build on it."""
    own_first = _first_calls(own)
    other_first = _first_calls(other)
    kids_of: dict[int, list[ModuleCall]] = defaultdict(list)
    for record in own.modules:
        if record.call_index == 0 and 0 <= record.parent < len(own.modules) and not is_no_op(record):
            kids_of[record.parent].append(record)
    found = []
    for record in sorted(own.modules, key=lambda item: item.finish_order):
        if record.call_index != 0 or not record.path or record.path in taken or record.path in partners:
            continue
        if is_no_op(record) or not record.inputs or not record.outputs:
            continue
        chain = _chain_of(record, kids_of.get(record.index, []), partners, other, other_first)
        if chain is not None and chain.module in own_first:
            partners[chain.module] = (chain.run, chain.confidence)
            found.append(chain)
    return found


def _chain_of(
    record: ModuleCall,
    kids: list[ModuleCall],
    partners: dict[str, tuple[tuple[str, ...], float]],
    other: Trace,
    other_first: dict[str, int],
) -> Chain | None:
    if not kids or kids[0].path not in partners or len(record.inputs) != 1 or not kids[0].inputs:
        return None
    if not _same_tensor(record.inputs[0], kids[0].inputs[0]):
        return None
    # NOTE: the last child whose output the module returns: the run ends there
    last = None
    for position, kid in enumerate(kids):
        if kid.outputs and kid.path in partners and _same_tensor(record.outputs[0], kid.outputs[0]):
            last = position
    if last is None:
        return None
    aligned = [kid for kid in kids[: last + 1] if kid.path in partners]
    run = tuple(path for kid in aligned for path in partners[kid.path][0])
    if len(run) < 2 or len(set(run)) != len(run) or any(path not in other_first for path in run):
        return None
    calls = [other.modules[other_first[path]] for path in run]
    if not _pipeline(kids[: last + 1]) or not _pipeline(calls):
        return None
    # NOTE: a run of calls that follow each other: each starts after the one before it started and finishes after
    # it finished (so none is inside another)
    if any(
        later.index <= earlier.index or later.finish_order <= earlier.finish_order
        for earlier, later in zip(calls, calls[1:])
    ):
        return None
    first, final = calls[0], calls[-1]
    if not first.inputs or not final.outputs:
        return None
    if _count(first.inputs[0]) != _count(record.inputs[0]) or _count(final.outputs[0]) != _count(record.outputs[0]):
        return None
    confidence = round(sum(partners[kid.path][1] for kid in aligned) / len(aligned), 3)
    evidence = (
        f"chain: its children {', '.join(kid.path for kid in aligned)} align with {SEPARATOR.join(run)}; "
        f"it takes {first.path}'s input and returns {final.path}'s output"
    )
    return Chain(record.path, run, confidence, evidence)


def _pipeline(calls: list[ModuleCall]) -> bool:
    """Whether calls can be stages of one flow: each takes one tensor, not the one the call before it took.
    Parallel branches (`wq`, `wk`, `wv` of one input) are not a chain, nor are layers that also take a mask or
    a rotary table made by the module's own code: a chain's record holds its first member's inputs only, so a
    tensor that enters the run elsewhere would go uncompared and the run look like it diverged on its own."""
    if any(len(call.inputs) != 1 for call in calls):
        return False
    return not any(_same_tensor(earlier.inputs[0], later.inputs[0]) for earlier, later in zip(calls, calls[1:]))


def _same_tensor(left: TensorSummary, right: TensorSummary) -> bool:
    """Whether two summaries on one side are of the same tensor (or a view of it): as many numbers, the same
    moments."""
    if _count(left) != _count(right) or left.mean is None or right.mean is None:
        return False
    if left.std is None or right.std is None:
        return False
    spread = max(abs(left.std), abs(right.std), 1e-12)
    return abs(left.mean - right.mean) + abs(left.std - right.std) <= _SAME_TENSOR * spread


def _count(summary: TensorSummary) -> int:
    return math.prod(summary.shape)


def _first_calls(trace: Trace) -> dict[str, int]:
    first: dict[str, int] = {}
    for record in trace.modules:
        first.setdefault(record.path, record.index)
    return first
