"""A rotary table held two ways, paired where both hold the same numbers (issue 30, item 9).

Meta's Llama, Mistral and gemma_pytorch hand each attention one complex table `freqs_cis` `[T, d/2]` (e^{i·θ});
transformers hands it `cos`, `sin` `[1, T, d]`, each angle written twice along the last dimension: as two
halves (`cat(freqs, freqs)`, the rotate-half layout) or as interleaved pairs (`repeat_interleave`, the layout of
rotating adjacent pairs). Tensor by tensor, nothing pairs: one tensor holds what two hold. With full tensors on
both sides, a complex tensor (or a real one whose last dimension of 2 holds (cos, sin)) left out of the pairing
pairs with two left-out tensors of the other side when its real parts equal the first and its imaginary parts
the second in either layout; the verdict then rests on the table too, and the report says how it was compared
(`compared`, relation "rotary"). A table whose numbers differ in both layouts stays left out with that said:
where it was produced is then a suspect (`diff/unpaired.py`).

Complex tensors are stored as safetensors `C64` (two float32 per number); NumPy reads them here only, so no
other comparison meets a complex array.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from modeltrace.diff.pairing import LeftOut, Pairing, TablePair, dtype_kind
from modeltrace.trace.records import TensorSummary
from modeltrace.trace.tensors import TensorStore

HALVES = "halves: each angle at j and j + d/2"
INTERLEAVED = "interleaved pairs: each angle at 2j and 2j + 1"
_COMPLEX_CODES = {"C64": np.dtype("<c8")}


def _core(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def _angles(summary: TensorSummary, store: TensorStore) -> np.ndarray | None:
    """The table as complex numbers `[..., d/2]`: a stored complex tensor, or a float one whose last dimension of
    2 holds (cos, sin); None for anything else or where it is not stored."""
    if summary.tensor is None:
        return None
    if dtype_kind(summary.dtype) == "c":
        raw = store.raw(summary.tensor)
        if raw is None or raw[0] not in _COMPLEX_CODES:
            return None
        code, shape, data = raw
        dtype = _COMPLEX_CODES[code]
        if len(data) != math.prod(shape) * dtype.itemsize:
            return None  # NOTE: a damaged file: the tensor is compared by its statistics, as before
        return np.frombuffer(data, dtype=dtype).reshape(_core(shape))
    if dtype_kind(summary.dtype) == "f" and len(summary.shape) >= 2 and summary.shape[-1] == 2:
        array = store.get(summary.tensor)
        if array is None or array.size != math.prod(summary.shape):
            return None
        array = np.asarray(array, dtype=np.float64).reshape(_core(summary.shape))
        return array[..., 0] + 1j * array[..., 1]
    return None


def _spread(part: np.ndarray, layout: str) -> np.ndarray:
    """`[..., d/2]` -> `[..., d]`, each value written twice in `layout`."""
    return np.concatenate([part, part], axis=-1) if layout == HALVES else np.repeat(part, 2, axis=-1)


def _match(table: np.ndarray, cos: np.ndarray, sin: np.ndarray, atol: float) -> tuple[str | None, float]:
    """(layout, largest difference) where the table's real and imaginary parts are `cos` and `sin` in a layout,
    else (None, the smallest largest difference of the two layouts)."""
    best = np.inf
    for layout in (HALVES, INTERLEAVED):
        expected_cos, expected_sin = _spread(table.real, layout), _spread(table.imag, layout)
        if expected_cos.shape != cos.shape:
            return None, best
        difference = float(max(np.max(np.abs(expected_cos - cos)), np.max(np.abs(expected_sin - sin))))
        if difference <= atol:
            return layout, difference
        best = min(best, difference)
    return None, best


def pair_tables(
    pairing: Pairing,
    refs: list[TensorSummary],
    cands: list[TensorSummary],
    ref_store: TensorStore,
    cand_store: TensorStore,
    atol: float,
) -> None:
    """Pair the rotary tables among `pairing`'s left-out tensors (module docstring): a pair found moves from
    `left_out` to `tables`; a table of a fitting shape whose numbers differ keeps its place with the reason."""
    by_owner = {
        "reference": ({leaf.key: leaf for leaf in refs}, ref_store),
        "candidate": ({leaf.key: leaf for leaf in cands}, cand_store),
    }
    for owner, other in (("candidate", "reference"), ("reference", "candidate")):
        own_leaves, own_store = by_owner[owner]
        other_leaves, other_store = by_owner[other]
        for left in [item for item in pairing.left_out if item.owner == owner]:
            summary = own_leaves.get(left.key)
            table = _angles(summary, own_store) if summary is not None else None
            if table is None or table.ndim < 1:
                continue
            wanted = (*table.shape[:-1], 2 * table.shape[-1])
            others = [
                other_leaves[item.key]
                for item in pairing.left_out
                if item.owner == other
                and item.key in other_leaves
                and dtype_kind(other_leaves[item.key].dtype) == "f"
                and _core(other_leaves[item.key].shape) == wanted
                and other_leaves[item.key].tensor is not None
            ]
            closest = np.inf
            for cos, sin in itertools.permutations(others, 2):
                cos_array, sin_array = other_store.get(cos.tensor), other_store.get(sin.tensor)
                if cos_array is None or sin_array is None or {cos_array.size, sin_array.size} != {math.prod(wanted)}:
                    continue
                layout, difference = _match(
                    table, np.asarray(cos_array).reshape(wanted), np.asarray(sin_array).reshape(wanted), atol
                )
                if layout is None:
                    closest = min(closest, difference)
                    continue
                pairing.tables.append(TablePair(owner, left.key, cos.key, sin.key, layout, difference))
                paired = {(owner, left.key), (other, cos.key), (other, sin.key)}
                pairing.left_out[:] = [item for item in pairing.left_out if (item.owner, item.key) not in paired]
                break
            else:
                if others and closest < np.inf:
                    _explain(left, others, closest)


def _explain(left: LeftOut, others: list[TensorSummary], closest: float) -> None:
    names = ", ".join(repr(item.key) for item in others[:3])
    left.reason = (
        f"a rotary table whose cosines and sines differ from the other side's {names} in both layouts (halves, "
        f"interleaved pairs; max abs diff {closest:.3g}): where it was produced is a suspect"
    )
