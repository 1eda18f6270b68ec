"""Trace folders on disk: round trip, atomic replacement, and clear errors for anything that is not a trace."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import TRACE_FILE, read_trace, write_trace


def _trace(name: str = "Model") -> Trace:
    summary = TensorSummary(key="", shape=[1, 7, 64], dtype="float32", mean=0.1, std=1.0, min=-2.0, max=2.0)
    record = ModuleCall(
        index=0, path="", class_name=name, defined_at=SourceLocation("/m.py", 3), called_at=None,
        call_index=0, parent=-1, finish_order=0, outputs=[summary],
    )
    return Trace(model={"class": name, "file": "/m.py"}, modules=[record])


def test_round_trip(tmp_path: Path) -> None:
    written = write_trace(_trace(), tmp_path / "a.mtrace")
    assert read_trace(written).to_json() == _trace().to_json()
    assert read_trace(written / TRACE_FILE).modules[0].outputs[0].shape == [1, 7, 64]


def test_replacement_is_atomic_and_a_failed_write_keeps_the_old_trace(tmp_path: Path) -> None:
    destination = tmp_path / "a.mtrace"
    write_trace(_trace("Old"), destination)

    def crash(folder: Path) -> None:
        (folder / "tensors.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_trace(_trace("New"), destination, crash)
    assert read_trace(destination).model["class"] == "Old"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.mtrace"]

    write_trace(_trace("New"), destination)
    assert read_trace(destination).model["class"] == "New"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.mtrace"]


def test_refuses_to_replace_a_folder_that_is_not_a_trace(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(TraceFormatError, match="not a trace folder"):
        write_trace(_trace(), precious)
    assert (precious / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not a trace folder"),
        (b"", "corrupt or truncated"),
        (msgpack.packb({"schema": "modeltrace.trace/1", "model": {}})[:-3], "corrupt or truncated"),
        (msgpack.packb([1, 2, 3]), "no map at the top level"),
        (msgpack.packb({"schema": "modeltrace.trace/99"}), "trace schema 'modeltrace.trace/99'"),
        (msgpack.packb({"schema": "modeltrace.trace/1", "modules": [{"path": "x"}]}), "malformed trace record"),
    ],
)
def test_bad_files_raise_a_clear_error(tmp_path: Path, content: bytes | None, message: str) -> None:
    folder = tmp_path / "bad.mtrace"
    folder.mkdir()
    if content is not None:
        (folder / TRACE_FILE).write_bytes(content)
    with pytest.raises(TraceFormatError, match=message) as error:
        read_trace(folder)
    assert "bad.mtrace" in str(error.value)
