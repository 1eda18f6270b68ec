"""Identical parameters as alignment evidence (`diff/auto_align.py`): re-pairing the children of two aligned calls
against their call order (the vote of weights, call order and construction order), and pairing modules left
unaligned whose weights are the same and whose outputs hold the same numbers or a slice of them.

Two codebases may call siblings in another order (q/k/v, the position and segment embeddings), so the aligner
pairs the children of each aligned parent pair again regardless of order where the evidence clearly says so.
Identical parameters are such evidence even where the parents' outputs differ: they are what each side holds,
upstream of any bug in the children's forward. They are weighed against call order by the order in which each
side built its modules (`named_modules()` order): two of the three agreeing tell a forward that calls its
projections in another order (weights and construction agree) from a converter that loaded them into the wrong
ones (call order and construction agree).

A module the sequence alignment could not place because its signature differs, a last-position head (`[1, 1, V]`
against `[1, T, V]`: Meta's inference code computes the logits of the last position only), still holds the
same weights as its counterpart: left over on both sides, with the same parameters (and no other module left
over holding them) and outputs that hold the same numbers, the two pair; outputs of overlapping positions pair
when the two modules' names agree too (the shapes do not say which positions a slice holds: a class token is the
first), and the diff compares them on the trailing positions they share (`pairing.OVERLAP`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from modeltrace.diff.call_scores import CallFeatures, weights_score
from modeltrace.diff.pairing import DIFFERENT, OVERLAP, LeafPair, shape_relation
from modeltrace.trace.records import Trace


def unique_weight_pairs(
    refs: list[int], cands: list[int], ref_features: list[CallFeatures], cand_features: list[CallFeatures]
) -> set[tuple[int, int]]:
    """(reference, candidate) sibling calls whose modules hold the same parameter values (directly or transposed),
    where neither call has another such partner among the siblings: a weight copied to two modules (a converter
    loading `up_proj` into both `w1` and `w3`), or one module called twice, identifies nothing, and call order
    stays the evidence."""
    ref_partners: dict[int, list[int]] = defaultdict(list)
    cand_partners: dict[int, list[int]] = defaultdict(list)
    for c in cands:
        for r in refs:
            if weights_score(ref_features[r], cand_features[c]) == 1.0:
                cand_partners[c].append(r)
                ref_partners[r].append(c)
    return {
        (found[0], c) for c, found in cand_partners.items() if len(found) == 1 and len(ref_partners[found[0]]) == 1
    }


def repaired(
    current: dict[int, tuple[int, float]],
    scores: dict[tuple[int, int], float],
    evidence_of: Callable[[int, int], float],
    floor: float,
    gain: float,
) -> dict[int, tuple[int, float]] | None:
    """The greedy order-free pairing of sibling calls (`scores[candidate, reference]`, pairs under `floor`
    refused) by `evidence_of(candidate, reference)`, ties by score, when its total evidence beats the current
    pairs' by more than `gain` (between near-equal siblings, q/k/v of random weights, the statistics differ by
    noise and call order is the better evidence); else None."""
    options = sorted(((evidence_of(c, r), score, c, r) for (c, r), score in scores.items()), reverse=True)
    chosen: dict[int, tuple[int, float]] = {}
    chosen_evidence = 0.0
    taken: set[int] = set()
    for evidence, score, cand_index, ref_index in options:
        if score < floor or cand_index in chosen or ref_index in taken:
            continue
        chosen[cand_index] = (ref_index, score)
        chosen_evidence += evidence
        taken.add(ref_index)
    current_evidence = sum(evidence_of(c, r) for c, (r, _) in current.items())
    return chosen if chosen_evidence > current_evidence + gain else None


def built_order(trace: Trace) -> dict[str, int]:
    """Module path -> its rank in the order the model was built (the builds are recorded in `named_modules()`
    order); empty for traces without builds."""
    return {build.path: rank for rank, build in enumerate(getattr(trace, "builds", None) or [])}


def keeps_construction_order(
    changed: list[tuple[str, str]], ref_order: dict[str, int], cand_order: dict[str, int]
) -> bool:
    """Whether the re-paired (reference, candidate) modules were built in the same order on both sides; an
    unknown order is no evidence for a re-pairing."""
    ranks = [(ref_order.get(ref_path), cand_order.get(cand_path)) for ref_path, cand_path in changed]
    if any(ref_rank is None or cand_rank is None for ref_rank, cand_rank in ranks):
        return False
    return all(
        (first[0] < second[0]) == (first[1] < second[1])
        for position, first in enumerate(ranks)
        for second in ranks[position + 1 :]
    )


def leftover_weight_pairs(
    reference: Trace,
    candidate: Trace,
    left_ref: dict[str, int],
    left_cand: dict[str, int],
    ref_features: list[CallFeatures],
    cand_features: list[CallFeatures],
) -> list[tuple[str, str, str, str | None]]:
    """(reference path, candidate path, evidence, overlap) for modules left unaligned on both sides (path -> first
    call) that hold the same parameters, each the only one left over on its side to hold them, and whose first
    outputs hold the same numbers or overlapping positions; `overlap` describes the positions compared (None when
    the outputs have the same numbers)."""
    # NOTE: indexed by fingerprint, not compared pair by pair: a large trace leaves thousands of modules over
    by_weights: dict[tuple, list[str]] = defaultdict(list)
    by_transposed: dict[tuple, list[str]] = defaultdict(list)
    for ref_path, ref_index in left_ref.items():
        feature = ref_features[ref_index]
        if feature.weights is not None:
            by_weights[feature.weights].append(ref_path)
            by_transposed[feature.weights_transposed or feature.weights].append(ref_path)
    matches: dict[str, list[str]] = defaultdict(list)
    ref_matches: dict[str, list[str]] = defaultdict(list)
    for cand_path, cand_index in left_cand.items():
        feature = cand_features[cand_index]
        if feature.weights is None:
            continue
        found = [
            *by_weights.get(feature.weights, ()),
            *by_weights.get(feature.weights_transposed or feature.weights, ()),
            *by_transposed.get(feature.weights, ()),
        ]
        for ref_path in dict.fromkeys(found):
            matches[cand_path].append(ref_path)
            ref_matches[ref_path].append(cand_path)
    found = []
    for cand_path, refs in matches.items():
        if len(refs) != 1 or len(ref_matches[refs[0]]) != 1:
            continue
        ref_call, cand_call = reference.modules[left_ref[refs[0]]], candidate.modules[left_cand[cand_path]]
        if not ref_call.outputs or not cand_call.outputs:
            continue
        ref_out, cand_out = ref_call.outputs[0], cand_call.outputs[0]
        relation, dimension, count = shape_relation(ref_out.shape, cand_out.shape)
        if relation == DIFFERENT:
            continue
        if relation == OVERLAP and refs[0].rsplit(".", 1)[-1] != cand_path.rsplit(".", 1)[-1]:
            # NOTE: the comparison takes the trailing positions (a last-position head); which positions a slice
            # holds is not in the shapes: open_clip's `ln_post` normalises all 17 tokens where CLIPModel's
            # `post_layernorm` normalises the class token (the first), with the same weights. A slice pairs
            # only where the module's name says it is the same one too (`lm_head` and `lm_head`)
            continue
        described = LeafPair(ref_out, cand_out, relation, dimension, count).describe()
        overlap = described.removeprefix("overlap: ") if relation == OVERLAP else None
        found.append((refs[0], cand_path, f"weights equal, outputs {described}", overlap))
    return found
