"""Full tensors streamed to disk during the forward (`worker/tensor_stream.py`): a slow writer still stores every
tensor within the memory budget, a tensor changed in place after capture is stored as captured, a failing writer
(disk full) or a cancelled trace leaves no folder behind, and streamed shards read like any safetensors file.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import LlamaConfig, LlamaModel

import modeltrace
from modeltrace.errors import ModelTraceError, TraceFailed
from modeltrace.trace.records import Trace
from modeltrace.trace.reference import load_reference
from modeltrace.trace.tensors import SafetensorsStore, StreamingSafetensorsWriter, shard_paths
from modeltrace.worker.assemble import discarded_on_error, start_stream, write_captured
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest
from modeltrace.worker.tensor_stream import in_place_plan

from conftest import EXAMPLE_MODELING_FILE


def small_llama() -> tuple[LlamaModel, torch.Tensor]:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="eager",
        use_cache=False,
    )
    return LlamaModel(config).eval(), torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(0))


def streamed_trace(model: nn.Module, inputs: torch.Tensor | tuple, out: Path, budget: int) -> tuple[Path, object]:
    """Capture with full tensors streamed as `worker/job.py` does; returns the folder written and the stream."""
    stream = start_stream(out, budget)
    with (
        discarded_on_error(stream),
        torch.no_grad(),
        ModuleCapture(model, full_tensors=True, stream=stream) as capture,
    ):
        model(*inputs) if isinstance(inputs, tuple) else model(inputs)
    trace = Trace(model={"class": type(model).__name__}, modules=capture.records)
    return write_captured(trace, capture, out), stream


def copied_tensors(model: nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same capture keeping copies in memory (the path without a stream), to compare with."""
    with torch.no_grad(), ModuleCapture(model, full_tensors=True) as capture:
        model(inputs)
    return capture.tensors


@pytest.fixture
def slow_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer sleeps before each tensor: the forward outruns it."""
    write_many = StreamingSafetensorsWriter.write_many

    def throttled(self: StreamingSafetensorsWriter, tensors: Iterable[tuple]) -> None:
        tensors = list(tensors)
        time.sleep(0.02 * len(tensors))
        write_many(self, tensors)

    monkeypatch.setattr(StreamingSafetensorsWriter, "write_many", throttled)


def test_a_slow_writer_stores_every_tensor_within_the_memory_budget(slow_writer: None, tmp_path: Path) -> None:
    model, inputs = small_llama()
    expected = copied_tensors(model, inputs)
    budget = 8 * 1024  # a few of the model's tensors: the forward must wait for the writer
    folder, stream = streamed_trace(model, inputs, tmp_path / "slow.mtrace", budget)
    largest = max(tensor.numel() * tensor.element_size() for tensor in expected.values())
    assert stream.peak_queued_bytes <= max(budget, largest)
    assert stream.waited_seconds > 0  # back-pressure, not a growing queue
    assert stream.copies == 0  # nothing was changed in place: nothing was copied
    with load_reference(folder) as loaded:
        named = {
            summary.tensor
            for record in loaded.trace.modules
            for summary in (*record.inputs, *record.outputs)
            if summary.tensor is not None
        }
        assert named == set(expected)
        for name, tensor in expected.items():
            assert np.array_equal(loaded.tensors.get(name), tensor.numpy()), name
    assert sorted(path.name for path in tmp_path.iterdir()) == ["slow.mtrace"]


@pytest.fixture
def held_writer(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The writer writes nothing until the event is set (by the end of the model's forward): every captured
    tensor is still waiting in the queue when the forward changes it, however loaded the machine is."""
    write_many = StreamingSafetensorsWriter.write_many
    gate = threading.Event()

    def held(self: StreamingSafetensorsWriter, tensors: Iterable[tuple]) -> None:
        assert gate.wait(timeout=60)
        write_many(self, tensors)

    monkeypatch.setattr(StreamingSafetensorsWriter, "write_many", held)
    return gate


class InPlaceAfterCapture(nn.Module):
    """A module output changed in place by its caller after it was captured, three ways."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)
        self.third = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, done: threading.Event) -> torch.Tensor:
        hidden = self.first(x)
        hidden.add_(100.0)  # the output of `first`, changed after the capture
        other = self.second(hidden)
        other[:, 0] = -5.0  # __setitem__
        last = self.third(other)
        result = torch.relu_(last.view(-1)).view_as(last)  # through a view
        done.set()
        return result


def test_a_tensor_changed_in_place_after_capture_is_stored_as_captured(
    held_writer: threading.Event, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model, x = InPlaceAfterCapture(), torch.randn(3, 6)
    with torch.no_grad():
        first = model.first(x)
        second = model.second(first + 100.0)
        third = model.third(torch.cat([torch.full((3, 1), -5.0), second[:, 1:]], dim=1))
    folder, stream = streamed_trace(model, (x, held_writer), tmp_path / "inplace.mtrace", 1 << 20)
    assert stream.copies == 3  # the three changed tensors, and only those, were copied first
    with load_reference(folder) as loaded:
        outputs = {record.path: loaded.tensors.get(record.outputs[0].tensor) for record in loaded.trace.modules}
    assert np.array_equal(outputs["first"], first.numpy())  # without the +100
    assert np.array_equal(outputs["second"], second.numpy())  # without the -5 column
    assert np.array_equal(outputs["third"], third.numpy())  # with its negative values
    assert (outputs["third"] < 0).any()


class InPlaceOperators(nn.Module):
    """Module outputs changed in place the other ways model code writes it: an augmented assignment (the
    tensor's `__iadd__` slot), an activation module with `inplace=True` (`F.relu` calls `torch.relu_`) and a
    functional one (`F.silu(inplace=True)` calls `torch._C._nn.silu_`)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)
        self.third = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor, done: threading.Event) -> torch.Tensor:
        hidden = self.first(x)
        hidden += 100.0
        other = self.act(self.second(hidden))
        last = torch.nn.functional.silu(self.third(other), inplace=True)
        done.set()
        return last


def test_operators_and_inplace_activations_are_stored_as_captured(
    held_writer: threading.Event, tmp_path: Path
) -> None:
    """The guard wraps torch's in-place functions only while the forward runs: each change is seen, the values
    stored are those before it, and afterwards (and after a forward that raised) torch is as it was."""
    torch.manual_seed(0)
    model, x = InPlaceOperators(), torch.randn(3, 6)
    originals = (torch.Tensor.__iadd__, torch.Tensor.add_, torch.relu_, torch._C._nn.silu_, torch.nn.functional.relu_)
    with torch.no_grad():
        first = model.first(x)
        second = model.second(first + 100.0)
        third = model.third(torch.relu(second))
    folder, stream = streamed_trace(model, (x, held_writer), tmp_path / "operators.mtrace", 1 << 20)
    assert stream.copies == 3
    with load_reference(folder) as loaded:
        outputs = {record.path: loaded.tensors.get(record.outputs[0].tensor) for record in loaded.trace.modules}
    assert np.array_equal(outputs["first"], first.numpy())  # before `+= 100`
    assert np.array_equal(outputs["second"], second.numpy()) and (second < 0).any()  # before the ReLU
    assert np.array_equal(outputs["third"], third.numpy())  # before the SiLU
    assert (torch.Tensor.__iadd__, torch.Tensor.add_, torch.relu_, torch._C._nn.silu_, torch.nn.functional.relu_) == (
        originals
    )
    assert "__iadd__" not in vars(torch.Tensor) and "dropout_" not in vars(torch._VF)

    class Raises(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert torch.Tensor.add_ is not originals[1]  # wrapped while the forward runs
            raise RuntimeError("the forward failed")

    with pytest.raises(RuntimeError, match="the forward failed"):
        streamed_trace(Raises(), x, tmp_path / "raised.mtrace", 1 << 20)
    assert torch.Tensor.add_ is originals[1] and torch.relu_ is originals[2]


def _counting(function: object, calls: list[str], name: str) -> object:
    """A wrapper such as a library that traces torch's functions puts in their place (TorchLens does)."""

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(name)
        return function(*args, **kwargs)

    return counted


class WrapsTorchMidForward(nn.Module):
    """Changes its outputs in place after the capture, and wraps `torch.Tensor.mul_` during its forward, as a
    tracing library does on its first call."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)
        self.calls = calls

    def forward(self, x: torch.Tensor, done: threading.Event) -> torch.Tensor:
        hidden = self.first(x)
        hidden.add_(100.0)
        other = torch.relu_(self.second(hidden))
        torch.Tensor.mul_ = _counting(torch.Tensor.mul_, self.calls, "mul_")
        other.mul_(2.0)
        done.set()
        return other


def test_another_librarys_wrappers_of_torch_are_wrapped_not_bypassed_nor_undone(
    held_writer: threading.Event, tmp_path: Path
) -> None:
    """A library that replaced torch's in-place functions before the trace (`Tensor.add_`, `torch.relu_`) still
    sees each call during the forward, the guard still copies what they change, and its functions are where it
    put them afterwards; one it put in place during the forward (`Tensor.mul_`) stays."""
    torch.manual_seed(0)
    calls: list[str] = []
    model, x = WrapsTorchMidForward(calls), torch.randn(3, 6)
    with torch.no_grad():
        first = model.first(x)
        second = model.second(first + 100.0)
    in_place_plan()  # NOTE: torch's functions listed before the library replaced some, as after an earlier trace
    torch_add_, torch_relu_, torch_mul_ = torch.Tensor.add_, torch.relu_, torch.Tensor.mul_
    library_add_ = _counting(torch_add_, calls, "add_")
    library_relu_ = _counting(torch_relu_, calls, "relu_")
    torch.Tensor.add_, torch.relu_ = library_add_, library_relu_
    try:
        folder, stream = streamed_trace(model, (x, held_writer), tmp_path / "library.mtrace", 1 << 20)
        assert calls == ["add_", "relu_", "mul_"]  # the library saw every call made during the forward
        assert stream.copies == 2  # the outputs of `first` and `second`, before `add_` and before `relu_`
        with load_reference(folder) as loaded:
            outputs = {record.path: loaded.tensors.get(record.outputs[0].tensor) for record in loaded.trace.modules}
        assert np.array_equal(outputs["first"], first.numpy())  # before the library's `add_`
        assert np.array_equal(outputs["second"], second.numpy()) and (second < 0).any()  # before its `relu_`
        assert torch.Tensor.add_ is library_add_ and torch.relu_ is library_relu_  # put back as found
        assert torch.Tensor.mul_ is not torch_mul_ and torch.Tensor.mul_.__name__ == "counted"  # the forward's, kept
    finally:
        # NOTE: `add_` and `mul_` are inherited from `torch._C.TensorBase`: deleted, they are found there again
        torch.relu_ = torch_relu_
        for name in ("add_", "mul_"):
            if name in vars(torch.Tensor):
                delattr(torch.Tensor, name)
    assert torch.Tensor.mul_ is torch_mul_ and torch.Tensor.add_ is torch_add_


class ChangesAfterOtherThread(nn.Module):
    """Captures its first output, lets another thread's capture start and end, then changes that output in place."""

    def __init__(self, started: threading.Event, other_done: threading.Event) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.started, self.other_done = started, other_done

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        self.started.set()
        assert self.other_done.wait(timeout=60)
        hidden.add_(100.0)  # still guarded: this thread's capture is active
        return hidden


def test_a_capture_on_another_thread_ending_leaves_this_ones_guard(tmp_path: Path) -> None:
    """Two full-tensor captures on two threads: the one that ends first leaves torch's functions wrapped for the
    other, whose output changed in place afterwards is stored as captured; both put torch back once ended."""
    torch.manual_seed(0)
    started, other_done = threading.Event(), threading.Event()
    model, x = ChangesAfterOtherThread(started, other_done), torch.randn(3, 6)
    with torch.no_grad():
        expected = model.first(x)
    results: dict[str, object] = {}

    def first_thread() -> None:
        results["first"] = streamed_trace(model, x, tmp_path / "first.mtrace", 1 << 20)

    def second_thread() -> None:
        assert started.wait(timeout=60)
        try:
            other, other_x = small_llama()
            results["second"] = streamed_trace(other, other_x, tmp_path / "second.mtrace", 1 << 20)
        finally:
            other_done.set()

    threads = [threading.Thread(target=first_thread), threading.Thread(target=second_thread)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert set(results) == {"first", "second"}
    folder, stream = results["first"]
    assert stream.copies == 1 and not stream.stale
    with load_reference(folder) as loaded:
        stored = loaded.tensors.get(loaded.trace.modules[1].outputs[0].tensor)
    assert loaded.trace.modules[1].path == "first" and np.array_equal(stored, expected.numpy())
    assert "add_" not in vars(torch.Tensor) and "__iadd__" not in vars(torch.Tensor)


class LayerScaledBlock(nn.Module):
    """ConvNeXt's block as timm writes it, with its layer scale applied in place: the depthwise convolution's
    output permuted to channels-last (a strided tensor, captured as the norm's input), the MLP's output scaled in
    place after it was captured, and the block's own output permuted again (a strided output)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x).permute(0, 2, 3, 1)))))
        hidden.mul_(self.gamma)  # the output of `pwconv2`, changed after the capture
        return (x + hidden.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class LayerScaledStages(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, kernel_size=2, stride=2)
        self.blocks = nn.ModuleList(LayerScaledBlock(dim) for _ in range(3))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        hidden = self.stem(pixels)
        for block in self.blocks:
            hidden = block(hidden).permute(0, 3, 1, 2)
        return hidden


@pytest.mark.parametrize("writer", ["at the end, on the caller's thread", "by the writer thread, per tensor"])
def test_strided_and_in_place_changed_tensors_are_stored_as_captured(
    writer: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Permuted tensors are written from a contiguous copy, which must live until its bytes are written: three
    blocks' tensors of the same shapes, whose copies would otherwise share freed memory, each stored with its own
    values as captured (the same as the copies the path without a stream keeps), in-place layer scale included."""
    from modeltrace.worker import tensor_stream

    if writer.startswith("by the writer thread"):
        monkeypatch.setattr(tensor_stream, "WAKE_BYTES", 1)  # woken by every put: batches of one or a few
    torch.manual_seed(0)
    model, pixels = LayerScaledStages().eval(), torch.randn(2, 3, 16, 16)
    expected = copied_tensors(model, pixels)
    folder, stream = streamed_trace(model, pixels, tmp_path / "strided.mtrace", 1 << 20)
    with load_reference(folder) as loaded:
        assert expected and all(name in loaded.tensors for name in expected)
        for name, tensor in expected.items():
            assert np.array_equal(loaded.tensors.get(name), tensor.numpy()), name
        scaled = [record for record in loaded.trace.modules if record.path.endswith("pwconv2")]
        assert len(scaled) == 3
    if writer.startswith("at the end"):
        assert stream.copies == 3  # each `pwconv2` output, changed while queued, was copied first
    with torch.no_grad():
        block = model.blocks[0]
        unscaled = block.pwconv2(
            block.act(block.pwconv1(block.norm(block.dwconv(model.stem(pixels)).permute(0, 2, 3, 1))))
        )
    assert torch.equal(expected[scaled[0].outputs[0].tensor], unscaled)  # stored before its layer scale


def test_a_change_the_guard_cannot_see_is_not_stored_but_said(held_writer: threading.Event, tmp_path: Path) -> None:
    class Unseen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, done: threading.Event) -> torch.Tensor:
            hidden = self.first(x)
            torch._C.TensorBase.add_(hidden, 1.0)  # as C++ code would: torch's own method, not `Tensor.add_`
            done.set()
            return hidden

    model = Unseen()
    folder, stream = streamed_trace(model, (torch.randn(2, 4), held_writer), tmp_path / "unseen.mtrace", 1 << 20)
    with load_reference(folder) as loaded:
        first = next(record for record in loaded.trace.modules if record.path == "first").outputs[0]
        assert first.tensor is None and "changed in place" in first.not_stored
        assert loaded.trace.model["tensors_not_stored"] >= 1


def test_a_disk_full_mid_forward_leaves_no_folder_and_one_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, inputs = small_llama()
    write_many = StreamingSafetensorsWriter.write_many
    calls = []

    def filling(self: StreamingSafetensorsWriter, tensors: Iterable[tuple]) -> None:
        tensors = list(tensors)
        calls.extend(tensors)
        if len(calls) > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        write_many(self, tensors)

    monkeypatch.setattr(StreamingSafetensorsWriter, "write_many", filling)
    out = tmp_path / "full.mtrace"
    with pytest.raises(ModelTraceError) as failure:
        with modeltrace.capture(model, out, full_tensors=True), torch.no_grad():
            model(inputs)
    assert "No space left on device" in str(failure.value) and str(tmp_path) in str(failure.value)
    assert list(tmp_path.iterdir()) == []  # neither the trace nor its temporary folder
    monkeypatch.setattr(StreamingSafetensorsWriter, "write_many", write_many)
    with modeltrace.capture(model, out, full_tensors=True), torch.no_grad():
        model(inputs)
    with load_reference(out) as loaded:
        assert loaded.tensors is not None and len(loaded.tensors.file.names()) > 20


def test_an_exception_in_the_forward_leaves_no_temporary_folder(tmp_path: Path) -> None:
    model, inputs = small_llama()
    stream = start_stream(tmp_path / "x.mtrace", 1 << 20)
    with pytest.raises(RuntimeError):
        with discarded_on_error(stream), torch.no_grad(), ModuleCapture(model, full_tensors=True, stream=stream):
            model(inputs)
            raise RuntimeError("the model failed")
    assert list(tmp_path.iterdir()) == []


CANCELLED_RECIPE = """
import time
import torch
from torch import nn


class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 256)

    def forward(self, hidden_states):
        for _ in range(50):
            hidden_states = self.proj(hidden_states)
        time.sleep(60)
        return hidden_states


def build_model():
    return Slow()


def build_inputs(model):
    return (torch.randn(64, 256),)
"""


def test_a_cancelled_full_tensor_trace_leaves_nothing_and_the_next_one_works(tmp_path: Path) -> None:
    import sys

    recipe = tmp_path / "recipe_slow.py"
    recipe.write_text(CANCELLED_RECIPE)
    out = tmp_path / "traces" / "slow.mtrace"
    request = TraceRequest(file=str(recipe), recipe=str(recipe), out=str(out), timeout=120, full_tensors=True)
    with WorkerClient(python=sys.executable) as worker:
        worker.start()
        timer = threading.Timer(4.0, worker.cancel)
        timer.start()
        try:
            with pytest.raises(TraceFailed) as failure:
                worker.trace(request)
        finally:
            timer.cancel()
        assert failure.value.error.kind == "Cancelled" and failure.value.error.cause == "cancelled"
        assert list(out.parent.iterdir()) == []  # the temporary folder the tensors streamed into is gone
        result = worker.trace(
            TraceRequest(file=str(EXAMPLE_MODELING_FILE), out=str(out), timeout=120, full_tensors=True)
        )
    assert Path(result.trace) == out
    assert [path.name for path in out.parent.iterdir()] == ["slow.mtrace"]
    with load_reference(out) as loaded:
        assert loaded.tensors is not None


@pytest.mark.parametrize("how", ["one by one", "in one batch, written a few bytes per call"])
def test_streamed_shards_read_like_any_safetensors_file(
    how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    writer = StreamingSafetensorsWriter(tmp_path, first_header_bytes=512)
    tensors = {f"{index}/outputs/": torch.randn(index + 1, 3) for index in range(40)}
    tensors["bf16"] = torch.randn(5).to(torch.bfloat16)
    tensors["empty"] = torch.zeros(0, 4)
    tensors['ünïcode "quoted"\\'] = torch.randn(2)  # escaped in the header: its reserved size must hold
    items = [
        (
            name,
            {torch.float32: "F32", torch.bfloat16: "BF16"}[tensor.dtype],
            tensor.shape,
            memoryview(tensor.reshape(-1).view(torch.uint8).numpy()),
        )
        for name, tensor in tensors.items()
    ]
    if how == "one by one":
        for item in items:
            writer.write(*item)
    else:
        writev = os.writev

        def short_writev(descriptor: int, buffers: list) -> int:  # as a system may: less than asked
            return writev(descriptor, [bytes(memoryview(buffers[0]).cast("B")[:7])])

        monkeypatch.setattr(os, "writev", short_writev)
        writer.write_many(items)  # crosses shard boundaries mid-batch
    writer.close()
    shards = shard_paths(tmp_path)
    assert len(shards) > 1 and shards[0].name == "tensors.safetensors"
    read_back = {}
    for shard in shards:
        read_back.update(load_file(str(shard)))  # the safetensors library reads every shard
    assert set(read_back) == set(tensors)
    assert all(torch.equal(read_back[name], tensor) for name, tensor in tensors.items())
    store = SafetensorsStore(*shards)
    try:
        assert all(name in store for name in tensors)
        assert np.array_equal(store.get("39/outputs/"), tensors["39/outputs/"].numpy())
        assert np.array_equal(store.get("bf16"), tensors["bf16"].float().numpy())
    finally:
        store.close()


def test_a_folder_that_cannot_be_written_is_one_clear_message(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / "x.mtrace"
    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "trace", str(EXAMPLE_MODELING_FILE), "--full-tensors", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        f"modeltrace: {out}: cannot write a trace there (Not a directory: "
        + completed.stderr.split("(Not a directory: ")[1].strip()
    ]
    assert "Traceback" not in completed.stderr and str(out) in completed.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["a_file"]


def test_where_a_limit_cuts_the_note_names_the_modules_compared_by_statistics(tmp_path: Path) -> None:
    model, inputs = small_llama()
    out = tmp_path / "cut.mtrace"
    with modeltrace.capture(model, out, full_tensors=True, max_trace_mb=0.02), torch.no_grad():
        model(inputs)
    with load_reference(out) as loaded:
        cut = [record.path for record in loaded.trace.modules if any(summary.not_stored for summary in record.outputs)]
        stored = [record.path for record in loaded.trace.modules if record.outputs and record.outputs[0].tensor]
        [note] = [note for note in loaded.notes if "not stored in full" in note]
    assert cut and stored  # the limit cut part way
    assert "limit per trace" in note and f"the outputs of {len(cut)} module call(s)" in note
    assert cut[0] in note and "compared by statistics only" in note
