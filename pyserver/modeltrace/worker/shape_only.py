"""Shape-only tracing: any size of model on the meta device, shapes and dtypes with no weights and no compute.

A model built under `torch.device("meta")` has parameters with shapes but no storage, so a 70B configuration
builds in a fraction of a second and runs its forward pass in a few seconds, in a few hundred MB. What the meta
device cannot do is anything that depends on values: `.item()`, `.tolist()`, `nonzero`, boolean indexing. Model
code uses those on small integer tensors (token ids compared with the image token, a grid of patches, a causal
mask built from `arange`), rarely on activations.

`ShapeOnlyMode` (a `TorchDispatchMode`) therefore keeps a real CPU "shadow" next to every small meta tensor
whose value can be known: inputs, factory results (`arange`, `ones`, `full`), and whatever is computed from
shadowed tensors only. Every op still runs on meta (that gives the output's shape and dtype); when all of its
tensor arguments have shadows and the output is small, the op also runs on the shadows. Value-dependent ops
then use the shadows, so token counts, masks and grids come out exactly as in a real run, and a dense model
yields exactly the shapes of a real run.

Value-dependent ops on activations (which of a mixture's experts a token goes to) have no shadow to ask; they
get a stand-in: `nonzero` and boolean masks select every element (an upper bound on what a real run selects),
`.item()` reads 0 / False. Each such stand-in is counted in `approximations`, which the trace header reports.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")
# NOTE: tensors up to this many elements carry a real shadow (masks, ids, grids, positions of a full-size model
# at a short sequence are far below it; activations of a full-size model far above).
SHADOW_MAX_ELEMENTS = 1 << 16

_SELECTING_OPS = {
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
}


class ShapeOnlyMode(TorchDispatchMode):
    """Run a meta-device model with real shadows for small tensors; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.shadows: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.approximations: collections.Counter[str] = collections.Counter()
        self._functions = _ShadowFunctions(self)
        self._depth = 0

    # NOTE: `Tensor.tolist()` and `Tensor.numpy()` read storage directly, and `torch.tensor(data, device="meta")`
    # copies its data below the dispatcher: no aten op a dispatch mode could answer. A companion function mode
    # (`_ShadowFunctions`), entered and left with this one, handles them. (Patching `torch.tensor` instead leaks:
    # modules imported while it is patched keep the patched function.)
    def __enter__(self) -> ShapeOnlyMode:
        self._functions.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._functions.__exit__(None, None, None)
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            self._functions.__exit__(*exc_info)

    # --- shadows ------------------------------------------------------------------------------------------------

    def shadow_of(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.device.type != "meta":
            return value
        return self.shadows.get(value)

    def attach(self, meta: torch.Tensor, real: torch.Tensor) -> None:
        if isinstance(meta, torch.Tensor) and isinstance(real, torch.Tensor) and meta.device.type == "meta":
            if tuple(meta.shape) == tuple(real.shape) and meta.dtype == real.dtype:
                self.shadows[meta] = real

    def _shadow_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        missing = False

        def convert(value: Any) -> Any:
            nonlocal missing
            if isinstance(value, torch.Tensor):
                real = self.shadow_of(value)
                if real is None:
                    missing = True
                return real
            if isinstance(value, torch.device) and value.type == "meta":
                return CPU
            return value

        real_args, real_kwargs = pytree.tree_map(convert, (args, kwargs))
        device = real_kwargs.get("device")
        if isinstance(device, torch.device) and device.type == "meta":
            real_kwargs["device"] = CPU
        return None if missing else (real_args, real_kwargs)

    # --- dispatch -----------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            return self._scalar(args[0])
        shadowed = self._shadow_arguments(args, kwargs)
        try:
            output = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as error:
            return self._without_meta_kernel(func, args, kwargs, shadowed, error)
        if shadowed is not None and _small(output):
            try:
                real = func(*shadowed[0], **shadowed[1])
            except Exception:  # noqa: BLE001 - the meta result stands; it just has no shadow
                real = None
            if real is not None:
                self._attach_tree(output, real)
        elif _mutates(func):
            for argument in _written_arguments(func, args, kwargs):
                self.shadows.pop(argument, None)
        return output

    def _attach_tree(self, meta: Any, real: Any) -> None:
        meta_leaves, real_leaves = pytree.tree_leaves(meta), pytree.tree_leaves(real)
        if len(meta_leaves) == len(real_leaves):
            for meta_leaf, real_leaf in zip(meta_leaves, real_leaves):
                self.attach(meta_leaf, real_leaf)

    def _scalar(self, tensor: torch.Tensor) -> Any:
        real = self.shadow_of(tensor)
        if real is not None:
            return real.item()
        self.approximations["item"] += 1
        if tensor.dtype == torch.bool:
            return False
        return 0.0 if tensor.is_floating_point() else 0

    def _real_data(self, data: Any) -> Any:
        """`data` for `torch.tensor`, with meta tensors in it replaced by their shadows (or zeros)."""
        if isinstance(data, torch.Tensor) and data.device.type == "meta":
            real = self.shadow_of(data)
            if real is None:
                self.approximations["tensor"] += 1
                real = torch.zeros(data.shape, dtype=data.dtype)
            return real
        if isinstance(data, (list, tuple)):
            return type(data)(self._real_data(item) for item in data)
        return data

    def _without_meta_kernel(  # noqa: ANN001 - torch's op type
        self, func, args: tuple, kwargs: dict, shadowed: tuple | None, error: BaseException
    ) -> Any:
        """An op the meta device cannot run: from the shadows when there are some, else a stand-in."""
        if shadowed is not None:
            real = func(*shadowed[0], **shadowed[1])
            meta = pytree.tree_map(lambda value: _meta_like(value) if isinstance(value, torch.Tensor) else value, real)
            self._attach_tree(meta, real)
            return meta
        if _mixed_devices(args, kwargs):
            # A real CPU tensor meeting a meta one (an index built on the CPU): move it to meta, keeping its value.
            moved_args, moved_kwargs = pytree.tree_map(self._to_meta, (args, kwargs))
            return self.__torch_dispatch__(func, (), moved_args, moved_kwargs)
        name = _SELECTING_OPS.get(func)
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name == "nonzero" and source is not None:
            self.approximations["nonzero"] += 1
            return torch.empty((source.numel(), source.dim()), dtype=torch.long, device=META)
        if name == "masked_select" and source is not None:
            self.approximations["masked_select"] += 1
            mask = args[1]
            count = torch.broadcast_shapes(source.shape, mask.shape).numel()
            return torch.empty((count,), dtype=source.dtype, device=META)
        if func in _UNIQUE_OPS and source is not None:
            self.approximations["unique"] += 1
            values = torch.empty((source.numel(),), dtype=source.dtype, device=META)
            inverse = torch.empty(source.shape, dtype=torch.long, device=META)
            counts = torch.empty((source.numel(),), dtype=torch.long, device=META)
            return values, inverse, counts
        if func is aten.repeat_interleave.Tensor and source is not None:
            self.approximations["repeat_interleave"] += 1
            return torch.empty((source.numel(),), dtype=torch.long, device=META)
        raise error

    def _to_meta(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            meta = _meta_like(value)
            self.attach(meta, value)
            return meta
        return value


_UNIQUE_OPS = (aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default)


class _ShadowFunctions(TorchFunctionMode):
    """The torch-function half of `ShapeOnlyMode`: shadows for `torch.tensor` on meta and for `tolist`."""

    def __init__(self, mode: ShapeOnlyMode) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        if func in _FACTORIES:
            device = kwargs.get("device")
            if device is None and func is torch.as_tensor and len(args) > 2:
                device = args[2]
            if device is not None and torch.device(device).type == "meta":
                kwargs = {**kwargs, "device": CPU}
                data = self.mode._real_data(args[0]) if args else None
                with torch._C.DisableTorchFunction():
                    real = func(data, *args[1:], **kwargs)
                return real.to(META)  # through the dispatch mode: the copy keeps `real` as its shadow
        elif func in _READERS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            real = self.mode.shadow_of(args[0])
            if real is not None:
                return _READERS[func](real, *args[1:], **kwargs)
        return func(*args, **kwargs)


_FACTORIES = (torch.tensor, torch.as_tensor)
_READERS = {torch.Tensor.tolist: torch.Tensor.tolist, torch.Tensor.numpy: torch.Tensor.numpy}


def _default_device() -> torch.device:
    """The device of an active `with torch.device(...)` block, else the CPU (`torch.get_default_device` calls
    `torch.tensor`, which is wrapped while the mode is active)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return torch.device(mode.device)
    return CPU


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device=META)


def _small(output: Any) -> bool:
    leaves = [leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)]
    return bool(leaves) and all(leaf.numel() <= SHADOW_MAX_ELEMENTS for leaf in leaves)


def _mutates(func) -> bool:  # noqa: ANN001
    schema = getattr(func, "_schema", None)
    return bool(schema) and any(
        argument.alias_info is not None and argument.alias_info.is_write for argument in schema.arguments
    )


def _written_arguments(func, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:  # noqa: ANN001
    schema = func._schema
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        if isinstance(value, torch.Tensor):
            yield value


def _mixed_devices(args: tuple, kwargs: dict) -> bool:
    devices = {leaf.device.type for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)}
    return "meta" in devices and len(devices) > 1


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """Build modules on the meta device (parameters and buffers with shapes but no storage)."""
    with torch.device(META):
        yield


def to_meta_inputs(mode: ShapeOnlyMode, value: Any) -> Any:
    """Move synthesised inputs to the meta device, each keeping its real value as a shadow."""
    return pytree.tree_map(mode._to_meta, value)
