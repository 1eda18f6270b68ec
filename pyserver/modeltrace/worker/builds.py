"""How each module of the traced model was built: its construction line, settings, parameters and buffers.

Recorded once per trace, not per call, so the forward's capture cost does not change. The construction line
is where the module object was constructed, in the file of the code that registered it (`ConstructionRecorder`,
active while the model is built): torch's global module-registration hook says where each child was registered
(`self.ln_2 = nn.LayerNorm(...)` in a parent's `__init__`: the first frame of model code above the hook,
`source_map.caller_location`, the walk the capture uses for call sites), and `nn.Module.__init__`, wrapped
meanwhile, the frames of model code that called each module's class. The construction line is the innermost of
those in the registering file: the line of `model += [nn.Tanh()]`, not that of `self.layers =
nn.ModuleList(model)` that registered it later; the line of `self.act = ACT2FN[...]`, not that of the
library's factory that called the class. A module whose construction was not seen (a `copy.deepcopy`) keeps
the line that registered it. After the forward, `record_builds` reads each module's settings (the `name=value`
fields of `extra_repr()` and its public scalar attributes) and fingerprints its own parameters and buffers
(statistics, a small sample of fixed positions and the same positions of the transpose), which
`diff/settings.py` compares; for each setting its class's `__init__` assigns, the line that assigns it
(`assignments`), where a setting built differently is fixed.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import sys
import types
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch import nn

from modeltrace.trace.records import ModuleBuild, ParameterRecord, SourceLocation
from modeltrace.worker import source_map
from modeltrace.worker.assignments import assignment_lines
from modeltrace.worker.capture import named_modules
from modeltrace.worker.stats import summarize, summary_from_moments, without_storage


# NOTE: values at this many fixed positions per parameter: enough to tell a copied weight from a re-initialised
# or transposed one (statistics alone cannot tell a square matrix from its transpose), small next to the trace.
SAMPLE_SIZE = 32
# Weights over this many elements get statistics of at least STATISTICS_ELEMENTS of them (`statistics_sample`).
MAX_EXACT_STATISTICS = 1 << 16
STATISTICS_ELEMENTS = 1 << 14
# NOTE: ...read as runs of this many consecutive elements (one 64-byte cache line of float32): a weight's
# statistics then read STATISTICS_ELEMENTS / STATISTICS_RUN lines of memory, not the whole weight. Evenly strided
# single elements (the sample before, `statistics_run` 1) fetched every line of a weight whose stride was under
# 16 elements and one in a few otherwise (the hardware prefetches neighbours): a medium Llama's fingerprints read
# its 105 MB of weights from memory on the second thread while the forward, itself streaming those weights,
# waited on the same memory (docs/benchmarks.md, "The weights beside the forward").
STATISTICS_RUN = 16
# Attributes every module has that say nothing about how it computes.
_NOT_SETTINGS = frozenset({"training"})
_SCALARS = (bool, int, float, str, type(None))
_MAX_LIST_SETTING = 16


# NOTE: frames of model code kept above a module's construction: enough to reach the `__init__` of the file that
# registers it through a library's factory (transformers' `ACT2FN[...]`, timm's `create_conv2d`)
_CONSTRUCTION_FRAMES = 8


class ConstructionRecorder:
    """Context manager active while the model is built: where each submodule was constructed and registered.

    `location_of(parent, name, child)` gives the line of model code that constructed `child`, registered as
    `name` on `parent`, in the file that registered it (see the module's docstring); the last registration wins
    (a module re-assigned later in `__init__` was built by the later line).
    """

    def __init__(self) -> None:
        self._locations: dict[tuple[int, str], tuple[nn.Module, SourceLocation | None]] = {}
        # NOTE: weak references: a module built and dropped during the build is not kept alive by the record
        self._constructions: dict[int, tuple[Any, tuple[SourceLocation, ...]]] = {}
        self._handle: Any = None

    def __enter__(self) -> ConstructionRecorder:
        self._handle = nn.modules.module.register_module_module_registration_hook(self._registered)
        _start_recording(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _stop_recording(self)
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _registered(self, parent: nn.Module, name: str, submodule: nn.Module | None) -> None:
        # depth 2: caller_location <- this hook <- torch's `__setattr__` / `register_module`, where the walk starts
        location, _ = source_map.caller_location(2)
        # NOTE: the parent is held until the recorder is dropped, so that its id stays its own meanwhile.
        self._locations[(id(parent), name)] = (parent, location)

    def constructed(self, module: nn.Module, stack: tuple[SourceLocation, ...]) -> None:
        """`module`'s construction was called from `stack` (frames of model code, innermost first); the first
        construction of an object counts (a class calling `nn.Module.__init__` twice is still built once)."""
        known = self._constructions.get(id(module))
        if known is not None and known[0]() is module:
            return
        try:
            reference: Any = weakref.ref(module)
        except TypeError:  # NOTE: a class with `__slots__` and no `__weakref__`: held until the recorder is cleared
            reference = lambda: module  # noqa: E731
        self._constructions[id(module)] = (reference, stack)

    def construction_stack(self, module: nn.Module) -> tuple[SourceLocation, ...]:
        known = self._constructions.get(id(module))
        return known[1] if known is not None and known[0]() is module else ()

    def location_of(self, parent: nn.Module, name: str, child: nn.Module | None = None) -> SourceLocation | None:
        found = self._locations.get((id(parent), name))
        registered = found[1] if found is not None and found[0] is parent else None
        stack = self.construction_stack(child) if child is not None else ()
        return construction_line(registered, stack)

    def clear(self) -> None:
        self._locations.clear()
        self._constructions.clear()


def construction_line(registered: SourceLocation | None, stack: tuple[SourceLocation, ...]) -> SourceLocation | None:
    """The innermost frame of the construction `stack` in the file of the line that `registered` the module (that
    line when none is), or the stack's innermost frame when the registration has no line of model code."""
    if registered is None:
        return stack[0] if stack else None
    return next((location for location in stack if location.file == registered.file), registered)


# The recorders active now, and `nn.Module.__init__` as it was before the first of them wrapped it.
_recorders: list[ConstructionRecorder] = []
_unwrapped_init: list[Any] = []


def _recording_init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
    _unwrapped_init[0](self, *args, **kwargs)
    if _recorders:
        stack = _construction_stack(self, sys._getframe(1))
        for recorder in list(_recorders):
            recorder.constructed(self, stack)


def _start_recording(recorder: ConstructionRecorder) -> None:
    if not _recorders:
        current = nn.Module.__init__
        if current is not _recording_init:
            _unwrapped_init[:] = [current]
            functools.update_wrapper(_recording_init, current)
            nn.Module.__init__ = _recording_init  # type: ignore[method-assign]
    _recorders.append(recorder)


def _stop_recording(recorder: ConstructionRecorder) -> None:
    if recorder in _recorders:
        _recorders.remove(recorder)
    # NOTE: put back only our own wrapper: code that wrapped it after us keeps its wrapper (ours is inert then)
    if not _recorders and nn.Module.__init__ is _recording_init and _unwrapped_init:
        nn.Module.__init__ = _unwrapped_init[0]  # type: ignore[method-assign]


def _construction_stack(module: nn.Module, frame: FrameType | None) -> tuple[SourceLocation, ...]:
    """The frames of model code that called `module`'s class: from `frame` (the caller of `nn.Module.__init__`)
    outward, past the frames constructing `module` itself (its classes' `__init__`s, a decorator's wrapper),
    which take the new object as their first argument: no frame that called the class holds it yet."""
    while frame is not None and _first_argument(frame) is module:
        frame = frame.f_back
    return source_map.model_locations(frame, _CONSTRUCTION_FRAMES)


def _first_argument(frame: FrameType) -> Any:
    code = frame.f_code
    if code.co_argcount:
        return frame.f_locals.get(code.co_varnames[0])
    if code.co_flags & inspect.CO_VARARGS:
        values = frame.f_locals.get(code.co_varnames[code.co_kwonlyargcount])
        return values[0] if isinstance(values, tuple) and values else None
    return None


def record_builds(
    model: nn.Module,
    constructions: ConstructionRecorder | None = None,
    keep_tensor: Any = None,
    parameters: dict[str, list[ParameterRecord]] | None = None,
) -> list[ModuleBuild]:
    """A `ModuleBuild` for every module of `model` (`named_modules()` order, the root's path `""`).

    `keep_tensor(tensor, summary, name)`, when given, stores a parameter's full tensor (the capture's `_keep`
    with its size limits) under `parameters/{path}/{name}`. `parameters`: the fingerprints `parameter_records`
    already made (the worker makes them on a second thread during the forward).
    """
    if parameters is None and keep_tensor is None:
        parameters = parameter_records(model)  # NOTE: the native batch where it can (`ParameterFingerprints`)
    with torch.no_grad():
        return _record_builds(model, constructions, keep_tensor, parameters)


def parameter_records(model: nn.Module) -> dict[str, list[ParameterRecord]]:
    """The fingerprints of every module's own parameters and buffers, by module path: the torch-heavy part of
    `record_builds` (`ParameterFingerprints` splits it for a second thread)."""
    return ParameterFingerprints(model).records()


class ParameterFingerprints:
    """The fingerprints of every module's own parameters and buffers, made in three steps so that only reads of
    memory run beside the forward: planned where it is made (the modules walked; each contiguous float32 CPU
    tensor's statistics view and sample positions listed), `read()` (one call of the native kernel for all of
    those, without the GIL: safe on a second thread, and the forward's thread never waits for the GIL on its
    account), then `records()` on the job's thread (every other tensor, another dtype or device or a subclass, is
    fingerprinted there one at a time by `_fingerprint`, which gives the same records). Nothing here parses
    source: in Python 3.11, `ast` on two threads at once fails with a SystemError."""

    def __init__(self, model: nn.Module) -> None:
        self._batch = _fingerprint_batch()
        # (path, kind, name, tensor, shared_with, index of its native item or -1)
        self._entries: list[tuple[str, str, str, torch.Tensor, str | None, int]] = []
        self._paths: list[str] = []
        self._items: list[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = []
        self._positions: list[torch.Tensor] = []  # NOTE: held while the kernel reads them
        self._read: list | None = None
        self.elements = 0  # of every tensor planned (a tied one once per holder)
        seen: dict[int, str] = {}
        for path, module in named_modules(model):
            self._paths.append(path)
            for kind, name, tensor, shared_with, _ in _own_tensors(module, path, seen):
                self.elements += tensor.numel()
                item = -1
                if self._batch is not None and _batchable(tensor):
                    item = len(self._items)
                    self._items.append(self._item(tensor))
                self._entries.append((path, kind, name, tensor, shared_with, item))

    def _item(self, tensor: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...], int, int]:
        count = tensor.numel()
        if count > MAX_EXACT_STATISTICS:
            # NOTE: `statistics_view`'s sizes and strides, worked out without making the view (two torch calls per
            # weight): a batched tensor is contiguous, so its flat view starts where it does
            stride, run = statistics_sample(tuple(tensor.shape))
            sizes, strides = (count // stride, run), (stride, 1)
        else:
            sizes, strides = (count,), (1,)
        positions = sample_index(count, *tensor.shape) if tensor.dim() == 2 else sample_positions(count)
        self._positions.append(positions)
        return tensor.data_ptr(), sizes, strides, positions.data_ptr(), positions.numel()

    def read(self) -> None:
        """Read the planned tensors (the native batch; the GIL released throughout)."""
        self._read = self._batch(self._items) if self._batch is not None and self._items else []

    def records(self) -> dict[str, list[ParameterRecord]]:
        """The records by module path (every module's, empty where it holds no tensor), reading first if needed."""
        if self._read is None:
            self.read()
        assert self._read is not None
        records: dict[str, list[ParameterRecord]] = {path: [] for path in self._paths}
        with torch.no_grad():
            for path, kind, name, tensor, shared_with, item in self._entries:
                result = self._read[item] if item >= 0 else None
                records[path].append(
                    _fingerprint(kind, name, tensor, shared_with, None, "")
                    if result is None
                    else _record_from_read(kind, name, tensor, shared_with, result)
                )
        return records


def _fingerprint_batch() -> Any:
    from modeltrace.worker import native

    kernels = native.kernels()
    return kernels.get("f32_fingerprints") if kernels else None


def _batchable(tensor: torch.Tensor) -> bool:
    """A tensor the native batch reads as `_fingerprint` would: plain, contiguous float32 in CPU memory."""
    return (
        tensor.dtype is torch.float32
        and type(tensor) is torch.Tensor
        and tensor.is_cpu
        and tensor.layout is torch.strided
        and not tensor.is_nested
        and not tensor.is_neg()
        and tensor.numel() > 1
        and tensor.is_contiguous()
    )


def _record_from_read(
    kind: str, name: str, tensor: torch.Tensor, shared_with: str | None, read: tuple
) -> ParameterRecord:
    """`_fingerprint`'s record for a tensor the native batch read: its moments and its sample's values."""
    count, shape = tensor.numel(), list(tensor.shape)
    stride = run = 1
    elements = count
    if count > MAX_EXACT_STATISTICS:
        stride, run = statistics_sample(tuple(shape))
        # NOTE: the view's size, worked out (`statistics_view`: `count // stride` runs): the view is made only
        # for the general path below, not for every large weight (a torch call each)
        elements = count // stride * run
    summary = summary_from_moments(name, shape, "float32", elements, read[:5])
    if summary is None:
        # NOTE: equal values (a norm's weight of ones), a cancelling variance or a non-finite sum: the general path
        summary = summarize(statistics_view(tensor) if count > MAX_EXACT_STATISTICS else tensor, name)
        summary.shape = shape
    record = ParameterRecord(
        name=name, kind=kind, summary=summary, shared_with=shared_with, statistics_stride=stride, statistics_run=run
    )
    values = list(read[5])
    if tensor.dim() == 2:
        half = len(values) // 2
        record.sample, record.sample_transposed = values[:half], values[half:]
    else:
        record.sample = values
    return record


def _record_builds(
    model: nn.Module,
    constructions: ConstructionRecorder | None,
    keep_tensor: Any,
    fingerprints: dict[str, list[ParameterRecord]] | None,
) -> list[ModuleBuild]:
    builds: list[ModuleBuild] = []
    seen: dict[int, str] = {}
    parents: dict[str, tuple[nn.Module, str]] = {}
    # NOTE: the worker fingerprints the parameters on a second thread while the forward runs (`WeightWork`):
    # every dict of the model is read through a copy (`list(...)`, atomic under the GIL), never iterated while
    # model code may add to it
    for path, module in named_modules(model):
        for child_name, child in list(module._modules.items()):
            if child is not None:
                parents.setdefault(f"{path}.{child_name}" if path else child_name, (module, child_name))
        built_at = None
        if constructions is not None and path in parents:
            parent, name = parents[path]
            built_at = constructions.location_of(parent, name, module)
        module_class = type(module)
        settings = module_settings(module)
        assigned = assignment_lines(module_class)
        builds.append(
            ModuleBuild(
                path=path,
                class_name=module_class.__name__,
                qualified_class=f"{module_class.__module__}.{module_class.__qualname__}",
                built_at=built_at,
                settings=settings,
                parameters=(
                    fingerprints[path]
                    if fingerprints is not None and path in fingerprints
                    else _parameters(module, path, seen, keep_tensor)
                ),
                assigned_at={name: assigned[name] for name in settings if name in assigned},
            )
        )
    return builds


def module_settings(module: nn.Module) -> dict[str, Any]:
    """The scalar settings of a module: public scalar attributes, then the `name=value` fields of `extra_repr()`.

    Positional fields of `extra_repr()` (`LayerNorm`'s `(64,)`) are left out: what they mean depends on the
    class, and the attributes hold them by name (`normalized_shape`).
    """
    settings: dict[str, Any] = {}
    attributes = vars(module)
    for name in _public_names(tuple(attributes)):
        try:
            value = attributes[name]
        except KeyError:  # NOTE: removed meanwhile by model code on another thread: not a setting now
            continue
        plain = _plain(value)
        if plain is not _SKIP:
            settings[name] = plain
    try:
        text = module.extra_repr()
    except Exception:  # noqa: BLE001 - user code: a broken extra_repr leaves the attributes
        text = ""
    if text and isinstance(text, str):
        settings.update(_named_fields(text))
    return settings


@functools.lru_cache(maxsize=4096)
def _named_fields(text: str) -> tuple[tuple[str, Any], ...]:
    """The `name=value` fields of an `extra_repr()` text, parsed once per text (a model's layers repeat theirs)."""
    fields = []
    for field_text in split_fields(text):
        name, separator, value = field_text.partition("=")
        name = name.strip()
        if separator and name.isidentifier():
            fields.append((name, _literal(value.strip())))
    return tuple(fields)


_SKIP = object()


@functools.lru_cache(maxsize=4096)
def _public_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """The attribute names that may be settings, of a module whose `__dict__` has `names` (in their order):
    cached per layout, as a model's modules share a few, and most of a module's attributes are private."""
    return tuple(name for name in names if not name.startswith("_") and name not in _NOT_SETTINGS)


def _plain(value: Any) -> Any:
    """A msgpack-safe form of a setting, or `_SKIP` for values that are not settings (tensors, configs, modules)."""
    # NOTE: by exact type, not isinstance: an isinstance check on a transformers config object goes through its
    # slow `__getattribute__`, and every attention module holds one
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is torch.dtype:
        return str(value).removeprefix("torch.")
    if kind in _SEQUENCES and len(value) <= _MAX_LIST_SETTING and all(type(item) in _SCALARS for item in value):
        return list(value)
    if kind in _FUNCTIONS:
        # an activation kept as a function (`self.activation = F.gelu`)
        return f"{getattr(value, '__module__', None) or '?'}.{getattr(value, '__qualname__', value.__name__)}"
    return _SKIP


_SEQUENCES = (tuple, list, torch.Size)
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)


@functools.lru_cache(maxsize=4096)
def _literal(text: str) -> Any:
    """A field's value as a Python literal when it is one (`1e-05`, `True`, `(64,)`, `'tanh'`), else the text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    plain = _plain(value)
    return text if plain is _SKIP else plain


def split_fields(text: str) -> list[str]:
    """`extra_repr()` split at its top-level commas: `"(64,), eps=1e-05"` -> `["(64,)", "eps=1e-05"]`."""
    fields: list[str] = []
    depth = 0
    quote = ""
    start = 0
    for position, character in enumerate(text):
        if quote:
            if character == quote:
                quote = ""
        elif character in "'\"":
            quote = character
        elif character in "([{":
            depth += 1
        elif character in ")]}":
            depth -= 1
        elif character == "," and depth == 0:
            fields.append(text[start:position].strip())
            start = position + 1
    fields.append(text[start:].strip())
    return [field_text for field_text in fields if field_text]


def _own_tensors(
    module: nn.Module, path: str, seen: dict[int, str]
) -> Iterator[tuple[str, str, torch.Tensor, str | None, str]]:
    """`(kind, name, detached tensor, shared_with, qualified name)` of the module's own parameters, then buffers;
    `seen` (id -> qualified name, over the whole model) names the first holder of a tensor held twice (tied)."""
    own = [("parameter", name, tensor) for name, tensor in list(module._parameters.items())]
    own += [("buffer", name, tensor) for name, tensor in list(module._buffers.items())]
    for kind, name, tensor in own:
        if tensor is None:
            continue
        qualified = f"{path}.{name}" if path else name
        shared_with = seen.get(id(tensor))
        if shared_with is None:
            seen[id(tensor)] = qualified
        yield kind, name, tensor.detach(), shared_with, qualified


def _parameters(module: nn.Module, path: str, seen: dict[int, str], keep_tensor: Any) -> list[ParameterRecord]:
    return [
        _fingerprint(kind, name, tensor, shared_with, keep_tensor, f"parameters/{qualified}")
        for kind, name, tensor, shared_with, qualified in _own_tensors(module, path, seen)
    ]


def _fingerprint(
    kind: str, name: str, tensor: torch.Tensor, shared_with: str | None, keep_tensor: Any, stored_name: str
) -> ParameterRecord:
    if without_storage(tensor) is not None:
        # NOTE: a sparse, nested or quantized buffer: statistics of its values read densely (with a note), no
        # sample (its memory has no row-major order to sample), never stored in full
        return ParameterRecord(name=name, kind=kind, summary=summarize(tensor, name), shared_with=shared_with)
    count = tensor.numel()
    stride = run = 1
    if count > MAX_EXACT_STATISTICS and tensor.device.type != "meta":
        # NOTE: statistics of a large weight over a fixed subset of its elements: the same elements for any
        # tensor of its shape, so two copies compare equal and a changed one differs, at a fraction of a full pass
        # (a medium Llama's weights take longer to summarise than its forward pass)
        stride, run = statistics_sample(tuple(tensor.shape))
        summary = summarize(statistics_view(tensor), name)
        summary.shape = list(tensor.shape)
    else:
        summary = summarize(tensor, name)
    record = ParameterRecord(
        name=name, kind=kind, summary=summary, shared_with=shared_with, statistics_stride=stride, statistics_run=run
    )
    if tensor.device.type == "meta" or count == 0:
        return record
    values = tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.to(torch.float64)
    if tensor.is_cpu and values is tensor:
        # NOTE: a float32 or float64 CPU weight (the common case): both samples in one gather, read as they are
        # (`tolist()` widens float32 exactly, as a float64 copy would): one torch call per weight instead of six
        if tensor.dim() == 2:
            numbers = torch.take(values, sample_index(count, *tensor.shape)).tolist()
            half = len(numbers) // 2
            record.sample, record.sample_transposed = numbers[:half], numbers[half:]
        else:
            record.sample = torch.take(values, sample_positions(count)).tolist()
    else:
        positions = sample_positions(count)
        record.sample = values.reshape(-1)[positions].to("cpu", torch.float64).tolist()
        if tensor.dim() == 2:
            # NOTE: the same flat positions in the transpose's row-major order, read in place (no transposed copy)
            rows = tensor.shape[0]
            record.sample_transposed = values[positions % rows, positions // rows].to("cpu", torch.float64).tolist()
    if keep_tensor is not None and shared_with is None:
        keep_tensor(tensor, summary, stored_name)
    return record


def statistics_view(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of a large weight that its statistics are of (`statistics_sample`), as a `(runs, run)` view
    of its row-major order (of a contiguous copy where it is not contiguous)."""
    stride, run = statistics_sample(tuple(tensor.shape))
    return tensor.reshape(-1).as_strided((tensor.numel() // stride, run), (stride, 1))


@functools.lru_cache(maxsize=1024)
def statistics_sample(shape: tuple[int, ...]) -> tuple[int, int]:
    """`(stride, run)`: the elements whose statistics stand for a large weight's of `shape` (over
    `MAX_EXACT_STATISTICS` elements): runs of `run` consecutive elements of the row-major order, run `i` starting
    at element `i * stride`, as many as fit in the weight (`count // stride`: at least `STATISTICS_ELEMENTS`
    elements). The stride is a whole number of runs, the largest that gives that many, that shares no factor
    with the last dimension's size (a row's length): the runs then start at every column position in turn (a
    stride of a multiple of the row length would read the same columns of every row) and, where the weight has
    at most `STATISTICS_ELEMENTS / run` rows, in every row."""
    count, row = math.prod(shape), shape[-1] if shape else 1
    runs = STATISTICS_ELEMENTS // STATISTICS_RUN
    multiple = max(1, count // (STATISTICS_RUN * runs))
    while math.gcd(multiple, row) != 1:
        multiple -= 1
    return multiple * STATISTICS_RUN, STATISTICS_RUN


@functools.lru_cache(maxsize=1024)
def sample_positions(count: int) -> torch.Tensor:
    """`SAMPLE_SIZE` distinct flat positions scattered over `count` elements (the same for any tensor of that
    size): multiples of a large prime modulo `count`, so they fall on many rows and columns of a matrix.
    Cached per size (layers repeat their shapes): callers only read the tensor."""
    if count <= SAMPLE_SIZE:
        return torch.arange(count)
    return (torch.arange(SAMPLE_SIZE, dtype=torch.int64) * _SAMPLE_STRIDE) % count


@functools.lru_cache(maxsize=1024)
def sample_index(count: int, rows: int, columns: int) -> torch.Tensor:
    """For a `rows` x `columns` matrix: the flat indices of `sample_positions(count)`, then those of the same
    positions in the transpose's row-major order (element `[position % rows, position // rows]`), for one
    `torch.take` of both samples. Cached per shape, as `sample_positions`."""
    positions = sample_positions(count)
    return torch.cat([positions, positions % rows * columns + positions // rows])


# NOTE: a prime: its multiples are distinct modulo any element count it does not divide.
_SAMPLE_STRIDE = 2_654_435_761
