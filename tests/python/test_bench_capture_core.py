"""bench/capture_core.py, the C prototype of a per-call capture core: it must record what the engine records
(every call, its place in the call tree, its call site, its inputs' and outputs' keys, shapes and statistics),
or its row in bench_peers.py would time less work than the engine does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_bench_script
from modeltrace.worker.capture import ModuleCapture

capture_core = load_bench_script("capture_core")
bench_peers = load_bench_script("bench_peers")

pytestmark = pytest.mark.skipif(capture_core.unavailable() is not None, reason=str(capture_core.unavailable()))


def _close(found: float | None, expected: float | None) -> bool:
    if found is None or expected is None:
        return found is expected
    return abs(found - expected) <= 1e-6 * max(1.0, abs(expected))


def test_the_prototype_records_what_the_engine_records() -> None:
    model, input_ids = bench_peers.build_llama("tiny")
    with torch.no_grad(), ModuleCapture(model) as capture:
        model(input_ids)
    table = capture_core.capture_rows(model, input_ids)

    rows = table["modules"]
    assert len(rows) == len(capture.records) == 32
    for row, record in zip(rows, capture.records, strict=True):
        index, path, calls, parent, finish, where, offset, inputs, outputs = row
        assert (index, path, calls, parent, finish) == (
            record.index,
            record.path,
            record.call_index,
            record.parent,
            record.finish_order,
        )
        if record.parent >= 0:  # NOTE: the root's call site is this test, a line apart between the two captures
            assert offset == record.call_site, path
            assert table["locations"][where] == [record.called_at.file, record.called_at.line, record.called_at.column]
        for pairs, summaries in ((inputs, record.inputs), (outputs, record.outputs)):
            assert [key for key, _ in pairs] == [summary.key for summary in summaries], path
            for (_, position), summary in zip(pairs, summaries, strict=True):
                shape, dtype, mean, std, minimum, maximum, abs_max, positive, _ = table["summaries"][position]
                assert (list(shape), dtype) == (summary.shape, summary.dtype), (path, summary.key)
                for found, expected in (
                    (mean, summary.mean),
                    (std, summary.std),
                    (minimum, summary.min),
                    (maximum, summary.max),
                    (abs_max, summary.abs_max),
                    (positive, summary.positive_fraction),
                ):
                    assert _close(found, expected), (path, summary.key, found, expected)


def test_the_prototype_leaves_the_model_as_it_found_it(tmp_path: Path) -> None:
    model, input_ids = bench_peers.build_llama("tiny")
    with torch.no_grad():
        expected = model(input_ids).logits
    capture_core.run_core(model, input_ids, tmp_path)
    assert (tmp_path / "core.mtrace" / "trace.msgpack").stat().st_size > 0
    assert not any("_call_impl" in module.__dict__ for module in model.modules())
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, expected)
