"""The line drill-down's rules on hand-made line records (statistics as the worker's recorder computes them):
masks built in several lines, compared by how many entries they mask."""

from __future__ import annotations

import torch

from modeltrace.diff.lines import _by_order
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
