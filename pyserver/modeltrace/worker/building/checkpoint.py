"""The checkpoint strategy: a local folder saved with `save_pretrained`, loaded with
`from_pretrained(local_files_only=True)`, optionally spread over devices (`device_map`) or ranks (`tp_plan`)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building.built import BuiltModel, built_model
from modeltrace.worker.building.configs import error_line
from modeltrace.worker.building.inputs import InputSynthesizer
from modeltrace.worker.building.source import HUB_ID, is_pretrained_model, refuse_hub_id
from modeltrace.worker.building.trials import first_running_inputs

# Seconds the builder may spend trying input variants before it settles for the first one.
DEFAULT_TRIAL_BUDGET = 60.0


def check_checkpoint(checkpoint: Path | str) -> None:
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelTraceError(
                f"checkpoint {str(checkpoint)!r}: the folder holds no config.json (save the model with "
                "save_pretrained into it)"
            )
        return
    if HUB_ID.match(str(checkpoint)) and not str(checkpoint).startswith(("/", ".", "~")):
        refuse_hub_id(str(checkpoint), "checkpoint")
    raise ModelTraceError(
        f"checkpoint {str(checkpoint)!r}: no such folder (ModelTrace never downloads: save the model locally "
        "with save_pretrained and point to that folder, or pass --recipe)"
    )


def build_checkpoint(
    model_class: type, folder: Path, seed: int, attention: str, file: Path, load_options: dict[str, Any] | None = None
) -> BuiltModel:
    if not is_pretrained_model(model_class):
        raise ModelTraceError(
            f"{file}: {model_class.__name__} is not a transformers model (PreTrainedModel), so it cannot load a "
            "checkpoint folder; pass --recipe"
        )
    torch.manual_seed(seed)
    options = dict(load_options or {})
    if options.get("device_map") is not None:
        from modeltrace.worker.placement import check_device_map_fits, check_device_map_names

        check_device_map_fits(options["device_map"], model_class)
        if isinstance(options["device_map"], dict):
            skeleton = None
            with contextlib.suppress(Exception), torch.device("meta"):
                skeleton = model_class(model_class.config_class.from_pretrained(str(folder), local_files_only=True))
            if skeleton is not None:
                check_device_map_names(options["device_map"], skeleton, model_class)
    try:
        # NOTE: weights_only=True (also transformers' default): a pickled `pytorch_model.bin` is read with torch's
        # restricted unpickler, so a checkpoint cannot run code; safetensors files are never pickles.
        model = model_class.from_pretrained(
            str(folder), local_files_only=True, attn_implementation=attention, weights_only=True, **options
        )
    except ModelTraceError:
        raise
    except Exception as error:  # noqa: BLE001
        if options.get("device_map") is not None:
            _explain_device_map_failure(error, options["device_map"], model_class, folder)
        raise ModelTraceError(
            f"{folder}: loading {model_class.__name__} from this folder failed ({type(error).__name__}: "
            f"{error_line(error)})"
        ) from error
    model.eval()
    config = model.config
    _restore_buffers(model, model_class, config)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    synthesizer = InputSynthesizer(model, config, seed)
    deadline = time.monotonic() + DEFAULT_TRIAL_BUDGET
    ran = first_running_inputs(
        model, synthesizer, contextlib.nullcontext, deadline, [], "checkpoint", always_try=False
    )
    return built_model(model, model_class, config, ran, synthesizer, {"checkpoint": str(folder.resolve())})


def _explain_device_map_failure(error: Exception, device_map: Any, model_class: type, folder: Path) -> None:
    """A failed `from_pretrained(device_map=...)` said in the map's terms, when the cause is the map."""
    from modeltrace.worker.placement import check_device_map_covers

    if isinstance(device_map, dict):
        skeleton = None
        with contextlib.suppress(Exception), torch.device("meta"):
            skeleton = model_class(model_class.config_class.from_pretrained(str(folder), local_files_only=True))
        if skeleton is not None:
            check_device_map_covers(device_map, skeleton, model_class)
    raise ModelTraceError(
        f"{folder}: loading {model_class.__name__} with --device-map {json_text(device_map)} failed "
        f"({type(error).__name__}: {error_line(error)})"
    ) from error


def json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built in here get their parameters on the meta device (one at a time on the CPU first) and their
    buffers for real: what `__init__` computes (rotary frequencies, position ids) without the weights."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, parameter: Any) -> None:
        register(self, name, parameter)
        if parameter is not None and parameter.device.type != "meta":
            self._parameters[name] = nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _restore_buffers(model: nn.Module, model_class: type, config: Any) -> None:
    """Non-persistent buffers (not in the checkpoint) as the class's `__init__` computes them.

    `from_pretrained` builds the model on the meta device and leaves non-persistent buffers (a rotary embedding's
    `inv_freq`) to the model's `_init_weights`; a model that does not set them there gets uninitialised memory.
    """
    persistent = set(model.state_dict())
    loose = {name: buffer for name, buffer in model.named_buffers() if name not in persistent}
    if not loose:
        return
    try:
        with _parameters_on_meta():
            fresh = model_class(config)
    except Exception:  # noqa: BLE001 - the loaded model keeps what from_pretrained gave it
        return
    computed = dict(fresh.named_buffers())
    with torch.no_grad():
        for name, buffer in loose.items():
            value = computed.get(name)
            if value is not None and value.device.type != "meta" and value.shape == buffer.shape:
                buffer.copy_(value.to(device=buffer.device, dtype=buffer.dtype))
