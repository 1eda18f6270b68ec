"""The tolerances a comparison allows, by dtype: atol, rtol and the scale-aware `rel_tol` of a pair of dtypes.

Tolerances default to atol 1e-3 and rtol 0, and rtol follows the lower precision of the two dtypes for half
precision (float16: rtol 1e-3, bfloat16: rtol 1.6e-2, the defaults of `torch.testing.assert_close`); a value
given by the user applies to every dtype (and a given atol is absolute, not scaled). `rel_tol`, the largest
‖a - b‖ / ‖reference‖, defaults to float32 1e-4, float16 2e-3, bfloat16 2e-2, float64 1e-7 (the lower precision
of the two dtypes decides). How the comparison applies them: `verdict` (full tensors), `sides` (statistics).
"""

from __future__ import annotations

from collections.abc import Callable

from modeltrace.diff.result import DiffOptions


DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 0.0
# ‖a - b‖ / ‖reference‖ allowed by dtype (the lower precision of the two): a few roundings of the dtype
# accumulated over a model (float32 eps 1.2e-7, float16 9.8e-4, bfloat16 7.8e-3).
DEFAULT_REL_TOL = {"float64": 1e-7, "float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}
# rtol by dtype when the user gives none (torch.testing.assert_close's defaults for half precision)
HALF_PRECISION_RTOL = {"float16": 1e-3, "bfloat16": 1.6e-2}
_PRECISION_RANK = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}


def dtype_tolerance(ref_dtype: str, cand_dtype: str, options: DiffOptions, cache: dict) -> tuple[float, float]:
    """(atol, rtol) for a pair of dtypes."""
    return dtype_tolerances(ref_dtype, cand_dtype, options, cache)[:2]


def dtype_tolerances(
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
    """The lower precision of two dtypes (the one whose tolerances apply to the pair)."""
    return min((ref_dtype, cand_dtype), key=lambda name: _PRECISION_RANK.get(name, 2))


def scale_measures(rel_err: float | None, cosine: float | None, number: Callable[[float], str]) -> str:
    """`, relative error X, cosine Y` after a divergence's max differences (the report's text and the editor's
    warning), "" where either is unknown. The relative error is what `rel_tol` bounds: where the reference's
    values are small, an absolute difference under atol can still be a divergence, and this says by how much."""
    return f", relative error {number(rel_err)}, cosine {cosine:.6f}" if None not in (rel_err, cosine) else ""
