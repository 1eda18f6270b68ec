"""Comparison of aligned module calls: shapes, dtypes, then values, and the first divergence.

Values are compared on full tensors when both sides have them: max abs difference, max relative difference
(|a - b| / |reference| over the reference's non-zero elements), and allclose at `atol + rtol·|reference|`
(plus half a printed digit when a side's values were parsed back from a repr). Otherwise statistics are
compared, the weaker check: if two tensors are allclose at tolerance t, their min, max and mean differ by at
most t and their std by about as much, so a statistic further apart than t (plus the rounding of the stored
numbers) proves a mismatch, while agreeing statistics only suggest a match. The statistics' largest difference
is reported as `max_abs_diff`: a lower bound of the true one.

Tolerances default to atol 1e-3, rtol 0, and follow the lower precision of the two dtypes for half precision
(float16: rtol 1e-3, bfloat16: rtol 1.6e-2, the defaults of `torch.testing.assert_close`); a value given by
the user applies to every dtype.

The first divergence is the first module, in the order modules finish (innermost first), whose inputs match and
whose outputs differ; where the reference has no outputs for a module (the transformers debugger keeps outputs
of leaf modules only), a module whose inputs match and one of whose children receives differing inputs. Inside
it, the last child whose outputs still match and the first child whose inputs differ bound the lines where the
difference arises.
"""

from __future__ import annotations

import math
import operator
import threading
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from modeltrace.diff.align import Alignment, RenameMap, align_traces
from modeltrace.diff.auto_align import ModuleMapping, ModulePair
from modeltrace.diff.mapping import ConcatenatedTensors
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import ModuleCall, TensorSummary
from modeltrace.trace.tensors import LoadedTrace


DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 0.0
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
    """`atol` / `rtol` None: the defaults above, dtype-aware; `maps`: rename rules for alignment; `mapping`: a
    module mapping (`--mapping` file) that replaces alignment by names; `automatic`: align by evidence when names
    leave most modules unaligned."""

    atol: float | None = None
    rtol: float | None = None
    maps: tuple[RenameMap, ...] = ()
    mapping: ModuleMapping | None = None
    automatic: bool = True


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


@dataclass
class Divergence:
    """The first divergence: `module`, whether its inputs matched (False only for the fallback when no module
    has matching inputs and differing outputs), and the children that bound where the difference arises."""

    module: ModuleResult
    inputs_match: bool
    inferred: bool = False
    last_matching_child: ModuleResult | None = None
    first_differing_child: ModuleResult | None = None


@dataclass
class DiffResult:
    reference: LoadedTrace
    candidate: LoadedTrace
    options: DiffOptions
    alignment: Alignment
    modules: list[ModuleResult]
    first_divergence: Divergence | None
    notes: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return not any(module.status in (MISMATCH, DIVERGENCE) for module in self.modules)

    def finish_ordered(self) -> list[ModuleResult]:
        """Candidate modules in the order their calls returned (records without one last, in call order)."""
        return sorted(self.modules, key=_finish_key)


def _finish_key(module: ModuleResult) -> tuple[int, int]:
    order = module.candidate.finish_order
    return (order if order >= 0 else 1 << 60, module.candidate.index)


# ------------------------------------------------------------------------------------------------ tolerances


def _tolerance(ref_dtype: str, cand_dtype: str, options: DiffOptions, cache: dict) -> tuple[float, float]:
    key = (ref_dtype, cand_dtype)
    found = cache.get(key)
    if found is None:
        lower = min((ref_dtype, cand_dtype), key=lambda name: _PRECISION_RANK.get(name, 2))
        atol = options.atol if options.atol is not None else DEFAULT_ATOL
        rtol = options.rtol if options.rtol is not None else HALF_PRECISION_RTOL.get(lower, DEFAULT_RTOL)
        found = cache[key] = (atol, rtol)
    return found


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


def compare_arrays(reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float,
                   slack_abs: float = 0.0, slack_rel: float = 0.0) -> tuple[bool, float, float, str | None]:
    """(allclose, max abs diff, max rel diff, reason) of two arrays of one shape; NaN and ±Inf must sit at the
    same places. Runs block by block in cache-sized scratch buffers."""
    a = reference.reshape(-1)
    b = candidate.reshape(-1)
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        if a.size == 0:
            return True, 0.0, 0.0, None
        difference = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = float(difference.max())
        nonzero = a != 0
        max_rel = float((difference[nonzero] / np.abs(a[nonzero].astype(np.float64))).max()) if nonzero.any() else 0.0
        return max_abs <= atol + slack_abs, max_abs, max_rel, None
    work = np.dtype(np.float64) if np.float64 in (a.dtype, b.dtype) else np.dtype(np.float32)
    first, second = _scratch(work)
    limit = atol + slack_abs
    relative = rtol + slack_rel
    max_abs = 0.0
    max_rel = 0.0
    close = True
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
                ok, block_abs, block_rel, why = _compare_nonfinite(x, y, limit, relative)
                close &= ok
                reason = reason or why
                max_abs = max(max_abs, block_abs)
                max_rel = max(max_rel, block_rel)
                continue
            block_max = max(high, -low)
            if block_max == 0.0:
                continue
            max_abs = max(max_abs, block_max)
            if relative:
                np.abs(d, out=d)
                magnitude = np.abs(x, out=second[:count])
                close &= float((d - relative * magnitude).max()) <= limit
                ratio = np.divide(d, magnitude, out=magnitude)
                block_rel = float(np.fmax.reduce(ratio))
            else:
                close &= block_max <= limit
                # d / x is signed too; 0 / 0 gives NaN, which fmax / fmin skip
                ratio = np.divide(d, x, out=second[:count])
                block_rel = max(float(np.fmax.reduce(ratio)), -float(np.fmin.reduce(ratio)))
            if block_rel == math.inf:  # non-zero differences where the reference is exactly zero: left out
                nonzero = x != 0
                block_rel = float((np.abs(d[nonzero]) / np.abs(x[nonzero])).max()) if nonzero.any() else 0.0
            if block_rel == block_rel:
                max_rel = max(max_rel, block_rel)
    return close, max_abs, max_rel, reason


def _compare_nonfinite(x: np.ndarray, y: np.ndarray, limit: float, relative: float):
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
        return close, 0.0, 0.0, reason
    d = np.abs(xs - ys)
    magnitude = np.abs(xs)
    close &= bool((d <= limit + relative * magnitude).all())
    nonzero = magnitude > 0
    max_rel = float((d[nonzero] / magnitude[nonzero]).max()) if nonzero.any() else 0.0
    return close, float(d.max()), max_rel, reason


# ----------------------------------------------------------------------------------------- the comparison


_NUMBERS = operator.attrgetter("mean", "std", "min", "max", "nan_count", "inf_count")
_SHAPE_DTYPE = operator.attrgetter("shape", "dtype")
_DTYPE = operator.attrgetter("dtype")
_STAT_NAMES = ("mean", "std", "min", "max")


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
        self.tolerances: dict = {}
        self.full_cache: dict[tuple[str, str], LeafResult | None] = {}
        self.stat_refs: list[TensorSummary] = []
        self.stat_cands: list[TensorSummary] = []
        self.queued_sides: list[int] = []
        self.queued_counts: list[int] = []
        self.special: dict[int, list[LeafResult]] = {}
        self.structure: dict[int, str] = {}
        self.both_count_nans = reference.kind == "modeltrace" and candidate.kind == "modeltrace"
        self.sides = sides
        self.totals: list[int] = [0] * sides
        self.compared: list[int] = [0] * sides
        self.bad: list[int] = [0] * sides
        self.maxima: list[float] = [-math.inf] * sides

    def side(self, refs: list[TensorSummary], cands: list[TensorSummary], side: int) -> None:
        """Pair the leaves of one side; compare full tensors now, queue the rest."""
        if len(refs) == len(cands):
            if not self.full:
                if refs:
                    self.stat_refs.extend(refs)
                    self.stat_cands.extend(cands)
                    self.queued_sides.append(side)
                    self.queued_counts.append(len(refs))
                return
            pairs = zip(refs, cands)
        else:
            pairs, self.structure[side] = _pair_by_key(refs, cands)
        queued = 0
        for ref, cand in pairs:
            if self.full and ref.tensor is not None and cand.tensor is not None and ref.shape == cand.shape \
                    and ref.dtype == cand.dtype:
                cache_key = (ref.tensor, cand.tensor)
                if cache_key in self.full_cache:
                    cached = self.full_cache[cache_key]
                else:
                    tolerance = _tolerance(ref.dtype, cand.dtype, self.options, self.tolerances)
                    cached = self.full_cache[cache_key] = self._full(ref, cand, *tolerance)
                if cached is not None:
                    if cached.key != cand.key:
                        cached = LeafResult(cand.key, cached.status, cached.check, cached.max_abs_diff,
                                            cached.max_rel_diff, cached.reason, cached.atol, cached.rtol)
                    self.special.setdefault(side, []).append(cached)
                    continue
            self.stat_refs.append(ref)
            self.stat_cands.append(cand)
            queued += 1
        if queued:
            self.queued_sides.append(side)
            self.queued_counts.append(queued)

    def _full(self, ref: TensorSummary, cand: TensorSummary, atol: float, rtol: float) -> LeafResult | None:
        a = self.ref_store.get(ref.tensor)
        b = self.cand_store.get(cand.tensor)
        if a is None or b is None:
            return None
        if a.shape != b.shape:
            return LeafResult(cand.key, MISMATCH, "shape", reason=f"stored shape {list(a.shape)} vs {list(b.shape)}")
        ref_abs, ref_rel = self.ref_store.precision(ref.tensor)
        cand_abs, cand_rel = self.cand_store.precision(cand.tensor)
        close, max_abs, max_rel, reason = compare_arrays(a, b, atol, rtol, ref_abs + cand_abs, ref_rel + cand_rel)
        if not close and reason is None:
            reason = f"max abs diff {max_abs:.3g} over atol {atol:g}" + (f" + rtol {rtol:g}·|ref|" if rtol else "")
        return LeafResult(cand.key, MATCH if close else MISMATCH, "full", max_abs, max_rel, reason, atol, rtol)

    @staticmethod
    def _table(summaries: list[TensorSummary]) -> np.ndarray:
        """mean, std, min, max, nan_count, inf_count of every summary as a (count, 6) float array."""
        count = len(summaries)
        try:
            flat = np.fromiter(chain.from_iterable(map(_NUMBERS, summaries)), np.float64, 6 * count)
        except TypeError:  # a statistic is None (shape-only traces, empty tensors): None becomes NaN
            flat = np.array(list(map(_NUMBERS, summaries)), dtype=np.float64)
        return flat.reshape(count, 6)

    def run_statistics(self) -> None:
        """Shapes, dtypes and statistics of every queued pair at once, then counted per side."""
        refs, cands = self.stat_refs, self.stat_cands
        count = len(refs)
        if not count:
            return
        valid = np.fromiter(map(operator.eq, map(_SHAPE_DTYPE, refs), map(_SHAPE_DTYPE, cands)), bool, count)
        ref_dtypes = list(map(_DTYPE, refs))
        dtype_names = sorted(set(ref_dtypes))
        tolerance_table = np.array([_tolerance(name, name, self.options, self.tolerances) for name in dtype_names],
                                   dtype=np.float64).reshape(len(dtype_names), 2)
        if len(dtype_names) == 1:
            tolerances = np.broadcast_to(tolerance_table, (count, 2))
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
            limit = (tolerances[:, 0] + tolerances[:, 1] * scale)[:, None] + (ref_abs + cand_abs) \
                + (ref_rel + cand_rel) * magnitude
            limit[:, 0] += _STAT_NUMERIC_SLACK * scale
            mean, std = ref_stats[:, 0], ref_stats[:, 1]
            std_slack = _STAT_NUMERIC_SLACK * (mean * mean + std * std) / np.maximum(std, 1e-30)
            std_slack[~np.isfinite(std_slack)] = 0.0
            limit[:, 1] += std_slack
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
            if ref.shape != cand.shape:
                special.append(LeafResult(cand.key, MISMATCH, "shape", reason=f"shape {ref.shape} vs {cand.shape}"))
            else:
                atol, rtol = _tolerance(ref.dtype, cand.dtype, self.options, self.tolerances)
                special.append(LeafResult(cand.key, MISMATCH, "statistics", atol=atol, rtol=rtol,
                                          reason=f"dtype {ref.dtype} vs {cand.dtype}"))
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
        first_tolerances = tolerances[first_rows].tolist()
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
                LeafResult(cand.key, MISMATCH, "statistics", value if value != -math.inf else None, None, reason,
                           atol, rtol)
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
        return (min(checks, key=_CHECK_RANK.__getitem__) if checks else None, max(values) if values else None,
                max(relatives) if relatives else None)


def _pair_by_key(refs: list[TensorSummary], cands: list[TensorSummary]):
    by_key = {ref.key: ref for ref in refs}
    pairs = []
    used: set[int] = set()
    leftover = []
    for cand in cands:
        ref = by_key.get(cand.key)
        if ref is not None and id(ref) not in used:
            pairs.append((ref, cand))
            used.add(id(ref))
        else:
            leftover.append(cand)
    free_refs = [ref for ref in refs if id(ref) not in used]
    for ref, cand in zip(free_refs, leftover):
        pairs.append((ref, cand))
    structure = f"{len(refs)} tensors in the reference, {len(cands)} in the candidate"
    return pairs, structure


def diff_traces(reference: LoadedTrace, candidate: LoadedTrace, options: DiffOptions | None = None) -> DiffResult:
    """Align and compare `candidate` against `reference`; raises `DiffError` when nothing aligns."""
    options = options or DiffOptions()
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
    compare_side = comparer.side
    results: list[ModuleResult] = []
    missing_outputs: dict[int, str] = {}
    ref_lacks_outputs = reference.kind == "hf-debugger"
    cand_lacks_outputs = candidate.kind == "hf-debugger"
    pruned = alignment.pruned
    how = alignment.how
    for position, record in enumerate(cand_records):
        ref_position = reference_for[position]
        if ref_position < 0:
            result = ModuleResult(record, None)
            result.reason = ("pruned from the reference (do_prune_layers)" if position in pruned
                             else "no counterpart in the reference")
            results.append(result)
            continue
        ref = ref_records[ref_position]
        results.append(ModuleResult(record, ref, aligned_by=how[position], pair=alignment.pair_of.get(position)))
        compare_side(ref.inputs, record.inputs, 2 * position)
        if ref.outputs and record.outputs:
            compare_side(ref.outputs, record.outputs, 2 * position + 1)
        elif ref.outputs or record.outputs:
            if ref_lacks_outputs if not ref.outputs else cand_lacks_outputs:
                side_name = "reference" if not ref.outputs else "candidate"
                missing_outputs[position] = (f"the {side_name} (a debugger output) records no outputs for modules "
                                             "with submodules")
            else:
                comparer.structure[2 * position + 1] = ("the candidate returns no tensors" if not record.outputs
                                                        else "the reference returns no tensors")
        else:
            missing_outputs[position] = ""

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
            result.atol, result.rtol = _tolerance(ref_outputs[0].dtype, cand_outputs[0].dtype, options, tolerances)
        if result.outputs == MISMATCH:
            result.status, result.reason = MISMATCH, reason
        elif result.outputs == MATCH:
            result.status = MATCH
        else:
            result.status, result.reason = NOT_COMPARED, "no comparable tensor outputs"

    divergence = _first_divergence(results)
    if divergence is not None:
        divergence.module.status = DIVERGENCE
    notes = [*reference.notes, *candidate.notes]
    if alignment.prefix:
        notes.append(f"aligned by stripping the prefix {alignment.prefix!r} from the {alignment.prefix_side}'s "
                     "module paths")
    return DiffResult(reference, candidate, options, alignment, results, divergence, notes)


def _first_divergence(results: list[ModuleResult]) -> Divergence | None:
    children: dict[int, list[ModuleResult]] = {}
    for result in results:
        children.setdefault(result.candidate.parent, []).append(result)
    ordered = sorted(results, key=_finish_key)
    for result in ordered:
        if result.reference is None or result.inputs not in (MATCH, NONE):
            continue
        kids = [kid for kid in children.get(result.candidate.index, []) if kid.reference is not None]
        if result.outputs == MISMATCH:
            return _bounded(Divergence(result, inputs_match=True), kids)
        if result.outputs == UNKNOWN and any(kid.inputs == MISMATCH for kid in kids):
            return _bounded(Divergence(result, inputs_match=True, inferred=True), kids)
    for result in ordered:
        if result.status == MISMATCH:
            kids = [kid for kid in children.get(result.candidate.index, []) if kid.reference is not None]
            return _bounded(Divergence(result, inputs_match=False), kids)
    return None


def _bounded(divergence: Divergence, kids: list[ModuleResult]) -> Divergence:
    kids = sorted(kids, key=lambda kid: kid.candidate.index)
    last_match = None
    for kid in kids:
        if kid.inputs == MISMATCH:
            divergence.first_differing_child = kid
            break
        if kid.outputs == MATCH:
            last_match = kid
    divergence.last_matching_child = last_match
    return divergence


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
