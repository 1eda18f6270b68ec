"""Writing a model's parameters to the shared parameter store, once per content (`trace/parameter_store.py` says
the layout and reads it).

`store_parameters(model, builds, ...)` names the store file of the model's weights by a digest of every stored
tensor (name, dtype, shape, bytes: SHA-256), writes the file only when the store does not hold it yet, marks the
parameter records of `builds` as stored there, and returns the header's reference. Hashing a 1B model's weights
takes seconds, so the digest is kept per model and reused while every tensor's identity, data pointer and
version counter (`_version`, bumped by every in-place write: `load_state_dict`, an optimizer step, `copy_`) are
unchanged: a second capture of an unchanged model reads no weight. `WeightWork` fingerprints and hashes the
weights on a second thread, beside and after the worker's forward; its fresh model has no digest yet, so the store
remembers the digest each build made (`<store>/builds/<key>.json`: `build_identity.py` says what a key covers),
and a build with the same key whose fingerprints are the same takes it after a spot check of the file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import mmap
import os
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modeltrace.errors import TraceFormatError
from modeltrace.trace.parameter_store import MAX_STORE_HEADER_BYTES, STORE_SUFFIX, default_store, open_parameters
from modeltrace.trace.safetensors_header import read_header
from modeltrace.trace.records import ModuleBuild
from modeltrace.trace.tensors import write_safetensors
from modeltrace.worker.stats import without_storage
from modeltrace.worker.tensor_stream import safetensors_code


DIGEST_NAME = "sha256"
# model -> (version key, digest) of its stored tensors; weak, so that a dropped model takes its entry with it
_DIGESTS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, str]] = weakref.WeakKeyDictionary()
# store files checked to be whole, by (path, size, mtime): checked again only when they change
_VERIFIED: set[tuple[str, int, int]] = set()
# store files whose bytes differed from the model compared with them: rewritten if the digest says they are its
_DIFFERING: set[str] = set()
# NOTE: bounds on `_matching_digest`: the store files whose header it reads, those it compares
MAX_HEADERS_READ = 64
MAX_FILES_COMPARED = 4
# `<store>/builds/<build key>.json`: the digest each build's weights had (`remembered_digest`)
BUILDS_FOLDER = "builds"
MAX_BUILD_ENTRY_BYTES = 4096
# NOTE: every edit of a traced model's files makes a new key: past this many entries the oldest quarter goes
MAX_BUILD_ENTRIES = 2048


def stored_tensors(model: nn.Module, max_tensor_bytes: int | None) -> tuple[list[tuple[str, torch.Tensor]], dict]:
    """The parameters and buffers the store holds for `model` (`parameters/PATH.NAME`, `named_modules()` order,
    a tied weight once, under its first name), and those left out for their size (name -> reason)."""
    kept: list[tuple[str, torch.Tensor]] = []
    too_large: dict[str, str] = {}
    seen: set[int] = set()
    for path, module in model.named_modules():
        for name, tensor in (*module._parameters.items(), *module._buffers.items()):
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if tensor.device.type == "meta" or tensor.numel() == 0 or without_storage(tensor) is not None:
                continue
            if safetensors_code(tensor.dtype) is None:
                continue
            qualified = f"{path}.{name}" if path else name
            size = tensor.numel() * tensor.element_size()
            if max_tensor_bytes is not None and size > max_tensor_bytes:
                too_large[qualified] = (
                    f"{size / 2**20:.1f} MB is over the {max_tensor_bytes / 2**20:.1f} MB limit per tensor"
                )
                continue
            kept.append((f"parameters/{qualified}", tensor))
    return kept, too_large


def _version_key(tensors: list[tuple[str, torch.Tensor]]) -> tuple | None:
    """What changes when a stored tensor does: identity, data pointer, version counter (None when a tensor has
    no version counter, an inference-mode tensor: then the digest is computed every time)."""
    try:
        return tuple((name, id(tensor), tensor.data_ptr(), tensor._version) for name, tensor in tensors)
    except RuntimeError:
        return None


def _raw(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def compute_digest(tensors: list[tuple[str, torch.Tensor]]) -> str:
    """The content digest of the stored tensors: SHA-256 over each one's name, dtype, shape and bytes.

    NOTE: SHA-256, not BLAKE2b: on this project's machines (SHA extensions) it hashes 350 MB/s to BLAKE2b's 190."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in tensors:
            digest.update(f"{name}\0{safetensors_code(tensor.dtype)}\0{list(tensor.shape)}\0".encode())
            digest.update(_raw(tensor))  # NOTE: hashlib releases the GIL over large buffers
    return digest.hexdigest()


def model_digest(model: nn.Module, tensors: list[tuple[str, torch.Tensor]], folder: Path | None = None) -> str:
    """`compute_digest`, reused while the model's stored tensors are unchanged, or read from the name of the store
    file in `folder` that holds exactly them (see the module docstring)."""
    key = _version_key(tensors)
    cached = _DIGESTS.get(model)
    if key is not None and cached is not None and cached[0] == key:
        return cached[1]
    digest = _matching_digest(folder, tensors) if folder is not None and tensors else None
    if digest is None:
        digest = compute_digest(tensors)
    if key is not None:
        _DIGESTS[model] = (key, digest)
    return digest


def _layout(tensors: list[tuple[str, torch.Tensor]]) -> dict[str, tuple]:
    return {name: (safetensors_code(tensor.dtype), list(tensor.shape), _nbytes(tensor)) for name, tensor in tensors}


def _matching_digest(folder: Path, tensors: list[tuple[str, torch.Tensor]]) -> str | None:
    """The digest of a store file in `folder` that holds exactly `tensors` (the same names, dtypes, shapes and
    bytes), among the newest ones whose header lists them; None when none does. Files that list them but hold
    other bytes are noted in `_DIFFERING`. Anything unreadable counts as no match: never an error."""
    layout = _layout(tensors)
    try:
        with os.scandir(folder) as listing:
            files = [
                (entry.stat().st_mtime_ns, entry.path)
                for entry in listing
                if entry.name.endswith(STORE_SUFFIX) and entry.name[: -len(STORE_SUFFIX)].isalnum()
            ]
    except OSError:
        return None
    compared = 0
    for _, path in sorted(files, reverse=True)[:MAX_HEADERS_READ]:
        if compared >= MAX_FILES_COMPARED:
            break
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                header, data_start = read_header(handle, Path(path), size, MAX_STORE_HEADER_BYTES)
                offsets = _offsets_if_same_layout(header, layout, size - data_start)
                if offsets is None:
                    continue
                compared += 1
                if _same_bytes(handle.fileno(), data_start, offsets, tensors):
                    return Path(path).name.removesuffix(STORE_SUFFIX)
        except (OSError, ValueError, BufferError, TraceFormatError):  # unreadable, empty, changed meanwhile
            continue
        _DIFFERING.add(path)
    return None


def fingerprints_digest(records: dict[str, list]) -> str:
    """SHA-256 of every parameter record (`builds.ParameterFingerprints.records()`: names, shapes, dtypes,
    statistics and samples), in module order: what a remembered digest's weights must show again."""
    import msgpack

    digest = hashlib.sha256()
    for path, path_records in records.items():
        digest.update(msgpack.packb([path, [record.to_json() for record in path_records]]))
    return digest.hexdigest()


def _build_entry(folder: Path, build_key: str) -> Path:
    return folder / BUILDS_FOLDER / f"{build_key}.json"


def remembered_digest(
    folder: Path, build_key: str, fingerprints: str, tensors: list[tuple[str, torch.Tensor]]
) -> str | None:
    """The digest the store remembers for the build `build_key` (`build_identity.py`), when the weights it was
    remembered for had these `fingerprints`, its store file is the one remembered (size, time, inode) and lists
    `tensors`, and starts each with their bytes (4 KB of each read: the whole match reads all); None otherwise.
    The entry is data another process wrote: anything unreadable, oversized or malformed counts as none, never
    an error."""
    try:
        with open(_build_entry(folder, build_key), "rb") as handle:
            text = handle.read(MAX_BUILD_ENTRY_BYTES + 1)
        entry = json.loads(text) if len(text) <= MAX_BUILD_ENTRY_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("fingerprints") != fingerprints:
        return None
    digest = entry.get("digest")
    if not (isinstance(digest, str) and len(digest) == 64 and all(char in "0123456789abcdef" for char in digest)):
        return None
    try:
        with open(folder / f"{digest}{STORE_SUFFIX}", "rb") as handle:
            status = os.fstat(handle.fileno())
            if entry.get("file") != _file_identity(status):
                return None
            size = status.st_size
            header, data_start = read_header(handle, folder / f"{digest}{STORE_SUFFIX}", size, MAX_STORE_HEADER_BYTES)
            offsets = _offsets_if_same_layout(header, _layout(tensors), size - data_start)
            if offsets is None or not _same_bytes(handle.fileno(), data_start, offsets, tensors, whole=False):
                return None
    except (OSError, ValueError, BufferError, RuntimeError, TraceFormatError):
        return None
    return digest


def remember_digest(folder: Path, build_key: str, fingerprints: str, digest: str) -> None:
    """Remember that the build `build_key` made the weights of the store file `digest`, with these
    `fingerprints`, and the file's identity now (`_file_identity`: a file written since is not trusted on the
    entry's word). A temporary sibling renamed into place; a store that cannot be written, or a file that is
    gone, remembers nothing: never an error."""
    entry = _build_entry(folder, build_key)
    temporary = entry.with_name(f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        file = _file_identity(os.stat(folder / f"{digest}{STORE_SUFFIX}"))
        entry.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"digest": digest, "fingerprints": fingerprints, "file": file}))
        os.replace(temporary, entry)
    except OSError:
        temporary.unlink(missing_ok=True)
        return
    _prune_entries(entry.parent)


def _prune_entries(folder: Path) -> None:
    """Past `MAX_BUILD_ENTRIES`, remove the entries written longest ago, down to three quarters of it (an entry
    removed is only a byte match the next time that build runs). Never an error."""
    try:
        with os.scandir(folder) as listing:
            entries = [(item.stat().st_mtime_ns, item.path) for item in listing if item.name.endswith(".json")]
        if len(entries) <= MAX_BUILD_ENTRIES:
            return
        for _, path in sorted(entries)[: len(entries) - MAX_BUILD_ENTRIES * 3 // 4]:
            os.unlink(path)
    except OSError:
        pass


def _file_identity(status: os.stat_result) -> list[int]:
    return [status.st_size, status.st_mtime_ns, status.st_ino]


def remember_model_digest(model: nn.Module, tensors: list[tuple[str, torch.Tensor]], digest: str) -> None:
    """Keep `digest` as the model's while its stored tensors are unchanged (`model_digest` then returns it)."""
    key = _version_key(tensors)
    if key is not None:
        _DIGESTS[model] = (key, digest)


def _offsets_if_same_layout(header: dict, layout: dict[str, tuple], data_size: int) -> dict[str, int] | None:
    """Where each tensor of `layout` starts in the file's data, when the header lists exactly those tensors with
    their dtypes and shapes, each entry's bytes inside the data and of its size; else None."""
    if len(header) - ("__metadata__" in header) != len(layout):
        return None
    starts: dict[str, int] = {}
    for name, (code, shape, nbytes) in layout.items():
        entry = header.get(name)
        if not isinstance(entry, dict) or entry.get("dtype") != code or entry.get("shape") != shape:
            return None
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(value) is int for value in offsets)):
            return None
        begin, end = offsets
        if not 0 <= begin <= end <= data_size or end - begin != nbytes:
            return None
        starts[name] = begin
    return starts


def _same_bytes(descriptor: int, data_start: int, starts: dict[str, int], tensors: list, whole: bool = True) -> bool:
    """Whether the file's bytes at `starts` equal each tensor's: the first 4 KB of every tensor first (other
    weights differ there: a mismatch costs a few pages read), then all of them (`whole`), each from a read-only
    map of its own bytes in the file (no copy; a tensor off the CPU is copied to it one at a time, as for
    hashing)."""
    with torch.no_grad():
        for name, tensor in tensors:
            start = _first_bytes(tensor, 4096)
            # NOTE: read, not mapped: a map and its page faults cost ~60 us a tensor
            if os.pread(descriptor, len(start), data_start + starts[name]) != start:
                return False
        if whole:
            for name, tensor in tensors:
                if not _file_bytes_equal(descriptor, data_start + starts[name], _raw(tensor)):
                    return False
    return True


_PLAIN = (torch.Tensor, nn.Parameter)


def _first_bytes(tensor: torch.Tensor, limit: int) -> bytes:
    """The first `limit` bytes of the tensor's data (whole elements), as bytes (compared with `==`, they are
    compared by `memcmp`; a memoryview compares element by element)."""
    count = max(1, limit // tensor.element_size())
    if (
        type(tensor) in _PLAIN
        and tensor.is_cpu
        and tensor.layout is torch.strided
        and tensor.is_contiguous()
        and not tensor.is_neg()
        and not tensor.is_conj()
    ):
        # NOTE: straight from memory: `_raw`'s six tensor calls cost more than the read, ~80 tensors a model
        return ctypes.string_at(tensor.data_ptr(), min(count, tensor.numel()) * tensor.element_size())
    return _raw(tensor.detach().reshape(-1)[:count]).tobytes()


def _file_bytes_equal(descriptor: int, offset: int, raw: memoryview) -> bool:
    """Whether the file holds `raw` at `offset`. NOTE: one tensor's pages mapped at a time and unmapped before the
    next: a map of the whole store file counted all its pages, read once, in the process's resident memory
    (+578 MB at the peers benchmark's large size); now it grows by the largest weight."""
    if raw.nbytes == 0:
        return True
    aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(descriptor, offset - aligned + raw.nbytes, access=mmap.ACCESS_READ, offset=aligned) as mapped:
        # NOTE: every view of the map is released before it closes (an exported buffer would refuse the close)
        with memoryview(mapped) as whole, whole[offset - aligned :] as stored:
            return _equal(stored, raw)


def _c_memcmp() -> Any:
    """The C library's `memcmp` through ctypes (which releases the GIL around it), or None where there is none."""
    try:
        library = ctypes.CDLL(ctypes.util.find_library("c") or None) if os.name != "nt" else ctypes.cdll.msvcrt
        function = library.memcmp
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


_MEMCMP = _c_memcmp()


def _equal(first: memoryview, second: memoryview) -> bool:
    if first.nbytes != second.nbytes:
        return False
    first_bytes, second_bytes = np.frombuffer(first, dtype=np.uint8), np.frombuffer(second, dtype=np.uint8)
    if _MEMCMP is not None and first.nbytes:
        # NOTE: `memcmp` reads each side once; NumPy's `array_equal` also writes and reads an array of booleans,
        # one per element: a medium Llama's store match took 28 ms with it, beside a forward that streams the
        # same weights from memory
        return _MEMCMP(first_bytes.ctypes.data, second_bytes.ctypes.data, first.nbytes) == 0
    return bool(np.array_equal(first_bytes, second_bytes))  # NumPy releases the GIL over the loop


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# NOTE: statistics only, the fingerprints are read on the second thread when the model holds this many parameter
# and buffer elements. A small model's read takes less than starting a thread (tens of µs against ~0.1 ms), and
# its forward holds the GIL most of the time: the thread would wait for it, and the two threads take turns on it
# (measured at the peers benchmark's tiny Llama, 0.2 M parameters, with the per-weight Python read of before:
# worker statistics ~1 ms slower with the thread, the forward 2.1 -> 3.3 ms).
THREAD_MIN_ELEMENTS = 1 << 22


class WeightWork:
    """What the worker does with its parameters that does not depend on the forward, on a second thread: their
    fingerprints (`builds.parameter_records`) while the forward runs, then the weights' digest (`model_digest`)
    once it has ended.

    The fingerprints are planned here, on the job's thread; the second thread only reads the weights (one call of
    the native kernel, without the GIL: `builds.ParameterFingerprints`), and `fingerprints()` makes the records
    once it has (raising what it raised). A Python loop on the second thread cost a medium Llama's forward ~3%:
    each of its weights handed the GIL back and forth while the forward's thread needed it between its kernels.

    The digest (with full tensors: `max_tensor_mb` set) waits for the forward to end, which `fingerprints()` and
    `wait()` say (both are asked for after it): its byte match against the store reads every weight and the store
    file, twice the memory the forward streams, and beside the forward it cost it more than it takes alone (a
    medium Llama's worker trace with full tensors: 1.35x a plain forward with the match beside it, 1.31x after
    it). After the forward it runs while the job's thread makes the construction records; its result is left in
    `model_digest`'s cache for `store_parameters` (a model changed meanwhile is caught by its check and hashed
    again). Below `THREAD_MIN_ELEMENTS`, statistics only, the fingerprints are made when asked for, on the
    caller's thread. The settings and construction lines stay on the job's thread: they parse source (`ast`,
    unsafe on two threads in 3.11).

    With a `build_key` (`build_identity.BuildInputs`), the digest waits for the fingerprints' records too: a
    digest the store remembers for that build, whose weights had the same fingerprints, is taken after a spot
    check of its file (`remembered_digest`) instead of the byte match; a digest found otherwise is remembered."""

    def __init__(self, model: nn.Module, max_tensor_mb: float | None, build_key: str | None = None) -> None:
        from modeltrace.worker.builds import ParameterFingerprints

        self._model, self._max_tensor_mb = model, max_tensor_mb
        self._build_key = build_key if max_tensor_mb is not None else None
        self._fingerprints_digest: str | None = None
        self._remembered = False
        self._fingerprinted = threading.Event()  # NOTE: the records' digest made, or never to be
        # NOTE: planned here whether or not it is read on the second thread (after the forward it costs the same)
        self._plan = ParameterFingerprints(model)
        self._error: BaseException | None = None
        self._recorded, self._finished = threading.Event(), threading.Event()
        self._forward_ended = threading.Event()
        self._abandoned = False
        self._threaded = max_tensor_mb is not None or self._plan.elements >= THREAD_MIN_ELEMENTS
        if self._threaded:
            threading.Thread(target=self._run, name="modeltrace-weight-work", daemon=True).start()

    def _run(self) -> None:
        try:
            self._plan.read()
        except BaseException as error:  # noqa: BLE001 - raised again by `fingerprints()`, on the job's thread
            self._error = error
        finally:
            self._recorded.set()
        if self._max_tensor_mb is not None:
            self._forward_ended.wait()
        if self._max_tensor_mb is not None and not self._abandoned:
            try:
                self._digest()
            except Exception:  # noqa: BLE001 - `store_parameters` hashes again and reports what fails
                pass
        self._finished.set()

    def _digest(self) -> None:
        if self._build_key is not None:
            self._fingerprinted.wait()
            if self._abandoned or self._remembered:
                return
        model_digest(self._model, self._stored_tensors(), default_store())

    def _stored_tensors(self) -> list[tuple[str, torch.Tensor]]:
        assert self._max_tensor_mb is not None
        return stored_tensors(self._model, int(self._max_tensor_mb * 2**20))[0]

    def _take_remembered(self, records: dict[str, list]) -> None:
        """The digest the store remembers for this build and these fingerprints, kept as the model's; on the
        job's thread (a few Python calls a tensor: on the second one they would wait for the GIL meanwhile)."""
        assert self._build_key is not None
        try:
            self._fingerprints_digest = fingerprints_digest(records)
            tensors = self._stored_tensors()
            digest = remembered_digest(default_store(), self._build_key, self._fingerprints_digest, tensors)
        except Exception:  # noqa: BLE001 - only a byte match more: never the trace's failure
            self._fingerprints_digest = digest = None
        if digest is not None:
            remember_model_digest(self._model, tensors, digest)
            self._remembered = True

    def remember(self, stored: dict[str, Any]) -> None:
        """After `store_parameters`: the store remembers this build's digest and fingerprints, and its file as it
        is now (a file written again since is matched again), unless it was remembered already."""
        if self._build_key is None or self._fingerprints_digest is None or self._remembered:
            return
        if isinstance(stored.get("file"), str) and isinstance(stored.get("store"), str):
            folder = Path(stored["store"])
            digest = stored["file"].removesuffix(STORE_SUFFIX)
            remember_digest(folder, self._build_key, self._fingerprints_digest, digest)

    def forward_exited(self, error_type: type[BaseException] | None, *_: object) -> bool:
        """The forward's exit (an `ExitStack.push` callback): the digest starts, or, if it raised, is not made
        (nothing will ask for it, and the thread ends). Never swallows the error."""
        self._abandoned = error_type is not None
        if self._abandoned:
            self._fingerprinted.set()
        self._forward_ended.set()
        return False

    def wait(self) -> None:
        """Until the digest too is done (`store_parameters` then finds it in the cache). After the forward."""
        self._forward_ended.set()
        self._fingerprinted.set()  # NOTE: fingerprints never asked for (a failure): the byte match goes on
        if not self._threaded and not self._finished.is_set():
            self._run()
        self._finished.wait()

    def fingerprints(self) -> dict[str, list]:
        """The parameters' records by module path. After the forward: the digest starts."""
        self._forward_ended.set()
        if not self._threaded:
            # NOTE: a small model's, on the job's thread, after the forward (see THREAD_MIN_ELEMENTS)
            self._plan.read()
            self._recorded.set()
        self._recorded.wait()
        try:
            if self._error is not None:
                raise self._error
            records = self._plan.records()
            if self._build_key is not None:
                self._take_remembered(records)
            return records
        finally:
            self._fingerprinted.set()


def store_parameters(
    model: nn.Module, builds: list[ModuleBuild], max_tensor_bytes: int | None = None, store: Path | None = None
) -> dict[str, Any]:
    """Make sure the store holds the model's parameters (writing them only when it does not), mark the records
    of `builds` stored there, and return the header's `parameters` reference. A store that cannot be written
    (read-only, full) leaves the parameters unstored, each record saying why, and the trace is written anyway."""
    tensors, too_large = stored_tensors(model, max_tensor_bytes)
    folder = Path(store) if store is not None else default_store()
    digest = model_digest(model, tensors, folder)
    path = folder / f"{digest}{STORE_SUFFIX}"
    try:
        # NOTE: a file found holding other bytes than the weights its name says: damaged, written again
        if str(path) in _DIFFERING or not _is_whole(path, tensors):
            _write(path, tensors)
            _DIFFERING.discard(str(path))
    except OSError as error:
        reason = f"cannot write the parameter store {path}: {(error.strerror or str(error)).lower()}"
        _mark(builds, {}, dict.fromkeys((name.removeprefix("parameters/") for name, _ in tensors), reason))
        return {"not_stored": reason}
    _mark(builds, {name.removeprefix("parameters/"): name for name, _ in tensors}, too_large)
    return {
        "store": str(folder),
        "file": path.name,
        "digest": f"{DIGEST_NAME}:{digest}",
        "tensors": len(tensors),
        "bytes": sum(tensor.numel() * tensor.element_size() for _, tensor in tensors),
    }


def _mark(builds: list[ModuleBuild], stored: dict[str, str], not_stored: dict[str, str]) -> None:
    for build in builds:
        for record in build.parameters:
            qualified = f"{build.path}.{record.name}" if build.path else record.name
            if qualified in stored:
                record.summary.tensor, record.summary.not_stored = stored[qualified], None
            elif qualified in not_stored:
                record.summary.tensor, record.summary.not_stored = None, not_stored[qualified]


def _is_whole(path: Path, tensors: list[tuple[str, torch.Tensor]]) -> bool:
    """Whether the store file exists and holds every tensor with its shape (a header check: a truncated or
    garbage file is rewritten, never trusted). Checked once per file version."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return False
    key = (str(path), status.st_size, status.st_mtime_ns)
    if key in _VERIFIED:
        return True
    from modeltrace.errors import TraceFormatError

    try:
        with open_parameters(path) as stored:
            whole = all(
                name in stored.tensors and stored.tensors[name].shape == tuple(tensor.shape)
                for name, tensor in tensors
            )
    except TraceFormatError:
        whole = False
    if whole:
        _VERIFIED.add(key)
    return whole


def _write(path: Path, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Write the store file atomically (a temporary sibling renamed into place, so that a reader or a second
    capture never sees half of one); flushed to the disk later (`storage.sync_later`)."""
    from modeltrace.trace.storage import sync_later

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with torch.no_grad():
            write_safetensors(
                temporary,
                {name: (safetensors_code(tensor.dtype) or "", tensor.shape, _raw(tensor)) for name, tensor in tensors},
                {"format": "pt", "modeltrace": "parameter store"},
            )
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    sync_later(path)
