"""Tensor-level matching of one side (inputs or outputs) of two aligned module calls.

Independently written implementations call the same computation with different arguments: transformers' decoder
layer takes `hidden_states, attention_mask, position_ids, position_embeddings, ...` where a port's block takes
`x`; transformers' attention returns `(attn_output, attn_weights)` where the port returns one tensor. So the
tensors of a side are paired by role and value, not by position in the tuple:

- a pair needs tensors of one kind (floating / integer / bool) and shapes that hold the same numbers: equal,
  equal up to leading size-1 dimensions (`[7, 64]` / `[1, 7, 64]`, "broadcast"), or one computing a subset of
  the other's positions along one dimension that is not the last (a last-token head `[1, 1, V]` against
  `[1, 7, V]`, `logits_to_keep`: "overlap", compared on the trailing positions they share);
- among those, the best pairs win: equal shapes over broadcast over overlap, then the same key (weak evidence:
  names differ between implementations), then close statistics (cos against cos, not against sin), then the
  same position;
- tensors left with the same key, or the first tensors of a side where nothing pairs, are paired anyway as a
  shape mismatch (a real shape difference stays a mismatch);
- everything else is left out with its reason (a mask, position ids, a cache, attention weights that the other
  side does not have), and neither blocks nor decides the verdict.

The common case (same number of tensors, same shapes and dtypes in order) takes a fast path with no scoring.
"""

from __future__ import annotations

import math

import operator
from dataclasses import dataclass, field

from modeltrace.trace.records import TensorSummary


SAME = "same"
BROADCAST = "broadcast"
OVERLAP = "overlap"
DIFFERENT = "different"

_RELATION_SCORE = {SAME: 4.0, BROADCAST: 3.5, OVERLAP: 2.0}


@dataclass(slots=True)
class LeafPair:
    """A reference and a candidate tensor compared with each other; for `OVERLAP`, `dimension` (of the shapes
    padded to the same rank with leading 1s) and `count` (the trailing positions both hold)."""

    reference: TensorSummary
    candidate: TensorSummary
    relation: str
    dimension: int | None = None
    count: int | None = None

    def describe(self) -> str:
        if self.relation == SAME:
            return "same shape"
        if self.relation == BROADCAST:
            return f"same numbers, shapes {self.reference.shape} and {self.candidate.shape}"
        if self.relation == OVERLAP:
            rank = max(len(self.reference.shape), len(self.candidate.shape))
            dimension = self.dimension or 0
            larger = max(
                _padded(self.reference.shape, rank)[dimension], _padded(self.candidate.shape, rank)[dimension]
            )
            return (
                f"overlap: the last {self.count} of {larger} positions of dimension {self.dimension} "
                f"({self.reference.shape} vs {self.candidate.shape})"
            )
        return f"shape {self.reference.shape} vs {self.candidate.shape}"


@dataclass(slots=True)
class LeftOut:
    """A tensor of one side that was not compared: `owner` is "reference" or "candidate"."""

    owner: str
    key: str
    shape: list[int]
    reason: str


@dataclass(slots=True)
class TablePair:
    """A rotary table held as one tensor of complex numbers (or of (cos, sin) pairs in a last dimension of 2) on
    one side and as its cosines and sines on the other (`diff/rotary_tables.py`): `complex_key` and `owner` (the
    side holding it), the other side's `cos_key` and `sin_key`, the `layout` their last dimension repeats the
    angles in, and the largest difference found."""

    owner: str
    complex_key: str
    cos_key: str
    sin_key: str
    layout: str
    max_abs_diff: float

    def describe(self) -> str:
        return (
            f"rotary table: {self.complex_key!r} holds the cosines and sines {self.cos_key!r}, {self.sin_key!r} "
            f"({self.layout})"
        )


@dataclass(slots=True)
class Pairing:
    pairs: list[LeafPair]
    left_out: list[LeftOut] = field(default_factory=list)
    trivial: bool = False
    # rotary tables that hold the same numbers in another form (one tensor against two), compared from full tensors
    tables: list[TablePair] = field(default_factory=list)


def dtype_kind(dtype: str) -> str:
    if dtype == "bool":
        return "b"
    if "float" in dtype:
        return "f"
    if "complex" in dtype:
        return "c"
    return "i"


def _padded(shape: list[int], rank: int) -> list[int]:
    return [1] * (rank - len(shape)) + list(shape)


def rows_of(shape: list[int] | tuple[int, ...] | None) -> tuple[int, int] | None:
    """(elements, width) of a shape, the width its last dimension other than 1: equal for the same rows in another
    grid (`[1, 16, 16, 32]` and `[1, 256, 32]`; `[1, 32, 1, 1]` and `[1, 32]`), which the callers take only across
    ranks (a shape of the same rank with the same elements is a transpose)."""
    if not shape:
        return None
    width = next((size for size in reversed(shape) if size != 1), 1)
    return (math.prod(shape), width)


def shape_relation(reference: list[int], candidate: list[int]) -> tuple[str, int | None, int | None]:
    """(relation, dimension, count) of two shapes; see the module docstring."""
    if reference == candidate:
        return SAME, None, None
    rank = max(len(reference), len(candidate))
    ref, cand = _padded(reference, rank), _padded(candidate, rank)
    if ref == cand:
        return BROADCAST, None, None
    if len(reference) != len(candidate) and rows_of(reference) == rows_of(candidate):
        # NOTE: the same rows in another grid: timm's Swin keeps [B, H, W, C] where transformers keeps [B, H*W, C],
        # timm's ConvNeXt head norms [B, C, 1, 1] where transformers' norms [B, C]; row-major, the two hold the same
        # numbers in the same order (compared reshaped, as broadcast shapes are). Only across ranks: two shapes of
        # one rank with the same elements ([1, 4, 7, 7] and [1, 7, 4, 7]) are a transpose, not a regrid
        return BROADCAST, None, None
    differing = [position for position in range(rank) if ref[position] != cand[position]]
    if len(differing) == 1 and differing[0] != rank - 1:
        dimension = differing[0]
        count = min(ref[dimension], cand[dimension])
        if count >= 1:
            return OVERLAP, dimension, count
    return DIFFERENT, None, None


def _closeness(ref: TensorSummary, cand: TensorSummary) -> float:
    if ref.mean is None or cand.mean is None or ref.std is None or cand.std is None:
        return 0.0
    scale = max(abs(ref.std), abs(cand.std), abs(ref.mean), abs(cand.mean), 1e-12)
    distance = (abs(ref.mean - cand.mean) + abs(ref.std - cand.std)) / scale
    return 1.0 / (1.0 + distance) if distance == distance else 0.0


def _last_name(key: str) -> str:
    return key.rsplit(".", 1)[-1]


_SHAPE_DTYPE = operator.attrgetter("shape", "dtype")
_KEY = operator.attrgetter("key")
_KEY_SHAPE_DTYPE = operator.attrgetter("key", "shape", "dtype")


def in_order(refs: list[TensorSummary], cands: list[TensorSummary]) -> bool:
    """Whether the pairing is one to one in order: same count, same shapes and dtypes in order, and either the
    same keys or no two tensors of a side sharing a shape (then no other pairing of equal shapes exists;
    `cos, sin` against `sin, cos` needs the scoring of `pair_leaves`). The common case, checked without
    building anything: it runs for every side of every call."""
    if len(refs) != len(cands):
        return False
    if len(refs) == 1:
        return refs[0].shape == cands[0].shape and refs[0].dtype == cands[0].dtype
    # NOTE: the common case first, in one pass: the same keys, shapes and dtypes in the same order
    if list(map(_KEY_SHAPE_DTYPE, refs)) == list(map(_KEY_SHAPE_DTYPE, cands)):
        return True
    if list(map(_SHAPE_DTYPE, refs)) != list(map(_SHAPE_DTYPE, cands)):
        return False
    return list(map(_KEY, refs)) == list(map(_KEY, cands)) or len(
        {(tuple(ref.shape), ref.dtype) for ref in refs}
    ) == len(refs)


def looks_like_probabilities(leaf: TensorSummary) -> bool:
    """Whether a tensor reads as rows of probabilities (attention weights after the softmax): non-negative, at most
    1, and a mean of 1 / its last dimension (rows summing to 1 average exactly that), from its statistics."""
    if leaf.min is None or leaf.max is None or leaf.mean is None or len(leaf.shape) < 2 or leaf.shape[-1] < 2:
        return False
    if dtype_kind(leaf.dtype) != "f" or leaf.min < 0.0 or leaf.max > 1.0 + 1e-3:
        return False
    return abs(leaf.mean * leaf.shape[-1] - 1.0) <= 1e-3


def _meanings_differ(ref: TensorSummary, cand: TensorSummary) -> bool:
    """Attention weights of another meaning (issue 30, item 6): rows of probabilities on one side, raw scores (or
    anything else) on the other, however alike their shapes; such tensors are never paired."""
    return looks_like_probabilities(ref) != looks_like_probabilities(cand)


def _single_number_of_another_role(ref: TensorSummary, cand: TensorSummary) -> bool:
    """Two one-element tensors under other names whose values differ: a shape of one number says nothing of role
    (open_clip returns `logit_scale.exp()` where CLIPModel returns the `[1, 1]` logits), so such a pair needs
    its values to agree (to 1e-3) to be formed; otherwise both are left out with their reason."""
    if math.prod(ref.shape) != 1 or math.prod(cand.shape) != 1 or _last_name(ref.key) == _last_name(cand.key):
        return False
    if ref.mean is None or cand.mean is None:
        return False
    return abs(ref.mean - cand.mean) > 1e-3 * max(abs(ref.mean), abs(cand.mean), 1e-12)


def _regridded(reference: list[int], candidate: list[int]) -> bool:
    """Whether two shapes relate only as the same rows in another grid (not equal, not broadcast)."""
    rank = max(len(reference), len(candidate))
    return len(reference) != len(candidate) and _padded(reference, rank) != _padded(candidate, rank)


def _named(key: str) -> str:
    """The last component of a key that names something (tuple and list positions name nothing)."""
    return next((part for part in reversed(key.split(".")) if part and not part.isdigit()), "")


def _regrid_of_another_role(ref: TensorSummary, cand: TensorSummary) -> bool:
    """Two tensors under other names that hold the same rows only in another grid, whose statistics lie further
    apart than either's scale: a regrid keeps the numbers, so such a pair is a guess by element count that the
    values refute (the reference's rotary `cos` `[1, T, d]` against gemma_pytorch's zero-filled `kv_cache`
    `[1, T, 1, d]`); both are left out with their reason. Tensors without names (a block's single output against
    a tuple's first) and pairs whose statistics agree still pair (timm's Swin `[B, H, W, C]` blocks)."""
    if not _regridded(list(ref.shape), list(cand.shape)):
        return False
    ref_name, cand_name = _named(ref.key), _named(cand.key)
    if not ref_name or not cand_name or ref_name == cand_name:
        return False
    if ref.mean is None or cand.mean is None or ref.std is None or cand.std is None:
        return False
    distance = abs(ref.mean - cand.mean) + abs(ref.std - cand.std)
    return distance >= max(abs(ref.std), abs(cand.std), abs(ref.mean), abs(cand.mean), 1e-12)


def pair_leaves(refs: list[TensorSummary], cands: list[TensorSummary]) -> Pairing:
    """Pair the tensors of one side of two aligned calls (see the module docstring)."""
    if in_order(refs, cands) and not any(_meanings_differ(ref, cand) for ref, cand in zip(refs, cands)):
        return Pairing([LeafPair(ref, cand, SAME) for ref, cand in zip(refs, cands)], trivial=True)
    scored = []
    for ref_position, ref in enumerate(refs):
        ref_kind = dtype_kind(ref.dtype)
        for cand_position, cand in enumerate(cands):
            if dtype_kind(cand.dtype) != ref_kind:
                continue
            relation, dimension, count = shape_relation(ref.shape, cand.shape)
            if relation == DIFFERENT:
                continue
            if _single_number_of_another_role(ref, cand) or _meanings_differ(ref, cand):
                continue
            if _regrid_of_another_role(ref, cand):
                continue
            score = _RELATION_SCORE[relation]
            if ref.key == cand.key:
                score += 1.0
            elif _last_name(ref.key) == _last_name(cand.key):
                score += 0.5
            score += _closeness(ref, cand)
            if ref_position == cand_position:
                score += 0.3
            scored.append((-score, ref_position, cand_position, relation, dimension, count))
    scored.sort()
    ref_taken: dict[int, int] = {}
    cand_taken: set[int] = set()
    pairs: list[tuple[int, LeafPair]] = []
    for _, ref_position, cand_position, relation, dimension, count in scored:
        if ref_position in ref_taken or cand_position in cand_taken:
            continue
        ref_taken[ref_position] = cand_position
        cand_taken.add(cand_position)
        pairs.append((cand_position, LeafPair(refs[ref_position], cands[cand_position], relation, dimension, count)))
    # Same key but shapes that hold different numbers: a real shape difference, compared (and failed) as such.
    ref_by_key = {ref.key: position for position, ref in enumerate(refs) if position not in ref_taken}
    for cand_position, cand in enumerate(cands):
        if cand_position in cand_taken:
            continue
        ref_position = ref_by_key.pop(cand.key, None)
        if ref_position is not None:
            ref_taken[ref_position] = cand_position
            cand_taken.add(cand_position)
            pairs.append((cand_position, LeafPair(refs[ref_position], cand, DIFFERENT)))
    if not pairs and refs and cands:
        ref_position = next((position for position, ref in enumerate(refs) if dtype_kind(ref.dtype) == "f"), 0)
        cand_position = next((position for position, cand in enumerate(cands) if dtype_kind(cand.dtype) == "f"), 0)
        # NOTE: weights of another meaning are left out even here: comparing them would fail a correct port
        if not _meanings_differ(refs[ref_position], cands[cand_position]):
            ref_taken[ref_position] = cand_position
            cand_taken.add(cand_position)
            pairs.append((cand_position, LeafPair(refs[ref_position], cands[cand_position], DIFFERENT)))
    pairs.sort(key=lambda item: item[0])
    left_out = [
        LeftOut("reference", ref.key, ref.shape, _why_left_out(ref, cands, "candidate"))
        for position, ref in enumerate(refs)
        if position not in ref_taken
    ]
    left_out += [
        LeftOut("candidate", cand.key, cand.shape, _why_left_out(cand, refs, "reference"))
        for position, cand in enumerate(cands)
        if position not in cand_taken
    ]
    return Pairing([pair for _, pair in pairs], left_out)


def _why_left_out(leaf: TensorSummary, others: list[TensorSummary], other_side: str) -> str:
    kind = dtype_kind(leaf.dtype)
    alike = [
        other
        for other in others
        if dtype_kind(other.dtype) == kind and list(other.shape) == list(leaf.shape) and _meanings_differ(leaf, other)
    ]
    if alike:
        meaning = "rows of probabilities" if looks_like_probabilities(leaf) else "not rows of probabilities"
        return (
            f"{meaning}, unlike the {other_side}'s {alike[0].key!r} of the same shape (attention weights of another "
            "meaning: scores before the softmax against probabilities after it)"
        )
    refuted = [other for other in others if dtype_kind(other.dtype) == kind and _regrid_of_another_role(leaf, other)]
    if refuted:
        return (
            f"the {other_side}'s {refuted[0].key!r} holds as many rows in another grid under another name, but its "
            "statistics say other numbers"
        )
    fitting = [
        other
        for other in others
        if dtype_kind(other.dtype) == kind and shape_relation(leaf.shape, other.shape)[0] != DIFFERENT
    ]
    if fitting:
        return (
            f"the {other_side}'s tensors of a fitting shape ({', '.join(repr(other.key) for other in fitting[:3])}) "
            "pair better with others"
        )
    return f"no {leaf.dtype} tensor of a fitting shape in the {other_side}"
