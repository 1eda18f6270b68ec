"""Traces on disk: a `NAME.mtrace/` folder holding `trace.msgpack` and, optionally, `tensors.safetensors`.

Writes are atomic: everything goes into a temporary sibling folder that is renamed into place, so a crash at
any point leaves either the previous trace or the new one, never half of one. Reads never unpickle, check the
file's size before reading it, and turn every malformed input into a `TraceFormatError` naming the file.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import msgpack

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import SCHEMA, Trace


TRACE_FILE = "trace.msgpack"
TENSORS_FILE = "tensors.safetensors"
TRACE_SUFFIX = ".mtrace"
# NOTE: a 50,000-record trace is ~20 MB; anything past this limit is not a trace we wrote.
MAX_TRACE_BYTES = int(os.environ.get("MODELTRACE_MAX_TRACE_BYTES", 2 * 1024**3))


def write_trace(trace: Trace, destination: Path, write_extra: Callable[[Path], None] | None = None) -> Path:
    """Write `trace` to the folder `destination` atomically; `write_extra(tmp_folder)` adds files (tensors)."""
    destination = Path(destination).absolute()
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = destination.with_name(f".{destination.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    temporary.mkdir()
    try:
        payload = msgpack.packb(trace.to_json(), use_bin_type=True)
        with open(temporary / TRACE_FILE, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if write_extra is not None:
            write_extra(temporary)
        _swap_into_place(temporary, destination)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return destination


def _swap_into_place(temporary: Path, destination: Path) -> None:
    """Rename `temporary` to `destination`, moving an existing trace aside first and deleting it after."""
    if not destination.exists():
        os.rename(temporary, destination)
        return
    if not (destination / TRACE_FILE).exists() and any(destination.iterdir()):
        raise TraceFormatError(f"{destination}: exists and is not a trace folder; refusing to replace it")
    previous = destination.with_name(f".{destination.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(destination, previous)
    os.rename(temporary, destination)
    shutil.rmtree(previous, ignore_errors=True)


def read_trace(path: Path | str) -> Trace:
    """Read a trace folder (or its `trace.msgpack`), validating size, format and schema."""
    path = Path(path)
    trace_file = path if path.name == TRACE_FILE else path / TRACE_FILE
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace")
    if not trace_file.is_file():
        raise TraceFormatError(f"{path}: not a trace folder (no {TRACE_FILE} inside)")
    size = trace_file.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{trace_file}: {size} bytes is over the {MAX_TRACE_BYTES}-byte limit for traces")
    raw = trace_file.read_bytes()
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        # TypeError: a corrupt map whose key decodes to an unhashable value.
        raise TraceFormatError(f"{trace_file}: corrupt or truncated trace ({error})") from None
    if not isinstance(data, dict):
        raise TraceFormatError(f"{trace_file}: not a ModelTrace trace (top level is {type(data).__name__})")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise TraceFormatError(f"{trace_file}: trace schema {schema!r}; this ModelTrace reads {SCHEMA!r}")
    try:
        return Trace.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise TraceFormatError(f"{trace_file}: malformed trace record ({type(error).__name__}: {error})") from None


def tensors_path(trace_folder: Path) -> Path | None:
    """The safetensors file of full tensors, when the trace has one."""
    candidate = Path(trace_folder) / TENSORS_FILE
    return candidate if candidate.is_file() else None
