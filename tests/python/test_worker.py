"""The worker process: warm between traces, a fresh import of the user's files for each, and every way a
trace can fail (exception, timeout, cancel, segfault, `os._exit`) turned into a structured error after which
the next trace still works.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from modeltrace.errors import TraceFailed
from modeltrace.trace.storage import read_trace
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

from conftest import EXAMPLE_MODELING_FILE, line_of


def _request(file: Path, out: Path, **extra: Any) -> TraceRequest:
    return TraceRequest(file=str(file), out=str(out), **{"timeout": 60, **extra})


RECIPE_TEMPLATE = """
import torch
from torch import nn


class Faulty(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, hidden_states):
        hidden_states = self.proj(hidden_states)
{fault}
        return hidden_states


def build_model():
    return Faulty()


def build_inputs(model):
    return (torch.randn(1, 4),)
"""


def _parent_pid(pid: int) -> int:
    """The parent of a running process (Linux `/proc`; 0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # NOTE: the command name (field 2) is in parentheses and may hold spaces: fields after the last ')'
    return int(stat.rsplit(")", 1)[1].split()[1])


def _recipe(tmp_path: Path, fault: str) -> Path:
    recipe = tmp_path / "recipe_faulty.py"
    recipe.write_text(RECIPE_TEMPLATE.format(fault="\n".join(f"        {line}" for line in fault.splitlines())))
    return recipe


def test_trace_of_the_example_and_warm_retrace(worker: WorkerClient, tmp_path: Path) -> None:
    progress: list[str] = []
    result = worker.trace(_request(EXAMPLE_MODELING_FILE, tmp_path / "a.mtrace"), on_progress=progress.append)
    assert result.model_class == "TinyLlamaModel" and result.modules > 20
    assert any("running TinyLlamaModel.forward" in message for message in progress)
    trace = read_trace(result.trace)
    assert trace.model["class"] == "TinyLlamaModel"
    assert trace.model["file"] == str(EXAMPLE_MODELING_FILE.resolve())

    # The warm path, by what it does: the same worker process (which said Ready once torch was imported) serves
    # the second trace, and runs it in a fresh child forked from itself, so torch is not imported again.
    worker_pid = worker._process.pid
    children: list[tuple[int, int]] = []

    def note_child(message: str) -> None:
        child = worker._child_pid
        if child is not None and not any(pid == child for pid, _ in children):
            children.append((child, _parent_pid(child)))

    again = worker.trace(_request(EXAMPLE_MODELING_FILE, tmp_path / "b.mtrace"), on_progress=note_child)
    assert again.modules == result.modules
    assert worker._process.pid == worker_pid, "a new worker process (importing torch again) served the second trace"
    assert len(children) == 1, children
    child, parent = children[0]
    assert child != worker_pid and parent == worker_pid, (child, parent, worker_pid)


def test_each_trace_imports_the_files_afresh(worker: WorkerClient, example_copy: Path, tmp_path: Path) -> None:
    first = read_trace(worker.trace(_request(example_copy, tmp_path / "first.mtrace")).trace)
    source = example_copy.read_text()
    example_copy.write_text(
        source.replace(
            "hidden_states = self.norm(hidden_states)", "hidden_states = self.norm(self.norm(hidden_states))"
        )
    )
    second = read_trace(worker.trace(_request(example_copy, tmp_path / "second.mtrace")).trace)
    assert [record.path for record in first.modules].count("norm") == 1
    assert [record.path for record in second.modules].count("norm") == 2


def test_a_retrace_after_an_edit_reads_the_file_afresh_past_what_the_worker_read_ahead(
    worker: WorkerClient, example_copy: Path, tmp_path: Path
) -> None:
    """The zygote parses and hashes a trace's source files ahead of the next trace (`Zygote._warm`); a file edited
    since is read again: class lines moved by the edit and the new hash, not the parse or hash read ahead."""
    import hashlib

    path = str(example_copy.resolve())
    first = worker.trace(_request(example_copy, tmp_path / "first.mtrace"))
    assert path in first.source_files
    example_copy.write_text("# two lines\n# above every class\n" + example_copy.read_text())
    second = read_trace(worker.trace(_request(example_copy, tmp_path / "second.mtrace")).trace)

    def class_lines(trace: Any) -> dict[str, int]:
        return {
            record.class_name: record.defined_at.line
            for record in trace.modules
            if record.defined_at is not None and record.defined_at.file == path
        }

    before = class_lines(read_trace(first.trace))
    assert before and class_lines(second) == {name: line + 2 for name, line in before.items()}
    assert second.model["source_hashes"][path] == hashlib.sha256(example_copy.read_bytes()).hexdigest()


def test_exception_in_forward_is_located_in_the_model_code(
    worker: WorkerClient, example_copy: Path, tmp_path: Path
) -> None:
    source = example_copy.read_text()
    example_copy.write_text(
        source.replace(
            "        gate = self.activation(self.gate_proj(hidden_states))",
            "        raise ValueError('boom in the MLP')\n        gate = self.activation(self.gate_proj(hidden_states))",
        )
    )
    out = tmp_path / "failed.mtrace"
    with pytest.raises(TraceFailed) as failure:
        worker.trace(_request(example_copy, out))
    error = failure.value.error
    assert error.kind == "ValueError" and error.message == "boom in the MLP"
    assert error.cause == "forward" and error.model_class == "TinyLlamaModel"
    assert error.file == str(example_copy.resolve())
    assert error.line == line_of(example_copy, "raise ValueError('boom in the MLP')")
    assert "ValueError: boom in the MLP" in str(failure.value)
    assert not out.exists() and not list(tmp_path.glob(".failed.mtrace*"))


@pytest.mark.parametrize(
    ("fault", "error_type", "cause", "words"),
    [
        ("import os\nos.kill(os.getpid(), 11)", "WorkerCrashed", "crash", "segmentation fault"),
        ("import os\nos._exit(3)", "WorkerExited", "exit", "exit code 3"),
        ("import sys\nsys.exit(4)", "SystemExit", "forward", "4"),
    ],
)
def test_a_dying_child_becomes_an_error_and_the_worker_survives(
    worker: WorkerClient, tmp_path: Path, fault: str, error_type: str, cause: str, words: str
) -> None:
    recipe = _recipe(tmp_path, fault)
    with pytest.raises(TraceFailed) as failure:
        worker.trace(_request(recipe, tmp_path / "x.mtrace", recipe=str(recipe)))
    assert failure.value.error.kind == error_type and failure.value.error.cause == cause
    assert words in failure.value.error.message
    result = worker.trace(_request(EXAMPLE_MODELING_FILE, tmp_path / "after.mtrace"))
    assert result.model_class == "TinyLlamaModel"


def test_timeout_stops_an_endless_forward(worker: WorkerClient, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "while True:\n    pass")
    worker_pid = worker._process.pid
    # NOTE: the hang guard is the client's own deadline (the timeout plus HARD_TIMEOUT_GRACE_SECONDS), whose
    # message differs ("did not answer within 3 s"): the message below says the worker's timer stopped the trace.
    with pytest.raises(TraceFailed) as failure:
        worker.trace(_request(recipe, tmp_path / "x.mtrace", recipe=str(recipe), timeout=3))
    assert failure.value.error.kind == "TimeoutError" and failure.value.error.cause == "timeout"
    assert "the trace ran past its 3 s timeout and was stopped" in failure.value.error.message
    # only the trace's child was stopped: the same worker process serves the next trace
    assert worker.trace(_request(EXAMPLE_MODELING_FILE, tmp_path / "after.mtrace")).modules > 0
    assert worker._process.pid == worker_pid


def test_cancel_from_another_thread(worker: WorkerClient, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "import time\ntime.sleep(60)")
    timer = threading.Timer(1.5, worker.cancel)
    timer.start()
    try:
        with pytest.raises(TraceFailed) as failure:
            worker.trace(_request(recipe, tmp_path / "x.mtrace", recipe=str(recipe)))
    finally:
        timer.cancel()
    assert failure.value.error.kind == "Cancelled" and failure.value.error.cause == "cancelled"
    assert not (tmp_path / "x.mtrace").exists()


def test_worker_killed_from_outside_mid_trace(tmp_path: Path) -> None:
    import psutil

    recipe = _recipe(tmp_path, "import time\ntime.sleep(60)")
    with WorkerClient(python=sys.executable) as client:
        client.start()
        zygote = psutil.Process(client._process.pid)
        killer = threading.Timer(2.0, zygote.kill)
        killer.start()
        with pytest.raises(TraceFailed) as failure:
            client.trace(_request(recipe, tmp_path / "x.mtrace", recipe=str(recipe)))
        assert failure.value.error.kind == "WorkerCrashed" and failure.value.error.cause == "crash"
        time.sleep(0.5)
        strays = [
            process
            for process in psutil.process_iter(["cmdline"])
            if "recipe_faulty" in " ".join(process.info["cmdline"] or []) or process.ppid() == zygote.pid
        ]
        assert not strays, [(process.pid, process.info["cmdline"], process.status()) for process in strays]
        # An idle worker that died is replaced on the next trace.
        assert client.trace(_request(EXAMPLE_MODELING_FILE, tmp_path / "y.mtrace")).modules > 0


def test_print_in_model_code_does_not_corrupt_the_frames(worker: WorkerClient, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "print('x' * 100000)")
    result = worker.trace(_request(recipe, tmp_path / "p.mtrace", recipe=str(recipe)))
    assert result.model_class == "Faulty"


FAKE_WORKER = """
import os, sys
sys.path.insert(0, {package!r})
from modeltrace.worker.protocol import read_frame, write_frame
write_frame(1, {{"type": "ready", "pid": os.getpid()}})
read_frame(0)
if {mode!r} == "malformed":
    os.write(1, bytes([0, 0, 0, 4]) + b"junk")
elif {mode!r} == "unknown type":
    write_frame(1, {{"type": "traceTree", "nodes": []}})
elif {mode!r} == "unknown key":
    write_frame(1, {{"type": "result", "trace": "t", "model_class": "M", "modules": 1, "seconds": 1.0, "colour": 1}})
else:
    write_frame(1, {{"type": "result", "trace": "t", "model_class": "M", "modules": "many", "seconds": 1.0}})
read_frame(0)
"""


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("malformed", "malformed frame (undecodable frame"),
        ("unknown type", "unknown type 'traceTree'"),
        ("unknown key", "a 'result' frame has an unknown key 'colour'"),
        ("wrong type", "a 'result' frame, key 'modules' should be int, not str 'many'"),
    ],
)
def test_a_worker_answering_with_a_bad_frame_gives_one_clear_error(tmp_path: Path, mode: str, expected: str) -> None:
    """A worker of another version, or one whose output was corrupted: one error naming what it sent, the worker
    stopped, never a hang until the timeout."""
    import modeltrace

    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER.format(package=str(Path(modeltrace.__file__).parent.parent), mode=mode))
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    fake_python.chmod(0o755)
    client = WorkerClient(python=str(fake_python))
    with pytest.raises(TraceFailed) as failure:
        client.trace(_request(tmp_path / "model.py", tmp_path / "out.mtrace"))
    # NOTE: a client that waited on would end at its deadline with a TimeoutError, not this kind
    assert failure.value.error.kind == "WorkerProtocolError" and failure.value.error.cause == "protocol"
    assert expected in failure.value.error.message
    assert not client.running


STORAGELESS_RECIPE = """
import torch
from torch import nn


class SparseMix(nn.Module):
    def __init__(self):
        super().__init__()
        dense = torch.zeros(8, 8)
        dense[0, 1] = 1.0
        dense[3, 2] = 2.0
        self.register_buffer("adjacency", dense.to_sparse())
        self.register_buffer("adjacency_csr", dense.to_sparse_csr())
        self.register_buffer("codes", torch.quantize_per_tensor(torch.linspace(-1, 1, 8), 0.1, 0, torch.qint8))
        self.register_buffer("ragged", torch.nested.nested_tensor([torch.ones(2), torch.full((3,), 2.0)]))

    def forward(self, x):
        mixed = torch.sparse.mm(self.adjacency, x)
        return mixed.to_sparse()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.mix = SparseMix()

    def forward(self, x):
        return self.proj(self.mix(self.proj(x)).to_dense())


def build_model():
    torch.manual_seed(0)
    return Net().eval()


def build_inputs(model):
    return (torch.randn(8, 4),)
"""


@pytest.mark.parametrize("full_tensors", [False, True], ids=["statistics", "full-tensors"])
def test_tensors_without_storage_are_summarised_with_a_note(
    worker: WorkerClient, tmp_path: Path, full_tensors: bool
) -> None:
    """A sparse (COO and CSR), quantized and nested buffer, and a submodule returning a sparse tensor: the
    trace completes (build fingerprint, module statistics, line capture, full-tensor capture), each such tensor
    summarised through its dense values with a note saying so, and the trace diffs against itself."""
    recipe = tmp_path / "recipe_storageless.py"
    recipe.write_text(STORAGELESS_RECIPE)
    out = tmp_path / "storageless.mtrace"
    worker.trace(_request(recipe, out, recipe=str(recipe), full_tensors=full_tensors, lines=True))
    trace = read_trace(out)
    mix_output = next(record for record in trace.modules if record.path == "mix").outputs[0]
    assert mix_output.shape == [8, 4] and mix_output.not_stored is not None
    assert "sparse_coo" in mix_output.not_stored and "dense form" in mix_output.not_stored
    assert mix_output.mean is not None and mix_output.positive_fraction is not None
    assert mix_output.tensor is None
    buffers = {record.name: record for build in trace.builds if build.path == "mix" for record in build.parameters}
    assert set(buffers) == {"adjacency", "adjacency_csr", "codes", "ragged"}
    # the sparse buffer's statistics are those of the dense matrix: two non-zeros (1 and 2) of 64
    for name in ("adjacency", "adjacency_csr"):
        summary = buffers[name].summary
        assert summary.shape == [8, 8] and summary.max == 2.0 and summary.mean == pytest.approx(3 / 64), name
    assert buffers["codes"].summary.dtype == "qint8" and buffers["codes"].summary.max == pytest.approx(1.0)
    assert "dequantized" in buffers["codes"].summary.not_stored
    assert buffers["ragged"].summary.shape == [2] and buffers["ragged"].summary.mean == pytest.approx(8 / 5)
    assert all(record.sample == [] for record in buffers.values())
    if full_tensors:  # the ordinary tensors around it are stored as usual
        assert next(record for record in trace.modules if record.path == "proj").outputs[0].tensor is not None
    import subprocess

    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(out), str(out)], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
