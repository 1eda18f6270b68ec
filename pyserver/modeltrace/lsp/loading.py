"""Read a trace for the editor: stream its records one at a time, keep what the editor shows, share repeats.

`storage.read_trace` decodes the whole msgpack document first: for a 50,000-call trace that is ~140 MB of
dicts on the way to ~80 MB of records, and the server's memory never shrinks back. Streamed, without the
calls' inputs (hints and hovers show outputs) and with the strings, shapes and source locations that
thousands of records repeat stored once, it is ~40 MB. Anything that needs inputs reads the trace file.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import msgpack

from modeltrace.errors import TraceFormatError
from modeltrace.lsp.store import LoadedTrace, build_loaded_trace
from modeltrace.trace.records import SCHEMA, LineRecord, ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import MAX_TRACE_BYTES, TRACE_FILE


# NOTE: one shared empty list for every record's inputs: loaded records are read-only.
_NO_INPUTS: list[TensorSummary] = []


class _Sharing:
    """One copy of each string, shape and location that the records of a trace repeat."""

    def __init__(self) -> None:
        self.shapes: dict[tuple[int, ...], list[int]] = {}
        self.locations: dict[tuple[str, int, int | None], SourceLocation] = {}

    def shape(self, shape: list[int]) -> list[int]:
        # NOTE: shared lists are never mutated: records are read-only once loaded.
        return self.shapes.setdefault(tuple(shape), shape)

    def location(self, location: SourceLocation | None) -> SourceLocation | None:
        if location is None:
            return None
        key = (location.file, location.line, location.column)
        shared = self.locations.get(key)
        if shared is None:
            location.file = sys.intern(location.file)
            shared = self.locations[key] = location
        return shared

    def summary(self, summary: TensorSummary) -> TensorSummary:
        summary.key = sys.intern(summary.key)
        summary.dtype = sys.intern(summary.dtype)
        summary.device = sys.intern(summary.device)
        summary.shape = self.shape(summary.shape)
        return summary

    def module(self, data: dict[str, Any]) -> ModuleCall:
        record = ModuleCall.from_json(data)
        record.path = sys.intern(record.path)
        record.class_name = sys.intern(record.class_name)
        record.defined_at = self.location(record.defined_at)
        record.called_at = self.location(record.called_at)
        record.inputs = _NO_INPUTS
        record.outputs = [self.summary(summary) for summary in record.outputs]
        return record


def read_trace_for_display(path: Path | str) -> Trace:
    """Like `storage.read_trace` (same checks, same errors) but streamed, and without the calls' inputs."""
    path = Path(path)
    trace_file = path if path.name == TRACE_FILE else path / TRACE_FILE
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace")
    if not trace_file.is_file():
        raise TraceFormatError(f"{path}: not a trace folder (no {TRACE_FILE} inside)")
    size = trace_file.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{trace_file}: {size} bytes is over the {MAX_TRACE_BYTES}-byte limit for traces")
    sharing = _Sharing()
    document: dict[str, Any] = {}
    try:
        with open(trace_file, "rb") as handle:
            unpacker = msgpack.Unpacker(handle, raw=False, strict_map_key=False, max_buffer_size=size or 1)
            for _ in range(unpacker.read_map_header()):
                key = unpacker.unpack()
                if key == "modules":
                    document[key] = [sharing.module(unpacker.unpack()) for _ in range(unpacker.read_array_header())]
                elif key == "lines":
                    document[key] = [
                        LineRecord.from_json(unpacker.unpack()) for _ in range(unpacker.read_array_header())
                    ]
                else:
                    document[key] = unpacker.unpack()
    except (msgpack.UnpackException, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise TraceFormatError(f"{trace_file}: corrupt or truncated trace ({error})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise TraceFormatError(f"{trace_file}: malformed trace record ({type(error).__name__}: {error})") from None
    schema = document.get("schema")
    if schema != SCHEMA:
        raise TraceFormatError(f"{trace_file}: trace schema {schema!r}; this ModelTrace reads {SCHEMA!r}")
    # NOTE: the header goes through `Trace.from_json`, so that this reader follows the format as it grows.
    trace = Trace.from_json({**document, "modules": [], "lines": []})
    trace.modules = document.get("modules", [])
    trace.lines = document.get("lines", [])
    return trace


def load_trace(owner: str, uri: str, trace_path: str) -> LoadedTrace:
    """Read and index a trace for the document `uri` (CPU work: run it off the event loop)."""
    # NOTE: loading creates a million objects and no garbage; the collector would run hundreds of times for
    # nothing (a third of the loading time).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return build_loaded_trace(owner, uri, trace_path, read_trace_for_display(trace_path))
    finally:
        if was_enabled:
            gc.enable()


# Traces with fewer calls are not worth a full collection each time one is installed.
FREEZE_MIN_CALLS = 10_000


def settle_memory(loaded: LoadedTrace) -> None:
    """After a large trace was installed: collect once, then keep what is alive out of later collections.

    A large trace is hundreds of thousands of long-lived objects without reference cycles; every full
    collection would walk them all (~0.2 s for 50,000 calls), stalling whichever request it interrupts.
    Frozen, they are skipped; they are still freed by reference counting when their trace goes.
    """
    if loaded.call_count < FREEZE_MIN_CALLS:
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
