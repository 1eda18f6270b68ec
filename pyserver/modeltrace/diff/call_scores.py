"""How alike two calls are, for the automatic alignment (`diff/auto_align.py`): what the aligner knows of a call
(`CallFeatures`, names left out), the weights of each kind of evidence, and the NumPy form of the pair score
(`Codes`, `score_rows`), which scores millions of pairs at once exactly as `auto_align.pair_score` scores one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modeltrace.diff.kinds import NO_OP, UNKNOWN
from modeltrace.diff.pairing import rows_of

WEIGHTS = {"output": 0.35, "input": 0.15, "values": 0.3, "layer": 0.2, "weights": 0.4}
KIND_MISMATCH = 0.25
# the shape score of the same rows in another grid (same width, same number of elements)
RESHAPED = 0.9
SHAPE_MISMATCH = 0.5


@dataclass
class CallFeatures:
    """What the aligner knows of one call, names left out."""

    kind: str
    output_shape: tuple[int, ...] | None
    input_shape: tuple[int, ...] | None
    mean: float | None
    std: float | None
    layer: tuple[int, ...]
    input_mean: float | None = None
    input_std: float | None = None
    # the module's own parameters as sampled values, and with 2-D ones transposed (None: it has none recorded)
    weights: tuple | None = None
    weights_transposed: tuple | None = None


class Codes:
    """Integer codes of the features, for scoring every pair at once with NumPy."""

    def __init__(self, ref: list[CallFeatures], cand: list[CallFeatures]) -> None:
        kinds: dict[str, int] = {UNKNOWN: 0, NO_OP: 1}
        shapes: dict[object, int] = {None: 0}
        lasts: dict[object, int] = {None: 0}
        flats: dict[object, int] = {None: 0}
        layers: dict[tuple[int, ...], int] = {(): 0}

        def code(table: dict, key: object) -> int:
            return table.setdefault(key, len(table))

        weight_codes: dict[object, int] = {None: 0}

        def encode(side: list[CallFeatures]) -> dict[str, np.ndarray]:
            return {
                "weights": np.array([code(weight_codes, item.weights) for item in side], dtype=np.int32),
                "weights_t": np.array([code(weight_codes, item.weights_transposed) for item in side], dtype=np.int32),
                "kind": np.array([code(kinds, item.kind) for item in side], dtype=np.int32),
                "out": np.array([code(shapes, item.output_shape) for item in side], dtype=np.int32),
                "in": np.array([code(shapes, item.input_shape) for item in side], dtype=np.int32),
                "out_last": np.array(
                    [
                        code(lasts, (len(item.output_shape), item.output_shape[-1]) if item.output_shape else None)
                        for item in side
                    ],
                    dtype=np.int32,
                ),
                "in_last": np.array(
                    [
                        code(lasts, (len(item.input_shape), item.input_shape[-1]) if item.input_shape else None)
                        for item in side
                    ],
                    dtype=np.int32,
                ),
                "out_flat": np.array([code(flats, rows_of(item.output_shape)) for item in side], dtype=np.int32),
                "in_flat": np.array([code(flats, rows_of(item.input_shape)) for item in side], dtype=np.int32),
                "out_rank": np.array([len(item.output_shape or ()) for item in side], dtype=np.int32),
                "in_rank": np.array([len(item.input_shape or ()) for item in side], dtype=np.int32),
                "layer": np.array([code(layers, item.layer) for item in side], dtype=np.int32),
                "mean": np.array([np.nan if item.mean is None else item.mean for item in side], dtype=np.float32),
                "std": np.array([np.nan if item.std is None else item.std for item in side], dtype=np.float32),
                "spread": np.array(
                    [1e-12 if item.std is None else max(abs(item.std), 1e-12) for item in side], dtype=np.float32
                ),
            }

        self.ref = encode(ref)
        self.cand = encode(cand)


def weights_score(ref: CallFeatures, cand: CallFeatures) -> float | None:
    """1 when the two modules hold the same parameter values (directly, or one's 2-D parameters transposed),
    None when either has no parameters recorded or they differ (different weights are no evidence against a
    pair: random weights, or the very weight a bug failed to copy)."""
    if ref.weights is None or cand.weights is None:
        return None
    if ref.weights == cand.weights or ref.weights == cand.weights_transposed or ref.weights_transposed == cand.weights:
        return 1.0
    return None


def score_rows(
    codes: Codes, rows: slice | np.ndarray, columns: slice | np.ndarray = slice(None), paired: bool = False
) -> np.ndarray:
    """Scores of candidate calls `rows` (axis 0) against reference calls `columns` (axis 1), or with `paired`
    of `rows[k]` against `columns[k]` (one axis), as `pair_score` gives them (NumPy form of the same rule, in
    float32 and whole-array operations: it runs on millions of pairs)."""
    if paired:
        cand = {name: values[rows] for name, values in codes.cand.items()}
        ref = {name: values[columns] for name, values in codes.ref.items()}
    else:
        cand = {name: values[rows, None] for name, values in codes.cand.items()}
        ref = {name: values[None, columns] for name, values in codes.ref.items()}
    one, half, zero = np.float32(1.0), np.float32(0.5), np.float32(0.0)

    def shape(side: str, last: str) -> np.ndarray:
        # 1 equal, 0.5 unknown on a side, 0.9 the same rows in another grid, 0.6 the same width elsewhere, 0 different
        partial = np.where(cand[last] == ref[last], np.float32(0.6), zero)
        flat, rank = side + "_flat", side + "_rank"
        regrid = (cand[flat] == ref[flat]) & (cand[flat] != 0) & (cand[rank] != ref[rank])
        partial = np.where(regrid, np.float32(RESHAPED), partial)
        known = np.where((cand[side] == 0) | (ref[side] == 0), half, partial)
        return np.where((cand[side] == ref[side]) & (cand[side] != 0), one, known)

    output = shape("out", "out_last")
    layer = np.where(
        cand["layer"] == ref["layer"], one, np.where((cand["layer"] == 0) | (ref["layer"] == 0), half, zero)
    )
    structure = (
        np.float32(WEIGHTS["output"]) * output
        + np.float32(WEIGHTS["input"]) * shape("in", "in_last")
        + np.float32(WEIGHTS["layer"]) * layer
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        distance = (np.abs(cand["mean"] - ref["mean"]) + np.abs(cand["std"] - ref["std"])) / np.maximum(
            cand["spread"], ref["spread"]
        )
        values = np.log10(np.maximum(distance, np.float32(1e-3)))  # NaN where a side has no statistics
    values = np.clip(values * np.float32(-1 / 3), zero, one)  # 1 - log10(distance / 1e-3) / 3
    has_values = ~np.isnan(values)
    weights_equal = (
        (cand["weights"] != 0)
        & (ref["weights"] != 0)
        & (
            (cand["weights"] == ref["weights"])
            | (cand["weights_t"] == ref["weights"])
            | (cand["weights"] == ref["weights_t"])
        )
    )
    base = WEIGHTS["output"] + WEIGHTS["input"] + WEIGHTS["layer"]
    total = structure + np.float32(WEIGHTS["values"]) * np.where(has_values, values, zero)
    total += np.float32(WEIGHTS["weights"]) * weights_equal
    weight = (
        np.float32(base) + np.float32(WEIGHTS["values"]) * has_values + np.float32(WEIGHTS["weights"]) * weights_equal
    )
    score = total / weight
    kind = np.where(cand["kind"] == ref["kind"], one, np.float32(KIND_MISMATCH))
    kind = np.where((cand["kind"] == 0) | (ref["kind"] == 0), np.float32(0.8), kind)
    kind = np.where((cand["kind"] == 1) | (ref["kind"] == 1), zero, kind)  # a no-op pairs with nothing (code 1)
    return score * kind * np.where(output == 0, np.float32(SHAPE_MISMATCH), one)
