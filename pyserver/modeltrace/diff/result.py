"""What a diff finds: the statuses, the options, and the result records (`LeafResult` per pair of tensors,
`ModuleResult` per candidate call, `Divergence`, `DiffResult`), below every module that fills or reads them.

No logic beyond the records' own properties: the comparison (`compare`), the first-divergence search
(`divergence`), the evidence (`evidence`), the replay (`replay`) and the report (`report`) all build on these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from modeltrace.diff.align import Alignment, RenameMap
from modeltrace.diff.auto_align import ModuleMapping, ModulePair
from modeltrace.diff.gradients import GradientDiff
from modeltrace.diff.pairing import Pairing
from modeltrace.diff.steps import StepReport
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import ModuleCall, SourceLocation, SourceRange
from modeltrace.trace.tensors import LoadedTrace


MATCH = "match"
MISMATCH = "mismatch"
DIVERGENCE = "divergence"
NOT_COMPARED = "not_compared"
# Side statuses: "match", "mismatch", "unknown" (not comparable), "none" (no tensors on either side).
UNKNOWN = "unknown"
NONE = "none"


class DiffError(ModelTraceError):
    """The two traces cannot be diffed (nothing aligns)."""


@dataclass(frozen=True)
class DiffOptions:
    """`atol` / `rtol` / `rel_tol` None: the defaults of `tolerances`, dtype-aware; `maps`: rename rules for
    alignment; `mapping`: a module mapping (`--mapping` file) that replaces alignment by names; `automatic`: align
    by evidence when names leave most modules unaligned."""

    atol: float | None = None
    rtol: float | None = None
    maps: tuple[RenameMap, ...] = ()
    rel_tol: float | None = None
    mapping: ModuleMapping | None = None
    automatic: bool = True

    def __post_init__(self) -> None:
        # NOTE: a negative tolerance makes identical traces diverge, NaN compares false with everything and inf
        # says MATCH on any bug: each is refused where it enters, named as the user wrote it.
        for name, value in (("atol", self.atol), ("rtol", self.rtol), ("rel-tol", self.rel_tol)):
            if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ModelTraceError(f"--{name} {value!r}: expected a finite tolerance >= 0")


@dataclass(slots=True)
class LeafResult:
    key: str
    status: str
    check: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    reason: str | None = None
    atol: float | None = None
    rtol: float | None = None
    rel_err: float | None = None
    cosine: float | None = None
    reference_key: str | None = None
    note: str | None = None


@dataclass(slots=True)
class ModuleResult:
    """One candidate module call and how it compares with its reference counterpart."""

    candidate: ModuleCall
    reference: ModuleCall | None
    status: str = NOT_COMPARED
    inputs: str = UNKNOWN
    outputs: str = UNKNOWN
    check: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    reason: str | None = None
    atol: float | None = None
    rtol: float | None = None
    aligned_by: str | None = None
    pair: ModulePair | None = None  # the mapping pair that aligned it (automatic alignment or a mapping file)
    input_leaves: list[LeafResult] = field(default_factory=list)
    output_leaves: list[LeafResult] = field(default_factory=list)
    rel_err: float | None = None
    cosine: float | None = None
    rel_tol: float | None = None
    # how each side's tensors were paired (None: one to one, in order, same shapes)
    input_pairing: Pairing | None = None
    output_pairing: Pairing | None = None
    replay: ReplayResult | None = None
    settings: list = field(default_factory=list)
    parameters: list = field(default_factory=list)
    # a boundary difference (`divergence.find_divergence`): its outputs differ, the next compared tensors match
    # again (the other side does the same work right after it, in its caller); not a divergence, not a mismatch
    boundary: bool = False
    # for a boundary difference: the next compared call, whose inputs match again
    absorbed_by: ModuleResult | None = None
    # an aligned call compared in part that the search moved into (`diff/unaligned.py`): its own comparison (the
    # values of `unaligned._COMPARISON_FIELDS`), restored when the verdict is recomputed
    compared_before: tuple | None = None


@dataclass(slots=True)
class ReplayResult:
    """A candidate module re-run on the reference's inputs: `status` MATCH (its own computation agrees: its
    recorded outputs differ only through its inputs), MISMATCH (it differs on its own), or NOT_COMPARED with
    `reason` (the replay could not run: the verdict falls back to the plain comparison)."""

    status: str
    reason: str | None = None
    max_abs_diff: float | None = None
    rel_err: float | None = None
    cosine: float | None = None
    replaced: list[str] = field(default_factory=list)


@dataclass
class Divergence:
    """The first divergence: `module`, whether its inputs matched (False only for the fallback when no module
    has matching inputs and differing outputs), and the children that bound where the difference arises."""

    module: ModuleResult
    inputs_match: bool
    inferred: bool = False
    last_matching_child: ModuleResult | None = None
    first_differing_child: ModuleResult | None = None
    # candidate source lines known to hold the cause (see `_source_range`)
    lines: SourceRange | None = None
    # filled by the evidence side (diff/lines.py, diff/settings.py)
    line: Any = None
    built_at: SourceLocation | None = None
    settings: list = field(default_factory=list)
    parameters: list = field(default_factory=list)
    # True when the replay on the reference's inputs decided it
    by_replay: bool = False
    # candidate inputs compared with nothing, with where they were produced (`diff/unpaired.py`)
    unpaired_inputs: list = field(default_factory=list)
    # a module without counterpart (`diff/unaligned.py`): the aligned call whose comparison showed the difference
    # (its reference call is what the line drill-down reads); None for an aligned divergence
    compared_in: ModuleResult | None = None


@dataclass
class DiffResult:
    reference: LoadedTrace
    candidate: LoadedTrace
    options: DiffOptions
    alignment: Alignment
    modules: list[ModuleResult]
    first_divergence: Divergence | None
    notes: list[str] = field(default_factory=list)
    # why the verdict is neither a match nor a divergence (too little aligned to call a match; or modules differ
    # but every one of them received differing inputs, so none can be named: `divergence.comparison_stopped`)
    not_comparable: str | None = None
    replayed: bool = False
    # the worker's seconds for a replay: {"seconds", "build_seconds", "modules": {path: (replayed, live)}}
    replay_timing: dict | None = None
    # tensor-parallel traces: ranks that disagree, and which rank's shard holds the first divergence (`ranks.py`)
    ranks: list[dict] = field(default_factory=list)
    # generation traces: steps compared, first diverging step and token (`diff/steps.py`)
    steps: StepReport | None = None
    # backward traces: gradients compared, first divergence in backward order (`diff/gradients.py`)
    gradients: GradientDiff | None = None

    @property
    def match(self) -> bool:
        # NOTE: ranks of a parallel trace that disagree where they should hold the same tensor are a divergence
        # of their own, even where the merged values agree with the other trace
        if any(finding.get("kind") == "rank_divergence" for finding in self.ranks):
            return False
        if self.gradients is not None and not self.gradients.match:
            return False
        return not any(module.status in (MISMATCH, DIVERGENCE) and not module.boundary for module in self.modules)

    @property
    def boundary_differences(self) -> list[ModuleResult]:
        """Modules whose differing outputs the next compared tensors no longer show, in finishing order."""
        return sorted((module for module in self.modules if module.boundary), key=finish_key)

    @property
    def verdict(self) -> str:
        """ "match", "divergence", or "not_comparable" (no module differs but too little was compared to say
        match, or modules differ but no first divergence can be named)."""
        if self.not_comparable:
            return "not_comparable"
        return "divergence" if not self.match else "match"

    def finish_ordered(self) -> list[ModuleResult]:
        """Candidate modules in the order their calls returned (records without one last, in call order)."""
        return sorted(self.modules, key=finish_key)


def finish_key(module: ModuleResult) -> tuple[int, int]:
    return record_finish_key(module.candidate)


def record_finish_key(record: ModuleCall) -> tuple[int, int]:
    """Where a call stands in finishing order (calls without one last, in call order)."""
    order = record.finish_order
    return (order if order >= 0 else 1 << 60, record.index)
