"""A built model and its example inputs moved to the request's `--device` and `--dtype`: the trace (`job`) and
the replay (`replay`) both do it, after the build.
"""

from __future__ import annotations

from typing import Any

import torch

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building import BuiltModel
from modeltrace.worker.building.meta import TORCH_DTYPES as DTYPES


def move_built(built: BuiltModel, device: str, dtype_name: str) -> None:
    """Move the model to `device` in `dtype_name`, and its example inputs with it (integer inputs keep their
    dtype); a dtype or device torch does not know is a `ModelTraceError` naming the option."""
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise ModelTraceError(f"--dtype {dtype_name!r}: choose one of {', '.join(DTYPES)}")
    try:
        target = torch.device(device)
    except RuntimeError:
        raise ModelTraceError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None
    if not _in_place(built.model, target, dtype):
        _move_model(built.model, target, dtype)

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device=target, dtype=dtype) if value.is_floating_point() else value.to(target)
        return value

    built.args = tuple(move(value) for value in built.args)
    built.kwargs = {name: move(value) for name, value in built.kwargs.items()}


def inputs_to_placed_model(built: BuiltModel) -> None:
    """A model loaded with a device map: where accelerate put it whole on one device, `dispatch_model` only
    moved it there (`model.to`) and added no hook that would move the inputs, so the example inputs, built on
    the CPU, go to that device (in their own dtypes). A model spread over devices or offloaded keeps its
    inputs where they are: its hooks move them to each module's device."""
    if built.model.__dict__.get("_hf_hook") is not None:
        return
    devices = {tensor.device for tensor in built.model.parameters()}
    if len(devices) != 1:
        return
    (device,) = devices
    if device.type in ("cpu", "meta"):
        return

    def move(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    built.args = tuple(move(value) for value in built.args)
    built.kwargs = {name: move(value) for name, value in built.kwargs.items()}


def _in_place(model: torch.nn.Module, target: torch.device, dtype: torch.dtype) -> bool:
    """Whether every parameter and buffer is already on `target`, its floating ones in `dtype`: the common case
    (a model built on the CPU in float32 and traced there), where `_apply`'s two walks over every module and
    tensor would cost a fresh worker a few milliseconds per trace and change nothing. A device named without an
    index (`cuda`) means the current one: always moved."""
    if target.type != "cpu" and target.index is None:
        return False
    on_cpu = target.type == "cpu"
    # NOTE: one walk over the modules' own tensors (`parameters()` and `buffers()` walk the tree once each), and
    # `is_cpu` rather than a `device` object per tensor: this runs before every trace, a tiny model's in ~0.1 ms
    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for tensor in tensors.values():
                if tensor is None:
                    continue
                if not (tensor.is_cpu if on_cpu else tensor.device == target):
                    return False
                if tensor.dtype != dtype and tensor.is_floating_point():
                    return False
    return True


def _move_model(model: torch.nn.Module, target: torch.device, dtype: torch.dtype) -> None:
    model.to(device=target)
    # NOTE: not `model.to(dtype=...)`: it casts complex buffers too, to a real dtype, dropping their imaginary
    # part (a rotary table held as complex numbers, as gemma_pytorch registers it, would lose its sines)
    model._apply(lambda tensor: tensor.to(dtype) if tensor.is_floating_point() else tensor)
