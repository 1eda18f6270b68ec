"""Traces on disk: a `NAME.mtrace/` folder holding `trace.msgpack` and, optionally, `tensors.safetensors` (and, for
a trace with more tensors than one file's reserved header holds, `tensors-00001.safetensors` and so on).

Writes are atomic: everything goes into a temporary sibling folder that is renamed into place, so a crash at
any point leaves either the previous trace or the new one, never half of one. Reads never unpickle, check the
file's size before reading it, and turn every malformed input into a `TraceFormatError` naming the file.

`trace.msgpack` holds the `modeltrace.trace/1` trace in a table layout (`"layout": "table/1"`): each distinct
tensor summary once, in columns (keys, shapes, dtypes, and the six statistics of all summaries as one float64
array), each distinct source location once, and module and line records as arrays that point into those
tables. Records share summaries (the output of one call is the input of the next) and locations, so the file is
about a third of the records' JSON and packs in about half the time, which a tiny model's forward pass notices.
How each module was built (`builds`: settings, parameters and buffers, construction line; once per module,
not per call) follows as plain maps, and each line record names the module call it ran in; files written
before either are read with none. Files written before the table layout (the records' JSON itself) are still
read. `show --format json` prints
the contract's JSON either way.
"""

from __future__ import annotations

import array
import atexit
import itertools
import math
import os
import shutil
import struct
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from modeltrace.collector import collector_paused
from modeltrace.errors import ModelTraceError, TraceFormatError
from modeltrace.trace.validation import validate_header, validate_trace
from modeltrace.trace.records import SCHEMA, LineRecord, ModuleCall, SourceLocation, TensorSummary, Trace


TRACE_FILE = "trace.msgpack"
TENSORS_FILE = "tensors.safetensors"
TRACE_SUFFIX = ".mtrace"
# NOTE: a 50,000-record trace is ~20 MB; anything past this limit is not a trace we wrote.
MAX_TRACE_BYTES = int(os.environ.get("MODELTRACE_MAX_TRACE_BYTES", 2 * 1024**3))


def _temporary_prefix(destination: Path, pid: int) -> str:
    return f".{destination.name}.tmp-{pid}-"


# numbers of this process's temporary trace folders (`begin_trace`); `next` on it is atomic in CPython
_TEMPORARY_NUMBERS = itertools.count()


def begin_trace(destination: Path) -> Path:
    """Create and return the temporary sibling folder that a trace of `destination` is written into (files
    streamed during the forward go there first); `write_trace(..., temporary=...)` completes it into place and
    `discard_trace` deletes it. Its name carries this process's id, so that the worker that forked this process
    can delete what a killed trace left (`remove_abandoned`)."""
    destination = Path(destination).absolute()
    prefix = _temporary_prefix(destination, os.getpid())
    # NOTE: numbered per process, not `uuid4()` (~70 µs right after a forward pass): the process id in the prefix
    # tells writers in different processes apart, the number those of one process
    temporary = destination.with_name(f"{prefix}{next(_TEMPORARY_NUMBERS)}")
    # NOTE: as few file-system calls as the common case needs (the parent exists, the destination does not):
    # each costs tens of µs right after a forward pass, and a tiny model's forward takes 2-4 ms.
    try:
        try:
            temporary.mkdir()
        except FileNotFoundError:
            destination.parent.mkdir(parents=True, exist_ok=True)
            temporary.mkdir()
        except FileExistsError:
            # left by an earlier process that had this process id and was killed while writing
            temporary = destination.with_name(f"{prefix}{uuid.uuid4().hex[:8]}")
            temporary.mkdir()
    except OSError as error:
        raise ModelTraceError(
            f"{destination}: cannot write a trace there ({error.strerror or error}: {error.filename or temporary})"
        ) from None
    return temporary


def discard_trace(temporary: Path) -> None:
    """Delete a temporary trace folder that will not be completed (best effort)."""
    shutil.rmtree(temporary, ignore_errors=True)


def remove_abandoned(destination: Path, pid: int) -> list[Path]:
    """Delete the temporary folders that process `pid` left for a trace of `destination` (it was killed: a
    cancelled or timed-out trace); returns those deleted."""
    destination = Path(destination).absolute()
    prefix = _temporary_prefix(destination, pid)
    removed = []
    try:
        names = os.listdir(destination.parent)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix):
            shutil.rmtree(destination.parent / name, ignore_errors=True)
            removed.append(destination.parent / name)
    return removed


def write_trace(
    trace: Trace,
    destination: Path,
    write_extra: Callable[[Path], None] | None = None,
    durable: bool = True,
    temporary: Path | None = None,
) -> Path:
    """Write `trace` to the folder `destination` atomically; `write_extra(tmp_folder)` adds files (tensors).

    The rename makes the write atomic for every process, crashed or not. `durable` also flushes the trace to the
    disk before the rename (against power loss); the worker passes False and calls `sync_trace` after it has
    answered, so that the user does not wait for the disk (an fsync costs 1-4 ms here, a tiny model's forward 3).
    `temporary`: the folder from `begin_trace` that files were already streamed into (deleted on failure).
    """
    destination = Path(destination).absolute()
    if temporary is None:
        temporary = begin_trace(destination)
    try:
        _write_file(temporary / TRACE_FILE, _pack(trace), durable)
        if write_extra is not None:
            write_extra(temporary)
        _swap_into_place(temporary, destination)
    except OSError as error:
        # NOTE: a full disk, a quota, a read-only folder: said as what failed to be written where (the earlier
        # trace at `destination` is untouched: only the temporary folder was written)
        shutil.rmtree(temporary, ignore_errors=True)
        raise write_error(destination, error) from None
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return destination


def write_error(destination: Path, error: OSError) -> ModelTraceError:
    """`cannot write the trace to X: no space left on device` for an `OSError` met writing a trace."""
    reason = (error.strerror or str(error)).lower()
    return ModelTraceError(f"cannot write the trace to {destination}: {reason}")


def check_destination(destination: Path | str) -> None:
    """Refuse, before any work, a trace destination that exists and is not a folder (a file, `/dev/full`)."""
    path = Path(destination)
    if os.path.lexists(path) and not path.is_dir():
        raise ModelTraceError(
            f"cannot write the trace to {path}: not a directory (a trace is a folder; choose another --out)"
        )


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


LAYOUT = "table/1"
# NOTE: a statistic that is None is stored as a NaN with this payload, distinct from the default NaN that a
# statistic read from elsewhere (a debugger's JSON) may hold, so both read back as they were.
_NONE_BITS = 0x7FF8_0000_0000_4E4F
_NONE = struct.unpack("<d", _NONE_BITS.to_bytes(8, "little"))[0]
_STATISTICS = ("mean", "std", "min", "max", "abs_max", "positive_fraction")


def _pack(trace: Trace) -> bytes:
    # NOTE: the tables are thousands of small acyclic objects made and dropped at once: the cyclic collector,
    # which they would set off a few times for nothing, is paused meanwhile.
    with collector_paused():
        table = _table(trace)
        if trace.builds_json is None:
            return msgpack.packb(table, use_bin_type=True)
        # NOTE: construction records reused between captures (`modeltrace.capture`: `worker/reuse.py`) are packed
        # once: the map is written key by key, the same bytes as `packb(table)`, with their packed form spliced in
        packer = msgpack.Packer(use_bin_type=True)
        parts = [packer.pack_map_header(len(table))]
        for key, value in table.items():
            parts.append(packer.pack(key))
            parts.append(_packed_builds(trace.builds_json) if key == "builds" else packer.pack(value))
        return b"".join(parts)


# id of a reused `builds_json` list -> (that list, its msgpack bytes); the last few only (one per model captured)
_PACKED_BUILDS: dict[int, tuple[list[dict[str, Any]], bytes]] = {}
_PACKED_BUILDS_KEPT = 8


def _packed_builds(builds_json: list[dict[str, Any]]) -> bytes:
    """`packb(builds_json)`, made once per list: a reused list is never modified (its owner makes a new one)."""
    cached = _PACKED_BUILDS.get(id(builds_json))
    if cached is not None and cached[0] is builds_json:
        return cached[1]
    packed = msgpack.packb(builds_json, use_bin_type=True)
    while len(_PACKED_BUILDS) >= _PACKED_BUILDS_KEPT:
        del _PACKED_BUILDS[next(iter(_PACKED_BUILDS))]
    _PACKED_BUILDS[id(builds_json)] = (builds_json, packed)
    return packed


def _table(trace: Trace) -> dict[str, Any]:
    """The table layout of `trace` (see the module docstring)."""
    fill = native_table_rows if native_table_rows is not None else _table_rows
    locations, keys, shapes, dtypes, extra, statistics, modules, lines = fill(trace.modules, trace.lines, _NONE)
    # NOTE: the tables come before the records that point into them: the reader decodes in one pass.
    return {
        "schema": trace.schema,
        "layout": LAYOUT,
        "model": trace.model,
        "locations": locations,
        "summaries": {"keys": keys, "shapes": shapes, "dtypes": dtypes, "extra": extra, "statistics": statistics},
        "modules": modules,
        "lines": lines,
        # NOTE: once per module, not per call: a few hundred small maps, read through `Trace.from_json`.
        "builds": trace.builds_to_json(),
        # NOTE: generation and backward traces only (steps, cache, gradients): plain maps, read by `Trace.from_json`.
        **({"generation": trace.generation.to_json()} if trace.generation is not None else {}),
        **({"gradients": trace.gradients.to_json()} if trace.gradients is not None else {}),
    }


# NOTE: the same pass in C (`worker/native/capture_core.c`), set by the worker where its native module is built
# (`worker/assemble.py`); the server never loads that module (it reads traces, it writes none)
native_table_rows: Callable[[list, list, float], tuple] | None = None


def _table_rows(module_records: list[ModuleCall], line_records: list[LineRecord], none: float) -> tuple:
    """The tables of the records: (locations, summary keys, shapes, dtypes, their rare fields, their statistics
    as little-endian float64 bytes, module rows, line rows), `none` standing for a statistic that is None."""
    summary_index: dict[int, int] = {}
    keys: list[str] = []
    shapes: list[list[int]] = []
    dtypes: list[str] = []
    numbers: list[float] = []
    extra: list[list[Any]] = []  # the rare fields: [index, device, nan_count, inf_count, tensor, not_stored]
    location_index: dict[int, int] = {}
    locations: list[list[Any]] = []

    # NOTE: one loop, calling out only for a summary seen the first time: this runs for every record of every
    # trace while the user waits, and a Python call per summary or location costs about as much as packing it.
    def add(summary: TensorSummary) -> int:
        index = summary_index[id(summary)] = len(keys)
        keys.append(summary.key)
        shapes.append(summary.shape)
        dtypes.append(summary.dtype)
        mean, std, minimum, maximum, abs_max, positive = (
            summary.mean,
            summary.std,
            summary.min,
            summary.max,
            summary.abs_max,
            summary.positive_fraction,
        )
        numbers.extend(
            (
                none if mean is None else mean,
                none if std is None else std,
                none if minimum is None else minimum,
                none if maximum is None else maximum,
                none if abs_max is None else abs_max,
                none if positive is None else positive,
            )
        )
        if (
            summary.device != "cpu"
            or summary.nan_count
            or summary.inf_count
            or summary.tensor is not None
            or summary.not_stored is not None
        ):
            extra.append(
                [index, summary.device, summary.nan_count, summary.inf_count, summary.tensor, summary.not_stored]
            )
        if summary.placement is not None:
            # NOTE: tensor-parallel traces only: a seventh field, after a row of its own or a new one
            if not extra or extra[-1][0] != index:
                extra.append(
                    [index, summary.device, summary.nan_count, summary.inf_count, summary.tensor, summary.not_stored]
                )
            extra[-1].append(summary.placement)
        return index

    get = summary_index.get
    modules = []
    for record in module_records:
        row_locations = []
        for location in (record.defined_at, record.called_at):
            index = None
            if location is not None:
                index = location_index.get(id(location))
                if index is None:
                    index = location_index[id(location)] = len(locations)
                    locations.append([location.file, location.line, location.column])
            row_locations.append(index)
        modules.append(
            [
                record.index,
                record.path,
                record.class_name,
                row_locations[0],
                row_locations[1],
                record.call_index,
                record.parent,
                record.finish_order,
                record.call_site,
                [index if (index := get(id(summary))) is not None else add(summary) for summary in record.inputs],
                [index if (index := get(id(summary))) is not None else add(summary) for summary in record.outputs],
            ]
        )
        if record.device is not None:  # NOTE: spread over devices (`--device-map`): a twelfth field
            modules[-1].append(record.device)
    lines = [
        [
            record.file,
            record.line,
            record.name,
            record.call_index,
            index if (index := get(id(record.tensor))) is not None else add(record.tensor),
            record.module_call,
        ]
        for record in line_records
    ]
    statistics = _little_endian(array.array("d", numbers)).tobytes()
    return locations, keys, shapes, dtypes, extra, statistics, modules, lines


def sync_trace(folder: Path) -> None:
    """Flush a written trace folder's files and its directory entry to the disk (best effort: a trace that was
    replaced or deleted meanwhile has nothing left to flush)."""
    folder = Path(folder)
    try:
        _fsync_all([*folder.iterdir(), folder, folder.parent])
    except OSError:
        pass


def _fsync_all(paths: list[Path]) -> None:
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


# NOTE: paths written but not flushed yet (`sync_later`); flushed together at exit (`flush_written`)
_unflushed: dict[Path, None] = {}
_unflushed_lock = threading.Lock()
# Past this many, the capture that adds one flushes them all: the cost of one flush, amortised over as many captures.
MAX_UNFLUSHED = 256


def sync_later(path: Path) -> None:
    """Flush a written trace folder (or a parameter store file) to the disk later: when the interpreter exits
    (`atexit`), or when `MAX_UNFLUSHED` wait. The rename that made it visible already happened, so a crashed
    process never leaves half a trace; only a power loss before the flush can cost the last traces.

    NOTE: not an fsync per capture, on this thread or another: measured on a tiny model, a background fsync
    after each capture tripled the wall time of the next one (its directory operations wait for the journal
    commit), for a forward of 2 ms. One flush at the end costs about one write."""
    with _unflushed_lock:
        first = not _unflushed and not _exit_hook_registered
        _unflushed[Path(path)] = None
        full = len(_unflushed) >= MAX_UNFLUSHED
    if first:
        _register_exit_hook()
    if full:
        flush_written()


_exit_hook_registered = False


def _register_exit_hook() -> None:
    global _exit_hook_registered
    if not _exit_hook_registered:
        _exit_hook_registered = True
        atexit.register(flush_written)


def flush_written() -> None:
    """Flush to the disk every trace folder and store file that `sync_later` was given (best effort: one
    replaced or deleted since has nothing left to flush)."""
    with _unflushed_lock:
        paths = list(_unflushed)
        _unflushed.clear()
    for path in paths:
        if path.is_dir():
            sync_trace(path)
        elif path.exists():
            _sync_file(path)


def _sync_file(path: Path) -> None:
    """Flush one file and its folder's entry for it (best effort)."""
    try:
        _fsync_all([path, path.parent])
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
    check_destination(destination)
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
        # NOTE: module paths are shared here, not with `sys.intern`: most are distinct (tens of thousands in a
        # large trace), and the interpreter's table of interned strings grows with them and never shrinks.
        self.paths: dict[str, str] = {}

    def path(self, path: str) -> str:
        return self.paths.setdefault(path, path)

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
        record.path = self.path(record.path)
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


def _little_endian(values: array.array) -> array.array:
    if sys.byteorder == "big":
        values.byteswap()
    return values


class _Tables:
    """The tables of a table-layout file, decoded as they stream by, and the records that point into them.

    NOTE: a summary is built the first time a record points at it, not when its table is read: with
    `inputs=False` the calls' input summaries (half of a trace's) are never built, and the summaries that are
    built sit next to the records that keep them instead of among thousands freed after loading, which would
    keep the language server's memory pages from being returned (~20 MB for a 50,000-call trace).
    """

    def __init__(self, sharing: _Sharing) -> None:
        self.sharing = sharing
        self.locations: list[SourceLocation] = []
        self.summaries: list[TensorSummary | None] = []
        self.keys: list[Any] = []
        self.shapes: list[Any] = []
        self.dtypes: list[Any] = []
        self.statistics = array.array("d")
        self.extra: dict[int, list[Any]] = {}

    def read_locations(self, rows: Any) -> None:
        if not isinstance(rows, list):
            raise ValueError("locations must be an array")
        for file, line, column in rows:
            location = SourceLocation(file, line, column)
            self.locations.append(self.sharing.location(location))

    def read_summaries(self, columns: Any) -> None:
        keys, shapes, dtypes = columns["keys"], columns["shapes"], columns["dtypes"]
        statistics, extra = columns["statistics"], columns.get("extra", [])
        count = len(keys)
        if not (
            isinstance(keys, list)
            and isinstance(shapes, list)
            and isinstance(dtypes, list)
            and isinstance(extra, list)
            and isinstance(statistics, bytes)
            and len(shapes) == count
            and len(dtypes) == count
            and len(statistics) == 8 * len(_STATISTICS) * count
        ):
            raise ValueError(f"summary columns of different lengths for {count} summaries")
        numbers = array.array("d")
        numbers.frombytes(statistics)
        self.statistics = _little_endian(numbers)
        self.keys, self.shapes, self.dtypes = keys, shapes, dtypes
        self.summaries = [None] * count
        for row in extra:
            index, _device, _nan_count, _inf_count, _tensor, _not_stored, *_placement = row
            if type(index) is not int or not 0 <= index < count:
                raise ValueError(f"summary index {index!r} is not one of the {count} summaries")
            self.extra[index] = row
        if self.sharing.inputs:
            self._build_all()

    def _build_all(self) -> None:
        """Every summary at once (all are used when inputs are read): one loop, no call per summary."""
        values = self.statistics.tolist()
        width = len(_STATISTICS)
        keys, shapes, dtypes, summaries, share = (
            self.keys,
            self.shapes,
            self.dtypes,
            self.summaries,
            self.sharing.summary,
        )
        for position in range(len(summaries)):
            statistics_of = [_statistic(value) for value in values[position * width : (position + 1) * width]]
            summaries[position] = share(
                TensorSummary(
                    keys[position],
                    list(shapes[position]),
                    dtypes[position],
                    "cpu",
                    *statistics_of[:5],
                    0,
                    0,
                    statistics_of[5],
                )
            )
        for position in self.extra:
            self._add_extra(summaries[position], position)  # type: ignore[arg-type]

    def summary(self, index: Any) -> TensorSummary:
        if type(index) is not int or not 0 <= index < len(self.summaries):
            raise ValueError(f"summary index {index!r} is not one of the {len(self.summaries)} summaries")
        summary = self.summaries[index]
        if summary is None:
            summary = self.summaries[index] = self._build_summary(index)
        return summary

    def _build_summary(self, index: int) -> TensorSummary:
        width = len(_STATISTICS)
        statistics_of = [_statistic(value) for value in self.statistics[index * width : (index + 1) * width]]
        # NOTE: values as decoded, not coerced (a shape 1.5 must not become 1): `validation` checks them all
        summary = TensorSummary(
            self.keys[index],
            list(self.shapes[index]),
            self.dtypes[index],
            "cpu",
            *statistics_of[:5],
            0,
            0,
            statistics_of[5],
        )
        summary = self.sharing.summary(summary)
        if index in self.extra:
            self._add_extra(summary, index)
        return summary

    def _add_extra(self, summary: TensorSummary, index: int) -> None:
        """The rare fields of a summary (device, NaN/Inf counts, stored tensor, placement) from its `extra` row."""
        _index, device, nan_count, inf_count, tensor, not_stored, *placement = self.extra[index]
        if placement:  # tensor-parallel traces: how the ranks held it
            summary.placement = placement[0]
        summary.device = sys.intern(device) if isinstance(device, str) else device
        summary.nan_count, summary.inf_count = nan_count, inf_count
        summary.tensor = tensor
        summary.not_stored = not_stored

    def location(self, index: Any) -> SourceLocation | None:
        if index is None:
            return None
        if type(index) is not int or not 0 <= index < len(self.locations):
            raise ValueError(f"location index {index!r} is not one of the {len(self.locations)} locations")
        return self.locations[index]

    def module(self, row: Any) -> ModuleCall:
        (
            index,
            path,
            class_name,
            defined_at,
            called_at,
            call_index,
            parent,
            finish_order,
            call_site,
            inputs,
            outputs,
            *device,
        ) = row
        summary = self.summary
        if not isinstance(path, str) or not isinstance(class_name, str):
            raise ValueError(f"module call {index!r}: path and class must be strings")
        return ModuleCall(
            index,
            self.sharing.path(path),
            sys.intern(class_name),
            self.location(defined_at),
            self.location(called_at),
            call_index,
            parent,
            finish_order,
            call_site,
            [summary(position) for position in inputs] if self.sharing.inputs else _NO_INPUTS,
            [summary(position) for position in outputs],
            str(device[0]) if device else None,
        )

    def line(self, row: Any) -> LineRecord:
        # NOTE: rows written before line records named their module call have five fields.
        file, line, name, call_index, tensor, *rest = row
        if len(rest) > 1:
            raise ValueError(f"line record with {len(row)} fields")
        module_call = rest[0] if rest else -1
        if not isinstance(file, str) or not isinstance(name, str):
            raise ValueError(f"line record of {file!r}: file and name must be strings")
        return LineRecord(sys.intern(file), line, sys.intern(name), call_index, self.summary(tensor), module_call)


def _statistic(value: float) -> float | None:
    if value == value:
        return value
    # a NaN: None when it carries the payload the writer gives None, else a NaN that was stored
    return None if struct.unpack("<Q", struct.pack("<d", value))[0] == _NONE_BITS else math.nan


def require_readable(path: Path, missing: str) -> None:
    """A `TraceFormatError` naming `path` unless it can be looked up: `missing` when it does not exist, else why
    (a name over 255 characters, a folder without permission, a link loop), never an OSError's traceback."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: {missing}") from None
    except OSError as error:
        raise TraceFormatError(f"{path}: cannot be read ({(error.strerror or str(error)).lower()})") from None


def read_trace(path: Path | str, inputs: bool = True) -> Trace:
    """Read a trace folder (or its `trace.msgpack`), validating size, format and schema.

    Records are decoded one at a time from the stream (never the whole document as dicts first) with
    repeated values shared; `inputs=False` skips the calls' input summaries (the editor shows outputs).
    """
    path = Path(path)
    trace_file = path if path.name == TRACE_FILE else path / TRACE_FILE
    require_readable(path, "no such trace")
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
            tables = _Tables(sharing)
            for _ in range(entries):
                key = unpacker.unpack()
                if key in ("modules", "lines"):
                    layout = document.get("layout")
                    if layout not in (None, LAYOUT):
                        raise TraceFormatError(
                            f"{trace_file}: trace layout {layout!r}; this ModelTrace reads {LAYOUT!r}"
                        )
                    if layout is None:  # written before the table layout: each record's JSON
                        read = sharing.module if key == "modules" else sharing.line
                    else:
                        read = tables.module if key == "modules" else tables.line
                    document[key] = [read(unpacker.unpack()) for _ in range(unpacker.read_array_header())]
                elif key == "locations" and document.get("layout") == LAYOUT:
                    tables.read_locations(unpacker.unpack())
                elif key == "summaries" and document.get("layout") == LAYOUT:
                    tables.read_summaries(unpacker.unpack())
                else:
                    document[key] = unpacker.unpack()
            try:
                unpacker.skip()
            except msgpack.OutOfData:
                pass
            else:
                raise TraceFormatError(f"{trace_file}: damaged trace (data after the end of the document)")
    except (msgpack.UnpackException, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise TraceFormatError(f"{trace_file}: corrupt or truncated trace ({type(error).__name__}: {error})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        # TypeError also covers a corrupt map whose key decodes to an unhashable value.
        raise TraceFormatError(f"{trace_file}: malformed trace record ({type(error).__name__}: {error})") from None
    schema = document.get("schema")
    if schema != SCHEMA:
        raise TraceFormatError(f"{trace_file}: trace schema {schema!r}; this ModelTrace reads {SCHEMA!r}")
    validate_header(
        {key: value for key, value in document.items() if key not in ("modules", "lines")}, str(trace_file)
    )
    try:
        # NOTE: the header goes through `Trace.from_json`, so this reader follows the format as it grows.
        trace = Trace.from_json({**document, "modules": [], "lines": []})
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise TraceFormatError(f"{trace_file}: malformed trace header ({type(error).__name__}: {error})") from None
    if not all(isinstance(document.get(key, []), list) for key in ("modules", "lines")):
        raise TraceFormatError(f"{trace_file}: malformed trace (modules and lines must be arrays)")
    trace.modules = document.get("modules", [])
    trace.lines = document.get("lines", [])
    validate_trace(trace, str(trace_file))
    return trace


def tensors_path(trace_folder: Path) -> Path | None:
    """The safetensors file of full tensors, when the trace has one."""
    candidate = Path(trace_folder) / TENSORS_FILE
    return candidate if candidate.is_file() else None


def tensors_paths(trace_folder: Path) -> list[Path]:
    """Every safetensors shard of the trace's full tensors: `tensors.safetensors`, then those a streamed trace
    added (`tensors-00001.safetensors`, …); empty when it has none."""
    from modeltrace.trace.tensors import shard_paths

    return shard_paths(Path(trace_folder))
