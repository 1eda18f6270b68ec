"""Full tensors without torch: a safe safetensors reader and writer over NumPy, and the stores a diff reads.

The language server and the diff never import torch, so full tensors are read here: the safetensors header is
parsed and checked (size, offsets inside the file, byte counts matching shape and dtype) before anything is
mapped, and tensors are NumPy views of a read-only memory map. bfloat16 has no NumPy dtype: it is widened to
float32 exactly (its bits are the top half of a float32). Every malformed input raises `TraceFormatError`
naming the file.

A `TensorStore` maps the names held in `TensorSummary.tensor` to arrays: `SafetensorsStore` for a trace's
`tensors.safetensors`, `DebuggerTensors` for a transformers debugger output (values parsed from repr strings,
or one small safetensors file per tensor). `LoadedTrace` is a trace plus its store, what `load_reference`
returns and what the diff compares.
"""

from __future__ import annotations

import errno
import json
import json.encoder
import math
import mmap
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modeltrace.errors import ModelTraceError, TraceFormatError
from modeltrace.trace.records import Trace
from modeltrace.trace.safetensors_header import read_header


# safetensors dtype code -> (NumPy dtype or None for bfloat16, item size, ModelTrace/torch dtype name)
SAFETENSORS_DTYPES: dict[str, tuple[Any, int, str]] = {
    "F64": (np.float64, 8, "float64"),
    "F32": (np.float32, 4, "float32"),
    "F16": (np.float16, 2, "float16"),
    "BF16": (None, 2, "bfloat16"),
    "I64": (np.int64, 8, "int64"),
    "I32": (np.int32, 4, "int32"),
    "I16": (np.int16, 2, "int16"),
    "I8": (np.int8, 1, "int8"),
    "U64": (np.uint64, 8, "uint64"),
    "U32": (np.uint32, 4, "uint32"),
    "U16": (np.uint16, 2, "uint16"),
    "U8": (np.uint8, 1, "uint8"),
    "BOOL": (np.bool_, 1, "bool"),
}
# Every dtype code of the safetensors format (0.6): a code outside it is damage. Those without a NumPy dtype
# above (float8, complex) are kept as bytes and compared by their statistics.
SAFETENSORS_CODES = frozenset(
    {*SAFETENSORS_DTYPES, "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"}
)
DTYPE_CODES = {name: code for code, (_, _, name) in SAFETENSORS_DTYPES.items()}
# NOTE: a header describes tensors, it is never this large; a bigger one is corrupt or hostile.
MAX_HEADER_BYTES = 100 * 1024 * 1024


def widen_bfloat16(raw: np.ndarray) -> np.ndarray:
    """float32 copy of bfloat16 values given as their uint16 bit patterns (exact)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


@dataclass(slots=True)
class TensorInfo:
    code: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def dtype_name(self) -> str:
        return SAFETENSORS_DTYPES[self.code][2]


class SafetensorsFile:
    """A safetensors file, validated on open and memory-mapped read-only; arrays are views into the map."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._map: mmap.mmap | None = None
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            status = self.path.stat()
        except FileNotFoundError:
            raise TraceFormatError(f"{self.path}: no such tensor file") from None
        except OSError as error:
            raise TraceFormatError(f"{self.path}: cannot be read ({error.strerror})") from None
        if not stat.S_ISREG(status.st_mode):
            raise TraceFormatError(f"{self.path}: not a regular file, refused as a tensor file")
        size = status.st_size
        with open(self.path, "rb") as handle:
            header, self._data_start = read_header(handle, self.path, size, MAX_HEADER_BYTES)
            data_size = size - self._data_start
            self._parse_header(header, data_size)
            if data_size > 0:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)

    def _parse_header(self, header: dict[str, Any], data_size: int) -> None:
        for name, entry in header.items():
            if name == "__metadata__":
                if isinstance(entry, dict):
                    self.metadata = {str(key): str(value) for key, value in entry.items()}
                continue
            try:
                code = entry["dtype"]
                shape = tuple(entry["shape"])
                begin, end = entry["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise TraceFormatError(f"{self.path}: corrupt safetensors entry {name!r}") from None
            # NOTE: sizes and offsets as the file holds them: a 1.5 or an Infinity is damage, not a number to round
            if not all(type(number) is int and number >= 0 for number in (*shape, begin, end)) or begin > end:
                raise TraceFormatError(
                    f"{self.path}: corrupt safetensors entry {name!r} (shape {entry['shape']!r}, "
                    f"offsets {entry['data_offsets']!r})"
                )
            if code not in SAFETENSORS_CODES:
                raise TraceFormatError(f"{self.path}: safetensors entry {name!r} has an unknown dtype {code!r}")
            if end > data_size:
                raise TraceFormatError(
                    f"{self.path}: truncated safetensors file ({name!r} ends at byte {end} of {data_size})"
                )
            if code in SAFETENSORS_DTYPES and end - begin != math.prod(shape) * SAFETENSORS_DTYPES[code][1]:
                raise TraceFormatError(f"{self.path}: corrupt safetensors entry {name!r} (size does not match shape)")
            self.tensors[str(name)] = TensorInfo(str(code), shape, begin, end)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def raw(self, name: str) -> memoryview:
        """The tensor's bytes (little-endian, row-major), without a copy."""
        info = self.tensors[name]
        if info.begin == info.end:
            return memoryview(b"")
        assert self._map is not None
        return memoryview(self._map)[self._data_start + info.begin : self._data_start + info.end]

    def array(self, name: str) -> np.ndarray | None:
        """The tensor as an array (a read-only view; bfloat16 widened to a float32 copy), None for a dtype NumPy
        cannot hold (float8, complex)."""
        info = self.tensors[name]
        spec = SAFETENSORS_DTYPES.get(info.code)
        if spec is None:
            return None
        dtype, _, _ = spec
        buffer = self.raw(name)
        if dtype is None:
            return widen_bfloat16(np.frombuffer(buffer, dtype="<u2")).reshape(info.shape)
        return np.frombuffer(buffer, dtype=np.dtype(dtype).newbyteorder("<")).reshape(info.shape)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                # Arrays still point into the map; it is released when they are.
                pass
            self._map = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def write_safetensors(
    path: Path,
    tensors: Mapping[str, tuple[str, Iterable[int], bytes | memoryview]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `{name: (dtype code, shape, raw bytes)}` as a safetensors file (header padded to 8 bytes)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (code, shape, data) in tensors.items():
        length = len(data) if isinstance(data, bytes) else data.nbytes
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + length]}
        offset += length
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for _, _, data in tensors.values():
            handle.write(data)


class TensorStore:
    """Full tensors by name (the names in `TensorSummary.tensor`); `get` returns None for an unknown name."""

    def get(self, name: str) -> np.ndarray | None:
        raise NotImplementedError

    def __contains__(self, name: object) -> bool:
        raise NotImplementedError

    def precision(self, name: str) -> tuple[float, float]:
        """(absolute, relative) rounding of the stored values: (0, 0) when exact, more for printed reprs."""
        return (0.0, 0.0)

    def raw(self, name: str) -> tuple[str, tuple[int, ...], bytes | memoryview] | None:
        """(safetensors dtype code, shape, bytes) of an exactly stored tensor, for writing it elsewhere."""
        return None

    def close(self) -> None:
        pass


class SafetensorsStore(TensorStore):
    """A trace's `tensors.safetensors`, and the further shards of a streamed trace (`shard_paths`), if any."""

    def __init__(self, path: Path, *more: Path) -> None:
        self.file = SafetensorsFile(path)
        self.files = [self.file]
        try:
            self.files.extend(SafetensorsFile(shard) for shard in more)
        except BaseException:
            self.close()
            raise
        # name -> the file holding it (the first one that does, were a name in two)
        self._where: dict[str, SafetensorsFile] = {}
        for tensor_file in reversed(self.files):
            self._where.update(dict.fromkeys(tensor_file.tensors, tensor_file))

    def get(self, name: str) -> np.ndarray | None:
        tensor_file = self._where.get(name)
        return tensor_file.array(name) if tensor_file is not None else None

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def raw(self, name: str) -> tuple[str, tuple[int, ...], memoryview] | None:
        tensor_file = self._where.get(name)
        if tensor_file is None:
            return None
        info = tensor_file.tensors[name]
        return info.code, info.shape, tensor_file.raw(name)

    def close(self) -> None:
        for tensor_file in self.files:
            tensor_file.close()


class DebuggerTensors(TensorStore):
    """Tensors of a transformers debugger output: arrays parsed from repr strings, or per-tensor files read on
    demand (each a safetensors file holding one tensor named `data`)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.precisions: dict[str, tuple[float, float]] = {}
        self.files: dict[str, tuple[Path, tuple[int, ...]]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.arrays or name in self.files

    def precision(self, name: str) -> tuple[float, float]:
        return self.precisions.get(name, (0.0, 0.0))

    def get(self, name: str) -> np.ndarray | None:
        array = self.arrays.get(name)
        if array is not None or name not in self.files:
            return array
        path, shape = self.files[name]
        with SafetensorsFile(path) as tensor_file:
            if "data" not in tensor_file:
                raise TraceFormatError(f"{path}: holds no tensor named 'data' (not a debugger tensor file)")
            info = tensor_file.tensors["data"]
            if info.shape != tuple(shape):
                raise TraceFormatError(
                    f"{path}: holds a tensor of shape {list(info.shape)}, its JSON entry says {list(shape)}"
                )
            found = tensor_file.array("data")
            return None if found is None else np.array(found)

    def raw(self, name: str) -> tuple[str, tuple[int, ...], bytes] | None:
        if name not in self.files:
            return None
        path, _ = self.files[name]
        with SafetensorsFile(path) as tensor_file:
            if "data" not in tensor_file:
                return None
            info = tensor_file.tensors["data"]
            return info.code, info.shape, bytes(tensor_file.raw("data"))


@dataclass
class LoadedTrace:
    """A trace (ours or converted from a debugger output) with access to its full tensors, when it has any.

    `kind` is "modeltrace" or "hf-debugger"; `stat_precision` is the (absolute, relative) rounding of its
    statistics ((0, 0) for ours, about 5e-5 relative for the debugger's printed `tensor(1.2345e-01)`);
    `notes` are remarks for the report (pruned layers, tensors whose files were overwritten).
    """

    trace: Trace
    tensors: TensorStore | None
    path: Path
    kind: str
    stat_precision: tuple[float, float] = (0.0, 0.0)
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.tensors is not None:
            self.tensors.close()

    def __enter__(self) -> LoadedTrace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def file_size_checked(path: Path, limit: int, what: str) -> int:
    """The size of `path`, raising a `TraceFormatError` when it is missing, not a regular file or over `limit`
    bytes."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such {what}") from None
    except OSError as error:
        raise TraceFormatError(f"{path}: cannot be read ({error.strerror})") from None
    # NOTE: a FIFO never ends a read, a device such as /dev/zero never ends one either (and says size 0)
    if not stat.S_ISREG(status.st_mode):
        raise TraceFormatError(f"{path}: not a regular file, refused as a {what}")
    size = status.st_size
    if size > limit:
        raise TraceFormatError(f"{path}: {size} bytes is over the {limit}-byte limit for a {what}")
    return size


# NOTE: the header space each shard of a streamed tensors file reserves, growing per shard: a tiny trace wastes
# 64 KB of spaces, a 1B model's few thousand tensors fit in the first two or three shards.
FIRST_SHARD_HEADER_BYTES = 64 * 1024
MAX_SHARD_HEADER_BYTES = 16 * 1024 * 1024
# the characters of a header entry besides its name, dtype, shape and offsets: `:{"dtype":,"shape":[],
# "data_offsets":[,]}` and the comma before the next entry
_ENTRY_FRAME = len(':{"dtype":,"shape":[],"data_offsets":[,]}') + 1
_quoted = json.encoder.encode_basestring_ascii  # what `json.dumps` writes for a string (ensure_ascii)
try:
    _IOV_MAX = max(1, min(os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):  # a system that does not say
    _IOV_MAX = 16


def shard_name(index: int) -> str:
    """The file name of shard `index` of a trace's tensors: the first is the `tensors.safetensors` that traces
    have always had (so readers of one file read a trace of one shard unchanged), later ones
    `tensors-00001.safetensors` and so on."""
    return "tensors.safetensors" if index == 0 else f"tensors-{index:05d}.safetensors"


def shard_paths(folder: Path) -> list[Path]:
    """The tensor shard files of a trace folder, in order (the first absent: none; stops at the first gap)."""
    paths: list[Path] = []
    while (candidate := Path(folder) / shard_name(len(paths))).is_file():
        paths.append(candidate)
    return paths


class StreamingSafetensorsWriter:
    """Writes tensors into safetensors shard files one by one, as they arrive, never holding them.

    A safetensors file starts with its header, which names every tensor and its offsets; a stream does not know
    them in advance. Each shard therefore reserves header space after its 8-byte length prefix, writes tensors'
    bytes back to back after it, and on `close` writes the header padded with spaces to the reserved size (the
    format allows trailing spaces in the header: `safetensors` and `SafetensorsFile` read it as any other
    file). A tensor whose header entry would overflow the reservation starts the next shard (`shard_name`).
    The files are written into a trace's temporary folder (`storage.begin_trace`), so nothing reads them
    before the rename that completes the trace.
    """

    def __init__(self, folder: Path, first_header_bytes: int = FIRST_SHARD_HEADER_BYTES) -> None:
        self.folder = Path(folder)
        self.shards = 0
        self.bytes_written = 0
        self._header_bytes = first_header_bytes
        self._descriptor: int | None = None
        self._entries: dict[str, Any] = {}
        self._header_used = 2  # the braces
        self._offset = 0

    def _open_shard(self) -> None:
        path = self.folder / shard_name(self.shards)
        self._descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.lseek(self._descriptor, 8 + self._header_bytes, os.SEEK_SET)
        self.shards += 1
        self._entries = {}
        self._header_used = 2
        self._offset = 0

    def write(self, name: str, code: str, shape: Iterable[int], data: memoryview) -> None:
        """Append one tensor: `data` its little-endian row-major bytes (any buffer: written without a copy)."""
        self.write_many([(name, code, shape, data)])

    def write_many(self, tensors: Iterable[tuple[str, str, Iterable[int], memoryview]]) -> None:
        """Append tensors, each `(name, dtype code, shape, bytes)`, with one `os.writev` per shard they land in
        (the writer thread of a stream hands the GIL back and forth with the forward once per call, not once
        per tensor)."""
        try:
            self._write_many(tensors)
        except OSError as error:
            raise self._write_error(error) from None

    def _write_error(self, error: OSError) -> ModelTraceError:
        # NOTE: a full disk during the forward pass is a write that failed, not the model's `forward` failing
        # (the folder is the trace's temporary one, next to its destination)
        reason = (error.strerror or str(error)).lower()
        return ModelTraceError(f"cannot write the trace's tensors into {self.folder.parent}: {reason}")

    def _write_many(self, tensors: Iterable[tuple[str, str, Iterable[int], memoryview]]) -> None:
        buffers: list[memoryview] = []  # of this shard, not written yet
        for name, code, shape, data in tensors:
            length = data.nbytes
            shape = list(shape)
            entry = {"dtype": code, "shape": shape, "data_offsets": [self._offset, self._offset + length]}
            # NOTE: the entry's size in the header `close` writes (`json.dumps` with these separators), plus its
            # comma; spelled out, as `json.dumps` per tensor cost more than a tiny model's layer
            size = (
                len(_quoted(name))
                + len(_quoted(code))
                + len(",".join(map(str, shape)))
                + len(str(self._offset))
                + len(str(self._offset + length))
                + _ENTRY_FRAME
            )
            if self._descriptor is None or self._header_used + size > self._header_bytes:
                if self._descriptor is not None:
                    self._write_buffers(buffers)
                    self._close_shard()
                    self._header_bytes = min(self._header_bytes * 4, MAX_SHARD_HEADER_BYTES)
                # NOTE: a name too long for any reservation would loop: it is a caller's bug, said as such
                if size + 2 > self._header_bytes:
                    raise ValueError(f"tensor name {name[:80]!r}… is too long for a safetensors header")
                self._open_shard()
                entry["data_offsets"] = [0, length]
            if length:
                buffers.append(data.cast("B") if data.ndim != 1 or data.format != "B" else data)
            self._entries[name] = entry
            self._header_used += size
            self._offset += length
            self.bytes_written += length
        self._write_buffers(buffers)

    def _write_buffers(self, buffers: list[memoryview]) -> None:
        """Write `buffers` back to back at the shard's position (then empty the list), in as few calls as the
        system allows (`os.writev` takes at most `SC_IOV_MAX` buffers and may write less than asked)."""
        descriptor = self._descriptor
        index = 0
        while index < len(buffers):
            assert descriptor is not None
            batch = buffers[index : index + _IOV_MAX]
            written = os.writev(descriptor, batch)
            if not written:
                raise OSError(errno.EIO, "the system wrote nothing")
            for buffer in batch:
                if written < buffer.nbytes:
                    buffers[index] = buffer[written:]
                    break
                written -= buffer.nbytes
                index += 1
        buffers.clear()

    def _close_shard(self) -> None:
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is None:
            return
        try:
            encoded = json.dumps(self._entries, separators=(",", ":")).encode()
            encoded += b" " * (self._header_bytes - len(encoded))
            payload = struct.pack("<Q", self._header_bytes) + encoded
            view = memoryview(payload)
            position = 0
            while position < len(payload):
                position += os.pwrite(descriptor, view[position:], position)
        finally:
            os.close(descriptor)

    def close(self) -> None:
        """Write the last shard's header; the files are complete safetensors files from here on."""
        try:
            self._close_shard()
        except OSError as error:
            raise self._write_error(error) from None

    def abort(self) -> None:
        """Close without completing (the caller deletes the temporary folder)."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            os.close(descriptor)
