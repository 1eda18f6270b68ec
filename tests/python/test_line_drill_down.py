"""The line drill-down's rules on hand-made line records (statistics as the worker's recorder computes them):
masks built in several lines, compared by how many entries they mask; values compared element by element where
the full tensors are stored; a name assigned again right after."""

from __future__ import annotations

from dataclasses import replace

import torch

from modeltrace.diff.lines import FullValues, _by_order
from modeltrace.trace.records import LineRecord
from modeltrace.worker.stats import summarize

REFERENCE, CANDIDATE = "/ref/modeling_x.py", "/port/model.py"
T = 7


def _record(file: str, line: int, name: str, value: torch.Tensor) -> LineRecord:
    return LineRecord(file, line, name, 0, summarize(value, ""), module_call=0)


def _reference() -> list[LineRecord]:
    """transformers' way: the embeddings, then a [1, 1, T, T] causal mask written with the dtype's minimum."""
    torch.manual_seed(0)
    embeddings = torch.randn(1, T, 16)
    minimum = torch.finfo(torch.float32).min
    mask = torch.full((T, T), minimum).triu(1)[None, None]
    return [
        _record(REFERENCE, 10, "input_ids", torch.arange(T)[None]),
        _record(REFERENCE, 11, "inputs_embeds", embeddings),
        _record(REFERENCE, 12, "causal_mask", mask),
        _record(REFERENCE, 13, "hidden_states", embeddings * 2),
    ]


def _candidate(ids: str, steps: list[tuple[int, str, torch.Tensor]], last_line: int) -> list[LineRecord]:
    """The port's forward: its ids and embeddings, the lines that build its mask, then a differing value."""
    torch.manual_seed(0)
    embeddings = torch.randn(1, T, 16)
    return [
        _record(CANDIDATE, 20, ids, torch.arange(T)[None]),
        _record(CANDIDATE, 21, "h", embeddings),
        *(_record(CANDIDATE, line, name, value) for line, name, value in steps),
        _record(CANDIDATE, last_line, "h", embeddings * 3),
    ]


def _meta_mask(diagonal: int) -> list[LineRecord]:
    """Meta's Llama: a matrix of -inf, `torch.triu(mask, diagonal)`, `torch.hstack([zeros, mask])`."""
    full = torch.full((T, T), float("-inf"))
    upper = torch.triu(full, diagonal=diagonal)
    steps = [(23, "mask", full), (25, "mask", upper), (27, "mask", torch.hstack([torch.zeros(T, 0), upper]))]
    return _candidate("tokens", steps, 30)


def _mistral_mask(diagonal: int) -> list[LineRecord]:
    """Mistral's reference: a matrix of ones, `torch.tril(tensor, diagonal)`, `torch.log(mask)`."""
    ones = torch.ones(T, T)
    lower = torch.tril(ones, diagonal=diagonal)
    steps = [
        (23, "tensor", ones),
        (29, "mask", lower),
        (30, "mask", torch.triu(lower, diagonal=-100)),
        (31, "mask", torch.log(lower)),
    ]
    return _candidate("input_ids", steps, 33)


def _drill(candidate: list[LineRecord]):
    reference = _reference()
    return _by_order(reference, reference[1:], candidate[1:], 1e-4)


def test_a_mask_built_in_several_lines_is_named_where_its_masked_entries_are_decided() -> None:
    found = _drill(_meta_mask(diagonal=2))
    assert found is not None
    assert (found.line, found.name) == (25, "mask")
    assert found.since == 23
    assert "masks 15 of 49 entries vs 21" in found.reason


def test_a_zero_one_matrix_turned_into_a_mask_is_named_where_its_zeros_are_decided() -> None:
    found = _drill(_mistral_mask(diagonal=1))
    assert found is not None
    assert (found.line, found.name) == (29, "mask")


def test_a_mask_written_with_minus_infinity_matches_one_written_with_the_dtype_minimum() -> None:
    """The intermediates (-inf everywhere, a 0/1 matrix) are not differences; the next value is."""
    for candidate in (_meta_mask(diagonal=1), _mistral_mask(diagonal=0)):
        found = _drill(candidate)
        assert found is not None
        assert found.name == "h" and found.line in (30, 33), found


def test_a_mask_passed_down_does_not_move_past_the_values_computed_before_it() -> None:
    """The candidate's attention receives its mask first; the reference records its mask after the queries: the
    match of the masks must not pass the queries over."""
    torch.manual_seed(0)
    hidden, query = torch.randn(1, T, 16), torch.randn(1, T, 16)
    minimum = torch.finfo(torch.float32).min
    reference = [
        _record(REFERENCE, 40, "hidden_states", hidden),
        _record(REFERENCE, 41, "query_states", query),
        _record(REFERENCE, 42, "causal_mask", torch.full((T, T), minimum).triu(1)[None, None]),
    ]
    candidate = [
        _record(CANDIDATE, 60, "x", hidden),
        _record(CANDIDATE, 60, "mask", torch.full((T, T), float("-inf")).triu(1)),
        _record(CANDIDATE, 62, "xq", query * 1.5),
    ]
    found = _by_order(reference, reference[1:], candidate[1:], 1e-4)
    assert found is not None
    assert (found.line, found.name) == (62, "xq")


class _Store:
    """Full tensors by name, as a trace's tensors file gives them."""

    def __init__(self, arrays: dict[str, torch.Tensor]) -> None:
        self.arrays = arrays

    def get(self, name: str):
        return self.arrays[name].numpy()


def _stored(file: str, line: int, name: str, value: torch.Tensor, key: str) -> LineRecord:
    record = _record(file, line, name, value)
    return replace(record, tensor=replace(record.tensor, tensor=key))


def test_the_same_numbers_in_another_order_differ_where_the_full_tensors_say() -> None:
    """Swin's patch merging concatenating the 2x2 neighbours in another order: the statistics agree, the elements
    do not; the line whose stored value (the norm's input, `[1, 64, 64]` against `[1, 8, 8, 64]`) is out of
    order is named."""
    torch.manual_seed(0)
    grid = torch.randn(1, 16, 16, 16)
    merged = grid.reshape(1, 8, 2, 8, 2, 16).permute(0, 1, 3, 4, 2, 5).flatten(3)
    swapped = grid.reshape(1, 8, 2, 8, 2, 16).permute(0, 1, 3, 2, 4, 5).flatten(3)
    reference = [
        _stored(REFERENCE, 641, "x", grid, "r0"),
        _stored(REFERENCE, 656, "x", merged, "r1"),
    ]
    candidate = [
        _stored(CANDIDATE, 309, "input_feature", grid.reshape(1, 256, 16), "c0"),
        _record(CANDIDATE, 318, "input_feature", swapped),
        _stored(CANDIDATE, 321, "input_feature", swapped.reshape(1, 64, 64), "c1"),
    ]
    store = {"r0": grid, "r1": merged, "c0": grid.reshape(1, 256, 16), "c1": swapped.reshape(1, 64, 64)}
    full = FullValues(_Store(store), _Store(store), 1e-4)
    assert _by_order(reference, reference[1:], candidate[1:], 1e-4) is None  # statistics alone see nothing
    found = _by_order(reference, reference[1:], candidate[1:], 1e-4, full=full)
    assert found is not None
    assert (found.line, found.name) == (321, "input_feature")
    assert "element by element" in found.reason
    right = {**store, "c1": merged.reshape(1, 64, 64)}
    candidate[-1] = _stored(CANDIDATE, 321, "input_feature", merged.reshape(1, 64, 64), "c1")
    assert (
        _by_order(reference, reference[1:], candidate[1:], 1e-4, full=FullValues(_Store(right), _Store(right), 1e-4))
        is None
    )


def test_a_name_assigned_again_right_after_is_compared_by_its_last_value() -> None:
    """`attn_mask = a - b` then `attn_mask = attn_mask.masked_fill(...)`: the reference's one line computes the
    second value; the first is an intermediate, not a difference."""
    torch.manual_seed(0)
    regions = torch.randint(0, 3, (4, 16)).float()
    difference = regions[:, None, :] - regions[:, :, None]
    mask = difference.masked_fill(difference != 0, -100.0)
    hidden = torch.randn(4, 16, 8)
    reference = [
        _record(REFERENCE, 570, "x", hidden),
        _record(REFERENCE, 578, "attn_mask", mask),
        _record(REFERENCE, 590, "x", hidden * 2),
    ]
    candidate = [
        _record(CANDIDATE, 540, "hidden_states", hidden),
        _record(CANDIDATE, 605, "attn_mask", difference),
        _record(CANDIDATE, 606, "attn_mask", mask),
        _record(CANDIDATE, 560, "hidden_states", hidden * 3),
    ]
    found = _by_order(reference, reference[1:], candidate[1:], 1e-4)
    assert found is not None
    assert (found.line, found.name) == (560, "hidden_states")


def test_a_line_that_only_lays_a_value_out_again_does_not_start_the_stretch(tmp_path) -> None:
    """ConvNeXt's layer scale skipped before a permute that timm applies after it: the permuted value is right,
    but the stretch that holds the cause starts after the line that computed it, not after the permute."""
    port = tmp_path / "port.py"
    port.write_text(
        "def forward(x, gamma):\n"
        "    y = x * 2\n"
        "    if gamma is None:\n"
        "        y = y * gamma\n"
        "    y = y.permute(0, 2, 1)\n"
        "    y = y + x.permute(0, 2, 1)\n"
        "    return y\n"
    )
    torch.manual_seed(0)
    x, gamma = torch.randn(1, 4, 8), torch.rand(4, 1) + 0.5
    reference = [
        _record(REFERENCE, 9, "x", x),
        _record(REFERENCE, 10, "x", x * 2),
        _record(REFERENCE, 11, "x", (x * 2).permute(0, 2, 1)),
        _record(REFERENCE, 12, "x", (x * 2 * gamma).permute(0, 2, 1)),
        _record(REFERENCE, 13, "x", (x * 2 * gamma + x).permute(0, 2, 1)),
    ]
    candidate = [
        _record(str(port), 1, "x", x),
        _record(str(port), 2, "y", x * 2),
        _record(str(port), 5, "y", (x * 2).permute(0, 2, 1)),
        _record(str(port), 6, "y", (x * 2 + x).permute(0, 2, 1)),
    ]
    found = _by_order(reference, reference[1:], candidate[1:], 1e-4)
    assert found is not None
    assert (found.line, found.since) == (6, 3)


def test_values_only_a_line_stored_compare_element_by_element_in_calls_without_counterpart() -> None:
    """Meta's query heads interleaved where transformers' converted weights put them in halves: the same numbers in
    another order, on purpose, inside an aligned attention (its own comparison covers it). A value stored only
    because a line assigned it (no module's tensor) is compared element by element only where the line ran in a
    call without counterpart (a position bias module): there a transposed bias is the first differing line."""
    torch.manual_seed(0)
    query = torch.randn(1, 4, T, 8)
    interleaved = query.reshape(1, 4, T, 2, 4).transpose(-1, -2).reshape(1, 4, T, 8)
    reference = [_stored(REFERENCE, 20, "x", query, "r0"), _stored(REFERENCE, 21, "query_states", query, "r1")]
    candidate = [_stored(CANDIDATE, 40, "x", query, "c0"), _stored(CANDIDATE, 41, "xq", interleaved, "c1")]
    store = {"r0": query, "r1": query, "c0": query, "c1": interleaved}
    module_tensors = ({"r0"}, {"c0"})  # the lines' own values ("r1", "c1") belong to no module's inputs or outputs
    aligned = FullValues(_Store(store), _Store(store), 1e-4, module_tensors, open_calls=set())
    assert _by_order(reference, reference[1:], candidate[1:], 1e-4, full=aligned) is None
    unaligned = FullValues(_Store(store), _Store(store), 1e-4, module_tensors, open_calls={0})
    found = _by_order(reference, reference[1:], candidate[1:], 1e-4, full=unaligned)
    assert found is not None and (found.line, found.name) == (41, "xq") and found.module_call == 0
    assert "element by element" in found.reason
