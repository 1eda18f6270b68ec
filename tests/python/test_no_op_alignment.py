"""No-op calls and reshaped grids in the automatic alignment (issue 30, item 3): an Identity, Dropout, DropPath or
Flatten never pairs (its values equal whatever its input equals), and
shapes holding the same rows in another grid ([B, H, W, C] against [B, H*W, C]) align and compare as the same
numbers. The corpus verdicts (tests/python/test_port_verdicts.py, timm's Swin against transformers') run it end
to end; these pin the rules on made-up calls.
"""

from __future__ import annotations

from modeltrace.diff.auto_align import CallFeatures, _Codes, _score_rows, pair_score
from modeltrace.diff.kinds import NO_OP, is_no_op, kind_of
from modeltrace.diff.pairing import BROADCAST, DIFFERENT, SAME, looks_like_probabilities, pair_leaves, shape_relation
from modeltrace.trace.records import ModuleCall, TensorSummary


def _call(class_name: str, shape_in: list[int], shape_out: list[int], moments_in=(0.1, 1.0), moments_out=(0.1, 1.0)):
    def summary(shape: list[int], moments: tuple[float, float]) -> TensorSummary:
        return TensorSummary(key="", shape=shape, dtype="float32", mean=moments[0], std=moments[1])

    return ModuleCall(
        index=1,
        path="layers.0.x",
        class_name=class_name,
        defined_at=None,
        called_at=None,
        call_index=0,
        parent=0,
        inputs=[summary(shape_in, moments_in)],
        outputs=[summary(shape_out, moments_out)],
    )


def test_identity_dropout_drop_path_and_flatten_are_no_ops() -> None:
    for name in ("Identity", "Dropout", "Dropout2d", "SwinDropPath", "DropPath", "Flatten"):
        assert is_no_op(_call(name, [1, 4, 8], [1, 4, 8], moments_out=(0.5, 2.0))), name
        assert kind_of(_call(name, [1, 4, 8], [1, 4, 8]), True) == NO_OP
    for name in ("OmDetTurboMLPWithDropout", "DropoutLayerNorm", "IdentityBlock"):
        assert not is_no_op(_call(name, [1, 4, 8], [1, 4, 8])), name


def test_only_no_op_classes_are_no_ops_whatever_the_values() -> None:
    # a LayerScale (or any module) that returns its input unchanged by the statistics keeps its kind
    assert not is_no_op(_call("LayerScale", [1, 4, 8], [1, 4, 8]))
    assert not is_no_op(_call("Linear", [1, 4, 8], [1, 4, 16]))
    assert kind_of(_call("LayerNorm", [1, 4, 8], [1, 4, 8]), True) == "norm"


def test_a_no_op_pairs_with_nothing_even_when_its_values_equal() -> None:
    identity = CallFeatures(NO_OP, (4, 8), (4, 8), 0.1, 1.0, (0,), 0.1, 1.0)
    linear = CallFeatures("linear", (4, 8), (4, 8), 0.1, 1.0, (0,), 0.1, 1.0)
    assert pair_score(linear, identity)[0] == 0.0
    assert pair_score(linear, linear)[0] > 0.9
    codes = _Codes([linear], [identity, linear])
    scores = _score_rows(codes, slice(None))
    assert scores[0, 0] == 0.0 and scores[1, 0] > 0.9  # the NumPy form says the same


def test_the_same_rows_in_another_grid_hold_the_same_numbers() -> None:
    assert shape_relation([1, 16, 16, 32], [1, 256, 32]) == (BROADCAST, None, None)
    assert shape_relation([1, 16, 16, 32], [1, 256, 16]) == (DIFFERENT, None, None)  # another width
    grid = CallFeatures("block", (16, 16, 32), (16, 16, 32), 0.1, 1.0, (0,), 0.1, 1.0)
    rows = CallFeatures("block", (256, 32), (256, 32), 0.1, 1.0, (0,), 0.1, 1.0)
    assert pair_score(grid, rows)[0] > 0.9
    assert abs(_score_rows(_Codes([grid], [rows]), slice(None))[0, 0] - pair_score(grid, rows)[0]) < 1e-6


def _leaf(key: str, shape: list[int], mean: float, low: float, high: float) -> TensorSummary:
    return TensorSummary(key=key, shape=shape, dtype="float32", mean=mean, std=0.1, min=low, max=high)


def test_attention_probabilities_never_pair_with_raw_scores() -> None:
    """Issue 30, item 6: weights after the softmax (rows summing to 1: non-negative, mean 1/T) and scores before it
    have the same shape and another meaning; they are left out, with the reason, rather than compared."""
    probabilities = _leaf("attn_weights", [1, 2, 5, 5], 0.2, 0.0, 0.9)
    scores = _leaf("scores", [1, 2, 5, 5], 0.05, -2.0, 3.0)
    assert looks_like_probabilities(probabilities) and not looks_like_probabilities(scores)
    pairing = pair_leaves([probabilities], [scores])
    assert pairing.pairs == []
    assert [(item.owner, item.key) for item in pairing.left_out] == [
        ("reference", "attn_weights"),
        ("candidate", "scores"),
    ]
    assert "scores before the softmax against probabilities after it" in pairing.left_out[0].reason
    # the same meaning on both sides pairs as before
    assert [
        pair.relation for pair in pair_leaves([probabilities], [_leaf("w", [1, 2, 5, 5], 0.2, 0.0, 0.8)]).pairs
    ] == [SAME]


def test_a_transpose_of_the_same_rank_is_not_a_regrid() -> None:
    assert shape_relation([1, 4, 7, 7], [1, 7, 4, 7]) == (DIFFERENT, None, None)
    grid = CallFeatures("attention", (4, 7, 7), (4, 7, 7), 0.1, 1.0, (0,), 0.1, 1.0)
    swapped = CallFeatures("attention", (7, 4, 7), (7, 4, 7), 0.1, 1.0, (0,), 0.1, 1.0)
    # the same width over other positions (0.6), never the regrid score (0.9), in both forms of the score
    assert abs(pair_score(grid, swapped)[0] - _score_rows(_Codes([grid], [swapped]), slice(None))[0, 0]) < 1e-6
    assert pair_score(grid, swapped)[0] < pair_score(grid, grid)[0]


def test_a_regrid_under_other_names_needs_values_that_agree() -> None:
    """The merged corpora's gemma_pytorch case: the reference's rotary `cos` `[1, T, d]` and the port's zero-filled
    `kv_cache` `[1, T, 1, d]` hold as many rows of one width, but their statistics refute that they hold the same
    numbers; paired, the attention's inputs "differed" and the verdict climbed to the root. They are left out."""

    def named(key: str, shape: list[int], mean: float, std: float) -> TensorSummary:
        return TensorSummary(key=key, shape=shape, dtype="float32", mean=mean, std=std, min=mean - std, max=mean + std)

    hidden = named("hidden_states", [1, 7, 64], 0.0, 1.0)
    cos, cache = named("position_embeddings.0", [1, 7, 16], 0.6, 0.4), named("kv_cache.0", [1, 7, 1, 16], 0.0, 0.0)
    pairing = pair_leaves([hidden, cos], [hidden, cache])
    assert [(pair.reference.key, pair.candidate.key) for pair in pairing.pairs] == [("hidden_states", "hidden_states")]
    assert sorted(item.key for item in pairing.left_out) == ["kv_cache.0", "position_embeddings.0"]
    assert "statistics say other numbers" in pairing.left_out[0].reason
    # the same regrid whose statistics agree pairs (a block's input under another name), and so do unnamed
    # tensors (a single output against a tuple's first) whatever their values (a bug may sit in the block)
    grid = named("x", [1, 4, 4, 8], 0.1, 1.0)
    assert [pair.relation for pair in pair_leaves([named("hidden_states", [1, 16, 8], 0.1, 1.1)], [grid]).pairs] == [
        BROADCAST
    ]
    assert [
        pair.relation
        for pair in pair_leaves([named("0", [1, 16, 8], 0.8, 8.0)], [named("", [1, 4, 4, 8], 0.1, 1.0)]).pairs
    ] == [BROADCAST]
