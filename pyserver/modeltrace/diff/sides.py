"""Each side (inputs, outputs) of every aligned call compared: its tensors paired (`pairing`), full tensors judged
as they come (`verdict`), and the pairs known by their statistics only judged all at once, column by column.

Each side of two aligned calls is paired tensor by tensor: by role and value, so that extra inputs (masks,
position ids, caches) and extra outputs (attention weights) on either side are left out, with their reason,
instead of making the side differ.

Where either side lacks full tensors, statistics are compared, the weaker check: if two tensors match by the
rule of `verdict`, their min and max differ by at most the elementwise allowance and their mean and std by at
most rel_tol·max(rms, atol) (the rms of the reference from its mean and std), so a statistic further apart (plus
the rounding of the stored numbers) proves a mismatch, while agreeing statistics only suggest a match. The
statistics' largest difference is reported as `max_abs_diff`: a lower bound of the true one.
"""

from __future__ import annotations

import itertools
import math
import operator

import numpy as np

from modeltrace.diff.pairing import BROADCAST, DIFFERENT, OVERLAP, LeafPair, Pairing, dtype_kind, in_order, pair_leaves
from modeltrace.diff.rotary_tables import pair_tables
from modeltrace.diff.result import MATCH, MISMATCH, NONE, NOT_COMPARED, UNKNOWN, DiffOptions, LeafResult
from modeltrace.diff.tolerances import dtype_tolerance, dtype_tolerances, lower_precision
from modeltrace.diff.verdict import compare_pair_arrays
from modeltrace.trace.records import TensorSummary
from modeltrace.trace.tensors import LoadedTrace


# NOTE: rounding of statistics computed in float32 (sums over many elements) on top of the tolerance.
_STAT_NUMERIC_SLACK = 1e-6
_CHECK_RANK = {"shape": 0, "statistics": 1, "full": 2}
_NUMBERS = operator.attrgetter("mean", "std", "min", "max", "nan_count", "inf_count")
_DTYPE = operator.attrgetter("dtype")
_STAT_NAMES = ("mean", "std", "min", "max")
# NOTE: cosines and sines lie in [-1, 1]: the diff's default atol per unit of scale, as an absolute difference
_TABLE_ATOL = 1e-3


class SideComparer:
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
        if self.full and pairing.left_out:
            atol = self.options.atol if self.options.atol is not None else _TABLE_ATOL
            pair_tables(pairing, refs, cands, self.ref_store, self.cand_store, atol)
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
            [dtype_tolerances(name, name, self.options, self.tolerances) for name in dtype_names], dtype=np.float64
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
                atol, rtol = dtype_tolerance(ref.dtype, cand.dtype, self.options, self.tolerances)
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
