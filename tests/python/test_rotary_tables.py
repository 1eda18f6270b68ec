"""A rotary table held as one complex tensor against cosines and sines (issue 30, item 9; `diff/rotary_tables.py`):
the two pair where they hold the same numbers, in the halves or the interleaved-pairs layout, and a table whose
numbers differ stays an unpaired input that names where it was produced. Tiny models in
tests/python/align_pairs/rotary_tables.py; the corpus (Meta's Llama, Mistral, gemma_pytorch against transformers)
runs the same rule in tests/python/test_port_verdicts.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeltrace.worker.client import WorkerClient
from tiny_pairs import diff_json, trace_models


MODEL_FILE = Path(__file__).parent / "align_pairs" / "rotary_tables.py"
MODELS = {
    "reference_halves": "reference_model('halves')",
    "reference_interleaved": "reference_model('interleaved')",
    "port_halves": "port_model('halves')",
    "port_interleaved": "port_model('interleaved')",
    "port_pairs": "port_model('halves', as_pairs=True)",
    "port_wrong_base": "port_model('halves', base=500.0)",
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    return trace_models(worker, tmp_path_factory.mktemp("rotary_tables"), MODEL_FILE, MODELS)


def _diff(traces: dict[str, Path], reference: str, candidate: str) -> tuple[int, dict]:
    return diff_json(traces[reference], traces[candidate])


@pytest.mark.parametrize(
    ("reference", "candidate", "layout"),
    [
        ("reference_halves", "port_halves", "halves"),
        ("reference_interleaved", "port_interleaved", "interleaved pairs"),
        ("reference_halves", "port_pairs", "halves"),
    ],
)
def test_a_complex_table_pairs_with_cosines_and_sines_that_hold_its_numbers(
    traces: dict[str, Path], reference: str, candidate: str, layout: str
) -> None:
    exit_code, document = _diff(traces, reference, candidate)
    assert exit_code == 0
    rotation = next(item for item in document["modules"] if item["path"] == "rotation")
    tables = [pair for pair in rotation["compared"]["inputs"] if pair["relation"] == "rotary"]
    assert [(pair["reference"], pair["candidate"]) for pair in tables] == [("cos + sin", "freqs_cis")]
    assert f"({layout}:" in tables[0]["how"]
    assert not [leaf for leaf in rotation["compared"]["left_out"] if leaf["key"] in ("cos", "sin", "freqs_cis")]


def test_a_table_of_other_numbers_stays_an_unpaired_input_named_where_it_was_produced(
    traces: dict[str, Path],
) -> None:
    exit_code, document = _diff(traces, "reference_halves", "port_wrong_base")
    assert exit_code == 1
    first = document["first_divergence"]
    assert first["path"] == "rotation"
    (unpaired,) = first["unpaired_inputs"]
    assert unpaired["key"] == "freqs_cis"
    assert "a rotary table whose cosines and sines differ" in unpaired["reason"]
    lines = MODEL_FILE.read_text().splitlines()
    assert "freqs_cis = torch.polar(" in lines[unpaired["produced_at"]["line"] - 1]
