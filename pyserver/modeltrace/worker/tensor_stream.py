"""Full tensors streamed to disk while the forward runs: a background writer fed by a bounded queue.

`ModuleCapture(..., stream=TensorStream(...))` hands each tensor to keep to `TensorStream.put` instead of copying
it: the queue holds the live tensor (no copy), and a writer thread writes its bytes into the safetensors shards
of the trace's temporary folder (`StreamingSafetensorsWriter`) while the forward goes on; the write releases the
GIL, so it hides behind torch's compute. The writer runs little Python and no torch call for a contiguous
tensor: its bytes are located when it is queued (a strided one is made contiguous by the writer, the copy held
until its bytes are written), and the writer is woken per few megabytes queued (`WAKE_BYTES`), writing all of
them with one `os.writev`; the forward's thread, which takes the GIL back after each of its kernels, otherwise
waits for the writer's Python code once per tensor (that waiting was most of what streaming cost). Three things
keep that correct and bounded:

- Memory: the queue holds at most `memory_budget` bytes of tensors not yet written (tensors the forward would
  otherwise have freed by then); a `put` that would go past it waits for the writer (back-pressure), so a
  full-tensor trace's peak memory is the plain forward's plus the budget, whatever the model size. One tensor
  larger than the whole budget is let in alone, once the queue is empty.
- Values as captured: a queued tensor that the forward is about to change in place (`x.add_`, `x[...] = `,
  `x += y`, `relu(inplace=True)`) is copied first, once (`_InPlaceGuard`: torch's in-place functions wrapped
  while the forward runs, every other call untouched); nothing is copied that is never changed. The tensor's
  version counter (`_version`) is the safety net for a change the guard cannot see (a write into `out=`, C++
  code): a tensor whose version moved before or while it was written is not kept (`stale`, with the reason for
  its summary).
- Failure: the first write error (disk full, a folder that cannot be written) stops the writer, drops the
  queue, and is raised by the next `put` (stopping the forward) or by `finish`, as one `ModelTraceError`
  naming the folder; the caller discards the temporary folder, so no half-written trace is left.

Device tensors are copied to the CPU when captured (that copy has to happen anyway; the copy cannot change). A
CUDA tensor's copy goes into pinned memory without waiting (`copy_to_host`): the forward's kernels stay queued
on the GPU, and the writer waits for the copy's event before it writes the bytes.
"""

from __future__ import annotations

import ctypes
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import TensorSummary
from modeltrace.trace.tensors import DTYPE_CODES, StreamingSafetensorsWriter
from modeltrace.worker.protocol import DEFAULT_TENSOR_MEMORY_MB  # noqa: F401 - re-exported for the worker
from modeltrace.worker.stats import is_plain, without_storage


# torch dtypes that have a safetensors code beyond the ones `trace/tensors.py` reads as NumPy arrays
# NOTE: stored as bytes that only `diff/rotary_tables.py` reads back as numbers (a complex rotary table against
# cosines and sines); every other reader gets no array for them, as for float8
_EXTRA_CODES = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64"}


def safetensors_code(dtype: torch.dtype) -> str | None:
    name = str(dtype).removeprefix("torch.")
    return DTYPE_CODES.get(name) or _EXTRA_CODES.get(name)


@dataclass(slots=True, eq=False)
class _Entry:
    name: str
    tensor: torch.Tensor
    summary: TensorSummary
    size: int
    version: int  # at capture; -1: no version counter (an inference tensor), or a private copy
    storage: int  # the address of its storage, 0 for a private copy (nothing else can change it)
    code: str  # its safetensors dtype
    data: memoryview | None  # its bytes, in place (a contiguous tensor); None: the writer makes it contiguous
    writing: bool = False  # taken by the writer
    written: bool = False
    copied: Any = None  # a CUDA tensor's copy: the event the writer waits for before its bytes are there


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors track no version
        return -1


class TensorStream:
    """The queue and the writer thread of one trace's full tensors (see the module docstring).

    `put` from the capturing thread; `finish` once, after the last `put`, to wait for the writer and complete
    the files (or raise its error); `abort` to stop it without completing. `stale` lists the summaries of
    tensors that were changed in place by something the guard cannot see, with the reason; `peak_queued_bytes`
    is the most the queue held at once (at most the budget, or one larger tensor alone).
    """

    def __init__(self, folder: Path, memory_budget: int) -> None:
        self.folder = Path(folder)
        self.memory_budget = max(0, int(memory_budget))
        self.files = StreamingSafetensorsWriter(self.folder)
        self.queued_bytes = 0
        self.peak_queued_bytes = 0
        self.waited_seconds = 0.0  # the forward's time spent waiting for the writer (back-pressure)
        self.copies = 0  # tensors copied before an in-place change
        self.stale: list[tuple[TensorSummary, str]] = []
        self.error: BaseException | None = None
        self._queue: deque[_Entry] = deque()
        self._by_storage: dict[int, list[_Entry]] = {}
        self._closing = False
        self._ready = False
        self._unsignalled = 0  # bytes queued since the writer was last woken
        self._wake_bytes = max(1, min(WAKE_BYTES, self.memory_budget // 4))
        self._condition = threading.Condition()
        # NOTE: started at the first wake-up: a trace under `WAKE_BYTES` is written by `finish`, on the caller's
        # thread, with no thread started or woken (at the tiny size, those hand-offs cost more than the forward)
        self._thread: threading.Thread | None = None
        self.guard = _InPlaceGuard(self)

    # -- the capturing thread ------------------------------------------------------------------------------

    def put(self, name: str, tensor: torch.Tensor, summary: TensorSummary) -> bool:
        """Queue `tensor` to be written under `name`; False (with `summary.not_stored` saying why) for a tensor
        that cannot be stored. Waits while the queue is over the budget; raises the writer's error."""
        code = safetensors_code(tensor.dtype)
        kind = without_storage(tensor)
        if code is None or kind is not None:
            # NOTE: sparse, nested and quantized tensors have no one block of memory to write
            what = kind or str(tensor.layout).removeprefix("torch.")
            summary.not_stored = f"{str(tensor.dtype).removeprefix('torch.')} {what} tensors are not stored"
            return False
        tensor = tensor.detach()
        size = tensor.numel() * tensor.element_size()
        version, storage, copied = _version(tensor), 0, None
        if tensor.device.type != "cpu":
            tensor, copied = copy_to_host(tensor)  # the copy that has to happen: nothing can change it after
            version = -1
        elif size:
            storage = tensor.untyped_storage().data_ptr()
        entry = _Entry(name, tensor, summary, size, version, storage, code, _bytes_of(tensor, size), copied=copied)
        condition = self._condition
        with condition:
            if self.error is None and self.queued_bytes and self.queued_bytes + size > self.memory_budget:
                waited = time.perf_counter()
                self._wake()  # NOTE: whatever is queued goes now, to make room
                while self.error is None and self.queued_bytes and self.queued_bytes + size > self.memory_budget:
                    condition.wait()
                self.waited_seconds += time.perf_counter() - waited
            if self.error is not None:
                raise self._failure()
            self.queued_bytes += size
            self.peak_queued_bytes = max(self.peak_queued_bytes, self.queued_bytes)
            self._queue.append(entry)
            if storage:
                self._by_storage.setdefault(storage, []).append(entry)
            self._unsignalled += size
            if self._unsignalled >= self._wake_bytes:
                self._wake()
        return True

    def _wake(self) -> None:
        """Have the writer take what is queued (the condition's lock held), starting it the first time."""
        self._unsignalled = 0
        self._ready = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="modeltrace-tensor-writer", daemon=True)
            self._thread.start()
        self._condition.notify_all()

    def protect(self, target: Any) -> None:
        """Called before an in-place change of `target`: a queued tensor over the same storage is copied first
        (once), or, when the writer is reading it right now, the change waits until it is written."""
        if not self._by_storage or not isinstance(target, torch.Tensor) or not target.is_cpu:
            return
        try:
            storage = target.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage (a subclass, a meta tensor)
            return
        condition = self._condition
        with condition:
            entries = self._by_storage.pop(storage, None)
            if not entries:
                return
            for entry in entries:
                while entry.writing and not entry.written:
                    condition.wait()
                if not entry.written:
                    entry.tensor = entry.tensor.clone(memory_format=torch.contiguous_format)
                    entry.data = _bytes_of(entry.tensor, entry.size)
                    entry.version, entry.storage = -1, 0
                    self.copies += 1

    def finish(self) -> None:
        """Wait for every queued tensor to be written, then complete the files; raises the writer's error."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
            batch = self._take_batch() if self._thread is None and self._queue else []
        if batch:
            self._write_batch(batch)
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            self.files.abort()
            raise self._failure()
        try:
            self.files.close()
        except OSError as error:
            self.error = error
            raise self._failure() from None

    def abort(self) -> None:
        """Stop the writer without completing the files (the caller deletes the folder)."""
        with self._condition:
            self._closing = True
            if self.error is None:
                self.error = ModelTraceError("the trace was stopped")
            self._drop_queue()
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join()
        self.files.abort()

    def _failure(self) -> ModelTraceError:
        error = self.error
        if isinstance(error, ModelTraceError):
            return error
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        return ModelTraceError(
            f"{self.folder}: writing the trace's full tensors failed ({type(error).__name__}: {reason}); no trace "
            "was written. Free some disk space, choose another --out, or lower --max-trace-mb"
        )

    # -- the writer thread ---------------------------------------------------------------------------------

    def _drop_queue(self) -> None:
        self._queue.clear()
        self._by_storage.clear()
        self.queued_bytes = 0

    def _run(self) -> None:
        # NOTE: the writer takes every tensor queued when it wakes (put wakes it per `WAKE_BYTES` queued, not per
        # tensor) and writes them with one `os.writev`: the forward's thread, which takes the GIL back after
        # each of its kernels, finds it held by the writer's Python code a few times per trace, not per tensor.
        condition = self._condition
        while True:
            with condition:
                while not (self._queue and self._ready) and not self._closing:
                    condition.wait()
                if not self._queue:
                    return
                batch = self._take_batch()
            if not self._write_batch(batch):
                return

    def _take_batch(self) -> list[_Entry]:
        """Everything queued, less what changed unseen since (the condition's lock held)."""
        batch: list[_Entry] = []
        while self._queue:
            entry = self._queue.popleft()
            if entry.version >= 0 and _version(entry.tensor) != entry.version:
                self._forget(
                    entry,
                    "changed in place before it was written, by an operation ModelTrace "
                    "cannot see; its statistics are from before the change",
                )
                continue
            entry.writing = True
            batch.append(entry)
        self._ready = False
        return batch

    def _write_batch(self, batch: list[_Entry]) -> bool:
        """Write `batch` (taken by `_take_batch`); False after an error, which stops the stream."""
        condition = self._condition
        tensors = [entry.tensor for entry in batch]
        try:
            # NOTE: a strided tensor's bytes come from a contiguous copy that `copies` keeps alive until
            # `write_many` has written them: the memoryview `_bytes_of` makes from an address does not hold the
            # tensor, and a copy dropped right after its view was made is freed and its memory reused by the next
            # one (each strided tensor of a batch was written with another's bytes or garbage: ConvNeXt's
            # permuted outputs, EnCodec's transposed ones)
            copies = [tensor.contiguous() if entry.data is None else None for entry, tensor in zip(batch, tensors)]
            for entry in batch:
                if entry.copied is not None:
                    entry.copied.synchronize()  # the device's copy into this pinned memory has landed
            self.files.write_many(
                (entry.name, entry.code, tensor.shape, _bytes_of(copy, entry.size) if copy is not None else entry.data)
                for entry, tensor, copy in zip(batch, tensors, copies)
            )
        except BaseException as error:  # noqa: BLE001 - handed to the capturing thread, raised there
            with condition:
                self.error = error
                for entry in batch:
                    entry.written = True
                self._drop_queue()
                condition.notify_all()
            return False
        with condition:
            for entry, tensor in zip(batch, tensors):
                if entry.version >= 0 and _version(tensor) != entry.version:
                    self.stale.append(
                        (
                            entry.summary,
                            "changed in place while it was being written, by an operation ModelTrace cannot see",
                        )
                    )
                self._forget(entry, None)
        return True

    def _forget(self, entry: _Entry, stale_reason: str | None) -> None:
        """Done with `entry` (the condition's lock held): written, or not to be."""
        entry.written = True
        if stale_reason is not None:
            self.stale.append((entry.summary, stale_reason))
        if entry.storage:
            siblings = self._by_storage.get(entry.storage)
            if siblings is not None:
                if entry in siblings:
                    siblings.remove(entry)
                if not siblings:
                    del self._by_storage[entry.storage]
        entry.tensor, entry.data, entry.copied = _RELEASED, None, None
        self.queued_bytes -= entry.size
        self._condition.notify_all()


def copy_to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A CPU copy of a device tensor, and for a CUDA one the event after which its bytes are there.

    A CUDA tensor goes into pinned memory with `non_blocking`: the capturing thread does not wait for the GPU
    (a plain `.to("cpu")` synchronises the stream per tensor, and a GPU forward is a queue of kernels: each wait
    drains it). Pinned blocks come from torch's caching host allocator, reused once the writer drops them; the
    stream's memory budget bounds how many are held."""
    if tensor.device.type != "cuda" or not is_plain(tensor):
        return tensor.to("cpu"), None  # NOTE: a subclass (DTensor) is moved by its own `to`
    try:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    except RuntimeError:  # NOTE: no page-locked memory to be had (a container's limit): the waiting copy
        return tensor.to("cpu"), None
    host.copy_(tensor, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(tensor.device))
    return host, copied


def _bytes_of(tensor: torch.Tensor, size: int) -> memoryview | None:
    """The `size` bytes of a contiguous CPU `tensor`, in place (no copy: valid while the tensor is), or None
    for a strided one.

    NOTE: made on the capturing thread when a tensor is queued, from its address (a few attribute reads), so that
    the writer thread runs no torch call: each one hands the GIL back and forth with the forward's thread, which
    then waits for the writer's Python code between its own kernels (measured: most of what streaming cost)."""
    if not size:
        return memoryview(b"")
    if not tensor.is_contiguous():
        return None
    return _memory_view(tensor.data_ptr(), size, _PYBUF_READ)


# NOTE: CPython's C API (stable since 3.3): a read-only byte memoryview over memory the caller keeps alive
_memory_view = ctypes.pythonapi.PyMemoryView_FromMemory
_memory_view.restype = ctypes.py_object
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_READ = 0x100


_RELEASED = torch.empty(0)
# the writer is woken once this much is queued (or a quarter of the memory budget, if less), at `finish`, and when
# the queue is full; written in one go: a few wake-ups per trace, each one `os.writev`
WAKE_BYTES = 4 << 20


# Dunder methods that change their tensor in place (`x += y`, `x[i] = v`); every other in-place torch call ends
# in one underscore (`add_`, `copy_`, `masked_fill_`), takes `inplace=True`, or writes into `out=`.
_IN_PLACE_DUNDERS = frozenset(
    {
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__imatmul__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
        "__setitem__",
    }
)


def _changes_first_argument(name: str) -> bool:
    return (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_DUNDERS


def _in_place_holders() -> tuple[Any, ...]:
    import torch.nn.functional

    return (torch.Tensor, torch, torch.nn.functional, torch._C._nn, torch._VF)


# what `_Holder.found` holds for a name that the holder's own namespace did not hold
_ABSENT = object()


@dataclass(slots=True)
class _Holder:
    """Where some in-place functions are found, and what the guard puts there: a module's are swapped in its
    dict at once (`own`: held there; `forwarded`: found through the module's `__getattr__`, as `torch._VF`
    finds them); a class's (`torch.Tensor`) one attribute at a time, through `setattr`, which updates its
    subclasses and its operator slots (`x += y`)."""

    holder: Any
    own: dict[str, Any]
    forwarded: dict[str, Any]
    wrapped: dict[str, Any]
    # NOTE: at the last swap-in, what each name held in the holder's own namespace (`_ABSENT`: nothing, inherited
    # or forwarded) and the wrapper put there instead: swap-out puts back exactly that, where the wrapper is still
    # there. Another library that replaced a function since it was listed (TorchLens wraps torch's functions
    # after its first call) has its own function wrapped and put back, not bypassed or undone.
    found: dict[str, Any] = field(default_factory=dict)
    installed: dict[str, Any] = field(default_factory=dict)
    # NOTE: the common case, told in C: the own names hold what was listed and no forwarded name is in the
    # namespace (then `found` is `listed_found`), and at exit every name still holds its wrapper (a tuple
    # comparison, which tests identity first: ~10 µs for torch's 465 functions, a Python loop ~60 µs)
    own_values: Callable[[Any], tuple[Any, ...]] = tuple
    own_listed: tuple[Any, ...] = ()
    all_values: Callable[[Any], tuple[Any, ...]] = tuple
    wrappers: tuple[Any, ...] = ()
    listed_found: dict[str, Any] = field(default_factory=dict)


_GUARD_LOCK = threading.Lock()
# the streams whose guard is entered (a capture per thread at most; usually one). NOTE: a tuple, replaced (under
# `_GUARD_LOCK`) rather than changed: a wrapper iterating it on one thread while another thread's capture ends
# would skip a stream in a list that shrank under it
_ACTIVE_STREAMS: tuple[TensorStream, ...] = ()
_HOLDERS: list[_Holder] | None = None


def in_place_plan() -> list[_Holder]:
    """Every in-place function of `_in_place_holders`, listed once per process with its wrapper."""
    global _HOLDERS
    if _HOLDERS is None:
        plan = []
        for holder in _in_place_holders():
            names = set(dir(holder))
            if holder is torch._VF:  # NOTE: a module that forwards its attributes to this one
                names |= set(dir(torch._C._VariableFunctions))
            entry = _Holder(holder, {}, {}, {})
            for name in sorted(names):
                original = getattr(holder, name, None) if _changes_first_argument(name) else None
                if callable(original) and not isinstance(original, type):
                    (entry.own if name in vars(holder) else entry.forwarded)[name] = original
                    entry.wrapped[name] = _protecting(original)
            entry.own_values, entry.own_listed = _values_of(tuple(entry.own)), tuple(entry.own.values())
            entry.all_values, entry.wrappers = _values_of(tuple(entry.wrapped)), tuple(entry.wrapped.values())
            entry.listed_found = {name: entry.own.get(name, _ABSENT) for name in entry.wrapped}
            plan.append(entry)
        _HOLDERS = plan
    return _HOLDERS


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A reader of these names' values from a namespace, as a tuple, in C (`KeyError` for a missing one)."""
    if len(names) == 1:
        only = names[0]
        return lambda namespace: (namespace[only],)
    return operator.itemgetter(*names) if names else lambda _namespace: ()


def _holds_listed(entry: _Holder, namespace: Any) -> bool:
    """Whether the holder's namespace holds exactly what was listed: its own functions, no forwarded one."""
    try:
        return entry.own_values(namespace) == entry.own_listed and namespace.keys().isdisjoint(entry.forwarded)
    except KeyError:
        return False


def _holds_wrappers(entry: _Holder, namespace: Any) -> bool:
    """Whether every name holds its listed wrapper, as a swap-in that found everything as listed left it."""
    try:
        return entry.all_values(namespace) == entry.wrappers
    except KeyError:
        return False


def _protecting(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original`, after protecting its first argument's memory for every active stream."""

    def protected(*args: Any, **kwargs: Any) -> Any:
        if args:
            for stream in _ACTIVE_STREAMS:
                stream.protect(args[0])
        return original(*args, **kwargs)

    protected.__name__ = getattr(original, "__name__", "protected")
    protected.__qualname__ = getattr(original, "__qualname__", protected.__name__)
    protected.__doc__ = getattr(original, "__doc__", None)
    return protected


def _swap_in(plan: list[_Holder]) -> None:
    """Put each holder's wrappers in place, each around the function found there now: the one listed, or one
    another library put there since (wrapped now, once per swap)."""
    for entry in plan:
        holder = entry.holder
        namespace = vars(holder)
        if _holds_listed(entry, namespace):
            found, installed = entry.listed_found, entry.wrapped
        else:
            found, installed = {}, {}
            for name, wrapper in entry.wrapped.items():
                current = namespace.get(name, _ABSENT)
                if current is not entry.own.get(name, _ABSENT):
                    replacement = getattr(holder, name, None) if current is _ABSENT else current
                    if not callable(replacement):
                        continue  # NOTE: not a function any more: left as it is
                    wrapper = _protecting(replacement)
                found[name] = current
                installed[name] = wrapper
        entry.found, entry.installed = found, installed
        if isinstance(holder, type):
            for name, wrapper in installed.items():
                setattr(holder, name, wrapper)
        else:
            namespace.update(installed)


def _swap_out(plan: list[_Holder]) -> None:
    """Put back what each swap-in found, where its wrapper is still in place (a function another library put
    there during the forward stays)."""
    for entry in plan:
        holder = entry.holder
        namespace = vars(holder)
        installed, found = entry.installed, entry.found
        restore: dict[str, Any]
        if found is entry.listed_found and _holds_wrappers(entry, namespace):
            restore, remove = entry.own, list(entry.forwarded)
        else:
            restore, remove = {}, []
            for name, wrapper in installed.items():
                if namespace.get(name) is wrapper:
                    if found[name] is _ABSENT:
                        remove.append(name)
                    else:
                        restore[name] = found[name]
        if isinstance(holder, type):
            for name, value in restore.items():
                setattr(holder, name, value)
            for name in remove:
                delattr(holder, name)  # NOTE: inherited: found in the base class again
        else:
            namespace.update(restore)
            for name in remove:
                del namespace[name]  # NOTE: forwarded: found through the module's `__getattr__` again
        entry.found, entry.installed = {}, {}


class _InPlaceGuard:
    """While the forward runs, every torch function that changes its first argument in place (`torch.Tensor`'s
    methods ending in one underscore and its in-place dunders, and the functions of that name in `torch`,
    `torch.nn.functional`, `torch._C._nn` and `torch._VF`, which `F.relu(x, inplace=True)` and its kin call) is
    replaced by a wrapper that first has `TensorStream.protect` copy any queued tensor over the same memory;
    every other call runs untouched. Put back on exit, whatever the forward raised: each name gets what it held at
    entry (another library's wrapper of torch's function is wrapped and put back, not bypassed), unless something
    else replaced the wrapper during the forward (then that stays).

    NOTE: not a `TorchFunctionMode`, which sees every torch call (and attribute read) of the forward in Python:
    ~10 ms of a medium Llama's 100 ms forward with full tensors, for the few calls that change anything. What a
    wrapper cannot see (a write into `out=`, an in-place call from C++ or through `torch.ops`) is caught by the
    version counter: that tensor is not kept, and its summary says why."""

    def __init__(self, stream: TensorStream) -> None:
        self.stream = stream

    def __enter__(self) -> _InPlaceGuard:
        global _ACTIVE_STREAMS
        with _GUARD_LOCK:
            _ACTIVE_STREAMS = (*_ACTIVE_STREAMS, self.stream)
            if len(_ACTIVE_STREAMS) == 1:
                plan = in_place_plan()
                try:
                    _swap_in(plan)
                except BaseException:
                    _swap_out(plan)
                    _ACTIVE_STREAMS = ()
                    raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        global _ACTIVE_STREAMS
        with _GUARD_LOCK:
            if self.stream in _ACTIVE_STREAMS:
                _ACTIVE_STREAMS = tuple(stream for stream in _ACTIVE_STREAMS if stream is not self.stream)
                if not _ACTIVE_STREAMS:
                    _swap_out(in_place_plan())
