"""A capture made into a trace on disk: the header completed (library versions, limits, what was left out, source
hashes) and the folder written with its full tensors.

Shared by the worker's jobs (`job.run_trace_job`: the CLI's and the editor's traces) and the library
(`modeltrace.capture`, in the caller's own process), so that both write the same `.mtrace`. Needs torch only:
transformers, when installed, is named among the versions.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from modeltrace.trace import storage
from modeltrace.trace.records import Trace
from modeltrace.trace.storage import TENSORS_FILE, begin_trace, discard_trace, write_trace
from modeltrace.version import __version__
from modeltrace.worker.capture import ModuleCapture, _capture_core
from modeltrace.worker.tensor_stream import TensorStream
from modeltrace.worker.lines import LineCapture

# NOTE: the trace's tables filled in C (`native/capture_core.c`, `table_rows`) where the worker's native module is
# built: the same tables as `storage._table_rows`, without a Python step per record and summary
_CORE = _capture_core()
if _CORE is not None:
    storage.native_table_rows = _CORE.table_rows


def jsonable(value: Any) -> Any:
    """A copy of a config dict holding only msgpack/JSON-safe values."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def assemble_trace(
    header: dict[str, Any], capture: ModuleCapture, line_capture: LineCapture | None, builds: list
) -> Trace:
    """The trace of one capture: `header` (class, file, options…) completed with the library versions, the
    capture's limits and what it left out, and the hashes of every source file the records point at. The CLI's
    and the editor's traces (`run_trace_job`) and the library's (`modeltrace.capture`) are made here."""
    trace = Trace(
        model={
            **header,
            "versions": {
                "modeltrace": __version__,
                "torch": torch.__version__,
                "transformers": _transformers_version(),
                "python": platform.python_version(),
            },
        },
        modules=capture.records,
        lines=line_capture.records if line_capture else [],
        builds=builds,
    )
    options = trace.model.setdefault("options", {})
    options["lines"] = line_capture is not None
    if capture.full_tensors:
        options["max_tensor_bytes"] = capture.max_tensor_bytes
        options["max_trace_bytes"] = capture.max_trace_bytes
        if capture.stream is not None:
            options["tensor_memory_bytes"] = capture.stream.memory_budget
    if capture.skipped:
        trace.model["tensors_not_stored"] = capture.skipped
    if line_capture and line_capture.truncated:
        trace.model["lines_truncated"] = True
    files = trace.files() | ({trace.model["file"]} if trace.model.get("file") else set())
    trace.model["source_hashes"] = {file: source_hash(file) for file in sorted(files)}
    return trace


def start_stream(out: Path, memory_budget: int) -> TensorStream:
    """A `TensorStream` writing into a new temporary folder for the trace `out` (`storage.begin_trace`), for a
    `ModuleCapture(..., stream=...)`; `write_captured` completes it into place."""
    temporary = begin_trace(out)
    try:
        return TensorStream(temporary, memory_budget)
    except BaseException:
        discard_trace(temporary)
        raise


@contextlib.contextmanager
def discarded_on_error(stream: TensorStream | None) -> Iterator[None]:
    """Around the forward: if it raises (or is interrupted), stop the stream's writer and delete its temporary
    folder, so that a failed trace leaves nothing behind."""
    try:
        yield
    except BaseException:
        if stream is not None:
            stream.abort()
            discard_trace(stream.folder)
        raise


def _finish_stream(trace: Trace, stream: TensorStream) -> None:
    """Wait for the writer (raising its error after deleting the folder), then turn the records that name a
    tensor the writer could not keep (changed in place unseen) into statistics-only ones, saying why."""
    try:
        stream.finish()
    except BaseException:
        discard_trace(stream.folder)
        raise
    if not stream.stale:
        return
    reasons = {summary.tensor: reason for summary, reason in stream.stale}
    summaries = [summary for record in trace.modules for summary in (*record.inputs, *record.outputs)]
    summaries += [record.tensor for record in trace.lines]
    for summary in summaries:
        reason = reasons.get(summary.tensor)
        if reason is not None:
            summary.tensor, summary.not_stored = None, reason
    trace.model["tensors_not_stored"] = int(trace.model.get("tensors_not_stored") or 0) + len(reasons)


def write_captured(trace: Trace, capture: ModuleCapture, out: Path, durable: bool = True) -> Path:
    """Write `trace` with the capture's full tensors (safetensors) into the folder `out`, atomically: the shards
    its stream has been writing, completed, or the kept copies written now."""
    if capture.stream is not None:
        _finish_stream(trace, capture.stream)
        return write_trace(trace, out, None, durable=durable, temporary=capture.stream.folder)
    write_extra = None
    if capture.tensors:
        from safetensors.torch import save_file

        def write_extra(folder: Path) -> None:
            save_file(capture.tensors, str(folder / TENSORS_FILE))

    return write_trace(trace, out, write_extra, durable=durable)


# path -> (modification time, size, sha256): a file is hashed again only when either changed (a capture in a loop
# hashed the same files every time)
_HASHES: dict[str, tuple[int, int, str]] = {}


def source_hash(file: str) -> str | None:
    """The SHA-256 of a source file, None where it cannot be read; reused while its time and size are the same."""
    try:
        status = os.stat(file)
        cached = _HASHES.get(file)
        if cached is not None and cached[:2] == (status.st_mtime_ns, status.st_size):
            return cached[2]
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    except OSError:
        return None
    _HASHES[file] = (status.st_mtime_ns, status.st_size, digest)
    return digest
