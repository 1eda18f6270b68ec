"""The worker's job pauses the cyclic collector from when its model is built to its end
(`collector.collector_paused`): what it makes meanwhile holds no reference cycles and goes when the job returns.
Whatever the job does, the caller gets the collector back as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from modeltrace.worker.job import JobFailed, run_trace_job
from modeltrace.worker.messages import TraceRequest

RECIPE = """\
import torch
from torch import nn

class Probe(nn.Module):
    def forward(self, hidden):
        if hidden.shape[0] == {fail_at}:
            raise ValueError("Probe: a batch of {fail_at} is refused")
        return hidden * 2

def build_model():
    return nn.Sequential(nn.Linear(4, 4), Probe()).eval()

def build_inputs(model):
    return (torch.ones({batch}, 4),)
"""


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was_enabled:
            gc.disable()


def _job(tmp_path: Path, batch: int, fail_at: int = -1) -> object:
    recipe = tmp_path / f"recipe_{batch}.py"
    recipe.write_text(RECIPE.format(batch=batch, fail_at=fail_at))
    request = TraceRequest(file=str(recipe), recipe=str(recipe), out=str(tmp_path / f"run_{batch}.mtrace"))
    return run_trace_job(request, lambda _message: None)


def test_the_collector_is_back_after_a_job_that_succeeds_or_fails(tmp_path: Path, collector_enabled: None) -> None:
    result = _job(tmp_path, batch=2)
    assert Path(result.trace, "trace.msgpack").is_file()
    assert gc.isenabled()
    with pytest.raises(JobFailed, match="a batch of 3 is refused"):
        _job(tmp_path, batch=3, fail_at=3)
    assert gc.isenabled()


def test_a_collector_the_caller_paused_stays_paused(tmp_path: Path, collector_enabled: None) -> None:
    gc.disable()
    try:
        _job(tmp_path, batch=2)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_model_outlives_its_job_until_the_next_one_starts(tmp_path: Path, collector_enabled: None) -> None:
    """A worker's child answers and ends with `os._exit`: the job leaves its model referenced instead of freeing its
    weights before the answer (`job._finished_models`); the next job lets it go, with no collection needed (nothing
    the capture made holds it in a reference cycle)."""
    import weakref

    from modeltrace.worker import job

    _job(tmp_path, batch=2)
    (kept,) = job._finished_models
    model = weakref.ref(kept.model)
    del kept
    gc.disable()
    try:
        assert model() is not None
        _job(tmp_path, batch=4)
        assert model() is None
        assert len(job._finished_models) == 1
    finally:
        gc.enable()
