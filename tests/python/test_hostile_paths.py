"""Paths that come from a trace are data: a hostile trace names `/dev/zero`, a FIFO, `/proc/self/environ` or a
private file as its source, and nothing reads them (or shows them) beyond what a source file may be.

Each check here fails without `trace.source_files`: the old code read whatever path a trace named, whole.
"""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from modeltrace.errors import ModelTraceError
from modeltrace.lsp.loading import load_trace_here
from modeltrace.trace.listing import render_listing
from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.source_files import (
    MAX_SOURCE_LINES,
    UnreadableSource,
    read_source_bytes,
    read_source_text,
)
from modeltrace.trace.storage import read_trace, write_trace


SECRET = "API_TOKEN=hunter2-do-not-leak"


def _hostile_trace(folder: Path, source: str, line: int = 3, hashes: dict[str, str] | None = None) -> Trace:
    """A small valid trace whose one module call names `source` (any path) at `line`."""
    summary = TensorSummary(key="0", shape=[1, 4], dtype="float32", mean=0.0, std=1.0, min=-1.0, max=1.0)
    record = ModuleCall(
        index=0,
        path="layer",
        class_name="Layer",
        defined_at=SourceLocation(source, line),
        called_at=SourceLocation(source, line, 4),
        call_index=0,
        parent=-1,
        finish_order=0,
        inputs=[summary],
        outputs=[summary],
    )
    model = {"class": "Model", "file": source, "source_hashes": hashes or {}}
    write_trace(Trace(model=model, modules=[record]), folder)
    return read_trace(folder)


def test_special_files_are_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "model.py"
    os.mkfifo(fifo)
    # NOTE: opening a FIFO with no writer blocks for ever: these return at once, or the test hangs.
    for path, reason in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "system file"),
        (Path("/proc/self/environ"), "system file"),
        (tmp_path, "not a regular file"),
        (tmp_path / "missing.py", "cannot read"),
    ):
        with pytest.raises(UnreadableSource, match=reason):
            read_source_bytes(path)


def test_a_link_to_a_special_file_is_refused_too(tmp_path: Path) -> None:
    link = tmp_path / "modeling.py"
    link.symlink_to("/dev/zero")
    with pytest.raises(UnreadableSource, match="system file"):
        read_source_bytes(link)


def test_source_files_are_read_below_a_size_bound(tmp_path: Path) -> None:
    source = tmp_path / "big.py"
    source.write_text("x = 1\n" * 100)
    assert read_source_text(source, limit=600) == "x = 1\n" * 100
    with pytest.raises(UnreadableSource, match="600 bytes, more than a source file.s 599 bytes"):
        read_source_bytes(source, limit=599)
    source.write_bytes(b"\xff\xfe")
    with pytest.raises(UnreadableSource, match="not UTF-8"):
        read_source_text(source)


@pytest.mark.parametrize("named", ["/dev/zero", "/proc/self/environ"])
def test_show_refuses_a_special_file_named_by_a_trace(tmp_path: Path, named: str) -> None:
    trace = _hostile_trace(tmp_path / "hostile.mtrace", named)
    with pytest.raises(ModelTraceError, match="system file"):
        render_listing(trace)


def test_show_prints_no_file_but_the_one_the_trace_recorded(tmp_path: Path) -> None:
    private = tmp_path / "private.env"
    private.write_text(f"{SECRET}\nline two\nline three\n")
    trace = _hostile_trace(tmp_path / "hostile.mtrace", str(private))

    listing = render_listing(trace)

    assert SECRET not in listing
    assert "is not the file this trace recorded" in listing
    # the annotations are the trace's own data, and still shown
    assert "3  # [1, 4]" in listing
    # named by the user, the same file is the user's choice
    assert SECRET in render_listing(trace, str(private))


def test_show_prints_the_recorded_file(tmp_path: Path) -> None:
    source = tmp_path / "modeling.py"
    source.write_text("import torch\n\nhidden = layer(x)\n")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    trace = _hostile_trace(tmp_path / "good.mtrace", str(source), hashes={str(source): digest})
    listing = render_listing(trace)
    assert "hidden = layer(x)" in listing
    assert "not the file" not in listing


def test_loading_here_never_reads_a_file_outside_the_searched_folders(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outside = tmp_path / "outside" / "passwd"
    outside.parent.mkdir()
    outside.write_text(f"{SECRET}\n" * 5)
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    folder = tmp_path / "hostile.mtrace"
    _hostile_trace(folder, str(outside), hashes={str(outside): digest})
    document = workspace / "modeling.py"
    document.write_text("x = 1\n")

    loaded, matches = load_trace_here(str(document), document.as_uri(), str(folder), [str(workspace)], {})

    assert [(match.recorded, match.found) for match in matches] == [(str(outside), None)]
    assert all(SECRET not in line for hints in loaded.files.values() for line in hints.lines)
    # ... and a link inside the workspace to the outside file is not the workspace's file either
    (workspace / "passwd").symlink_to(outside)
    _, linked = load_trace_here(str(document), document.as_uri(), str(folder), [str(workspace)], {})
    assert [match.found for match in linked] == [None]


def test_a_record_at_an_absurd_line_costs_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "far.mtrace"
    _hostile_trace(folder, str(tmp_path / "missing.py"), line=300_000_000)
    document = tmp_path / "modeling.py"
    document.write_text("x = 1\n")
    tracemalloc.start()
    try:
        loaded, _ = load_trace_here(str(document), document.as_uri(), str(folder), [str(tmp_path)], {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # (the old code padded the missing file with 3e8 empty lines: 2.4 GB)
    assert peak < 50 * 1024 * 1024
    assert all(len(hints.lines) <= MAX_SOURCE_LINES + 1 for hints in loaded.files.values())
