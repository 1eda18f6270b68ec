"""Damaged data is refused, not accepted silently: each damage below once read back as a good trace (a shape 1.5
became 1, a dtype `float33` was shown, a parent call that does not exist was followed), and `show --format json`
exited 0. Now each is one `TraceFormatError` naming the file, the record and the fault.

Both layouts are covered: the table layout the worker writes, and the record-per-map layout of older traces
(the repository's reference trace is one).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import TRACE_FILE, read_trace, write_trace


REFERENCE = Path(__file__).resolve().parents[2] / "examples" / "reference" / "tiny_llama.mtrace"


def _table_document(tmp_path: Path) -> dict[str, Any]:
    summary = TensorSummary(key="0", shape=[1, 7, 64], dtype="float32", mean=0.5, std=1.5, min=-3.0, max=3.0)
    records = [
        ModuleCall(
            index=index,
            path=f"layers.{index}" if index else "",
            class_name="Layer" if index else "Model",
            defined_at=SourceLocation("/m.py", 10 + index),
            called_at=SourceLocation("/m.py", 40 + index, 8),
            call_index=0,
            parent=index - 1,
            finish_order=2 - index,
            inputs=[summary],
            outputs=[summary],
        )
        for index in range(3)
    ]
    folder = write_trace(Trace(model={"class": "Model", "file": "/m.py"}, modules=records), tmp_path / "t.mtrace")
    return msgpack.unpackb((folder / TRACE_FILE).read_bytes(), raw=False, strict_map_key=False)


def _legacy_document() -> dict[str, Any]:
    return msgpack.unpackb((REFERENCE / TRACE_FILE).read_bytes(), raw=False, strict_map_key=False)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        target = document
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


# (what is damaged, the change, what the message says); module rows of the table layout are
# [index, path, class, defined_at, called_at, call_index, parent, finish_order, call_site, inputs, outputs]
TABLE_DAMAGES = [
    ("negative shape", _set(("summaries", "shapes", 0), [-1, 7, 64]), "-1 is not a size"),
    ("float shape", _set(("summaries", "shapes", 0), [1.5, 7, 64]), "1.5 is not a size"),
    ("2^40 shape", _set(("summaries", "shapes", 0), [2**40, 7, 64]), "is not a size"),
    ("huge tensor", _set(("summaries", "shapes", 0), [2**31, 2**31, 2**31]), "more elements than any tensor"),
    ("unknown dtype", _set(("summaries", "dtypes", 0), "float33"), "unknown dtype 'float33'"),
    ("parent out of range", _set(("modules", 1, 6), 7), "parent 7 is not an earlier call"),
    ("finish order out of range", _set(("modules", 1, 7), 99), "finish order 99"),
    ("index out of order", _set(("modules", 2, 0), 5), "index 5"),
    ("line 0", _set(("locations", 0, 1), 0), "line 0 of /m.py is not a line number"),
    ("line 2^62", _set(("locations", 0, 1), 2**62), "is not a line number"),
    ("float line", _set(("locations", 0, 1), 2.5), "line 2.5"),
    ("key as a list", _set(("summaries", "keys", 0), ["a"]), "malformed trace record|not a string"),
    ("path as a list", _set(("modules", 1, 1), ["a"]), "path and class must be strings"),
]


@pytest.mark.parametrize("change, message", [case[1:] for case in TABLE_DAMAGES], ids=[c[0] for c in TABLE_DAMAGES])
def test_a_damaged_table_trace_is_refused_naming_the_fault(tmp_path: Path, change: Callable, message: str) -> None:
    document = _table_document(tmp_path)
    change(document)
    folder = tmp_path / "damaged.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(msgpack.packb(document, use_bin_type=True))
    with pytest.raises(TraceFormatError, match=message) as refused:
        read_trace(folder)
    assert str(folder / TRACE_FILE) in str(refused.value)


LEGACY_DAMAGES = [
    ("statistic as a string", _set(("modules", 1, "outputs", 0, "mean"), ""), "statistic mean is '', not a number"),
    ("statistic as a bool", _set(("modules", 1, "outputs", 0, "std"), True), "statistic std is True"),
    ("tensor key as a list", _set(("modules", 1, "outputs", 0, "key"), ["x"]), "malformed trace record|not a string"),
    ("nan count negative", _set(("modules", 1, "outputs", 0, "nan_count"), -3), "nan_count -3 is not a count"),
    ("negative shape", _set(("modules", 1, "outputs", 0, "shape"), [1, -7, 64]), "-7 is not a size"),
    ("parent out of range", _set(("modules", 1, "parent"), 10_000), "parent 10000 is not an earlier call"),
    ("line 0", _set(("modules", 1, "called_at", "line"), 0), "line 0 of"),
]


@pytest.mark.parametrize("change, message", [case[1:] for case in LEGACY_DAMAGES], ids=[c[0] for c in LEGACY_DAMAGES])
def test_a_damaged_record_layout_trace_is_refused_naming_the_fault(
    tmp_path: Path, change: Callable, message: str
) -> None:
    document = _legacy_document()
    change(document)
    folder = tmp_path / "damaged.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(msgpack.packb(document, use_bin_type=True))
    with pytest.raises(TraceFormatError, match=message):
        read_trace(folder)


def test_the_undamaged_documents_read(tmp_path: Path) -> None:
    # the checks above fail for the damage, not for the documents they start from
    assert len(read_trace(REFERENCE).modules) == 30
    folder = tmp_path / "copy.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(msgpack.packb(_table_document(tmp_path), use_bin_type=True))
    assert [record.parent for record in read_trace(folder).modules] == [-1, 0, 1]


def test_bytes_after_the_document_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "trailing.mtrace"
    shutil.copytree(REFERENCE, folder)
    with open(folder / TRACE_FILE, "ab") as handle:
        handle.write(msgpack.packb({"schema": "forged"}))
    with pytest.raises(TraceFormatError, match="data after the end of the document"):
        read_trace(folder)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "extra, message",
    [
        # near msgpack's own depth limit (1024): `show --format json` ended in a RecursionError
        (_nested(1000), "header field model: nested more than 32 deep"),
        (b"\x00\x01", "header field model: a bytes value, not JSON data"),
    ],
    ids=["deep", "bytes"],
)
def test_a_header_that_is_not_plain_data_is_refused(tmp_path: Path, extra: Any, message: str) -> None:
    document = _legacy_document()
    document["model"] = {**document["model"], "extra": extra}
    folder = tmp_path / "header.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(msgpack.packb(document, use_bin_type=True))
    with pytest.raises(TraceFormatError, match=message):
        read_trace(folder)


@pytest.mark.parametrize(
    "header, message",
    [
        (b"[" * 50_000 + b"]" * 50_000, "corrupt safetensors header \\(nested too deeply\\)"),
        (b'{"x": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 4]}}', "shape \\[inf\\]"),
        (b'{"x": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}', "shape \\[1.5\\]"),
        (b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}}', "offsets \\[0.0, 4\\]"),
        (b'{"x": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}', "unknown dtype 'F33'"),
    ],
    ids=["nested", "infinity", "float-shape", "float-offset", "unknown-code"],
)
def test_a_damaged_safetensors_header_is_refused(tmp_path: Path, header: bytes, message: str) -> None:
    import struct

    from modeltrace.trace.tensors import SafetensorsFile

    path = tmp_path / "tensors.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(TraceFormatError, match=message):
        SafetensorsFile(path)


def test_a_path_component_over_255_characters_is_a_message(tmp_path: Path) -> None:
    from modeltrace.trace.reference import load_reference

    too_long = tmp_path / ("a" * 300 + ".mtrace")
    for read in (read_trace, load_reference):
        with pytest.raises(TraceFormatError, match="cannot be read \\(file name too long\\)"):
            read(too_long)
