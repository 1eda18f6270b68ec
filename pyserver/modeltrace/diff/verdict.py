"""The verdict rule on one pair of full tensors (reference `a`, candidate `b`), and the weight layouts it forgives.

Shapes that hold the same numbers compare as equal (`[7, 64]` / `[1, 7, 64]`); a side computing a subset of
positions (a last-token head) is compared on the positions both hold. A pair matches when both hold:

- elementwise: |a - b| <= atol' + rtol·|reference| everywhere, where atol' is atol, or, when atol is left to
  its default, atol per unit of the tensor's scale: atol · max(1, max|reference|) (floating-point error is
  relative: logits of magnitude 1e3 carry errors a thousand times those of hidden states of magnitude 1); with
  rtol left to its default too, that per-unit atol is at least the dtype's rtol (bfloat16: 1.6e-2 of
  max|reference|, its rounding at the tensor's scale);
- scale-aware: the relative error ‖a - b‖ / max(‖reference‖, atol·√n) is at most `rel_tol` (by dtype:
  `tolerances`), so a module whose output is 3e-4 off on values of std 0.02 (relative error ~1e-2) is flagged
  although it is under atol. Cosine similarity is reported alongside.

A module whose weights hold its counterpart's values in another order (`permuted_weight_modules`: a converter
permuting q/k rows for an interleaved rotary) matches where its outputs agree once their features are reordered.
The measures themselves are `arrays`; pairs known by their statistics only are judged in `sides`.
"""

from __future__ import annotations

import numpy as np

from modeltrace.diff.align import Alignment
from modeltrace.diff.arrays import measure_arrays
from modeltrace.diff.pairing import OVERLAP, LeafPair, _padded, dtype_kind
from modeltrace.diff.result import MATCH, MISMATCH, DiffOptions, LeafResult
from modeltrace.diff.tolerances import dtype_tolerances
from modeltrace.trace.records import Trace


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
    atol, rtol, rel_tol, scaled = dtype_tolerances(ref.dtype, cand.dtype, options, cache)
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
