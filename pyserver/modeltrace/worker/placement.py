"""Models spread over devices by accelerate (`--device-map auto|JSON`): reading the map, checking it, loading with
it, and saying per module where it ran.

ModelTrace does not place anything itself: `from_pretrained(device_map=..., offload_folder=...)` hands the model to
accelerate, which puts each block on a device (or on the disk / in CPU memory, loaded onto its execution device
only for its own forward) and moves activations between devices with its hooks. Capture wraps `_call_impl`, so it
sees what each module's caller passed and what it returned, after accelerate's hooks ran: real values on the
device that computed them (statistics are computed there, `stats.PendingStats`). What is read outside a forward
(the weights, for `builds`) is loaded the way accelerate's own hooks load it (`onloaded`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError


# NOTE: what a device_map value may name, as accelerate reads it: a device ("cpu", "cuda:1", "mps", "xpu:0"), a
# bare accelerator index (0), or "disk" (weights read from the offload folder for each forward).
_DEVICE_VALUE = re.compile(r"^(cpu|disk|meta|mps|(cuda|xpu|npu|hpu|mlu)(:\d+)?)$")


def parse_device_map(value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """`auto` (or `balanced`, `sequential`, as accelerate names its strategies), a JSON object given inline, or the
    path of a JSON file holding one: `{"model.layers.0": 0, "model.layers.1": "disk", ...}`."""
    if value is None or value == "" or isinstance(value, dict):
        return value or None
    text = str(value).strip()
    if text in ("auto", "balanced", "balanced_low_0", "sequential"):
        return text
    if not text.startswith("{"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ModelTraceError(
                f'--device-map {text!r}: expected auto, a JSON object such as \'{{"model.layers.0": "cpu"}}\', '
                "or the path of a JSON file holding one"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ModelTraceError(f"--device-map {path}: cannot read it: {error}") from None
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelTraceError(f"--device-map: not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(mapping, dict) or not mapping:
        raise ModelTraceError("--device-map: the JSON must be an object from module names to devices")
    for name, device in mapping.items():
        if not (isinstance(device, int) and not isinstance(device, bool) and device >= 0) and not (
            isinstance(device, str) and _DEVICE_VALUE.match(device)
        ):
            raise ModelTraceError(
                f"--device-map: module {name!r} is mapped to {device!r}, which is not a device (cpu, disk, 0, "
                "cuda:1, mps)"
            )
    return mapping


def check_device_map_fits(mapping: str | dict[str, Any], model_class: type) -> None:
    """Refuse, before loading, a map naming accelerators this machine does not have."""
    if not isinstance(mapping, dict):
        return
    for name, device in mapping.items():
        kind, index = _device_parts(device)
        if kind in ("cpu", "disk", "meta"):
            continue
        available = _accelerator_count(kind)
        if index >= available:
            have = f"{available} {kind} device{'s' if available != 1 else ''}" if available else f"no {kind} device"
            raise ModelTraceError(
                f"--device-map: {model_class.__name__} module {name!r} is mapped to {device!r}, but this machine "
                f"has {have} (map it to cpu or disk, or use --device-map auto)"
            )


def check_device_map_names(mapping: str | dict[str, Any], model: nn.Module, model_class: type) -> None:
    """Refuse a JSON map naming a module the model does not have (a typo, another model's layout, a layer past
    the last): accelerate would place it nowhere without a word."""
    if not isinstance(mapping, dict):
        return
    names = {name for name, _ in model.named_modules()} | {name for name, _ in model.named_parameters()}
    for key in mapping:
        if key and key not in names:
            close = sorted(name for name in names if name and "." not in name)
            raise ModelTraceError(
                f"--device-map: {model_class.__name__} has no module {key!r} (its top-level modules: "
                f"{', '.join(close[:8])})"
            )


def check_device_map_covers(mapping: str | dict[str, Any], model: nn.Module, model_class: type) -> None:
    """Refuse a JSON map that leaves some weight of the model on no device (named, not accelerate's KeyError)."""
    if not isinstance(mapping, dict):
        return
    keys = sorted(mapping, key=len, reverse=True)
    for name, _ in model.named_parameters():
        if "" in mapping:
            return
        if not any(name == key or name.startswith(key + ".") for key in keys):
            raise ModelTraceError(
                f"--device-map: {model_class.__name__} weight {name!r} is on no device: the map names no module "
                f"that holds it (add {name.rsplit('.', 1)[0]!r} or one of its parents, or use --device-map auto)"
            )


def _device_parts(device: Any) -> tuple[str, int]:
    if isinstance(device, int):
        return ("cuda" if torch.cuda.is_available() else "accelerator"), device
    kind, _, index = str(device).partition(":")
    return kind, int(index) if index else 0


def _accelerator_count(kind: str) -> int:
    if kind == "cuda":
        return torch.cuda.device_count()
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    module = getattr(torch, kind, None)
    try:
        return int(module.device_count()) if module is not None and module.is_available() else 0
    except (AttributeError, RuntimeError):
        return 0


def module_devices(model: nn.Module) -> dict[str, str]:
    """Where each module of a model dispatched by accelerate runs: its hook's execution device (inherited by
    modules without a hook of their own), with where its weights are kept between calls when that is elsewhere.
    Empty for a model accelerate did not dispatch (a single-device trace)."""
    # NOTE: transformers sets it as an instance attribute; `getattr` through `nn.Module.__getattr__` raises and
    # catches an AttributeError for every model without one (~40 µs before a tiny model's capture)
    device_map = model.__dict__.get("hf_device_map")
    if device_map is None and type(model).__getattr__ is not nn.Module.__getattr__:
        device_map = getattr(model, "hf_device_map", None)  # a wrapper that forwards attributes (PEFT)
    if not isinstance(device_map, dict) or not device_map:
        return {}
    keys = sorted(device_map, key=len, reverse=True)
    found: dict[str, str] = {}
    for path, module in model.named_modules():
        hook = _alignment_hook(module)
        if hook is None or getattr(hook, "execution_device", None) is None:
            parent = path.rpartition(".")[0] if "." in path else ""
            inherited = found.get(parent) if path else None
            if inherited is None:
                # NOTE: a model accelerate placed on one device whole gets no hooks: the map says where it is
                placed = next(
                    (device_map[key] for key in keys if key == "" or path == key or path.startswith(key + ".")), None
                )
                inherited = None if placed is None or placed == "disk" else _device_label(placed)
            if inherited is not None:
                found[path] = inherited
            continue
        label = _device_label(hook.execution_device)
        if getattr(hook, "offload", False):
            kept = next(
                (device_map[key] for key in keys if key == "" or path == key or path.startswith(key + ".")), None
            )
            kept_label = "disk" if kept == "disk" else "cpu"
            label = f"{label} (weights offloaded to {kept_label})"
        found[path] = label
    return found


def _device_label(device: Any) -> str:
    if isinstance(device, int):
        return f"cuda:{device}" if torch.cuda.is_available() else str(device)
    return str(torch.device(device)) if not isinstance(device, dict) else "cpu"


def _alignment_hook(module: nn.Module) -> Any:
    """accelerate's `AlignDevicesHook` of `module`, alone or inside a `SequentialHook`, if any."""
    # NOTE: accelerate sets it as an instance attribute (`add_hook_to_module`); `getattr` through
    # `nn.Module.__getattr__` raises and catches an AttributeError for every module without one (`onloaded` asks
    # of every module of every model: ~80 µs per tiny trace)
    hook = module.__dict__.get("_hf_hook")
    if hook is None:
        return None
    for candidate in [hook, *getattr(hook, "hooks", [])]:
        if hasattr(candidate, "execution_device"):
            return candidate
    return None


@contextlib.contextmanager
def onloaded(model: nn.Module) -> Iterator[None]:
    """Offloaded weights (on the meta device between calls) loaded onto their execution device, as accelerate's
    hook loads them for a forward, and offloaded again on exit: `builds` then fingerprints the real weights.

    NOTE: every offloaded module at once (the peak memory of the whole model): fine for what a trace records
    today; module by module would need `record_builds` to call back per module."""
    loaded: list[tuple[nn.Module, Any]] = []
    try:
        for _, module in model.named_modules():
            hook = _alignment_hook(module)
            if hook is not None and getattr(hook, "offload", False):
                hook.pre_forward(module)
                loaded.append((module, hook))
        yield
    finally:
        for module, hook in reversed(loaded):
            hook.post_forward(module, None)


def is_dispatched(model: nn.Module) -> bool:
    return bool(module_devices(model))
