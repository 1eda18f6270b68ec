"""Comparison of aligned module calls: tensor pairing, shapes, dtypes, then values, and the first divergence.

Each side (inputs, outputs) of two aligned calls is paired tensor by tensor (`pairing`): by role and value, so
that extra inputs (masks, position ids, caches) and extra outputs (attention weights) on either side are left
out, with their reason, instead of making the side differ. Shapes that hold the same numbers compare as equal
(`[7, 64]` / `[1, 7, 64]`); a side computing a subset of positions (a last-token head) is compared on the
positions both hold.

Values are compared on full tensors when both sides have them. A pair matches when both hold:

- elementwise: |a - b| <= atol' + rtol·|reference| everywhere, where atol' is atol, or, when atol is left to
  its default, atol per unit of the tensor's scale: atol · max(1, max|reference|) (floating-point error is
  relative: logits of magnitude 1e3 carry errors a thousand times those of hidden states of magnitude 1); with
  rtol left to its default too, that per-unit atol is at least the dtype's rtol (bfloat16: 1.6e-2 of
  max|reference|, its rounding at the tensor's scale);
- scale-aware: the relative error ‖a - b‖ / max(‖reference‖, atol·√n) is at most `rel_tol` (float32 1e-4,
  float16 2e-3, bfloat16 2e-2, float64 1e-7 by default; the lower precision of the two dtypes decides), so a
  module whose output is 3e-4 off on values of std 0.02 (relative error ~1e-2) is flagged although it is under
  atol. Cosine similarity is reported alongside.

Otherwise statistics are compared, the weaker check: if two tensors match by the rule above, their min and max
differ by at most the elementwise allowance and their mean and std by at most rel_tol·max(rms, atol) (the rms
of the reference from its mean and std), so a statistic further apart (plus the rounding of the stored
numbers) proves a mismatch, while agreeing statistics only suggest a match. The statistics' largest difference
is reported as `max_abs_diff`: a lower bound of the true one.

Tolerances default to atol 1e-3 and rtol 0, and rtol follows the lower precision of the two dtypes for half
precision (float16: rtol 1e-3, bfloat16: rtol 1.6e-2, the defaults of `torch.testing.assert_close`); a value
given by the user applies to every dtype (and a given atol is absolute, not scaled).

The first divergence is the first module, in the order modules finish (innermost first), whose compared inputs
match and whose compared outputs differ; where the reference has no outputs for a module (the transformers
debugger keeps outputs of leaf modules only), a module whose inputs match and one of whose children receives
differing inputs. With a replay (`diff.replay`: suspect candidate modules re-run on the reference's inputs), a
replayed module is judged on its own: one whose replayed output matches the reference is cleared (its outputs
differ only through its inputs), one whose replayed output differs is a divergence whatever its recorded inputs
were. Inside the divergence, the last child whose outputs still match and the first child whose inputs differ
bound the lines where the difference arises (`Divergence.lines`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import operator
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modeltrace.diff.align import Alignment, RenameMap, align_traces, map_notes
from modeltrace.diff.auto_align import ModuleMapping, ModulePair
from modeltrace.diff.gradients import GradientDiff, gradient_diff
from modeltrace.diff import native
from modeltrace.diff.mapping import ConcatenatedTensors
from modeltrace.errors import ModelTraceError
from modeltrace.diff.pairing import (
    BROADCAST,
    DIFFERENT,
    OVERLAP,
    LeafPair,
    Pairing,
    _padded,
    dtype_kind,
    in_order,
    pair_leaves,
)
from modeltrace.diff.steps import StepReport, restrict_to_common_steps, step_report
from modeltrace.trace.records import ModuleCall, SourceLocation, SourceRange, TensorSummary, Trace
from modeltrace.trace.tensors import LoadedTrace


DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 0.0
# ‖a - b‖ / ‖reference‖ allowed by dtype (the lower precision of the two): a few roundings of the dtype
# accumulated over a model (float32 eps 1.2e-7, float16 9.8e-4, bfloat16 7.8e-3).
DEFAULT_REL_TOL = {"float64": 1e-7, "float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}
# rtol by dtype when the user gives none (torch.testing.assert_close's defaults for half precision)
HALF_PRECISION_RTOL = {"float16": 1e-3, "bfloat16": 1.6e-2}
_PRECISION_RANK = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}
# NOTE: rounding of statistics computed in float32 (sums over many elements) on top of the tolerance.
_STAT_NUMERIC_SLACK = 1e-6
_BLOCK = 1 << 18

MATCH = "match"
MISMATCH = "mismatch"
DIVERGENCE = "divergence"
NOT_COMPARED = "not_compared"
# Side statuses: "match", "mismatch", "unknown" (not comparable), "none" (no tensors on either side).
UNKNOWN = "unknown"
NONE = "none"
_CHECK_RANK = {"shape": 0, "statistics": 1, "full": 2}


class DiffError(ModelTraceError):
    """The two traces cannot be diffed (nothing aligns)."""


@dataclass(frozen=True)
class DiffOptions:
    """`atol` / `rtol` / `rel_tol` None: the defaults above, dtype-aware; `maps`: rename rules for alignment;
    `mapping`: a module mapping (`--mapping` file) that replaces alignment by names; `automatic`: align by
    evidence when names leave most modules unaligned."""

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


@dataclass
class DiffResult:
    reference: LoadedTrace
    candidate: LoadedTrace
    options: DiffOptions
    alignment: Alignment
    modules: list[ModuleResult]
    first_divergence: Divergence | None
    notes: list[str] = field(default_factory=list)
    # why the verdict cannot be trusted as a match (too little aligned), or None
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
        return not any(module.status in (MISMATCH, DIVERGENCE) for module in self.modules)

    @property
    def verdict(self) -> str:
        """ "match", "divergence", or "not_comparable" (no module differs, but too little was compared to say
        match)."""
        if not self.match:
            return "divergence"
        return "not_comparable" if self.not_comparable else "match"

    def finish_ordered(self) -> list[ModuleResult]:
        """Candidate modules in the order their calls returned (records without one last, in call order)."""
        return sorted(self.modules, key=_finish_key)


def _finish_key(module: ModuleResult) -> tuple[int, int]:
    return _record_finish_key(module.candidate)


def _record_finish_key(record: ModuleCall) -> tuple[int, int]:
    """Where a call stands in finishing order (calls without one last, in call order)."""
    order = record.finish_order
    return (order if order >= 0 else 1 << 60, record.index)


class SuspectWatch:
    """Names the first `limit` aligned calls, in the order they finished, whose outputs differ, while the
    comparison is still running (in call order), and hands them to `found` once: the replay can then start
    while the rest is compared.

    A call finishes after every call it made, so its place among the finished calls is decided once every call
    before it in finishing order has been compared: the calls it made come right after it in call order, the
    others that finished before it started before it. A call whose outputs are compared by statistics only is
    decided after the whole comparison (`_Comparer.run_statistics`): the watch stops there, and the suspects are
    named after the diff as usual (`replay.suspects`, which gives the same list where the watch gave one)."""

    def __init__(self, records: list[ModuleCall], results: list[ModuleResult], limit: int, found: Any) -> None:
        """`results`: the diff's results, one per record in call order, appended as the records are compared."""
        self.order = sorted(range(len(records)), key=lambda position: _record_finish_key(records[position]))
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


# ------------------------------------------------------------------------------------------------ tolerances


def _tolerance(ref_dtype: str, cand_dtype: str, options: DiffOptions, cache: dict) -> tuple[float, float]:
    """(atol, rtol) for a pair of dtypes."""
    return _tolerances(ref_dtype, cand_dtype, options, cache)[:2]


def _tolerances(
    ref_dtype: str, cand_dtype: str, options: DiffOptions, cache: dict
) -> tuple[float, float, float, bool]:
    """(atol, rtol, rel_tol, atol scales with the tensor) for a pair of dtypes."""
    key = (ref_dtype, cand_dtype)
    found = cache.get(key)
    if found is None:
        lower = min((ref_dtype, cand_dtype), key=lambda name: _PRECISION_RANK.get(name, 2))
        atol = options.atol if options.atol is not None else DEFAULT_ATOL
        rtol = options.rtol if options.rtol is not None else HALF_PRECISION_RTOL.get(lower, DEFAULT_RTOL)
        rel_tol = (
            options.rel_tol if options.rel_tol is not None else DEFAULT_REL_TOL.get(lower, DEFAULT_REL_TOL["float32"])
        )
        if options.atol is None and options.rtol is None:
            # NOTE: the default atol is per unit of the tensor's scale, and a half-precision dtype cannot do
            # better than its rounding at that scale (bfloat16's 2^-7 of max|ref|): elements near zero carry the
            # absolute error of the large ones computed before them
            atol = max(atol, rtol)
        found = cache[key] = (atol, rtol, rel_tol, options.atol is None)
    return found


def lower_precision(ref_dtype: str, cand_dtype: str) -> str:
    return min((ref_dtype, cand_dtype), key=lambda name: _PRECISION_RANK.get(name, 2))


# ------------------------------------------------------------------------------------------- full tensors


# NOTE: scratch buffers reused across calls (fresh ones page-fault on every tensor), one set per thread.
_scratch_buffers = threading.local()


def _scratch(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    buffers = getattr(_scratch_buffers, "by_dtype", None)
    if buffers is None:
        buffers = _scratch_buffers.by_dtype = {}
    found = buffers.get(dtype.str)
    if found is None:
        found = buffers[dtype.str] = (np.empty(_BLOCK, dtype), np.empty(_BLOCK, dtype))
    return found


@dataclass(slots=True)
class ArrayComparison:
    """`close`: the elementwise rule; `rel_err` = ‖a - b‖ / max(‖reference‖, atol·√n); `cosine` of the two."""

    close: bool
    max_abs: float
    max_rel: float
    reason: str | None
    rel_err: float
    cosine: float
    limit: float


def compare_arrays(
    reference: np.ndarray,
    candidate: np.ndarray,
    atol: float,
    rtol: float,
    slack_abs: float = 0.0,
    slack_rel: float = 0.0,
) -> tuple[bool, float, float, str | None]:
    """(allclose, max abs diff, max rel diff, reason) of two arrays of one shape; NaN and ±Inf must sit at the
    same places. Runs block by block in cache-sized scratch buffers."""
    found = measure_arrays(reference, candidate, atol, rtol, slack_abs, slack_rel)
    return found.close, found.max_abs, found.max_rel, found.reason


def measure_arrays(
    reference: np.ndarray,
    candidate: np.ndarray,
    atol: float,
    rtol: float,
    slack_abs: float = 0.0,
    slack_rel: float = 0.0,
    scaled_atol: bool = False,
) -> ArrayComparison:
    """The elementwise check (atol per unit of max|reference| when `scaled_atol`) and the scale-aware measures
    (relative error, cosine similarity) of two arrays of one shape, in one pass of blocks."""
    a = reference.reshape(-1)
    b = candidate.reshape(-1)
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        if a.size == 0:
            return ArrayComparison(True, 0.0, 0.0, None, 0.0, 1.0, atol)
        difference = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = float(difference.max())
        nonzero = a != 0
        max_rel = float((difference[nonzero] / np.abs(a[nonzero].astype(np.float64))).max()) if nonzero.any() else 0.0
        norm = math.sqrt(float(np.dot(a.astype(np.float64), a.astype(np.float64))))
        rel_err = math.sqrt(float(np.dot(difference, difference))) / max(norm, atol * math.sqrt(a.size), 1e-300)
        return ArrayComparison(
            max_abs <= atol + slack_abs,
            max_abs,
            max_rel,
            None,
            rel_err,
            1.0 if max_abs == 0 else math.nan,
            atol + slack_abs,
        )
    measured = _measure_native(a, b, atol, rtol + slack_rel, slack_abs, scaled_atol)
    if measured is not None:
        return measured
    work = np.dtype(np.float64) if np.float64 in (a.dtype, b.dtype) else np.dtype(np.float32)
    first, second = _scratch(work)
    relative = rtol + slack_rel
    max_abs = 0.0
    max_rel = 0.0
    excess = -math.inf  # the largest |d| - relative·|x| (|d| without rtol)
    ref_absmax = 0.0
    sq_diff = sq_ref = sq_cand = dot = 0.0
    nonfinite_squares = 0.0  # 2·x·y of the non-finite blocks, counted in `dot` already
    nonfinite_seen = False
    identical: list[int] = []
    nonfinite_close = True
    reason = None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for start in range(0, a.size, _BLOCK):
            x = a[start : start + _BLOCK]
            y = b[start : start + _BLOCK]
            if x.dtype != work:
                x = x.astype(work)
            if y.dtype != work:
                y = y.astype(work)
            count = x.size
            d = np.subtract(x, y, out=first[:count])  # signed: max and min give the largest |d| without abs
            high, low = float(d.max()), float(d.min())
            if not (math.isfinite(high) and math.isfinite(low)):  # NaN or Inf somewhere in the block
                limit = atol * (max(1.0, ref_absmax) if scaled_atol else 1.0) + slack_abs
                ok, block_abs, block_rel, why, sums = _compare_nonfinite(x, y, limit, relative)
                nonfinite_close &= ok
                reason = reason or why
                max_abs = max(max_abs, block_abs)
                max_rel = max(max_rel, block_rel)
                excess = max(excess, sums[4])
                ref_absmax = max(ref_absmax, sums[5])
                sq_diff += sums[0]
                sq_ref += sums[1]
                sq_cand += sums[2]
                dot += sums[3]
                nonfinite_squares += sums[1] + sums[2] - sums[0]
                nonfinite_seen = True
                continue
            block_max = max(high, -low)
            if block_max == 0.0:
                identical.append(start)  # its squares are needed only if some other block differs
                continue
            sq_ref += float(np.dot(x, x))
            sq_diff += float(np.dot(d, d))
            sq_cand += float(np.dot(y, y))
            max_abs = max(max_abs, block_max)
            if relative:
                np.abs(d, out=d)
                magnitude = np.abs(x, out=second[:count])
                excess = max(excess, float((d - relative * magnitude).max()))
                ratio = np.divide(d, magnitude, out=magnitude)
                block_rel = float(np.fmax.reduce(ratio))
            else:
                excess = max(excess, block_max)
                # d / x is signed too; 0 / 0 gives NaN, which fmax / fmin skip
                ratio = np.divide(d, x, out=second[:count])
                block_rel = max(float(np.fmax.reduce(ratio)), -float(np.fmin.reduce(ratio)))
            if block_rel == math.inf:  # non-zero differences where the reference is exactly zero: left out
                nonzero = x != 0
                block_rel = float((np.abs(d[nonzero]) / np.abs(x[nonzero])).max()) if nonzero.any() else 0.0
            if block_rel == block_rel:
                max_rel = max(max_rel, block_rel)
        if scaled_atol and excess > atol + slack_abs:  # the scale matters only past the plain atol
            finite = a if not nonfinite_seen else a[np.isfinite(a)]
            if finite.size:
                ref_absmax = max(ref_absmax, float(finite.max()), -float(finite.min()))
        if sq_diff > 0.0:
            for start in identical:
                x = a[start : start + _BLOCK]
                x = x.astype(work) if x.dtype != work else x
                square = float(np.dot(x, x))
                sq_ref += square
                sq_cand += square
    limit = atol * (max(1.0, ref_absmax) if scaled_atol else 1.0) + slack_abs
    close = nonfinite_close and excess <= limit
    floor = atol * math.sqrt(max(a.size, 1))
    rel_err = math.sqrt(sq_diff) / max(math.sqrt(sq_ref), floor, 1e-300)
    # x·y from the squares: ‖x - y‖² = ‖x‖² - 2x·y + ‖y‖² (plus the non-finite blocks' own dot products)
    dot += (sq_ref + sq_cand - sq_diff - nonfinite_squares) / 2.0
    norms = math.sqrt(sq_ref) * math.sqrt(sq_cand)
    cosine = dot / norms if norms > 0 else (1.0 if sq_ref == sq_cand else 0.0)
    return ArrayComparison(close, max_abs, max_rel, reason, rel_err, min(1.0, max(-1.0, cosine)), limit)


def _measure_native(
    a: np.ndarray, b: np.ndarray, atol: float, relative: float, slack_abs: float, scaled_atol: bool
) -> ArrayComparison | None:
    """`measure_arrays` of two flat arrays by the compiled kernel (`diff/native`), in one pass; None where it does
    not apply (other or differing dtypes, empty or strided arrays, no kernel on this machine) or where the
    arrays hold NaN or Inf, or differences that overflow: numpy's path then says where."""
    if a.dtype != b.dtype or a.size == 0 or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    found = native.kernels()
    measure = found.get(a.dtype) if found is not None else None
    if measure is None:
        return None
    max_abs, max_rel, excess, abs_max, sq_diff, sq_ref, sq_cand, dot = measure(a, b, relative)
    if not all(map(math.isfinite, (max_abs, sq_diff, sq_ref, sq_cand))):
        return None
    # NOTE: as on numpy's path, the reference's scale enters the limit only past the plain atol
    ref_absmax = abs_max if scaled_atol and excess > atol + slack_abs else 0.0
    limit = atol * (max(1.0, ref_absmax) if scaled_atol else 1.0) + slack_abs
    floor = atol * math.sqrt(a.size)
    rel_err = math.sqrt(sq_diff) / max(math.sqrt(sq_ref), floor, 1e-300)
    norms = math.sqrt(sq_ref) * math.sqrt(sq_cand)
    if sq_diff == 0.0:
        cosine = 1.0
    else:
        cosine = dot / norms if norms > 0 else (1.0 if sq_ref == sq_cand else 0.0)
    return ArrayComparison(excess <= limit, max_abs, max_rel, None, rel_err, min(1.0, max(-1.0, cosine)), limit)


def _compare_nonfinite(x: np.ndarray, y: np.ndarray, limit: float, relative: float):
    """A block holding NaN or Inf: their places must agree; the finite rest is measured as usual. Returns
    (close, max abs, max rel, reason, (Σd², Σx², Σy², Σxy, largest excess, max|x|) over the finite elements)."""
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    inf_x, inf_y = np.isinf(x), np.isinf(y)
    close = True
    reason = None
    if not np.array_equal(nan_x, nan_y):
        close, reason = False, "NaN at different positions"
    elif not (np.array_equal(inf_x, inf_y) and np.array_equal(x[inf_x], y[inf_y])):
        close, reason = False, "Inf at different positions"
    finite = np.isfinite(x) & np.isfinite(y)
    xs, ys = x[finite].astype(np.float64), y[finite].astype(np.float64)
    if xs.size == 0:
        return close, 0.0, 0.0, reason, (0.0, 0.0, 0.0, 0.0, -math.inf, 0.0)
    signed = xs - ys
    d = np.abs(signed)
    magnitude = np.abs(xs)
    excess = float((d - relative * magnitude).max())
    close &= excess <= limit
    nonzero = magnitude > 0
    max_rel = float((d[nonzero] / magnitude[nonzero]).max()) if nonzero.any() else 0.0
    sums = (
        float(np.dot(signed, signed)),
        float(np.dot(xs, xs)),
        float(np.dot(ys, ys)),
        float(np.dot(xs, ys)),
        excess,
        float(magnitude.max()),
    )
    return close, float(d.max()), max_rel, reason, sums


# ----------------------------------------------------------------------------------------- the comparison


_NUMBERS = operator.attrgetter("mean", "std", "min", "max", "nan_count", "inf_count")
_DTYPE = operator.attrgetter("dtype")
_STAT_NAMES = ("mean", "std", "min", "max")


def permuted_weight_modules(reference: Trace, candidate: Trace, alignment: Alignment) -> set[int]:
    """Candidate call positions whose module holds its counterpart's weights in another order: each own parameter
    with the same shape and the same statistics (a reordering keeps every value), the fixed-position samples
    differing (the order is not the same). A converter that permutes q/k rows for an interleaved rotary does
    this on purpose; a bug that reorders features without touching weights (a rotary table concatenated the
    wrong way) is not taken for a layout."""
    if not reference.builds or not candidate.builds:
        return set()
    ref_builds = {build.path: build for build in reference.builds}
    cand_builds = {build.path: build for build in candidate.builds}
    found = set()
    for position, ref_position in enumerate(alignment.reference_for):
        if ref_position < 0:
            continue
        ref_build = ref_builds.get(reference.modules[ref_position].path)
        cand_build = cand_builds.get(candidate.modules[position].path)
        if ref_build is None or cand_build is None:
            continue
        ref_parameters = sorted(
            (parameter for parameter in ref_build.parameters if parameter.kind == "parameter"),
            key=lambda parameter: parameter.summary.shape,
        )
        cand_parameters = sorted(
            (parameter for parameter in cand_build.parameters if parameter.kind == "parameter"),
            key=lambda parameter: parameter.summary.shape,
        )
        if not ref_parameters or len(ref_parameters) != len(cand_parameters):
            continue
        reordered = False
        for ref_parameter, cand_parameter in zip(ref_parameters, cand_parameters):
            ref_summary, cand_summary = ref_parameter.summary, cand_parameter.summary
            if ref_summary.shape != cand_summary.shape or None in (ref_summary.mean, cand_summary.mean):
                break
            scale = max(abs(ref_summary.std or 0.0), 1e-12)
            if (
                abs(ref_summary.mean - cand_summary.mean) > 1e-6 * scale
                or abs((ref_summary.std or 0) - (cand_summary.std or 0)) > 1e-6 * scale
                or ref_summary.min != cand_summary.min
                or ref_summary.max != cand_summary.max
            ):
                break
            reordered = reordered or ref_parameter.sample != cand_parameter.sample
        else:
            if reordered:
                found.add(position)
    return found


def _features_permuted(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """`b` with its last dimension's features put in `a`'s order, when one order of features (the same for
    every row) could make them agree: each feature is matched by a signature of its whole column (its sum and
    its sum of magnitudes over every row), so rows permuted each their own way, or values merely shuffled,
    are never taken for a layout change. None where there is no last dimension to reorder."""
    if a.ndim == 0 or a.shape[-1] < 2 or a.shape != b.shape or not np.issubdtype(a.dtype, np.floating):
        return None
    columns = a.shape[-1]
    a_rows = a.reshape(-1, columns).astype(np.float64)
    b_rows = b.reshape(-1, columns).astype(np.float64)
    a_order = np.argsort(a_rows.sum(axis=0) + 0.61803 * np.abs(a_rows).sum(axis=0), kind="stable")
    b_order = np.argsort(b_rows.sum(axis=0) + 0.61803 * np.abs(b_rows).sum(axis=0), kind="stable")
    if np.array_equal(a_order, b_order):
        return None  # already in the same order: nothing a reordering could change
    reordered = np.empty_like(b_rows)
    reordered[:, a_order] = b_rows[:, b_order]
    return reordered.reshape(a.shape).astype(b.dtype)


def compare_pair_arrays(
    a: np.ndarray,
    b: np.ndarray,
    pair: LeafPair,
    options: DiffOptions,
    cache: dict,
    ref_precision: tuple[float, float] = (0.0, 0.0),
    cand_precision: tuple[float, float] = (0.0, 0.0),
    allow_permutation: bool = False,
) -> LeafResult:
    """The full-tensor verdict on one pair of tensors (reference `a`, candidate `b`) by the rule of the module
    docstring, after bringing broadcast-equivalent shapes together and cutting overlapping ones to the
    positions both hold. `allow_permutation`: the module's weights hold the reference's values in another
    order (`permuted_weight_modules`), so outputs equal once their features are reordered are a match."""
    ref, cand, relation = pair.reference, pair.candidate, pair.relation
    note = None
    if relation == OVERLAP and a.ndim and b.ndim:
        rank = max(a.ndim, b.ndim)
        a = a.reshape(_padded(list(a.shape), rank))
        b = b.reshape(_padded(list(b.shape), rank))
        dimension, count = pair.dimension, pair.count
        if dimension is not None and count is not None and count <= min(a.shape[dimension], b.shape[dimension]):
            index = tuple(slice(-count, None) if axis == dimension else slice(None) for axis in range(rank))
            a, b = a[index], b[index]
            note = pair.describe()
    elif a.shape != b.shape and a.size == b.size:
        b = b.reshape(a.shape)
        note = pair.describe()
    if a.shape != b.shape:
        return LeafResult(
            cand.key,
            MISMATCH,
            "shape",
            reason=f"stored shape {list(a.shape)} vs {list(b.shape)}",
            reference_key=ref.key,
        )
    if dtype_kind(ref.dtype) != dtype_kind(cand.dtype):
        return LeafResult(
            cand.key, MISMATCH, "full", reason=f"dtype {ref.dtype} vs {cand.dtype}", reference_key=ref.key
        )
    if ref.dtype != cand.dtype:
        note = f"{note + '; ' if note else ''}dtype {ref.dtype} vs {cand.dtype}"
    atol, rtol, rel_tol, scaled = _tolerances(ref.dtype, cand.dtype, options, cache)
    ref_abs, ref_rel = ref_precision
    cand_abs, cand_rel = cand_precision
    found = measure_arrays(a, b, atol, rtol, ref_abs + cand_abs, ref_rel + cand_rel, scaled)
    rel_limit = rel_tol + ref_rel + cand_rel
    close = found.close and not found.rel_err > rel_limit
    if not close and allow_permutation:
        permuted = _features_permuted(a, b)
        if permuted is not None:
            again = measure_arrays(a, permuted, atol, rtol, ref_abs + cand_abs, ref_rel + cand_rel, scaled)
            if again.close and not again.rel_err > rel_limit:
                note = (
                    f"{note + '; ' if note else ''}equal once the last dimension's features are reordered, "
                    "as the module's weights are the reference's in another order: the same numbers in another "
                    "layout (the permuted q/k rows of an interleaved rotary)"
                )
                return LeafResult(
                    cand.key,
                    MATCH,
                    "full",
                    again.max_abs,
                    again.max_rel,
                    None,
                    atol,
                    rtol,
                    again.rel_err,
                    again.cosine,
                    ref.key,
                    note,
                )
    reason = found.reason
    if not close and reason is None:
        if not found.close:
            reason = f"max abs diff {found.max_abs:.3g} over atol {found.limit:.3g}" + (
                f" + rtol {rtol:g}·|ref|" if rtol else ""
            )
        else:
            reason = (
                f"relative error {found.rel_err:.3g} over {rel_tol:g} (‖a-b‖/‖ref‖; max abs diff "
                f"{found.max_abs:.3g}, cosine {found.cosine:.6f})"
            )
    return LeafResult(
        cand.key,
        MATCH if close else MISMATCH,
        "full",
        found.max_abs,
        found.max_rel,
        reason,
        atol,
        rtol,
        found.rel_err,
        found.cosine,
        ref.key,
        note,
    )


class _Comparer:
    """Compares the leaf pairs of every side (inputs of module call i are side 2i, its outputs side 2i + 1).

    Full tensors are compared as they come (cached per pair of stored tensors) and kept as `special` results,
    with shape and dtype mismatches. Every other pair is queued, the pairs of one side consecutive, and compared
    in `run_statistics` column by column in NumPy; the outcome is counted per side in arrays (`totals`,
    `compared`, `bad`, `maxima`), so that a trace of thousands of modules costs no Python object per leaf."""

    def __init__(self, reference: LoadedTrace, candidate: LoadedTrace, options: DiffOptions, sides: int) -> None:
        self.reference = reference
        self.candidate = candidate
        self.options = options
        self.ref_store = reference.tensors
        self.cand_store = candidate.tensors
        self.full = self.ref_store is not None and self.cand_store is not None
        # candidate positions whose outputs may be compared up to a reordering of features
        self.permuted_positions: set[int] = set()
        self.tolerances: dict = {}
        self.full_cache: dict[tuple[str, str], LeafResult | None] = {}
        self.stat_refs: list[TensorSummary] = []
        self.stat_cands: list[TensorSummary] = []
        self.queued_sides: list[int] = []
        self.queued_counts: list[int] = []
        self.special: dict[int, list[LeafResult]] = {}
        self.structure: dict[int, str] = {}
        # rows of the statistics queue whose shapes or dtypes differ but hold comparable numbers
        self.stat_valid_rows: list[int] = []
        self.both_count_nans = reference.kind == "modeltrace" and candidate.kind == "modeltrace"
        self.sides = sides
        self.totals: list[int] = [0] * sides
        self.compared: list[int] = [0] * sides
        self.bad: list[int] = [0] * sides
        self.maxima: list[float] = [-math.inf] * sides

    def side(self, refs: list[TensorSummary], cands: list[TensorSummary], side: int) -> Pairing | None:
        """Pair the leaves of one side; compare full tensors now, queue the rest. Returns the pairing when it is
        not the plain one-to-one of equal shapes."""
        if not self.full and in_order(refs, cands):
            if refs:
                self.stat_refs.extend(refs)
                self.stat_cands.extend(cands)
                self.queued_sides.append(side)
                self.queued_counts.append(len(refs))
            return None
        pairing = pair_leaves(refs, cands)
        queued = 0
        for pair in pairing.pairs:
            ref, cand, relation = pair.reference, pair.candidate, pair.relation
            if relation == DIFFERENT:
                self.special.setdefault(side, []).append(
                    LeafResult(
                        cand.key, MISMATCH, "shape", reason=f"shape {ref.shape} vs {cand.shape}", reference_key=ref.key
                    )
                )
                continue
            if self.full and ref.tensor is not None and cand.tensor is not None:
                cache_key = (ref.tensor, cand.tensor)
                if cache_key in self.full_cache:
                    cached = self.full_cache[cache_key]
                else:
                    allow = side % 2 == 1 and side // 2 in self.permuted_positions
                    cached = self.full_cache[cache_key] = self._full(pair, allow)
                if cached is not None:
                    if cached.key != cand.key or cached.reference_key != ref.key:
                        cached = LeafResult(
                            cand.key,
                            cached.status,
                            cached.check,
                            cached.max_abs_diff,
                            cached.max_rel_diff,
                            cached.reason,
                            cached.atol,
                            cached.rtol,
                            cached.rel_err,
                            cached.cosine,
                            ref.key,
                            cached.note,
                        )
                    self.special.setdefault(side, []).append(cached)
                    continue
            if relation == OVERLAP:  # the statistics of a subset of positions say nothing about the whole
                self.special.setdefault(side, []).append(
                    LeafResult(
                        cand.key,
                        NOT_COMPARED,
                        None,
                        reference_key=ref.key,
                        note=pair.describe(),
                        reason="the two hold different positions and only statistics are stored: not comparable",
                    )
                )
                continue
            self.stat_refs.append(ref)
            self.stat_cands.append(cand)
            if relation == BROADCAST or ref.dtype != cand.dtype:
                self.stat_valid_rows.append(len(self.stat_refs) - 1)
            queued += 1
        if queued:
            self.queued_sides.append(side)
            self.queued_counts.append(queued)
        return None if pairing.trivial else pairing

    def _full(self, pair: LeafPair, allow_permutation: bool = False) -> LeafResult | None:
        a = self.ref_store.get(pair.reference.tensor)
        b = self.cand_store.get(pair.candidate.tensor)
        if a is None or b is None:
            return None
        return compare_pair_arrays(
            a,
            b,
            pair,
            self.options,
            self.tolerances,
            self.ref_store.precision(pair.reference.tensor),
            self.cand_store.precision(pair.candidate.tensor),
            allow_permutation,
        )

    @staticmethod
    def _table(summaries: list[TensorSummary]) -> np.ndarray:
        """mean, std, min, max, nan_count, inf_count of every summary as a (count, 6) float array."""
        count = len(summaries)
        try:
            flat = np.fromiter(itertools.chain.from_iterable(map(_NUMBERS, summaries)), np.float64, 6 * count)
        except TypeError:  # a statistic is None (shape-only traces, empty tensors): None becomes NaN
            flat = np.array(list(map(_NUMBERS, summaries)), dtype=np.float64)
        return flat.reshape(count, 6)

    def run_statistics(self) -> None:
        """Shapes, dtypes and statistics of every queued pair at once, then counted per side."""
        refs, cands = self.stat_refs, self.stat_cands
        count = len(refs)
        if not count:
            return
        # NOTE: every queued pair has equal shapes and dtypes (`in_order`, or a SAME pairing), except the rows of
        # `stat_valid_rows`, decided below: no need to compare them again here
        valid = np.ones(count, bool)
        ref_dtypes = list(map(_DTYPE, refs))
        if self.stat_valid_rows:  # broadcast-equivalent shapes, or floating dtypes of different precision
            rows = np.asarray(self.stat_valid_rows)
            valid[rows] = [dtype_kind(refs[row].dtype) == dtype_kind(cands[row].dtype) for row in rows.tolist()]
            for row in rows.tolist():
                ref_dtypes[row] = lower_precision(refs[row].dtype, cands[row].dtype)
        dtype_names = sorted(set(ref_dtypes))
        tolerance_table = np.array(
            [_tolerances(name, name, self.options, self.tolerances) for name in dtype_names], dtype=np.float64
        ).reshape(len(dtype_names), 4)
        if len(dtype_names) == 1:
            tolerances = np.broadcast_to(tolerance_table, (count, 4))
        else:
            codes = {name: code for code, name in enumerate(dtype_names)}
            tolerances = tolerance_table[np.fromiter(map(codes.__getitem__, ref_dtypes), np.int64, count)]
        ref_table, cand_table = self._table(refs), self._table(cands)
        ref_stats, cand_stats = ref_table[:, :4], cand_table[:, :4]
        ref_nan_count, cand_nan_count = ref_table[:, 4], cand_table[:, 4]
        ref_abs, ref_rel = self.reference.stat_precision
        cand_abs, cand_rel = self.candidate.stat_precision
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ref_nan = (ref_nan_count > 0) | (np.isnan(ref_stats[:, 0]) & ~np.isnan(ref_stats[:, 2]))
            cand_nan = (cand_nan_count > 0) | (np.isnan(cand_stats[:, 0]) & ~np.isnan(cand_stats[:, 2]))
            # NOTE: an infinite statistic is not compared: torch's float32 mean of a mask filled with the dtype's
            # minimum overflows to -inf where ours (float64) is finite; NaN presence is checked below.
            ref_stats[np.isinf(ref_stats)] = np.nan
            cand_stats[np.isinf(cand_stats)] = np.nan
            difference = np.abs(ref_stats - cand_stats)
            magnitude = np.fmax(np.abs(ref_stats), np.abs(cand_stats))
            scale = np.fmax(np.abs(ref_stats[:, 2]), np.abs(ref_stats[:, 3]))
            scale[np.isnan(scale)] = 0.0
            # elementwise allowance: atol (per unit of the scale when atol is the default) + rtol·scale
            elementwise = (
                tolerances[:, 0] * np.where(tolerances[:, 3] > 0, np.maximum(scale, 1.0), 1.0)
                + tolerances[:, 1] * scale
            )
            slack = (ref_abs + cand_abs) + (ref_rel + cand_rel) * magnitude
            limit = elementwise[:, None] + slack
            limit[:, 0] += _STAT_NUMERIC_SLACK * scale
            mean, std = ref_stats[:, 0], ref_stats[:, 1]
            std_slack = _STAT_NUMERIC_SLACK * (mean * mean + std * std) / np.maximum(std, 1e-30)
            std_slack[~np.isfinite(std_slack)] = 0.0
            limit[:, 1] += std_slack
            # scale-aware: |Δmean| and |Δstd| are at most rms(a - b) <= rel_tol·max(rms(ref), atol); the sample
            # std's n/(n-1) and the numbers' rounding get 1% and the slack above
            rms = np.sqrt(mean * mean + std * std)
            relative_limit = 1.01 * tolerances[:, 2] * np.fmax(rms, tolerances[:, 0])
            relative_limit[~np.isfinite(relative_limit)] = np.inf
            limit[:, 0] = np.minimum(limit[:, 0], relative_limit + slack[:, 0] + _STAT_NUMERIC_SLACK * scale)
            limit[:, 1] = np.minimum(limit[:, 1], relative_limit + slack[:, 1] + std_slack)
            over = difference > limit  # NaN compares False: a statistic missing on either side is skipped
            has_values = ~np.isnan(difference)
            compared = has_values.any(axis=1) & valid
            largest = np.fmax.reduce(np.where(has_values, difference, -np.inf), axis=1)
            largest[~compared] = -np.inf
            bad = (over.any(axis=1) | (ref_nan != cand_nan)) & valid
            if self.both_count_nans:
                bad |= ((ref_nan_count != cand_nan_count) | (ref_table[:, 5] != cand_table[:, 5])) & valid
        side_of_row = np.repeat(np.asarray(self.queued_sides), self.queued_counts)
        self.totals = np.bincount(side_of_row, weights=valid, minlength=self.sides).astype(np.int64).tolist()
        self.compared = np.bincount(side_of_row, weights=compared, minlength=self.sides).astype(np.int64).tolist()
        self.bad = np.bincount(side_of_row, weights=bad, minlength=self.sides).astype(np.int64).tolist()
        maxima = np.full(self.sides, -np.inf)
        np.maximum.at(maxima, side_of_row, largest)
        self.maxima = maxima.tolist()
        for row in np.flatnonzero(~valid).tolist():  # shapes or dtypes differ: rare, one by one
            ref, cand = refs[row], cands[row]
            special = self.special.setdefault(int(side_of_row[row]), [])
            if ref.shape != cand.shape and dtype_kind(ref.dtype) == dtype_kind(cand.dtype):
                special.append(
                    LeafResult(
                        cand.key, MISMATCH, "shape", reason=f"shape {ref.shape} vs {cand.shape}", reference_key=ref.key
                    )
                )
            else:
                atol, rtol = _tolerance(ref.dtype, cand.dtype, self.options, self.tolerances)
                special.append(
                    LeafResult(
                        cand.key,
                        MISMATCH,
                        "statistics",
                        atol=atol,
                        rtol=rtol,
                        reason=f"dtype {ref.dtype} vs {cand.dtype}",
                        reference_key=ref.key,
                    )
                )
        # Every differing row counts; the first of each output side is described (it gives the module's reason;
        # inputs are only counted).
        bad_rows = np.flatnonzero(bad & (side_of_row % 2 == 1))
        if not bad_rows.size:
            return
        bad_sides, first = np.unique(side_of_row[bad_rows], return_index=True)
        first_rows = bad_rows[first]
        first_over = over[first_rows]
        columns = np.where(first_over, difference[first_rows] - limit[first_rows], -np.inf).argmax(axis=1)
        has_over = first_over.any(axis=1).tolist()
        ref_values = ref_stats[first_rows, columns].tolist()
        cand_values = cand_stats[first_rows, columns].tolist()
        largest_values = largest[first_rows].tolist()
        first_tolerances = tolerances[first_rows, :2].tolist()
        columns = columns.tolist()
        for position, (row, side) in enumerate(zip(first_rows.tolist(), bad_sides.tolist())):
            ref, cand = refs[row], cands[row]
            if has_over[position]:
                reason = f"{_STAT_NAMES[columns[position]]} {ref_values[position]:.5g} vs {cand_values[position]:.5g}"
            elif bool(ref_nan[row]) != bool(cand_nan[row]):
                reason = "NaN in the reference only" if ref_nan[row] else "NaN in the candidate only"
            else:
                reason = f"NaN/Inf counts {ref.nan_count}/{ref.inf_count} vs {cand.nan_count}/{cand.inf_count}"
            value = largest_values[position]
            atol, rtol = first_tolerances[position]
            self.special.setdefault(side, []).append(
                LeafResult(
                    cand.key, MISMATCH, "statistics", value if value != -math.inf else None, None, reason, atol, rtol
                )
            )

    def side_status(self, side: int, label: str) -> tuple[str, str | None]:
        special = self.special.get(side)
        structure = self.structure.get(side)
        if special is None and structure is None:
            if self.bad[side]:
                return MISMATCH, None
            return (MATCH if self.totals[side] else NONE), None
        special = special or []
        bad = next((leaf for leaf in special if leaf.status == MISMATCH), None)
        if bad is not None or structure is not None or self.bad[side]:
            reason = (f"{label} {bad.key}: {bad.reason}" if bad.key else bad.reason) if bad is not None else None
            if structure is not None:
                reason = f"{reason}; {structure}" if reason else structure
            return MISMATCH, reason
        if self.totals[side] or any(leaf.status == MATCH for leaf in special):
            return MATCH, None
        return (NONE if not special else UNKNOWN), None

    def side_summary(self, side: int) -> tuple[str | None, float | None, float | None]:
        """(weakest check, max abs diff, max rel diff) of one side."""
        total = self.totals[side]
        maximum = self.maxima[side]
        stat_max = maximum if maximum != -math.inf else None
        stat_check = None
        if total:
            stat_check = "statistics" if self.compared[side] == total else "shape"
        special = self.special.get(side)
        if not special:
            return stat_check, stat_max, None
        checks = [leaf.check for leaf in special if leaf.check is not None]
        if stat_check:
            checks.append(stat_check)
        values = [leaf.max_abs_diff for leaf in special if leaf.max_abs_diff is not None]
        if stat_max is not None:
            values.append(stat_max)
        relatives = [leaf.max_rel_diff for leaf in special if leaf.max_rel_diff is not None]
        return (
            min(checks, key=_CHECK_RANK.__getitem__) if checks else None,
            max(values) if values else None,
            max(relatives) if relatives else None,
        )


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (reference counting still frees everything).

    NOTE: a diff makes a few objects per module call (results, lists) and no reference cycles; on a trace of
    thousands of calls the collector's passes over everything alive (both traces) cost ~10% of a
    statistics-only diff, for nothing to collect.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def diff_traces(
    reference: LoadedTrace,
    candidate: LoadedTrace,
    options: DiffOptions | None = None,
    watch: tuple[int, Any] | None = None,
) -> DiffResult:
    """Align and compare `candidate` against `reference`; raises `DiffError` when nothing aligns. `watch`:
    (limit, found): `found(modules)` is called during the comparison with the first `limit` calls, in finishing
    order, whose outputs differ, as soon as they are known (`SuspectWatch`; the replay starts on them)."""
    with _without_cycle_collection():
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

    comparer = _Comparer(reference, candidate, options, 2 * len(cand_records))
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
            result.atol, result.rtol, result.rel_tol, _ = _tolerances(
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
    result.not_comparable = _coverage_problem(result)
    if "parallel" in reference.trace.model or "parallel" in candidate.trace.model:
        from modeltrace.diff.ranks import rank_findings

        result.ranks = rank_findings(result)
    return result


def decide(result: DiffResult) -> None:
    """(Re)compute the first divergence from the module results (and their replays, when there are some)."""
    for module in result.modules:
        if module.status == DIVERGENCE:
            module.status = MISMATCH
    divergence = _first_divergence(result.modules)
    if divergence is not None:
        divergence.module.status = DIVERGENCE
        divergence.lines = source_range(divergence)
    result.first_divergence = divergence
    from modeltrace.diff.evidence import explain  # NOTE: here, not at the top: evidence imports this module

    explain(result)


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
    cand_calls = [module for module in result.modules if module.candidate.path]
    ref_calls = [record for record in result.reference.trace.modules if record.path]
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


def _first_divergence(results: list[ModuleResult]) -> Divergence | None:
    children: dict[int, list[ModuleResult]] = {}
    for result in results:
        children.setdefault(result.candidate.parent, []).append(result)
    ordered = sorted(results, key=_finish_key)

    def kids_of(result: ModuleResult) -> list[ModuleResult]:
        return [kid for kid in children.get(result.candidate.index, []) if kid.reference is not None]

    for result in ordered:
        if result.reference is None:
            continue
        replay = result.replay
        if replay is not None and replay.status == MATCH:
            continue  # on the reference's inputs it computes the reference's outputs: not where the bug is
        if replay is not None and replay.status == MISMATCH:
            divergence = Divergence(result, inputs_match=True, by_replay=True)
            return _bounded(divergence, kids_of(result))
        if result.inputs not in (MATCH, NONE):
            continue
        if result.outputs == MISMATCH:
            return _bounded(Divergence(result, inputs_match=True), kids_of(result))
        if result.outputs == UNKNOWN and any(kid.inputs == MISMATCH for kid in kids_of(result)):
            return _bounded(Divergence(result, inputs_match=True, inferred=True), kids_of(result))
    for result in ordered:
        if result.status == MISMATCH and not (result.replay is not None and result.replay.status == MATCH):
            return _bounded(Divergence(result, inputs_match=False), kids_of(result))
    return None


def _bounded(divergence: Divergence, kids: list[ModuleResult]) -> Divergence:
    kids = sorted(kids, key=lambda kid: kid.candidate.index)
    last_match = None
    for kid in kids:
        if kid.inputs == MISMATCH or (kid.replay is not None and kid.replay.status == MISMATCH):
            divergence.first_differing_child = kid
            break
        if kid.outputs == MATCH or (kid.replay is not None and kid.replay.status == MATCH and kid.inputs == MATCH):
            last_match = kid
    divergence.last_matching_child = last_match
    return divergence


# ---------------------------------------------------------------------------------------- source lines


_forward_cache: dict[tuple[str, float], dict[int, tuple[int, int]]] = {}
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python")


def _forward_ranges(file: str) -> dict[int, tuple[int, int]]:
    """{line of a class statement (and of its decorators): (first, last) line of its `forward`} of a file."""
    import ast
    import os

    try:
        key = (file, os.path.getmtime(file))
    except OSError:
        return {}
    found = _forward_cache.get(key)
    if found is not None:
        return found
    found = {}
    from modeltrace.trace.source_files import UnreadableSource, read_source_text

    try:
        tree = ast.parse(read_source_text(file), file)
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef):
            forward = next(
                (
                    item
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "forward"
                ),
                None,
            )
            if forward is not None:
                span = (forward.lineno, forward.end_lineno or forward.lineno)
                for line in [node.lineno, *(decorator.lineno for decorator in node.decorator_list)]:
                    found[line] = span
    if len(_forward_cache) > 64:
        _forward_cache.clear()
    _forward_cache[key] = found
    return found


def _derivable(last_match: ModuleResult, first_differing: ModuleResult | None) -> bool:
    """Whether the first differing child's differing inputs can have been computed from the last matching
    child's outputs: not when every one of them is of another kind (integer position ids against floating
    hidden states: they were computed from something else, possibly before that call)."""
    if first_differing is None:
        return True
    differing = {leaf.key for leaf in first_differing.input_leaves if leaf.status == MISMATCH}
    kinds = {dtype_kind(summary.dtype) for summary in first_differing.candidate.inputs if summary.key in differing}
    produced = {dtype_kind(summary.dtype) for summary in last_match.candidate.outputs}
    return not kinds or not produced or bool(kinds & produced)


def source_range(divergence: Divergence) -> SourceRange | None:
    """The smallest range of candidate lines known to hold the cause: inside the diverging module's `forward`,
    from the call of the last child whose outputs still match to the call of the first child whose inputs
    differ (or the forward's first / last line; the first line too when the differing inputs are of a kind
    the matching child does not produce, see `_derivable`). A module whose class lives in an installed library (a torch
    `nn.LayerNorm`) is not where the candidate's code went wrong: its call line is the range (its arguments, or
    how it was built: see `built_at`)."""
    record = divergence.module.candidate
    defined = record.defined_at
    if defined is not None and any(marker in defined.file for marker in _LIBRARY_MARKERS):
        called = record.called_at
        return SourceRange(called.file, called.line, called.line) if called is not None else None
    span = _forward_ranges(defined.file).get(defined.line) if defined is not None else None
    after = divergence.last_matching_child.candidate.called_at if divergence.last_matching_child else None
    if after is not None and not _derivable(divergence.last_matching_child, divergence.first_differing_child):
        after = None  # the differing values come from elsewhere: they may be computed before that call
    before = divergence.first_differing_child.candidate.called_at if divergence.first_differing_child else None
    if span is not None:
        first, last = span
        file = defined.file
        start = after.line if after is not None and after.file == file and first <= after.line <= last else first
        end = before.line if before is not None and before.file == file and first <= before.line <= last else last
        if start > end:
            start, end = first, last
        return SourceRange(file, start, end)
    if after is not None and before is not None and after.file == before.file and after.line <= before.line:
        return SourceRange(after.file, after.line, before.line)
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
