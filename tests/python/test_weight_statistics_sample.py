"""The statistics of a large weight: runs of consecutive elements (`builds.statistics_sample`), which reach every
row and column of the weight while reading a small part of its memory, and compare with a trace from before the
runs by the sample alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from modeltrace.diff.settings import compare_parameters
from modeltrace.worker.builds import (
    MAX_EXACT_STATISTICS,
    STATISTICS_ELEMENTS,
    STATISTICS_RUN,
    parameter_records,
    record_builds,
    statistics_sample,
)
from modeltrace.worker.stats import summarize


def _positions(shape: tuple[int, ...]) -> np.ndarray:
    stride, run = statistics_sample(shape)
    starts = np.arange(int(np.prod(shape)) // stride) * stride
    return (starts[:, None] + np.arange(run)).reshape(-1)


# NOTE: a medium Llama's projections and embedding, a wide lm_head, a convolution's kernel, a row length that is a
# power of two times the run (where a stride of a multiple of it would read the same columns of every row)
@pytest.mark.parametrize("shape", [(1536, 512), (512, 1536), (1024, 512), (4096, 4096), (256, 128, 3, 3), (300, 700)])
def test_the_runs_reach_every_row_and_column_inside_the_weight(shape: tuple[int, ...]) -> None:
    positions = _positions(shape)
    count = int(np.prod(shape))
    row = shape[-1]
    assert STATISTICS_ELEMENTS <= positions.size <= 2 * STATISTICS_ELEMENTS
    assert len(set(positions.tolist())) == positions.size and positions.max() < count
    assert set((positions % row).tolist()) == set(range(row))
    rows = count // row
    if rows <= STATISTICS_ELEMENTS // STATISTICS_RUN:
        assert set((positions // row).tolist()) == set(range(rows))
    # NOTE: the point of the runs: few cache lines of the weight's memory are read
    lines = len(set((positions * 4 // 64).tolist()))
    assert lines <= 2 * STATISTICS_ELEMENTS // STATISTICS_RUN < count * 4 // 64 // 4


def test_a_large_weight_has_the_statistics_of_its_runs() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(512, 1536)
    assert layer.weight.numel() > MAX_EXACT_STATISTICS
    records = {record.name: record for record in parameter_records(layer)[""]}
    weight = records["weight"]
    stride, run = statistics_sample((1536, 512))
    assert (weight.statistics_stride, weight.statistics_run) == (stride, run) and run == STATISTICS_RUN
    values = layer.weight.detach().numpy().reshape(-1)[_positions((1536, 512))].astype(np.float64)
    assert weight.summary.shape == [1536, 512]
    assert weight.summary.mean == pytest.approx(values.mean(), abs=1e-9)
    assert weight.summary.std == pytest.approx(values.std(ddof=1), rel=1e-7)
    assert (weight.summary.min, weight.summary.max) == (values.min(), values.max())
    # a small parameter keeps its exact statistics
    assert (records["bias"].statistics_stride, records["bias"].statistics_run) == (1, 1)


def _builds(layer: nn.Module) -> dict[str, object]:
    return {build.path: build for build in record_builds(layer)}


def test_a_row_changed_outside_the_value_sample_differs_by_its_statistics() -> None:
    torch.manual_seed(0)
    reference = nn.Linear(512, 1536)
    candidate = nn.Linear(512, 1536)
    candidate.load_state_dict(reference.state_dict())
    assert compare_parameters(_builds(reference)[""], _builds(candidate)[""]) == []
    # NOTE: a row the 32-value sample does not touch (it decides first when it does): every row is in the runs
    sampled_rows = {
        int(value)
        for value in np.nonzero(
            np.isin(candidate.weight.detach().numpy(), _builds(reference)[""].parameters[0].sample)
        )[0]
    }
    row = next(index for index in range(1536) if index not in sampled_rows)
    with torch.no_grad():
        candidate.weight[row] *= 3.0
    differences = compare_parameters(_builds(reference)[""], _builds(candidate)[""])
    assert [(difference.name, difference.note) for difference in differences] == [
        ("weight", "statistics differ (sample agrees)")
    ]


def test_a_trace_from_before_the_runs_compares_by_its_sample() -> None:
    """A weight recorded the old way (every stride-th element, `statistics_run` 1) against the same weight
    recorded now: the statistics are over other elements, so they are not compared, and the sample agrees."""
    torch.manual_seed(0)
    layer = nn.Linear(512, 1536)
    now = _builds(layer)[""]
    weight = now.parameters[0]
    stride = weight.summary.shape[0] * weight.summary.shape[1] // STATISTICS_ELEMENTS
    old_summary = summarize(layer.weight.detach().reshape(-1)[::stride], "weight")
    old_summary.shape = [1536, 512]
    assert old_summary.mean != weight.summary.mean
    old_weight = dataclasses.replace(weight, summary=old_summary, statistics_stride=stride, statistics_run=1)
    before = dataclasses.replace(now, parameters=[old_weight, *now.parameters[1:]])
    assert compare_parameters(before, now) == []
    # and read back from a trace written before the field existed
    data = old_weight.to_json()
    del data["statistics_run"]
    assert type(old_weight).from_json(data).statistics_run == 1


class _Mixed(nn.Module):
    """Every kind of tensor a fingerprint meets: large and small float32 weights, a norm's weight of ones (equal
    values: the general path), a tied weight, a float64 and an integer buffer, a transposed (non-contiguous)
    parameter, a one-element scale, an empty buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(300, 256)
        self.proj = nn.Linear(256, 512)
        self.norm = nn.LayerNorm(512)
        self.head = nn.Linear(256, 300, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("table", torch.randn(40, 3, dtype=torch.float64))
        self.register_buffer("positions", torch.arange(70_000))
        self.register_buffer("nothing", torch.zeros(0))
        self.transposed = nn.Parameter(torch.randn(700, 130).t())
        self.scale = nn.Parameter(torch.tensor([2.0]))


def _fingerprint_rows(records: dict) -> dict:
    return {
        path: [
            (
                record.name,
                record.kind,
                record.shared_with,
                record.statistics_stride,
                record.statistics_run,
                record.sample,
                record.sample_transposed,
                record.summary.shape,
                record.summary.dtype,
                record.summary.min,
                record.summary.max,
                record.summary.positive_fraction,
            )
            for record in module_records
        ]
        for path, module_records in records.items()
    }


def test_the_native_batch_gives_the_records_of_one_weight_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from modeltrace.worker import builds, native

    if not (native.kernels() or {}).get("f32_fingerprints"):
        pytest.skip(f"no native kernel here ({native.load_error or native.form})")
    torch.manual_seed(0)
    model = _Mixed()
    batched = builds.ParameterFingerprints(model)
    # embed and head (tied: recorded under both), proj and norm weight and bias; not the others
    assert len(batched._items) == 6
    records = batched.records()
    monkeypatch.setattr(builds, "_fingerprint_batch", lambda: None)
    one_at_a_time = builds.parameter_records(model)
    assert _fingerprint_rows(records) == _fingerprint_rows(one_at_a_time)
    for path, module_records in records.items():
        for record, expected in zip(module_records, one_at_a_time[path], strict=True):
            for statistic in ("mean", "std"):
                got, want = getattr(record.summary, statistic), getattr(expected.summary, statistic)
                assert got == want if want is None else got == pytest.approx(want, rel=1e-12, abs=1e-15, nan_ok=True)
    assert records["embed"][0].statistics_run == STATISTICS_RUN and records["norm"][0].summary.std == 0.0
