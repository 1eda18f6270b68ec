"""Property test of the trace reader: any mutation of a valid trace file either reads back as a trace or
raises our own `TraceFormatError`, never another exception (bounded in time with hypothesis)."""

from __future__ import annotations

from pathlib import Path

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import TRACE_FILE, read_trace, write_trace


def _valid_bytes(tmp_path: Path) -> bytes:
    summary = TensorSummary(key="0", shape=[1, 7, 64], dtype="float32", mean=0.5, std=1.5, min=-3.0, max=3.0)
    records = [
        ModuleCall(
            index=index,
            path=f"layers.{index}",
            class_name="Layer",
            defined_at=SourceLocation("/m.py", 10),
            called_at=SourceLocation("/m.py", 40, 8),
            call_index=0,
            parent=-1,
            finish_order=index,
            inputs=[summary],
            outputs=[summary],
        )
        for index in range(3)
    ]
    folder = write_trace(Trace(model={"class": "Model", "file": "/m.py"}, modules=records), tmp_path / "valid.mtrace")
    return (folder / TRACE_FILE).read_bytes()


mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=10_000)),
    st.tuples(
        st.just("flip"), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8)
    ),
    st.tuples(st.just("insert"), st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=16))),
)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(change=mutation)
def test_mutated_trace_files_read_or_fail_cleanly(tmp_path: Path, change: tuple) -> None:
    data = bytearray(_valid_bytes(tmp_path))
    kind, argument = change
    if kind == "truncate":
        data = data[: argument % (len(data) + 1)]
    elif kind == "flip":
        for position, value in argument:
            data[position % len(data)] = value
    else:
        position, extra = argument
        position %= len(data) + 1
        data[position:position] = extra
    folder = tmp_path / "mutated.mtrace"
    folder.mkdir(exist_ok=True)
    (folder / TRACE_FILE).write_bytes(bytes(data))
    try:
        trace = read_trace(folder)
    except TraceFormatError as error:
        assert "mutated.mtrace" in str(error)
    else:
        assert isinstance(trace, Trace)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    document=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
        max_leaves=30,
    )
)
def test_arbitrary_documents_with_the_right_schema_fail_cleanly(tmp_path_factory, document) -> None:
    folder = tmp_path_factory.mktemp("doc") / "doc.mtrace"
    folder.mkdir()
    payload = {"schema": "modeltrace.trace/1", "model": document, "modules": document, "lines": document}
    (folder / TRACE_FILE).write_bytes(msgpack.packb(payload))
    try:
        read_trace(folder)
    except TraceFormatError:
        pass


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    tables=st.lists(
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**63 - 1)
            | st.floats()
            | st.text(max_size=8)
            | st.binary(max_size=16),
            lambda children: (
                st.lists(children, max_size=12)
                | st.dictionaries(
                    st.sampled_from(["keys", "shapes", "dtypes", "statistics", "extra"]) | st.text(max_size=6),
                    children,
                    max_size=5,
                )
            ),
            max_leaves=40,
        ),
        min_size=4,
        max_size=4,
    ),
)
def test_arbitrary_tables_fail_cleanly(tmp_path_factory, tables: list) -> None:
    """A table-layout file whose tables and records are anything at all reads or raises `TraceFormatError`."""
    folder = tmp_path_factory.mktemp("table") / "table.mtrace"
    folder.mkdir()
    locations, summaries, modules, lines = tables
    payload = {
        "schema": "modeltrace.trace/1",
        "layout": "table/1",
        "model": {},
        "locations": locations,
        "summaries": summaries,
        "modules": modules,
        "lines": lines,
    }
    (folder / TRACE_FILE).write_bytes(msgpack.packb(payload, use_bin_type=True))
    try:
        read_trace(folder)
    except TraceFormatError:
        pass
