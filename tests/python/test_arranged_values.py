"""Values made of repeated copies (`diff/arranged.py`, issue 30): statistics cannot see how copies are arranged
(key heads tiled `0, 1, 0, 1` against repeated `0, 0, 1, 1`), so the first line whose statistics differ is the one
consuming them; the line that made the copies is named beside it. Records are made here from real arrays with
the statistics a trace records (sample std); the corpus case is mistral-kv_heads_tiled in test_port_verdicts.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modeltrace.diff.arranged import arranged_inputs
from modeltrace.trace.records import LineRecord, TensorSummary

SOURCE = """def attention(query, keys, cache):
    keys = tile(keys, 2)
    key = keys.transpose(1, 2)
    cache = tile(cache, 2)
    query = query * 2.0
    scores = query @ key + cache.sum()
"""


def _record(file: Path, line: int, name: str, values: np.ndarray) -> LineRecord:
    summary = TensorSummary(
        key=name,
        shape=list(values.shape),
        dtype="float32",
        mean=float(values.mean()),
        std=float(values.std(ddof=1)),
        min=float(values.min()),
        max=float(values.max()),
    )
    return LineRecord(str(file), line, name, 0, summary)


def test_the_line_that_made_copies_of_a_value_the_differing_line_reads_is_named(tmp_path: Path) -> None:
    file = tmp_path / "model.py"
    file.write_text(SOURCE)
    generator = np.random.default_rng(0)
    keys = generator.standard_normal((1, 7, 2, 16))
    query = generator.standard_normal((1, 4, 7, 16))
    cache = np.zeros((1, 7, 1, 16))
    tiled = np.tile(keys, (1, 1, 2, 1))
    body = [
        _record(file, 1, "query", query),
        _record(file, 1, "keys", keys),
        _record(file, 1, "cache", cache),
        _record(file, 2, "keys", tiled),
        _record(file, 3, "key", tiled.transpose(0, 2, 1, 3)),
        _record(file, 4, "cache", np.tile(cache, (1, 1, 2, 1))),
        _record(file, 5, "query", query * 2.0),
        _record(file, 6, "scores", (query * 2.0) @ tiled.transpose(0, 2, 3, 1)),
    ]
    # `key` was made of copies of `keys` on line 2 (the transpose on line 3 keeps its numbers); `query` was
    # computed (other numbers), and the zero-filled cache's copies say nothing (all its values are equal)
    assert arranged_inputs(body, len(body) - 1) == (("key", str(file), 2),)
    # a line reading only computed values names nothing
    assert arranged_inputs(body, 6) == ()
