"""Traces on disk: a `NAME.mtrace/` folder holding `trace.msgpack` and, optionally, `tensors.safetensors`.

Writes are atomic: everything goes into a temporary sibling folder that is renamed into place, so a crash at
any point leaves either the previous trace or the new one, never half of one. Reads never unpickle, check the
file's size before reading it, and turn every malformed input into a `TraceFormatError` naming the file.
`trace.msgpack` holds the `modeltrace.trace/1` JSON in its compact form (tensor summaries leave out a CPU
device and NaN/Inf counts of zero, which reading restores), so `show --format json` prints the full contract.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import SCHEMA, LineRecord, ModuleCall, SourceLocation, TensorSummary, Trace


TRACE_FILE = "trace.msgpack"
TENSORS_FILE = "tensors.safetensors"
TRACE_SUFFIX = ".mtrace"
# NOTE: a 50,000-record trace is ~20 MB; anything past this limit is not a trace we wrote.
MAX_TRACE_BYTES = int(os.environ.get("MODELTRACE_MAX_TRACE_BYTES", 2 * 1024**3))


def write_trace(
    trace: Trace, destination: Path, write_extra: Callable[[Path], None] | None = None, durable: bool = True
) -> Path:
    """Write `trace` to the folder `destination` atomically; `write_extra(tmp_folder)` adds files (tensors).

    The rename makes the write atomic for every process, crashed or not. `durable` also flushes the trace to the
    disk before the rename (against power loss); the worker passes False and calls `sync_trace` after it has
    answered, so that the user does not wait for the disk (an fsync costs 1-4 ms here, a tiny model's forward 3).
    """
    destination = Path(destination).absolute()
    temporary = destination.with_name(f".{destination.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    # NOTE: as few file-system calls as the common case needs (the parent exists, the destination does not):
    # each costs tens of µs right after a forward pass, and a tiny model's forward takes 2-4 ms.
    try:
        temporary.mkdir()
    except FileNotFoundError:
        destination.parent.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
    try:
        _write_file(temporary / TRACE_FILE, _pack(trace), durable)
        if write_extra is not None:
            write_extra(temporary)
        _swap_into_place(temporary, destination)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return destination


def _write_file(path: Path, payload: bytes, durable: bool) -> None:
    # NOTE: straight to the descriptor: Python's buffered file object adds nothing for one write of a whole
    # payload, and its set-up is measurable next to a tiny model's forward pass.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(descriptor, view) :]
        if durable:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _pack(trace: Trace) -> bytes:
    # NOTE: the JSON form is thousands of small acyclic dicts made and dropped at once: the cyclic collector,
    # which they would set off a few times for nothing, is paused meanwhile.
    collector_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return msgpack.packb(trace.to_json(compact=True), use_bin_type=True)
    finally:
        if collector_was_enabled:
            gc.enable()


def sync_trace(folder: Path) -> None:
    """Flush a written trace folder's files and its directory entry to the disk (best effort: a trace that was
    replaced or deleted meanwhile has nothing left to flush)."""
    folder = Path(folder)
    try:
        for path in folder.iterdir():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        for directory in (folder, folder.parent):
            descriptor = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    except OSError:
        pass


def _swap_into_place(temporary: Path, destination: Path) -> None:
    """Rename `temporary` to `destination`, moving an existing trace aside first and deleting it after."""
    try:
        os.rename(temporary, destination)  # nothing there yet (or an empty folder, which it replaces)
        return
    except OSError:
        if not os.path.lexists(destination):
            raise
    if not (destination / TRACE_FILE).exists() and any(destination.iterdir()):
        raise TraceFormatError(f"{destination}: exists and is not a trace folder; refusing to replace it")
    previous = destination.with_name(f".{destination.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(destination, previous)
    os.rename(temporary, destination)
    shutil.rmtree(previous, ignore_errors=True)


class _Sharing:
    """One copy of each string, shape and source location that the records of a trace repeat.

    A 50,000-call trace repeats a few hundred distinct keys, dtypes, shapes and locations: stored once, the
    records of a loaded trace take a fraction of the memory (it matters in the long-lived language server).
    Records are read-only once loaded, so sharing lists between them is safe.
    """

    def __init__(self, inputs: bool) -> None:
        self.inputs = inputs
        self.shapes: dict[tuple[int, ...], list[int]] = {}
        self.locations: dict[tuple[str, int, int | None], SourceLocation] = {}

    def shape(self, shape: list[int]) -> list[int]:
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
        record.inputs = [self.summary(summary) for summary in record.inputs] if self.inputs else _NO_INPUTS
        record.outputs = [self.summary(summary) for summary in record.outputs]
        return record

    def line(self, data: dict[str, Any]) -> LineRecord:
        record = LineRecord.from_json(data)
        record.file = sys.intern(record.file)
        record.name = sys.intern(record.name)
        record.tensor = self.summary(record.tensor)
        return record


# NOTE: one shared empty list for every record's inputs when they are not read: such records are read-only.
_NO_INPUTS: list[TensorSummary] = []


def read_trace(path: Path | str, inputs: bool = True) -> Trace:
    """Read a trace folder (or its `trace.msgpack`), validating size, format and schema.

    Records are decoded one at a time from the stream (never the whole document as dicts first) with
    repeated values shared; `inputs=False` skips the calls' input summaries (the editor shows outputs).
    """
    path = Path(path)
    trace_file = path if path.name == TRACE_FILE else path / TRACE_FILE
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace")
    if not trace_file.is_file():
        raise TraceFormatError(f"{path}: not a trace folder (no {TRACE_FILE} inside)")
    size = trace_file.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{trace_file}: {size} bytes is over the {MAX_TRACE_BYTES}-byte limit for traces")
    sharing = _Sharing(inputs)
    document: dict[str, Any] = {}
    try:
        with open(trace_file, "rb") as handle:
            unpacker = msgpack.Unpacker(handle, raw=False, strict_map_key=False, max_buffer_size=size or 1)
            try:
                entries = unpacker.read_map_header()
            except msgpack.UnpackValueError:
                raise TraceFormatError(f"{trace_file}: not a ModelTrace trace (no map at the top level)") from None
            for _ in range(entries):
                key = unpacker.unpack()
                if key == "modules":
                    document[key] = [sharing.module(unpacker.unpack()) for _ in range(unpacker.read_array_header())]
                elif key == "lines":
                    document[key] = [sharing.line(unpacker.unpack()) for _ in range(unpacker.read_array_header())]
                else:
                    document[key] = unpacker.unpack()
    except (msgpack.UnpackException, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise TraceFormatError(f"{trace_file}: corrupt or truncated trace ({type(error).__name__}: {error})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        # TypeError also covers a corrupt map whose key decodes to an unhashable value.
        raise TraceFormatError(f"{trace_file}: malformed trace record ({type(error).__name__}: {error})") from None
    schema = document.get("schema")
    if schema != SCHEMA:
        raise TraceFormatError(f"{trace_file}: trace schema {schema!r}; this ModelTrace reads {SCHEMA!r}")
    try:
        # NOTE: the header goes through `Trace.from_json`, so this reader follows the format as it grows.
        trace = Trace.from_json({**document, "modules": [], "lines": []})
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise TraceFormatError(f"{trace_file}: malformed trace header ({type(error).__name__}: {error})") from None
    if not all(isinstance(document.get(key, []), list) for key in ("modules", "lines")):
        raise TraceFormatError(f"{trace_file}: malformed trace (modules and lines must be arrays)")
    trace.modules = document.get("modules", [])
    trace.lines = document.get("lines", [])
    return trace


def tensors_path(trace_folder: Path) -> Path | None:
    """The safetensors file of full tensors, when the trace has one."""
    candidate = Path(trace_folder) / TENSORS_FILE
    return candidate if candidate.is_file() else None
