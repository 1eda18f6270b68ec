"""The measures of two arrays of one shape: the elementwise check |a - b| <= atol + rtol·|reference|, the
largest absolute and relative differences, the relative error ‖a - b‖ / max(‖reference‖, atol·√n) and the
cosine similarity, in one pass.

NaN and ±Inf must sit at the same places; the finite rest is measured as usual. The work runs in the compiled
kernel (`diff/native`) where it applies, else block by block in cache-sized NumPy scratch buffers. What the
measures mean for a verdict is `verdict`'s business.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from modeltrace.diff import native


_BLOCK = 1 << 18


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


# An additive attention mask writes "masked" as -inf (Meta's Llama, Mistral) or as a large finite negative
# (transformers: the dtype's minimum; gemma_pytorch: -2.38e38): at or below this, both mean the same thing.
MASKED_AT_OR_BELOW = -1e30


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
    (relative error, cosine similarity) of two arrays of one shape, in one pass of blocks. Two additive masks
    that mask the same positions, one with -inf and the other with a large finite negative, are the same mask:
    where a comparison fails and both arrays hold values at or below `MASKED_AT_OR_BELOW` at exactly the same
    places, those places count as equal (a second pass, only for such failing comparisons)."""
    found = _measure_arrays(reference, candidate, atol, rtol, slack_abs, slack_rel, scaled_atol)
    if found.close or reference.dtype.kind != "f" or candidate.dtype.kind != "f" or reference.size == 0:
        return found
    with np.errstate(invalid="ignore"):
        masked_reference = reference <= MASKED_AT_OR_BELOW
        if not masked_reference.any():
            return found
        masked_candidate = candidate <= MASKED_AT_OR_BELOW
    if not np.array_equal(masked_reference, masked_candidate):
        return found
    unmasked_reference = np.where(masked_reference, 0, reference).astype(reference.dtype, copy=False)
    unmasked_candidate = np.where(masked_candidate, 0, candidate).astype(candidate.dtype, copy=False)
    return _measure_arrays(unmasked_reference, unmasked_candidate, atol, rtol, slack_abs, slack_rel, scaled_atol)


def _measure_arrays(
    reference: np.ndarray,
    candidate: np.ndarray,
    atol: float,
    rtol: float,
    slack_abs: float = 0.0,
    slack_rel: float = 0.0,
    scaled_atol: bool = False,
) -> ArrayComparison:
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
