"""Trace folders on disk: round trip, atomic replacement, and clear errors for anything that is not a trace."""

from __future__ import annotations

import math
from pathlib import Path

import msgpack
import pytest

from modeltrace.errors import ModelTraceError, TraceFormatError
from modeltrace.trace import storage
from modeltrace.trace.records import LineRecord, ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import TRACE_FILE, read_trace, write_trace


def _trace(name: str = "Model") -> Trace:
    summary = TensorSummary(key="", shape=[1, 7, 64], dtype="float32", mean=0.1, std=1.0, min=-2.0, max=2.0)
    record = ModuleCall(
        index=0,
        path="",
        class_name=name,
        defined_at=SourceLocation("/m.py", 3),
        called_at=None,
        call_index=0,
        parent=-1,
        finish_order=0,
        outputs=[summary],
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

    with pytest.raises(ModelTraceError, match=f"cannot write the trace to {destination}: disk full"):
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


def _rich_trace() -> Trace:
    """Every field the table layout stores: shared summaries, missing and NaN statistics, off-CPU devices,
    NaN/Inf counts, stored and unstored tensors, locations with and without a column, line records."""
    hidden = TensorSummary(
        key="",
        shape=[1, 7, 64],
        dtype="float32",
        mean=0.1,
        std=1.0,
        min=-2.0,
        max=2.0,
        abs_max=2.0,
        positive_fraction=0.5,
    )
    meta = TensorSummary(key="attention_mask", shape=[1, 1, 7, 7], dtype="bool", device="meta")
    odd = TensorSummary(
        key="0",
        shape=[3],
        dtype="float16",
        device="cuda:0",
        mean=float("nan"),
        std=None,
        min=-1.0,
        max=float("inf"),
        nan_count=2,
        inf_count=1,
        tensor="1/outputs/0",
        not_stored=None,
    )
    skipped = TensorSummary(
        key="1",
        shape=[],
        dtype="int64",
        mean=3.0,
        std=None,
        min=3.0,
        max=3.0,
        abs_max=3.0,
        positive_fraction=1.0,
        not_stored="over the limit",
    )
    location = SourceLocation("/m.py", 40, 8)
    records = [
        ModuleCall(
            index=0,
            path="",
            class_name="Model",
            defined_at=SourceLocation("/m.py", 3),
            called_at=None,
            call_index=0,
            parent=-1,
            finish_order=1,
            call_site=None,
            inputs=[meta],
            outputs=[hidden],
        ),
        ModuleCall(
            index=1,
            path="layer",
            class_name="Layer",
            defined_at=SourceLocation("/m.py", 20),
            called_at=location,
            call_index=0,
            parent=0,
            finish_order=0,
            call_site=14,
            inputs=[hidden, meta],
            outputs=[odd, skipped],
        ),
    ]
    lines = [
        LineRecord(file="/m.py", line=41, name="x", call_index=0, tensor=hidden),
        LineRecord(file="/m.py", line=42, name="y", call_index=1, tensor=odd),
    ]
    return Trace(model={"class": "Model", "file": "/m.py", "options": {"lines": True}}, modules=records, lines=lines)


def _same(read: object, written: object) -> bool:
    """Equality of JSON values where NaN equals NaN."""
    if isinstance(written, float) and math.isnan(written):
        return isinstance(read, float) and math.isnan(read)
    if isinstance(written, dict):
        return (
            isinstance(read, dict)
            and read.keys() == written.keys()
            and all(_same(read[k], written[k]) for k in written)
        )
    if isinstance(written, list):
        return isinstance(read, list) and len(read) == len(written) and all(map(_same, read, written))
    return read == written and type(read) is type(written)


def test_table_layout_round_trip_keeps_every_field_and_stores_shared_summaries_once(tmp_path: Path) -> None:
    written = write_trace(_rich_trace(), tmp_path / "rich.mtrace")
    document = msgpack.unpackb((written / TRACE_FILE).read_bytes())
    assert document["layout"] == "table/1"
    assert len(document["summaries"]["keys"]) == 4  # `hidden` and `meta` appear in several records, stored once
    assert len(document["locations"]) == 3
    read = read_trace(written)
    assert _same(read.to_json(), _rich_trace().to_json())
    assert read.modules[1].outputs[0].mean != read.modules[1].outputs[0].mean  # a stored NaN stays a NaN
    assert read.modules[1].outputs[0].std is None  # and a missing statistic stays missing
    assert read_trace(written, inputs=False).modules[1].inputs == []


@pytest.mark.parametrize("form", ["json", "compact-json"])
def test_traces_written_before_the_table_layout_still_read(tmp_path: Path, form: str) -> None:
    """Older files hold the records' JSON (the compact form leaves out CPU devices and zero counts)."""
    document = _rich_trace().to_json()
    if form == "compact-json":
        for record in document["modules"]:
            for summary in record["inputs"] + record["outputs"]:
                for key, default in (("device", "cpu"), ("nan_count", 0), ("inf_count", 0)):
                    if summary[key] == default:
                        del summary[key]
    folder = tmp_path / "old.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(msgpack.packb(document))
    assert _same(read_trace(folder).to_json(), _rich_trace().to_json())


def _table_document(**changes: object) -> dict:
    document = msgpack.unpackb(msgpack.packb(storage._table(_rich_trace())))
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = document
        for parent in parents:
            target = target[int(parent)] if isinstance(target, list) else target[parent]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return document


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (_table_document(modules__1__9=[0, 4]), "summary index 4 is not one of the 4 summaries"),
        (_table_document(modules__1__9=[-1]), "summary index -1"),
        (_table_document(modules__1__4=7), "location index 7 is not one of the 3 locations"),
        (_table_document(lines__0__4="0"), "summary index '0'"),
        (_table_document(summaries__statistics=b"\x00" * 8), "summary columns of different lengths"),
        (_table_document(summaries__dtypes=["float32"]), "summary columns of different lengths"),
        (_table_document(modules__0=[0, "", "Model"]), "malformed trace record"),
        (_table_document(layout="table/9"), "trace layout 'table/9'"),
    ],
)
def test_malformed_tables_raise_a_clear_error(tmp_path: Path, document: dict, message: str) -> None:
    folder = tmp_path / "bad.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(msgpack.packb(document))
    with pytest.raises(TraceFormatError, match=message) as error:
        read_trace(folder)
    assert "bad.mtrace" in str(error.value)


def test_a_temporary_folder_left_under_this_process_number_is_not_reused(tmp_path: Path) -> None:
    """Temporary folders are numbered per process; one a killed process with the same id left under the next
    number is neither written into nor an error: the trace goes through another temporary folder."""
    import itertools
    import os

    destination = tmp_path / "left.mtrace"
    number = next(storage._TEMPORARY_NUMBERS)
    storage._TEMPORARY_NUMBERS = itertools.count(number + 1)
    left = tmp_path / f"{storage._temporary_prefix(destination, os.getpid())}{number + 1}"
    left.mkdir()
    (left / "partial").write_bytes(b"from a killed process")
    write_trace(Trace(model={"class": "Left"}, modules=[]), destination)
    assert read_trace(destination).model["class"] == "Left"
    assert (left / "partial").read_bytes() == b"from a killed process"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([left.name, "left.mtrace"])
