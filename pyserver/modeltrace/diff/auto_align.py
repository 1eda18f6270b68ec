"""Automatic alignment of two implementations whose module names and nesting differ.

A research implementation rarely shares transformers' names (`blocks.3.attn.wq` / `layers.3.self_attn.q_proj`)
or its nesting (a wrapper more or less, a `ModuleDict` never called). This aligner uses no path names. Each pair
of calls gets one score in [0, 1] from evidence:

- **kind** (`diff/kinds.py`): linear, norm, embedding, attention, MLP, block… from the class name's vocabulary
  and what the call takes; different known kinds nearly veto a pair;
- **signatures**: the first input's and first output's shapes, compared up to leading 1s (`[7, 64]` and
  `[1, 7, 64]` hold the same numbers); a shared last dimension is partial evidence (a last-position head);
- **values**: the first output's mean and std, relative to its spread (a port with copied weights reproduces
  them to ~1e-6; downstream of a bug they differ, so values add evidence and never veto);
- **weights**: a port's weights are copied from the reference, so a module whose own parameters hold the same
  values (the fixed-position samples a trace records per parameter, `ModuleBuild`), directly or transposed
  (transformers' `Conv1D` against `nn.Linear`), is the same module; different weights add nothing (random
  weights, or a weight not copied: the bug being looked for);
- **structure**: the layer index (the integers of the path: the repetition, not a name) and call order, which
  the sequence alignment below keeps.

Calls are aligned in the order they started (a pre-order walk of each call tree) by a weighted longest common
subsequence: pairs keep their order, extra calls on either side (wrappers, dropout, an extra rotary module) are
skipped for free. Children left over inside aligned parents are then paired regardless of order (q/k/v called in
another order), and a fused module is matched with the run of modules it replaces (`qkv` against `q`, `k`, `v`;
`gate_up` against `gate`, `up`), on either side, when their output widths add up and their inputs agree.
Calls align to module pairs by majority; every pair carries its confidence and evidence, and pairs below the
threshold are left unaligned with the best candidates they were refused against.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from modeltrace.diff.call_scores import (
    KIND_MISMATCH as _KIND_MISMATCH,
    RESHAPED as _RESHAPED,
    SHAPE_MISMATCH as _SHAPE_MISMATCH,
    WEIGHTS as _WEIGHTS,
    CallFeatures,
    Codes as _Codes,
    score_rows as _score_rows,
    weights_score as _weights_score,
)
from modeltrace.diff.chains import chain_runs
from modeltrace.diff.kinds import NO_OP, UNKNOWN, kind_of
from modeltrace.diff.nesting import contradicted
from modeltrace.diff.pairing import rows_of
from modeltrace.diff.weight_evidence import (
    built_order,
    keeps_construction_order,
    leftover_weight_pairs,
    repaired,
    unique_weight_pairs,
)
from modeltrace.trace.records import ModuleCall, Trace


DEFAULT_THRESHOLD = 0.5
# NOTE: below this a pair is never taken by the sequence alignment (it would only add noise to the order)
_FLOOR = 0.3
# NOTE: a stretch between anchors keeps an (N+1)×(M+1) float32 table: 5,000 × 5,000 calls is 100 MB
_MAX_CELLS = 60_000_000
_BAND = 0.1
_BAND_MIN = 128
# NOTE: stretches between anchors up to this many pairs are aligned in plain Python, all scored at once
_SMALL = 4096
# NOTE: how much better an order-free pairing of siblings must score in all to replace the ordered one
_REORDER_GAIN = 0.1
# NOTE: sibling groups up to this many pairs may be re-paired against their call order (scored pair by pair)
_REORDER_MAX_PAIRS = 1024
_INTEGER = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


@dataclass
class ModulePair:
    """Reference module(s) aligned with candidate module(s): one-to-one, or one side a fused module against a
    run of modules on the other (compared on the concatenation along the last dimension), or, with `chain`, one
    side a module against a run of modules on the other that it computes in sequence (compared on the run's
    first inputs and last outputs: `diff/chains.py`)."""

    reference: list[str]
    candidate: list[str]
    confidence: float
    evidence: str
    line: int | None = None  # where a mapping file gave it
    chain: bool = False
    # the positions compared where one side's output is a slice of the other's (a last-position head)
    overlap: str | None = None

    @property
    def fused(self) -> bool:
        return (len(self.reference) > 1 or len(self.candidate) > 1) and not self.chain


@dataclass
class Leftover:
    """A module left unaligned, with the best candidates it was refused against and why."""

    side: str
    path: str
    candidates: list[tuple[str, float, str]] = field(default_factory=list)


@dataclass
class ModuleMapping:
    pairs: list[ModulePair]
    leftovers: list[Leftover] = field(default_factory=list)
    threshold: float = DEFAULT_THRESHOLD
    source: str = "automatic"


def _normalised(shape: list[int]) -> tuple[int, ...]:
    """The shape without leading 1s: broadcasting makes `[1, 7, 64]` and `[7, 64]` hold the same numbers."""
    start = 0
    while start < len(shape) - 1 and shape[start] == 1:
        start += 1
    return tuple(shape[start:])


def _weight_fingerprints(trace: Trace) -> dict[str, tuple[tuple, tuple]]:
    """Per module path: its own non-constant parameters' samples (sorted, so that names do not matter), directly
    and with 2-D parameters transposed. Traces without builds (older ones, debugger outputs) give none."""
    found = {}
    for build in getattr(trace, "builds", None) or []:
        # NOTE: a constant parameter (a norm's initial ones, a zero bias) identifies nothing: every norm has one
        parameters = [
            parameter
            for parameter in build.parameters
            if parameter.kind == "parameter" and parameter.shared_with is None and len(set(parameter.sample)) > 1
        ]
        if not parameters:
            continue
        direct = tuple(sorted(tuple(parameter.sample) for parameter in parameters))
        transposed = tuple(sorted(tuple(parameter.sample_transposed or parameter.sample) for parameter in parameters))
        found[build.path] = (direct, transposed)
    return found


def features(trace: Trace) -> list[CallFeatures]:
    records = trace.modules
    weights = _weight_fingerprints(trace)
    has_children = [False] * len(records)
    for record in records:
        if 0 <= record.parent < len(records):
            has_children[record.parent] = True
    found = []
    for record in records:
        first_out = record.outputs[0] if record.outputs else None
        first_in = record.inputs[0] if record.inputs else None
        found.append(
            CallFeatures(
                kind=kind_of(record, not has_children[record.index]),
                output_shape=_normalised(first_out.shape) if first_out else None,
                input_shape=_normalised(first_in.shape) if first_in else None,
                mean=first_out.mean if first_out else None,
                std=first_out.std if first_out else None,
                layer=tuple(int(number) for number in _INTEGER.findall(record.path)),
                input_mean=first_in.mean if first_in else None,
                input_std=first_in.std if first_in else None,
                weights=weights[record.path][0] if record.path in weights else None,
                weights_transposed=weights[record.path][1] if record.path in weights else None,
            )
        )
    return found


def _shape_score(left: tuple[int, ...] | None, right: tuple[int, ...] | None) -> float:
    if left is None or right is None:
        # NOTE: unknown, not different: a debugger output records outputs of leaf modules only
        return 0.5
    if left == right:
        return 1.0
    if left and right and len(left) != len(right) and rows_of(left) == rows_of(right):
        return _RESHAPED  # the same rows in another grid ([B, H, W, C] against [B, H*W, C])
    if left and right and left[-1] == right[-1] and len(left) == len(right):
        return 0.6  # the same width over other positions: a last-position head, a subset of tokens
    return 0.0


def _values_score(ref: CallFeatures, cand: CallFeatures) -> float | None:
    """How close the first outputs' mean and std are, relative to their spread: 1 within 1e-3, 0 from 1 on."""
    return _moments_score(ref.mean, ref.std, cand.mean, cand.std)


def _same_inputs(ref: CallFeatures, cand: CallFeatures) -> float:
    """1 when the first inputs' mean and std agree to 1e-3 of their spread (upstream of anything the calls
    compute), else 0: near misses are noise, not evidence."""
    score = _moments_score(ref.input_mean, ref.input_std, cand.input_mean, cand.input_std)
    return 1.0 if score is not None and score >= 0.99 else 0.0


def _moments_score(
    ref_mean: float | None, ref_std: float | None, cand_mean: float | None, cand_std: float | None
) -> float | None:
    if ref_mean is None or cand_mean is None or ref_std is None or cand_std is None:
        return None
    spread = max(abs(ref_std), abs(cand_std), 1e-12)
    distance = (abs(ref_mean - cand_mean) + abs(ref_std - cand_std)) / spread
    if distance <= 1e-3:
        return 1.0
    return max(0.0, 1.0 - math.log10(distance / 1e-3) / 3.0)


def pair_score(ref: CallFeatures, cand: CallFeatures) -> tuple[float, str]:
    """The score of one pair and the evidence, as a short text."""
    parts: dict[str, float] = {
        "output": _shape_score(ref.output_shape, cand.output_shape),
        "input": _shape_score(ref.input_shape, cand.input_shape),
        "layer": 1.0 if ref.layer == cand.layer else (0.5 if not ref.layer or not cand.layer else 0.0),
    }
    values = _values_score(ref, cand)
    if values is not None:
        parts["values"] = values
    weights = _weights_score(ref, cand)
    if weights is not None:
        parts["weights"] = weights
    total_weight = sum(_WEIGHTS[name] for name in parts)
    score = sum(_WEIGHTS[name] * value for name, value in parts.items()) / total_weight
    if NO_OP in (ref.kind, cand.kind):
        # NOTE: a no-op never anchors a pair: its output is its input, so its values match whatever its input
        # matches (an Identity k_norm "equals" a k_proj downstream of the same tensor); issue 30, item 3
        score = 0.0
    if parts["output"] == 0:
        score *= _SHAPE_MISMATCH  # different numbers: at most part of a fused pair, never one-to-one
    if ref.kind == cand.kind and ref.kind != UNKNOWN:
        kind_text = f"kind {ref.kind}"
    elif UNKNOWN in (ref.kind, cand.kind):
        score *= 0.8
        kind_text = f"kind {ref.kind}/{cand.kind}"
    else:
        score *= _KIND_MISMATCH
        kind_text = f"kinds differ ({ref.kind}/{cand.kind})"
    evidence = [kind_text]
    evidence.append(
        "output "
        + _shape_text(cand.output_shape)
        + ("" if parts["output"] == 1 else f" vs {_shape_text(ref.output_shape)}")
    )
    if values is not None:
        evidence.append("values equal" if values == 1 else f"values {values:.2f}")
    if weights:
        evidence.append("weights equal" if ref.weights == cand.weights else "weights equal transposed")
    if ref.layer or cand.layer:
        evidence.append("same layer" if parts["layer"] == 1 else "layer differs")
    return score, ", ".join(evidence)


def _outputs_agree(ref: CallFeatures, cand: CallFeatures) -> bool:
    """Whether two calls' outputs agree as far as their statistics tell (or cannot be told apart)."""
    values = _values_score(ref, cand)
    return values is None or values >= 0.99


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return "-" if shape is None else "[" + ", ".join(str(size) for size in shape) + "]"


def _anchors(codes: _Codes) -> list[tuple[int, int, float]]:
    """(candidate, reference) calls that are the only ones of their kind, output and input shapes and layer index
    on each side, scoring at least the threshold, and keeping their order (the longest increasing run of them)."""

    def keys(side: dict[str, np.ndarray]) -> list[tuple[int, ...]]:
        return list(zip(side["kind"].tolist(), side["out"].tolist(), side["in"].tolist(), side["layer"].tolist()))

    def unique(side_keys: list[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
        counts: dict[tuple[int, ...], int] = defaultdict(int)
        for key in side_keys:
            counts[key] += 1
        return {key: index for index, key in enumerate(side_keys) if counts[key] == 1 and key[0] not in (0, 1)}

    cand_unique, ref_unique = unique(keys(codes.cand)), unique(keys(codes.ref))
    candidates = sorted((index, ref_unique[key]) for key, index in cand_unique.items() if key in ref_unique)
    if not candidates:
        return []
    scores = _score_rows(
        codes, np.array([c for c, _ in candidates]), np.array([r for _, r in candidates]), paired=True
    ).tolist()
    kept = [(cand, ref, score) for (cand, ref), score in zip(candidates, scores) if score >= DEFAULT_THRESHOLD]
    return _increasing_run(kept)


def _increasing_run(pairs: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The longest run of `pairs` (sorted by their first item) whose second items increase (patience sorting)."""
    tails: list[int] = []  # tails[k]: position in `pairs` of the smallest tail of an increasing run of length k+1
    back = [-1] * len(pairs)
    for position, (_, value, _) in enumerate(pairs):
        low, high = 0, len(tails)
        while low < high:
            middle = (low + high) // 2
            if pairs[tails[middle]][1] < value:
                low = middle + 1
            else:
                high = middle
        back[position] = tails[low - 1] if low > 0 else -1
        if low == len(tails):
            tails.append(position)
        else:
            tails[low] = position
    run = []
    position = tails[-1] if tails else -1
    while position >= 0:
        run.append(pairs[position])
        position = back[position]
    return run[::-1]


def _small_alignments(codes: _Codes, segments: list[tuple[int, int, int, int]]) -> list[tuple[int, int, float]]:
    """`_sequence_alignment` of many small stretches: every pair of every stretch scored in one NumPy call, each
    table filled in plain Python (a few dozen cells)."""
    if not segments:
        return []
    rows, columns = [], []
    for cand_start, cand_stop, ref_start, ref_stop in segments:
        for cand_index in range(cand_start, cand_stop):
            rows.extend([cand_index] * (ref_stop - ref_start))
            columns.extend(range(ref_start, ref_stop))
    flat = _score_rows(codes, np.array(rows), np.array(columns), paired=True).tolist()
    pairs = []
    offset = 0
    for cand_start, cand_stop, ref_start, ref_stop in segments:
        height, width = cand_stop - cand_start, ref_stop - ref_start
        scores = [flat[offset + row * width : offset + (row + 1) * width] for row in range(height)]
        offset += height * width
        table = [[0.0] * (width + 1) for _ in range(height + 1)]
        for row in range(1, height + 1):
            previous, current, row_scores = table[row - 1], table[row], scores[row - 1]
            for column in range(1, width + 1):
                score = row_scores[column - 1]
                diagonal = previous[column - 1] + score if score >= _FLOOR else -1.0
                current[column] = max(previous[column], current[column - 1], diagonal)
        row, column = height, width
        found = []
        while row > 0 and column > 0:
            value = table[row][column]
            if value == table[row - 1][column]:
                row -= 1
            elif value == table[row][column - 1]:
                column -= 1
            else:
                found.append((cand_start + row - 1, ref_start + column - 1, scores[row - 1][column - 1]))
                row -= 1
                column -= 1
        pairs.extend(reversed(found))
    return pairs


def _sequence_alignment(codes: _Codes, cand_range: slice, ref_range: slice) -> list[tuple[int, int, float]]:
    """Weighted longest common subsequence of two stretches of the call orders: pairs (candidate, reference,
    score) keeping the order, each pair scoring at least `_FLOOR`, gaps free.

    With free gaps, D[i][j] is the running maximum over j of max(D[i-1][j], D[i-1][j-1] + S[i][j]), so a row is
    a few NumPy operations. In a long stretch, pairs are scored only near the diagonal (relative positions at
    most `_BAND` of the longer stretch apart, never fewer than `_BAND_MIN` calls): a wrapper more or less, or a
    module missing on one side, shift positions by a few percent. Left of a row's band D[i][j] = D[i-1][j];
    right of it, the band's last value or D[i-1][j]."""
    count_cand, count_ref = cand_range.stop - cand_range.start, ref_range.stop - ref_range.start
    if count_cand * count_ref > _MAX_CELLS:
        raise ValueError(
            f"automatic alignment handles stretches of up to {_MAX_CELLS:,} call pairs between calls "
            f"it can pair for sure; these traces have one of {count_cand:,} × {count_ref:,}: give a "
            "mapping file (--mapping) or --map rules"
        )
    table = np.zeros((count_cand + 1, count_ref + 1), dtype=np.float32)
    scores = np.full((count_cand, count_ref), -np.inf, dtype=np.float32)
    half_width = max(_BAND_MIN, int(_BAND * max(count_ref, count_cand)))
    bands = []
    chunk = 256
    for start in range(0, count_cand, chunk):
        stop = min(start + chunk, count_cand)
        low = max(0, int(start * count_ref / count_cand) - half_width)
        high = min(count_ref, int(stop * count_ref / count_cand) + half_width + 1)
        block = _score_rows(
            codes,
            slice(cand_range.start + start, cand_range.start + stop),
            slice(ref_range.start + low, ref_range.start + high),
        )
        scores[start:stop, low:high] = np.where(block >= _FLOOR, block, -np.inf)
        bands.extend([(low, high)] * (stop - start))
    for row in range(1, count_cand + 1):
        previous, current = table[row - 1], table[row]
        low, high = bands[row - 1]
        current[: low + 1] = previous[: low + 1]
        segment = np.maximum(previous[low + 1 : high + 1], previous[low:high] + scores[row - 1, low:high])
        segment[0] = max(segment[0], previous[low])
        np.maximum.accumulate(segment, out=current[low + 1 : high + 1])
        np.maximum(previous[high + 1 :], current[high], out=current[high + 1 :])
    pairs = []
    row, column = count_cand, count_ref
    while row > 0 and column > 0:
        value = table[row, column]
        if value == table[row - 1, column]:
            row -= 1
        elif value == table[row, column - 1]:
            column -= 1
        else:
            pairs.append(
                (cand_range.start + row - 1, ref_range.start + column - 1, float(scores[row - 1, column - 1]))
            )
            row -= 1
            column -= 1
    pairs.reverse()
    return pairs


def align_calls(
    reference: Trace, candidate: Trace
) -> tuple[dict[int, tuple[int, float]], list[CallFeatures], list[CallFeatures], _Codes]:
    """Candidate call index -> (reference call index, score), from the sequence alignment and the order-free
    pass over children of aligned parents; with both sides' features and their codes."""
    ref_features, cand_features = features(reference), features(candidate)
    count_ref, count_cand = len(ref_features), len(cand_features)
    codes = _Codes(ref_features, cand_features)
    matched: dict[int, tuple[int, float]] = {}
    # NOTE: anchors split the sequence alignment into small independent pieces: calls whose kind, signatures
    # and layer index occur once on each side (a layer's block, its attention, its MLP) pair with each other
    # when they keep their order; the alignment then runs between consecutive anchors, so two 5,000-call
    # traces cost a few thousand small tables (scored in one NumPy call) instead of one 5,000 × 5,000 one.
    anchors = _anchors(codes)
    segments = []
    previous_cand, previous_ref = 0, 0
    for cand_anchor, ref_anchor, score in [*anchors, (count_cand, count_ref, 0.0)]:
        if cand_anchor > previous_cand and ref_anchor > previous_ref:
            segments.append((previous_cand, cand_anchor, previous_ref, ref_anchor))
        if cand_anchor < count_cand:
            matched[cand_anchor] = (ref_anchor, score)
        previous_cand, previous_ref = cand_anchor + 1, ref_anchor + 1
    small = [segment for segment in segments if (segment[1] - segment[0]) * (segment[3] - segment[2]) <= _SMALL]
    for cand_index, ref_index, score in _small_alignments(codes, small):
        matched[cand_index] = (ref_index, score)
    for cand_start, cand_stop, ref_start, ref_stop in segments:
        if (cand_stop - cand_start) * (ref_stop - ref_start) > _SMALL:
            for cand_index, ref_index, score in _sequence_alignment(
                codes, slice(cand_start, cand_stop), slice(ref_start, ref_stop)
            ):
                matched[cand_index] = (ref_index, score)
    # NOTE: the roots always correspond: the two models were called with the same inputs
    if count_ref and count_cand and 0 not in matched:
        matched[0] = (0, pair_score(ref_features[0], cand_features[0])[0])
    _pair_leftover_children(reference, candidate, ref_features, cand_features, matched)
    return matched, ref_features, cand_features, codes


def _children(trace: Trace) -> dict[int, list[int]]:
    found: dict[int, list[int]] = defaultdict(list)
    for record in trace.modules:
        found[record.parent].append(record.index)
    return found


def _pair_leftover_children(
    reference: Trace,
    candidate: Trace,
    ref_features: list[CallFeatures],
    cand_features: list[CallFeatures],
    matched: dict[int, tuple[int, float]],
) -> None:
    """Children of each aligned parent pair, paired again regardless of order where that scores better: the
    ordered pass keeps call order, but two codebases may call siblings in another order (the position and
    segment embeddings, q/k/v) or leave some over. Children whose partner lies elsewhere (under a wrapper) are
    left alone; unless the total gains clearly, and the parents' outputs agree, the ordered pairs stay."""
    ref_children, cand_children = _children(reference), _children(candidate)
    built = (built_order(reference), built_order(candidate))
    partner_of = {ref_index: cand_index for cand_index, (ref_index, _) in matched.items()}
    for cand_parent, (ref_parent, _) in list(matched.items()):
        cand_kids, ref_kids = cand_children.get(cand_parent, []), ref_children.get(ref_parent, [])
        if not cand_kids or not ref_kids:
            continue
        ref_set, cand_set = set(ref_kids), set(cand_kids)
        free_cand = [c for c in cand_kids if c not in matched or matched[c][0] in ref_set]
        free_ref = [r for r in ref_kids if r not in partner_of or partner_of[r] in cand_set]
        if len(free_cand) * len(free_ref) > _REORDER_MAX_PAIRS:
            # NOTE: a long run of siblings (a model's 384 layers) keeps its order; only its leftovers are paired
            free_cand = [c for c in free_cand if c not in matched]
            free_ref = [r for r in free_ref if r not in partner_of]
        if not free_cand or not free_ref or (len(free_cand) == 1 and len(free_ref) == 1 and free_cand[0] in matched):
            continue
        current = {c: matched[c] for c in free_cand if c in matched}
        scores = {(c, r): pair_score(ref_features[r], cand_features[c])[0] for c in free_cand for r in free_ref}
        # NOTE: which evidence may re-pair siblings against their call order: where the parents' outputs agree
        # (the port computes the same thing, its children in another order), the children's whole scores;
        # where they differ, the values that would re-pair the children may be the bug itself (gate and up
        # weights swapped), so only what is upstream of any bug in them: their inputs (position ids into the
        # position embedding, token type ids into the segment embedding), and first their own parameters where
        # each equals exactly one sibling's (`F.silu(self.w3(x)) * self.w1(x)`: w3 holds up_proj's weights).
        # Weights, call order and construction order then vote: a re-pairing by weights holds only where both
        # sides built the re-paired modules in the same order (Meta builds w1 before w3 as transformers builds
        # gate_proj before up_proj: the forward calls them in another order). Where construction agrees with
        # call order instead, the weights are what is wrong (a converter loading up_proj into w1): order stays.
        if _outputs_agree(ref_features[ref_parent], cand_features[cand_parent]):
            rules: list[tuple[bool, Callable[[int, int], float]]] = [(False, lambda c, r: scores[c, r])]
        else:
            same_weights = unique_weight_pairs(free_ref, free_cand, ref_features, cand_features)

            def upstream(c: int, r: int) -> float:
                return _same_inputs(ref_features[r], cand_features[c])

            rules = [(True, lambda c, r: upstream(c, r) + float((r, c) in same_weights))] if same_weights else []
            rules.append((False, upstream))
        for by_weights, evidence_of in rules:
            chosen = repaired(current, scores, evidence_of, _FLOOR, _REORDER_GAIN)
            if chosen is None:
                continue
            changed = [(r, c) for c, (r, _) in chosen.items() if current.get(c, (None,))[0] != r]
            pairs = [(reference.modules[r].path, candidate.modules[c].path) for r, c in changed]
            if by_weights and not keeps_construction_order(pairs, *built):
                continue
            for cand_index, (ref_index, _) in current.items():
                del matched[cand_index]
                partner_of.pop(ref_index, None)
            matched.update(chosen)
            partner_of.update({ref_index: cand_index for cand_index, (ref_index, _) in chosen.items()})
            break


def _module_pairs(
    reference: Trace,
    candidate: Trace,
    matched: dict[int, tuple[int, float]],
    ref_features: list[CallFeatures],
    cand_features: list[CallFeatures],
    threshold: float,
) -> tuple[list[ModulePair], set[str], set[str]]:
    """Calls aligned into module pairs by majority (each path on one side pairs with the path its calls aligned
    with most often), with the mean score of those calls as the confidence."""
    votes: dict[tuple[str, str], list[float]] = defaultdict(list)
    evidence: dict[tuple[str, str], str] = {}
    for cand_index, (ref_index, score) in matched.items():
        key = (reference.modules[ref_index].path, candidate.modules[cand_index].path)
        votes[key].append(score)
        if key not in evidence:
            evidence[key] = pair_score(ref_features[ref_index], cand_features[cand_index])[1]
    pairs: list[ModulePair] = []
    taken_ref: set[str] = set()
    taken_cand: set[str] = set()
    for (ref_path, cand_path), scores in sorted(votes.items(), key=lambda item: (-len(item[1]), -sum(item[1]))):
        if ref_path in taken_ref or cand_path in taken_cand:
            continue
        confidence = sum(scores) / len(scores)
        # NOTE: the roots are paired whatever their score: both models were called with the same inputs, and the
        # root's outputs (the logits, the embeddings) are what every user checks; a low score only means their
        # outputs are laid out differently (open_clip's tuple against CLIPModel's output), which pairing by role
        # and value sorts out
        if confidence < threshold and (ref_path, cand_path) != ("", ""):
            continue
        taken_ref.add(ref_path)
        taken_cand.add(cand_path)
        pairs.append(ModulePair([ref_path], [cand_path], round(confidence, 3), evidence[(ref_path, cand_path)]))
    return pairs, taken_ref, taken_cand


def _fused_pairs(
    reference: Trace, candidate: Trace, pairs: list[ModulePair], taken_ref: set[str], taken_cand: set[str]
) -> list[ModulePair]:
    """A fused module on one side against a run of sibling modules on the other, under aligned parents: the
    same input, output widths adding up, and the run's combined output statistics equal to the fused one's
    when both have values."""
    found = []
    cand_to_ref = {pair.candidate[0]: pair.reference[0] for pair in pairs}
    ref_to_cand = {value: key for key, value in cand_to_ref.items()}
    for fused_trace, run_trace, taken_fused, taken_run, counterpart_of, fused_is_candidate in (
        (candidate, reference, taken_cand, taken_ref, cand_to_ref, True),
        (reference, candidate, taken_ref, taken_cand, ref_to_cand, False),
    ):
        run_children = _children(run_trace)
        first_call = _first_calls(run_trace)
        for record in fused_trace.modules:
            if record.path in taken_fused or record.call_index != 0 or record.parent < 0:
                continue
            counterpart = counterpart_of.get(fused_trace.modules[record.parent].path)
            if counterpart is None or counterpart not in first_call:
                continue
            siblings = [
                run_trace.modules[index]
                for index in run_children.get(first_call[counterpart], [])
                if run_trace.modules[index].path not in taken_run
            ]
            run = _matching_run(record, siblings, _weight_moments(fused_trace), _weight_moments(run_trace))
            if run is None:
                continue
            confidence, evidence, members = run
            taken_run.update(item.path for item in members)
            taken_fused.add(record.path)
            paths = [item.path for item in members]
            found.append(
                ModulePair(paths, [record.path], confidence, evidence)
                if fused_is_candidate
                else ModulePair([record.path], paths, confidence, evidence)
            )
    return found


# NOTE: a parent is paired through its children only when at least this many of them align, all inside one parent
_MIN_ALIGNED_CHILDREN = 2


def _parent_pairs(
    reference: Trace,
    candidate: Trace,
    pairs: list[ModulePair],
    taken_ref: set[str],
    taken_cand: set[str],
    ref_features: list[CallFeatures],
    cand_features: list[CallFeatures],
) -> list[ModulePair]:
    """Unaligned modules whose aligned children all align inside one unaligned module on the other side, and whose
    outputs hold the same numbers: that module is their counterpart, whatever its layer index says (transformers'
    Swin merges patches at the end of stage N, timm at the start of stage N+1) and however its outputs differ
    (the bug may be in its own code). Repeated upwards while new pairs appear."""
    found: list[ModulePair] = []
    ref_first, cand_first = _first_calls(reference), _first_calls(candidate)
    cand_children = _children(candidate)
    changed = True
    while changed:
        changed = False
        partner = {
            cand: ref
            for pair in [*pairs, *found]
            if not pair.fused
            for cand, ref in [(pair.candidate[0], pair.reference[0])]
        }
        confidence_of = {pair.candidate[0]: pair.confidence for pair in [*pairs, *found] if not pair.fused}
        for path, index in cand_first.items():
            if not path or path in taken_cand or cand_features[index].kind == NO_OP:
                continue
            kids = [candidate.modules[kid].path for kid in cand_children.get(index, [])]
            aligned = [kid for kid in dict.fromkeys(kids) if kid in partner]
            if len(aligned) < _MIN_ALIGNED_CHILDREN:
                continue
            parents = {
                reference.modules[reference.modules[ref_first[partner[kid]]].parent].path
                if reference.modules[ref_first[partner[kid]]].parent >= 0
                else None
                for kid in aligned
            }
            if len(parents) != 1:
                continue
            ref_path = parents.pop()
            if not ref_path or ref_path in taken_ref or ref_path not in ref_first:
                continue
            ref_feature, cand_feature = ref_features[ref_first[ref_path]], cand_features[index]
            if (
                ref_feature.kind == NO_OP
                or _shape_score(ref_feature.output_shape, cand_feature.output_shape) < _RESHAPED
            ):
                continue
            confidence = round(sum(confidence_of[kid] for kid in aligned) / len(aligned), 3)
            evidence = (
                f"children aligned inside it: {', '.join(aligned)}; output {_shape_text(cand_feature.output_shape)}"
            )
            found.append(ModulePair([ref_path], [path], confidence, evidence))
            taken_ref.add(ref_path)
            taken_cand.add(path)
            changed = True
    return found


def _chain_pairs(
    reference: Trace, candidate: Trace, pairs: list[ModulePair], taken_cand: set[str]
) -> list[ModulePair]:
    """Candidate modules left unaligned that compute what a run of reference modules computes in sequence
    (`diff/chains.py`), paired with that run; the run's members keep their own pairs.

    NOTE: the run on the reference side only: a run on the candidate side would add a candidate record called at
    its first member's line and returning its last member's output, which the line drill-down reads as that
    line's tensor (a loop's `x = layer(x)` compared, at its first iteration, with the reference's encoder output)."""
    partners = {
        pair.candidate[0]: (tuple(pair.reference), pair.confidence)
        for pair in pairs
        if not pair.fused and len(pair.candidate) == 1
    }
    found = []
    for chain in chain_runs(candidate, reference, partners, taken_cand):
        taken_cand.add(chain.module)
        found.append(ModulePair(list(chain.run), [chain.module], chain.confidence, chain.evidence, chain=True))
    return found


def _same_input(left: ModuleCall, right: ModuleCall) -> bool:
    first, second = left.inputs[0], right.inputs[0]
    if _normalised(first.shape) != _normalised(second.shape):
        return False
    if first.mean is None or second.mean is None or first.std is None or second.std is None:
        return True
    spread = max(abs(first.std), abs(second.std), 1e-12)
    return abs(first.mean - second.mean) + abs(first.std - second.std) <= 1e-3 * spread


def _weight_moments(trace: Trace) -> dict[str, tuple[int, float, float]]:
    """Per module path: element count, mean and std of its largest own parameter (its weight), for telling a
    fused weight from the concatenation of the weights it replaces."""
    found = {}
    for build in getattr(trace, "builds", None) or []:
        summaries = [
            parameter.summary
            for parameter in build.parameters
            if parameter.kind == "parameter"
            and parameter.summary.mean is not None
            and parameter.summary.std is not None
        ]
        if summaries:
            largest = max(summaries, key=lambda summary: math.prod(summary.shape))
            found[build.path] = (math.prod(largest.shape), largest.mean, largest.std)
    return found


def pooled_moments(moments: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Mean and std of a concatenation, from its parts' counts, means and stds."""
    total = sum(count for count, _, _ in moments)
    mean = sum(count * value for count, value, _ in moments) / total
    squares = sum((count - 1) * std * std + count * value * value for count, value, std in moments)
    return mean, math.sqrt(max((squares - total * mean * mean) / max(total - 1, 1), 0.0))


def _matching_run(
    fused: ModuleCall,
    siblings: list[ModuleCall],
    fused_weights: dict[str, tuple[int, float, float]],
    run_weights: dict[str, tuple[int, float, float]],
) -> tuple[float, str, list[ModuleCall]] | None:
    """The siblings, in call order, that take the fused call's input and whose outputs, concatenated on the last
    dimension, have its shape: (confidence, evidence, members), or None. Siblings taking another input (an
    activation between `gate` and `up`, `down` after them) are passed over."""
    if not fused.outputs or not fused.inputs:
        return None
    target = fused.outputs[0].shape
    eligible = [
        item
        for item in siblings
        if item.outputs
        and item.inputs
        and item.call_index == 0
        and len(item.outputs[0].shape) == len(target)
        and item.outputs[0].shape[:-1] == target[:-1]
        and item.outputs[0].shape[-1] < target[-1]
        and _same_input(item, fused)
    ]
    for start in range(len(eligible)):
        members, width = [], 0
        for item in eligible[start:]:
            members.append(item)
            width += item.outputs[0].shape[-1]
            if width >= target[-1]:
                break
        if len(members) < 2 or width != target[-1]:
            continue
        evidence = f"fused: {fused.path} {_shape_text(tuple(target))} is the concatenation of " + " + ".join(
            f"{item.path} [{item.outputs[0].shape[-1]}]" for item in members
        )
        combined = _combined_moments(members)
        confidence = 0.75
        if combined is not None and fused.outputs[0].mean is not None and fused.outputs[0].std is not None:
            mean, std = combined
            spread = max(std, fused.outputs[0].std, 1e-12)
            distance = (abs(mean - fused.outputs[0].mean) + abs(std - fused.outputs[0].std)) / spread
            if distance < 1e-3:
                confidence = 0.95
                evidence += ", combined values equal"
            elif distance > 0.1:
                confidence = 0.6
                evidence += ", combined values differ"
        if fused.path in fused_weights and all(item.path in run_weights for item in members):
            count, mean, std = fused_weights[fused.path]
            parts = [run_weights[item.path] for item in members]
            pooled_mean, pooled_std = pooled_moments(parts)
            if count == sum(part[0] for part in parts) and abs(pooled_mean - mean) + abs(
                pooled_std - std
            ) <= 1e-5 * max(std, 1e-12):
                confidence = max(confidence, 0.95)
                evidence += ", weights concatenated"
        return confidence, evidence, members
    return None


def _combined_moments(members: list[ModuleCall]) -> tuple[float, float] | None:
    """Mean and std of the concatenation of the members' first outputs, from their own moments."""
    moments = []
    for item in members:
        summary = item.outputs[0]
        if summary.mean is None or summary.std is None:
            return None
        moments.append((math.prod(summary.shape), summary.mean, summary.std))
    return pooled_moments(moments)


def _leftovers(
    reference: Trace,
    candidate: Trace,
    pairs: list[ModulePair],
    ref_features: list[CallFeatures],
    cand_features: list[CallFeatures],
    codes: _Codes,
    threshold: float,
) -> list[Leftover]:
    """Modules of either side in no pair, each with its best three candidates on the other side and why they
    were refused (scored all at once with NumPy; the evidence text only for the three)."""
    paired = {
        "reference": {path for pair in pairs for path in pair.reference},
        "candidate": {path for pair in pairs for path in pair.candidate},
    }
    first = {"reference": _first_calls(reference), "candidate": _first_calls(candidate)}
    features_of = {"reference": ref_features, "candidate": cand_features}
    found = []
    for side, other in (("reference", "candidate"), ("candidate", "reference")):
        own = [(path, index) for path, index in first[side].items() if path not in paired[side]]
        targets = list(first[other].items())
        if not own or not targets:
            found.extend(Leftover(side, path) for path, _ in own)
            continue
        own_indices = np.array([index for _, index in own])
        target_indices = np.array([index for _, index in targets])
        # NOTE: `_score_rows` scores candidate rows against reference columns
        scores = (
            _score_rows(codes, own_indices, target_indices)
            if side == "candidate"
            else _score_rows(codes, target_indices, own_indices).T
        )
        count = min(3, scores.shape[1])
        best = np.argpartition(-scores, count - 1, axis=1)[:, :count]
        best = np.take_along_axis(best, np.argsort(-np.take_along_axis(scores, best, axis=1), axis=1), axis=1)
        for row, (path, index) in enumerate(own):
            options = []
            for column in best[row]:
                other_path, other_index = targets[column]
                if side == "reference":
                    score, evidence = pair_score(features_of[side][index], features_of[other][other_index])
                else:
                    score, evidence = pair_score(features_of[other][other_index], features_of[side][index])
                why = (
                    f"below the threshold {threshold}"
                    if score < threshold
                    else "its counterpart is paired with another module"
                    if other_path in paired[other]
                    else "the calls aligned elsewhere"
                )
                options.append((other_path, round(score, 3), f"{evidence}; {why}"))
            found.append(Leftover(side, path, options))
    return found


def _first_calls(trace: Trace) -> dict[str, int]:
    first: dict[str, int] = {}
    for record in trace.modules:
        first.setdefault(record.path, record.index)
    return first


def align_modules(reference: Trace, candidate: Trace, threshold: float = DEFAULT_THRESHOLD) -> ModuleMapping:
    """The module mapping between two traces, found without names."""
    matched, ref_features, cand_features, codes = align_calls(reference, candidate)
    pairs, taken_ref, taken_cand = _module_pairs(reference, candidate, matched, ref_features, cand_features, threshold)
    ref_first, cand_first = _first_calls(reference), _first_calls(candidate)
    dropped = contradicted(
        [(pair.reference[0], pair.candidate[0]) for pair in pairs],
        lambda ref, cand: _outputs_agree(ref_features[ref_first[ref]], cand_features[cand_first[cand]]),
    )
    pairs = [pair for pair in pairs if (pair.reference[0], pair.candidate[0]) not in dropped]
    taken_ref.difference_update(ref for ref, _ in dropped)
    taken_cand.difference_update(cand for _, cand in dropped)
    pairs.extend(_fused_pairs(reference, candidate, pairs, taken_ref, taken_cand))
    pairs.extend(_parent_pairs(reference, candidate, pairs, taken_ref, taken_cand, ref_features, cand_features))
    left_ref = {path: index for path, index in _first_calls(reference).items() if path not in taken_ref}
    left_cand = {path: index for path, index in _first_calls(candidate).items() if path not in taken_cand}
    for ref_path, cand_path, evidence, overlap in leftover_weight_pairs(
        reference, candidate, left_ref, left_cand, ref_features, cand_features
    ):
        # NOTE: identical weights are as sure as the best sequence pairs; a slice of the positions is still the module
        pairs.append(ModulePair([ref_path], [cand_path], 0.9, evidence, overlap=overlap))
        taken_ref.add(ref_path)
        taken_cand.add(cand_path)
    pairs.extend(_chain_pairs(reference, candidate, pairs, taken_cand))
    order = {record.path: record.index for record in reversed(candidate.modules)}
    pairs.sort(key=lambda pair: order.get(pair.candidate[0], 1 << 60))
    leftovers = _leftovers(reference, candidate, pairs, ref_features, cand_features, codes, threshold)
    return ModuleMapping(pairs, leftovers, threshold)
