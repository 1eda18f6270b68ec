"""Module-level capture: every call of every submodule of the model, one `ModuleCall` record per call.

What transformers' `utils/output_capturing.py` and `model_addition_debugger_context` see with hooks and
wrapped forwards, with four differences that make it cheap enough to leave on: one wrapper around
each module's `_call_impl` while the capture is active instead of two hooks per module (torch's hook dispatch
costs more than a tiny model's layer), statistics instead of reprs (`stats`), each tensor object summarised once per
forward pass (the RMSNorm output that feeds q, k and v projections is one summary), and source lines resolved
from the live stack (`source_map`). The wrapper only reads: the model's result is bitwise identical with and
without capture.
"""

from __future__ import annotations

import gc
import inspect
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from modeltrace.trace.records import ModuleCall, TensorSummary
from modeltrace.worker import native, source_map, stats
from modeltrace.worker.placement import module_devices
from modeltrace.worker.tensor_stream import TensorStream, copy_to_host
from modeltrace.worker.stats import PendingStats, is_dense, summarize, summarize_plain_cpu, without_storage


# NOTE: bounds on what one call records, so that a module returning a huge nested structure cannot blow up
# the trace: the first leaves in traversal order are kept.
MAX_LEAVES_PER_SIDE = 32
MAX_NESTING = 4


def iter_tensor_leaves(value: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(key, tensor)` for tensors inside tuples, lists, dicts and ModelOutputs, in order."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif depth >= MAX_NESTING:
        return
    else:
        if isinstance(value, dict):  # includes transformers' ModelOutput (an OrderedDict)
            items: Iterable[tuple[object, Any]] = value.items()
        elif isinstance(value, (tuple, list)):
            items = enumerate(value)
        else:
            return
        for name, item in items:
            key = f"{prefix}.{name}" if prefix else str(name)
            # NOTE: a tensor item is yielded here, not by a nested generator: `cos, sin` and the like are the
            # common container, walked on module calls and lines alike
            if isinstance(item, torch.Tensor):
                yield key, item
            else:
                yield from iter_tensor_leaves(item, key, depth + 1)


# NOTE: tensor subclasses (fake, functional) may have no real memory: spans are for these only.
_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)


class SummaryCache:
    """Reuse the summary of a tensor object seen earlier in this pass, unless it was modified in place since.

    Also reuse it for another tensor over exactly the same elements: `q_proj(x).view(...).transpose(1, 2)`,
    the `reshape` that feeds `o_proj`. Every statistic here ignores the order of the elements, so a view that
    is dense over the same memory span as a summarised dense tensor (same address, element count and dtype)
    has the same statistics, with its own shape. That holds only while the summarised tensor is alive (its
    memory cannot then belong to any other tensor) and neither was modified since (views share the version
    counter of their base). Callers that store full tensors skip this: a stored tensor has one shape.

    Summaries are not modified once made, so records share them: the cached summary itself where the key is
    the same, one copy per other key (`copy`), a fresh copy only for a view (its own shape). A copy handed out
    before its source has statistics (a device tensor waiting for `PendingStats.resolve`) gets them in
    `clear`, which callers run after resolving.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, int, TensorSummary]] = {}
        self._spans: dict[tuple[int, int, torch.dtype], tuple[weakref.ref, int, TensorSummary]] = {}
        self._late_copies: list[tuple[TensorSummary, TensorSummary]] = []
        # (id of source, key) -> (source, its copy under key); the source is held, so the id stays unique
        self._copies: dict[tuple[int, str], tuple[TensorSummary, TensorSummary]] = {}

    def get(self, tensor: torch.Tensor, key: str) -> TensorSummary | None:
        """The summary of `tensor` under `key` if this pass has one: the cached object itself when it has that
        key already (summaries are not modified once made), else a copy under `key`."""
        entry = self._entries.get(id(tensor))
        if entry is None or entry[1] != tensor_version(tensor) or entry[0]() is not tensor:
            return self.get_by_span(tensor, key)
        source = entry[2]
        return source if source.key == key else self.copy(source, key)

    def get_by_span(self, tensor: torch.Tensor, key: str) -> TensorSummary | None:
        """The summary of a live, unmodified dense tensor over the same elements as `tensor`, if any."""
        if not self._spans or not tensor.is_cpu or type(tensor) not in _PLAIN_TENSOR_TYPES:
            return None
        entry = self._spans.get((tensor.data_ptr(), tensor.numel(), tensor.dtype))
        if entry is None:
            return None
        return self._view_summary(entry, tensor, key, tensor_version(tensor), tensor.is_contiguous())

    def _view_summary(
        self,
        entry: tuple[weakref.ref, int, TensorSummary],
        tensor: torch.Tensor,
        key: str,
        version: int,
        contiguous: bool,
    ) -> TensorSummary | None:
        """The summary in span `entry`, with `tensor`'s shape under `key`, if its tensor is alive and neither was
        modified since (views share their base's version counter) and `tensor` is dense over those elements."""
        source = entry[0]()
        if source is None or version < 0 or version != entry[1] or tensor_version(source) != version:
            return None
        if not (contiguous or is_dense(tensor)):
            return None
        summary = self.copy(entry[2], key, share=False)
        summary.shape = list(tensor.shape)
        summary.tensor = None
        return summary

    def summarize_new(self, tensor: torch.Tensor, key: str, version: int, pending: PendingStats) -> TensorSummary:
        """The summary of a tensor that is not in the cache under its identity and version: one for a view over
        the elements of a live tensor summarised earlier, else a new one, which is cached. `get_by_span`,
        `summarize` and `put` in one: a plain CPU tensor's address, size, dtype and layout are read once, not
        three times (each is a call into torch's bindings, slow inside a forward pass)."""
        if (type(tensor) is not torch.Tensor and type(tensor) is not nn.Parameter) or not tensor.is_cpu:
            summary = summarize(tensor, key, pending)  # no span sharing: only plain CPU tensors have spans
            self.put(tensor, summary, version)
            return summary
        dtype = tensor.dtype
        try:
            address = tensor.data_ptr()
        except RuntimeError:
            # NOTE: a sparse tensor has no storage: summarised through its dense form (`stats.without_storage`),
            # never cached (its elements are not one span); the try costs nothing on the common path
            return summarize(tensor, key, pending)
        count = tensor.numel()
        contiguous = tensor.is_contiguous()
        span = (address, count, dtype)
        entry = self._spans.get(span) if self._spans else None
        if entry is not None:
            summary = self._view_summary(entry, tensor, key, version, contiguous)
            if summary is not None:
                # NOTE: the view itself is cached too: the same object is usually recorded again (a line's
                # `query_states`, then the `q` parameter of `apply_rotary_pos_emb`), by identity from then on.
                self._entries[id(tensor)] = (weakref.ref(tensor), version, summary)
                return summary
        try:
            summary = summarize_plain_cpu(tensor, key, dtype, address, count, contiguous, pending)
        except (RuntimeError, TypeError):
            if without_storage(tensor) is None:
                raise
            return summarize(tensor, key, pending)  # a nested or quantized tensor: see `stats.without_storage`
        if version >= 0:
            reference = weakref.ref(tensor)
            self._entries[id(tensor)] = (reference, version, summary)
            if contiguous:
                self._spans[span] = (reference, version, summary)
        return summary

    def put(self, tensor: torch.Tensor, summary: TensorSummary, version: int | None = None) -> None:
        if version is None:
            version = tensor_version(tensor)
        if version >= 0:
            reference = weakref.ref(tensor)
            self._entries[id(tensor)] = (reference, version, summary)
            if (
                tensor.is_cpu
                and type(tensor) in _PLAIN_TENSOR_TYPES
                and tensor.is_contiguous()
                and summary.tensor is None
            ):
                self._spans[(tensor.data_ptr(), tensor.numel(), tensor.dtype)] = (reference, version, summary)

    def copy(self, source: TensorSummary, key: str, share: bool = True) -> TensorSummary:
        """`source` under another key. Copies are shared (one per source and key: the `input` of q, k and v
        projections of one tensor is one object) unless `share` is False, for a caller that modifies its copy."""
        if share:
            shared = self._copies.get((id(source), key))
            if shared is not None and shared[0] is source:
                return shared[1]
        # NOTE: positional construction; `dataclasses.replace` costs ~5× more and this runs per cache hit.
        summary = TensorSummary(
            key,
            source.shape,
            source.dtype,
            source.device,
            source.mean,
            source.std,
            source.min,
            source.max,
            source.abs_max,
            source.nan_count,
            source.inf_count,
            source.positive_fraction,
            source.tensor,
            source.not_stored,
        )
        if source.positive_fraction is None and source.mean is None:
            self._late_copies.append((source, summary))
        if share:
            self._copies[(id(source), key)] = (source, summary)
        return summary

    def clear(self) -> None:
        for source, summary in self._late_copies:
            summary.mean, summary.std = source.mean, source.std
            summary.min, summary.max, summary.abs_max = source.min, source.max, source.abs_max
            summary.nan_count, summary.inf_count = source.nan_count, source.inf_count
            summary.positive_fraction = source.positive_fraction
        self._late_copies.clear()
        self._copies.clear()
        self._entries.clear()
        self._spans.clear()


def tensor_version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors track no version: never cache them
        return -1


# NOTE: positional parameter names of `forward` per module class (or per instance-level `forward` override),
# shared by every capture in the process: `inspect.signature` costs tens of µs.
_parameter_names: dict[object, list[str]] = {}


def forward_parameter_names(module: nn.Module) -> list[str]:
    """Positional parameter names of `module.forward`, to key positional inputs by name."""
    override = module.__dict__.get("forward")
    cache_key = type(module) if override is None else override
    names = _parameter_names.get(cache_key)
    if names is None:
        try:
            parameters = inspect.signature(module.forward).parameters.values()
            names = [
                parameter.name
                for parameter in parameters
                if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
            ]
        except (TypeError, ValueError):
            names = []
        if not names and override is not None:
            # NOTE: a `forward` replaced on the instance by a `(*args, **kwargs)` wrapper that does not say what it
            # wraps (transformers' tensor-parallel `tp_forward`): the class's own forward names the arguments
            names = _class_forward_names(type(module))
        _parameter_names[cache_key] = names
    return names


def _class_forward_names(module_class: type) -> list[str]:
    try:
        parameters = list(inspect.signature(module_class.forward).parameters.values())[1:]  # past `self`
    except (TypeError, ValueError):
        return []
    return [
        parameter.name
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    ]


def _capture_core() -> Any:
    """The extension module whose `Wrapper` and `Session` are the capture's call path in C, or None."""
    kernels = native.kernels()
    return kernels.get("capture_core") if kernels else None


def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`list(model.named_modules())`, walked in C where the extension module is built and every module keeps
    torch's walk (a capture walks the model at entry, and `worker/reuse.py` after it: torch's nested generators
    cost ~0.5 µs a module, more than a tiny model's forward spends in some of them)."""
    core = _capture_core()
    found = core.named_modules(model, nn.Module.named_modules) if core is not None else None
    return found if found is not None else list(model.named_modules())


def _put_wrappers(wrapped: list[tuple[nn.Module, Any]], put: bool) -> None:
    """Each wrapper set as its module's `_call_impl` (`put`), or taken off where it is still the one there."""
    core = _capture_core()
    if core is not None:
        core.put_wrappers(wrapped, put)
    elif put:
        for module, call in wrapped:
            module.__dict__["_call_impl"] = call
    else:
        for module, call in wrapped:
            if module.__dict__.get("_call_impl") is call:
                del module.__dict__["_call_impl"]


# NOTE: a subclass that overrides any of these summarises otherwise: its captures keep the Python closure's path
_SUMMARY_METHODS = ("_summary", "_summarize_arguments", "_summarize_output", "_summarize_all")

# NOTE: argument types that cannot hold tensors, skipped without walking them.
_SCALAR_TYPES = frozenset({int, float, bool, str, bytes, torch.dtype, torch.device})


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.3g} MB" if size >= 2**20 else f"{size:,} bytes"


class _ModelWrappers:
    """The wrappers of one model's modules (`ModuleCapture._make_call`), made by its first capture and reused by
    the next ones: making them costs more than a tiny model's forward takes to run a few of its layers (a class
    location, `forward`'s parameter names and a closure per module), and a script or notebook captures the same
    model again and again. Each wrapper reads the capture it records for from `live`, which the capture sets
    when it enters and clears when it exits. A wrapper is made again for a module that moved to another path,
    changed class or `forward`, or whose class's `_call_impl` was replaced; the cache holds the model and its
    modules weakly."""

    _of_model: weakref.WeakKeyDictionary[nn.Module, _ModelWrappers] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.live: list[Any] = [None]
        # NOTE: held while a capture of the model puts its wrappers in place or takes them off: two threads
        # entering captures of one model at once must not both find its modules free (the wrappers are shared)
        self.lock = threading.Lock()
        # id of a module -> (the module, weakly; its path, class, instance `forward`, class `_call_impl`; wrapper)
        self._calls: dict[int, tuple[weakref.ref, str, type, Any, Any, Any]] = {}

    @classmethod
    def forget(cls, model: nn.Module) -> None:
        """Drop `model`'s wrappers, which nothing will reuse (`forget_wrappers`)."""
        with cls._lock:
            cls._of_model.pop(model, None)

    @classmethod
    def of(cls, model: nn.Module) -> _ModelWrappers:
        with cls._lock:  # NOTE: captures of different models may enter on several threads at once
            found = cls._of_model.get(model)
            if found is None:
                found = cls._of_model[model] = cls()
            return found

    def calls_for(self, capture: ModuleCapture, named_modules: list[tuple[str, nn.Module]]) -> list[tuple]:
        """(module, wrapper) for each module not wrapped already (by another capture): the cached wrapper while it
        still fits the module (same path, class, instance `forward` and class `_call_impl`), else a new one. This
        runs for every module at every capture: the check is one pass in C where the extension module is built
        (`fitting_wrappers`), else inline."""
        if type(capture)._make_call is not ModuleCapture._make_call:
            # a subclass's own wrappers: never reused
            return [
                (module, capture._make_call(module, path, self.live))
                for path, module in named_modules
                if "_call_impl" not in module.__dict__
            ]
        core = _capture_core()
        if core is not None:
            found, misses = core.fitting_wrappers(self._calls, named_modules)
            for path, module in misses:
                found.append((module, self._new_call(capture, module, path)))
            return found
        calls = self._calls
        found = []
        for path, module in named_modules:
            attributes = module.__dict__
            if "_call_impl" in attributes:
                continue
            entry = calls.get(id(module))
            module_class = type(module)
            forward = attributes.get("forward")
            call_impl = module_class._call_impl
            if (
                entry is not None
                and entry[1] == path
                and entry[0]() is module
                and entry[2] is module_class
                and entry[3] is forward
                and entry[4] is call_impl
            ):
                found.append((module, entry[5]))
                continue
            found.append((module, self._new_call(capture, module, path)))
        return found

    def _new_call(self, capture: ModuleCapture, module: nn.Module, path: str) -> Any:
        """A new wrapper of `module`, cached for the model's later captures."""
        if len(self._calls) > _MAX_CACHED_WRAPPERS:
            self._calls = {key: kept for key, kept in self._calls.items() if kept[0]() is not None}
        call = capture._make_call(module, path, self.live)
        module_class = type(module)
        self._calls[id(module)] = (
            weakref.ref(module),
            path,
            module_class,
            module.__dict__.get("forward"),
            module_class._call_impl,
            call,
        )
        return call


def forget_wrappers(model: nn.Module) -> None:
    """Drop the wrappers cached for `model`'s later captures, where there will be none (a worker's job captures
    the model it built once): they would otherwise stay as long as the model, a closure, its cells and a weak
    reference per module, for the cyclic collector to walk (a tiny Llama: ~600 objects)."""
    _ModelWrappers.forget(model)


# NOTE: past this many wrappers cached for one model, those of modules that no longer exist are dropped (a
# model whose submodules are replaced between captures)
_MAX_CACHED_WRAPPERS = 4096


class ModuleCapture:
    """Context manager that records every module call of `model` while active.

    With `full_tensors`, a CPU copy of every captured tensor is kept in `tensors` under the name stored in
    its summary's `tensor` field (`"{record index}/outputs/{key}"`), for the safetensors file of the trace;
    a tensor over `max_tensor_bytes`, or one that would take the kept total over `max_trace_bytes`, is not
    kept: its summary says why in `not_stored` and keeps its statistics (`skipped` counts them). With a
    `stream` (`worker/tensor_stream.py`), kept tensors are written to disk by its writer thread while the forward
    runs instead, uncopied unless the forward changes them in place afterwards, and `tensors` stays empty.

    The wrapper runs on every module call, so it is written for speed (see bench/bench_capture.py): one
    closure with the capture's state bound, per-class caches for class locations and `forward`'s parameter
    names, bare tensor arguments summarised without walking them, and one summary per tensor object and
    version per pass (`SummaryCache`). Inputs are what the caller passed (before the model's own pre-hooks),
    outputs what the call returned (after its forward hooks); a call that raises keeps its record, with no
    outputs. The wrapping covers calls from every thread, as hooks would; a module another capture already
    wraps is left to that one (captures of the same model do not nest).
    """

    def __init__(
        self,
        model: nn.Module,
        full_tensors: bool = False,
        max_tensor_bytes: int | None = None,
        max_trace_bytes: int | None = None,
        retain_calls_bytes: int | None = None,
        stream: TensorStream | None = None,
    ) -> None:
        self.model = model
        # NOTE: with a stream, kept tensors go to its writer thread while the forward runs (no copy, no
        # `tensors` dict); without one they are copied into `tensors`, for callers that write them themselves
        self.stream = stream
        # NOTE: with `retain_calls_bytes`, each call's own arguments are kept (references, no copies) while the
        # tensors they hold stay under that many bytes, so that a replay can call a module again without a
        # forward (`worker/replay.py`); calls past the budget are not kept.
        self.retained: dict[tuple[str, int], tuple[tuple, dict]] | None = (
            {} if retain_calls_bytes is not None else None
        )
        self._retain_budget = retain_calls_bytes or 0
        self._retained_tensors: set[int] = set()
        self.full_tensors = full_tensors
        self.max_tensor_bytes = max_tensor_bytes
        self.max_trace_bytes = max_trace_bytes
        self.stored_bytes = 0
        self.skipped = 0
        self.records: list[ModuleCall] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self._device_copies: list[Any] = []  # the events of CUDA tensors' copies into `tensors`
        self._stack: list[int] = []
        self._finished = 0
        self._wrapped: list[tuple[nn.Module, Any]] = []
        self._collector_was_enabled = False
        self._devices: dict[str, str] = {}
        self._call_counts: dict[str, int] = {}  # calls of each module path so far: their records' call_index
        self._wrappers: _ModelWrappers | None = None  # those of the model, once this capture put some in place
        self.summary_cache = SummaryCache()
        self.pending = PendingStats()
        # NOTE: what `_summarize_all` summarises each tensor with: the same in C while the C call path serves this
        # capture (`_core_session`), else None for `_summary`. Never `self._summary` kept here: a bound method of
        # the capture held by the capture is a reference cycle, and every capture, with all its records, was then
        # left for the cyclic collector to find (a CLI job's whole fresh model with it)
        self._summary_of: Callable[..., TensorSummary] | None = None

    @property
    def call_stack(self) -> list[int]:
        """The record indices of the calls running now, innermost last (read by line capture, never written)."""
        return self._stack

    def __enter__(self) -> ModuleCapture:
        # NOTE: each module of the model gets its own `_call_impl` (in its instance dict, where torch's
        # `nn.Module.__call__` finds it first) instead of a pre- and a post-hook: no hook registration, no hook
        # dispatch (together ~20 µs per call on a tiny model), and no change to any class (assigning a method of
        # `nn.Module` walks its thousands of subclasses: ~0.2 ms each way).
        wrapped = self._wrapped
        # NOTE: a model spread over devices by accelerate (`--device-map`) says per module where it runs
        self._devices = module_devices(self.model)
        wrappers = _ModelWrappers.of(self.model)
        with wrappers.lock:
            try:
                wrapped.extend(wrappers.calls_for(self, named_modules(self.model)))
            except BaseException:
                wrapped.clear()
                raise
            if wrapped:
                core_session = self._core_session()
                if core_session is not None:
                    # NOTE: the Python walks over argument lists and outputs summarise through it too
                    self._summary_of = core_session.summary
                # NOTE: set before the first wrapper is put in place; a capture that wraps nothing (another one
                # holds every module: captures of the same model do not nest) leaves that one's session alone
                wrappers.live[0] = (
                    self,
                    self.records,
                    self._stack,
                    self._summary,
                    self._call_counts,
                    self._devices,
                    core_session,
                )
                self._wrappers = wrappers
                _put_wrappers(wrapped, True)
        # NOTE: the records and summaries are the only objects a capture adds, and they hold no reference
        # cycles: the cyclic collector (which a plain forward never triggers, and a captured one would a few
        # times) is paused until exit, when whatever the forward left in cycles is collected as usual.
        self._collector_was_enabled = gc.isenabled()
        gc.disable()
        if self.stream is not None and self.full_tensors:
            self.stream.guard.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._unwrap()
            self.pending.resolve()
            for copied in self._device_copies:
                copied.synchronize()
            self._device_copies.clear()
            self.summary_cache.clear()
            if self.stream is not None and self.full_tensors:
                self.stream.guard.__exit__(*exc_info)
        finally:
            if self._collector_was_enabled:
                gc.enable()

    def _unwrap(self) -> None:
        wrappers = self._wrappers
        if wrappers is None:
            return  # NOTE: nothing put in place
        with wrappers.lock:
            _put_wrappers(self._wrapped, False)
            self._wrapped.clear()
            if wrappers.live[0] is not None and wrappers.live[0][0] is self:
                wrappers.live[0] = None
            self._wrappers = None
            self._summary_of = None

    def _make_call(self, module: nn.Module, path: str, live: list[Any]):  # noqa: ANN202
        """The wrapper of `module`'s calls: made once per model and module, reused by the model's later captures
        (see `_ModelWrappers`), so it holds only what does not change between them; the capture it records for
        is the one in `live`, set while that capture is entered."""
        module_ref = weakref.ref(module)  # NOTE: the cache must not keep the model alive
        caller_location = source_map.caller_location
        module_class = type(module)
        class_name = module_class.__name__
        class_location = source_map.defined_at(module_class)
        parameter_names = forward_parameter_names(module)
        first_name = parameter_names[0] if parameter_names else None
        call_impl = module_class._call_impl  # torch's, with hooks and all
        tensor_type = torch.Tensor

        def capturing_call(*args: Any, **kwargs: Any) -> Any:
            session = live[0]
            if session is None:
                # NOTE: a wrapper left where no capture runs (a copy of the module's dict made during a capture)
                return call_impl(module_ref(), *args, **kwargs)
            capture, records, stack, summary_of, counts, devices, _ = session
            calls = counts.get(path, 0)  # of this module in this capture: its records' call_index
            counts[path] = calls + 1
            # depth 2: caller_location <- capturing_call <- torch's `__call__`, where the walk up starts
            called_at, call_site = caller_location(2)
            index = len(records)
            # NOTE: most modules take one tensor and return one: those skip the generic walks
            if not kwargs and len(args) == 1 and first_name is not None and isinstance(args[0], tensor_type):
                inputs = [summary_of(args[0], first_name, index, "inputs")]
            else:
                inputs = capture._summarize_arguments(args, kwargs, parameter_names, index) if args or kwargs else []
            record = ModuleCall(
                index,
                path,
                class_name,
                class_location,
                called_at,
                calls,
                stack[-1] if stack else -1,
                -1,
                call_site,
                inputs,
            )
            if capture.retained is not None:
                capture._retain(path, calls, args, kwargs)
            if devices:
                record.device = devices.get(path)
            records.append(record)
            stack.append(index)
            try:
                output = call_impl(module_ref(), *args, **kwargs)
            finally:
                # a call that raises keeps its record, with no outputs, in the order it ended
                stack.pop()
                record.finish_order = capture._finished
                capture._finished += 1
            if isinstance(output, tensor_type):
                record.outputs = [summary_of(output, "", index, "outputs")]
            else:
                record.outputs = capture._summarize_output(output, index)
            return output

        core = _capture_core()
        if core is None:
            return capturing_call
        # NOTE: the same call in C (`native/capture_core.c`) where the capture hands it a `Session`
        # (`_core_session`); this closure runs where it does not
        return core.Wrapper(
            live,
            capturing_call,
            module_ref,
            call_impl,
            path,
            class_name,
            class_location,
            first_name,
            parameter_names,
        )

    def _core_session(self) -> Any:
        """The `Session` of the C call path (`native/capture_core.c`) for this capture, or None where the Python
        closure records instead: full tensors and retained calls (kept by the closure's Python), a subclass
        that summarises otherwise, no extension module, or statistics taken by another kernel than the module's
        own (tests switch `stats._native_kernels`: both paths must give the same numbers)."""
        core = _capture_core()
        if core is None or self.full_tensors or self.retained is not None:
            return None
        if any(getattr(type(self), name) is not getattr(ModuleCapture, name) for name in _SUMMARY_METHODS):
            return None
        if stats._native_kernels.get(torch.float32) is not core.f32:
            return None
        cache = self.summary_cache
        return core.Session(
            self,
            self.records,
            self._stack,
            self._call_counts,
            self._devices,
            cache._entries,
            cache._spans,
            cache._copies,
            cache.copy,
            cache._view_summary,
            cache.summarize_new,
            self.pending,
            MAX_LEAVES_PER_SIDE,
            MAX_NESTING,
            ModuleCall,
            source_map._plumbing_cache,
            source_map._plumbing,
            source_map._location_cache,
            source_map.frame_location,
            torch.Tensor,
            nn.Parameter,
            torch.float32,
            stats.dtype_name(torch.float32),
            TensorSummary,
            cache._late_copies,
            stats._CANCELLATION_RATIO,
        )

    def _retain(self, path: str, call_index: int, args: tuple, kwargs: dict) -> None:
        """Keep a call's arguments (see `retained`), counting each tensor object once against the budget."""
        added = 0
        for name, value in (*enumerate(args), *kwargs.items()):
            for _, tensor in iter_tensor_leaves(value, str(name)):
                if id(tensor) not in self._retained_tensors:
                    self._retained_tensors.add(id(tensor))
                    added += tensor.numel() * tensor.element_size()
        if added > self._retain_budget:
            self._retain_budget = -1  # NOTE: spent: later calls are not kept either, however small
            return
        self._retain_budget -= added
        assert self.retained is not None
        self.retained[(path, call_index)] = (args, dict(kwargs))

    def keep_line_value(self, tensor: torch.Tensor, summary: TensorSummary, name: str) -> None:
        """Store a value a line assigned (`worker/lines.py`, small values only) as a module's tensors are."""
        self._keep(tensor, summary, name)

    def _keep_unless_meta(self, tensor: torch.Tensor, summary: TensorSummary, name: str) -> None:
        if tensor.device.type != "meta":
            self._keep(tensor, summary, name)

    def _keep(self, tensor: torch.Tensor, summary: TensorSummary, name: str) -> None:
        """Keep a CPU copy of `tensor` for the trace's tensors file, within the size limits."""
        size = tensor.numel() * tensor.element_size()
        if self.max_tensor_bytes is not None and size > self.max_tensor_bytes:
            summary.not_stored = f"{_megabytes(size)} is over the {_megabytes(self.max_tensor_bytes)} limit per tensor"
        elif self.max_trace_bytes is not None and self.stored_bytes + size > self.max_trace_bytes:
            summary.not_stored = f"the trace's tensors reached the {_megabytes(self.max_trace_bytes)} limit per trace"
        elif self.stream is not None:
            if self.stream.put(name, tensor, summary):
                summary.tensor = name
                self.stored_bytes += size
                return
        else:
            summary.tensor = name
            if tensor.device.type == "cuda":
                # NOTE: into pinned memory without waiting for the GPU; `__exit__` waits for the copies
                host, copied = copy_to_host(tensor.detach())
                self.tensors[name] = host.contiguous()
                if copied is not None:
                    self._device_copies.append(copied)
            else:
                self.tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
            self.stored_bytes += size
            return
        self.skipped += 1

    def _summarize_arguments(self, args: tuple, kwargs: dict, names: list[str], index: int) -> list[TensorSummary]:
        """Summaries of a call's arguments: positional ones under their parameter names (`args.N` past them)."""
        if not args:
            return self._summarize_all(kwargs.items(), index, "inputs")
        named: list[tuple[str, Any]] = list(zip(names, args))
        if len(args) > len(names):
            named.extend((f"args.{position}", args[position]) for position in range(len(names), len(args)))
        if kwargs:
            named.extend(kwargs.items())
        return self._summarize_all(named, index, "inputs")

    def _summarize_all(self, named_values: Iterable[tuple[str, Any]], index: int, side: str) -> list[TensorSummary]:
        summaries: list[TensorSummary] = []
        summary_of = self._summary_of or self._summary
        for name, value in named_values:
            if isinstance(value, torch.Tensor):
                if len(summaries) >= MAX_LEAVES_PER_SIDE:
                    break
                summaries.append(summary_of(value, name, index, side))
            elif value is None or type(value) in _SCALAR_TYPES:
                continue
            else:
                for key, tensor in iter_tensor_leaves(value, name):
                    if len(summaries) >= MAX_LEAVES_PER_SIDE:
                        return summaries
                    summaries.append(summary_of(tensor, key, index, side))
        return summaries

    def _summarize_output(self, output: Any, index: int) -> list[TensorSummary]:
        return self._summarize_all((("", output),), index, "outputs")

    def _summary(self, tensor: torch.Tensor, key: str, index: int, side: str) -> TensorSummary:
        """The summary of one tensor leaf: the one made earlier in this pass for the same tensor object and
        version (shared when the key is the same, else copied under `key`), one for a view over its elements,
        or a new one."""
        # NOTE: SummaryCache.get/put inlined: this runs for every tensor argument of every module call.
        cache = self.summary_cache
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors track no version: never cache them
            version = -1
        entry = cache._entries.get(id(tensor))
        if entry is not None and entry[1] == version and entry[0]() is tensor:
            summary = entry[2]
            if self.full_tensors and summary.tensor is None and summary.not_stored is None:
                # made by line capture (which keeps no tensors) before the module returned it: keep it now,
                # unchanged since (same version), under this record's name
                self._keep_unless_meta(tensor, summary, f"{index}/{side}/{key}")
            return summary if summary.key == key else cache.copy(summary, key)
        if not self.full_tensors:
            return cache.summarize_new(tensor, key, version, self.pending)
        summary = summarize(tensor, key, self.pending)
        if without_storage(tensor) is not None:
            return summary  # summarised densely with a note; nothing to store as one block, nor to cache by span
        self._keep_unless_meta(tensor, summary, f"{index}/{side}/{key}")
        if version >= 0:
            cache.put(tensor, summary, version)
        return summary
