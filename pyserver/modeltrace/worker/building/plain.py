"""The plain-module strategy: a non-model class of the file (a decoder layer, an attention block, an MLP).

Built from the file's shrunk config (its text part), with `layer_idx=0` where its `__init__` wants one, and fed
hidden states, rotary position embeddings from the file's rotary class, and so on (`--model CLASS`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.assemble import jsonable
from modeltrace.worker.building import shrink as shrinking
from modeltrace.worker.building.built import BuiltModel, own_sizes
from modeltrace.worker.building.configs import (
    config_class_of,
    default_config,
    error_line,
    read_config,
    set_attention,
    shrink_config,
)
from modeltrace.worker.building.input_spec import BATCH_SIZE, SEQUENCE_LENGTH, sub_config
from modeltrace.worker.building.meta import TORCH_DTYPES, meta_inputs
from modeltrace.worker.building.sizes import HIDDEN_WIDTH_NAMES, WIDTH
from modeltrace.worker.building.source import module_classes


_HIDDEN_INPUTS = (
    "hidden_states",
    "hidden_state",
    "x",
    "input",
    "inputs",
    "hidden",
    "features",
    "inputs_embeds",
    "embeddings",
    "input_tensor",
    "h",
)


def build_plain_module(
    module: ModuleType,
    model_class: type,
    config_path: Path | None,
    seed: int,
    attention: str,
    file: Path,
    shape_only: bool,
    dtype: str,
) -> BuiltModel:
    """A non-model class of the file (a decoder layer, an attention block, an MLP) from the file's config."""
    config_class = config_class_of(model_class, module, file)
    notes: dict[str, Any] = {"plain_module": True}
    if config_path is not None:
        config = read_config(config_class, Path(config_path))
    elif shape_only:
        config = shrinking.shrink(default_config(config_class, file), "default")
    else:
        defaults = default_config(config_class, file)
        config = shrink_config(config_class, defaults, file)
        notes["own_sizes"] = own_sizes(defaults, config)
    set_attention(config, attention)
    text_config = sub_config(config, "text")
    torch.manual_seed(seed)
    mode = None
    if shape_only:
        from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

        mode = ShapeOnlyMode()
        with mode, meta_device():
            model = _construct_plain(model_class, text_config, file)
            model.to(dtype=TORCH_DTYPES.get(dtype, torch.float32))
    else:
        model = _construct_plain(model_class, text_config, file)
    model.eval()
    kwargs = _plain_inputs(module, model, text_config, seed, file)
    if mode is not None:
        kwargs = {
            name: meta_inputs(mode, value, TORCH_DTYPES.get(dtype, torch.float32)) for name, value in kwargs.items()
        }
    built = BuiltModel(
        model=model,
        kwargs=kwargs,
        model_class=model_class.__name__,
        config=jsonable(text_config.to_dict()),
        notes={"config_class": type(config).__name__, **notes},
        shape_only=shape_only,
    )
    if mode is not None:
        built.forward_context = lambda: mode
    return built


def _construct_plain(model_class: type, config: Any, file: Path) -> nn.Module:
    parameters = inspect.signature(model_class.__init__).parameters
    arguments: dict[str, Any] = {}
    unknown = []
    hidden = _hidden_size(config)
    for name, parameter in list(parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name == "config" or name.endswith("_config") and parameter.default is inspect.Parameter.empty:
            arguments[name] = config
        elif name in ("layer_idx", "layer_id", "layer_index", "layer_number", "block_idx"):
            arguments[name] = 0
        elif parameter.default is not inspect.Parameter.empty:
            continue
        elif name in ("hidden_size", "dim", "embed_dim", "d_model", "hidden_dim", "in_features", "input_dim"):
            arguments[name] = hidden
        elif isinstance(getattr(config, name, None), (int, float, str)):
            arguments[name] = getattr(config, name)
        else:
            unknown.append(name)
    if unknown:
        raise ModelTraceError(
            f"{file}: {model_class.__name__}.__init__ needs {', '.join(unknown)}, which ModelTrace cannot guess; "
            "pass --recipe with build_model() and build_inputs(model)"
        )
    try:
        return model_class(**arguments)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__}({', '.join(arguments)}) failed: {type(error).__name__}: "
            f"{error_line(error)}; pass --recipe"
        ) from error


def _hidden_size(config: Any) -> int:
    for name in (*HIDDEN_WIDTH_NAMES, "dim"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return WIDTH


def _plain_inputs(module: ModuleType, model: nn.Module, config: Any, seed: int, file: Path) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    hidden = _hidden_size(config)
    shape = (BATCH_SIZE, SEQUENCE_LENGTH)
    parameters = inspect.signature(model.forward).parameters
    inputs: dict[str, Any] = {}
    missing: list[str] = []
    hidden_states = torch.randn(*shape, _width_of(model, hidden), generator=generator)
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        required = parameter.default is inspect.Parameter.empty
        if name in _HIDDEN_INPUTS:
            inputs[name] = hidden_states
        elif name == "position_embeddings" and (required or _rotary_class(module) is not None):
            embeddings = _position_embeddings(module, config, hidden_states, file)
            if embeddings is None and required:
                missing.append(name)
            elif embeddings is not None:
                inputs[name] = embeddings
        elif name in ("position_ids", "cache_position"):
            if required:
                positions = torch.arange(SEQUENCE_LENGTH)
                inputs[name] = positions.unsqueeze(0) if name == "position_ids" else positions
        elif name == "input_ids" and required:
            vocab = int(getattr(config, "vocab_size", 128) or 128)
            inputs[name] = torch.randint(0, vocab, shape, generator=generator)
        elif name == "use_cache":
            inputs[name] = False
        elif required:
            missing.append(name)
    if missing:
        raise ModelTraceError(
            f"{file}: {type(model).__name__}.forward needs {', '.join(missing)}, which ModelTrace cannot synthesise "
            "for a plain module; pass --recipe with build_model() and build_inputs(model)"
        )
    return inputs


def _width_of(model: nn.Module, hidden: int) -> int:
    """The feature size the module's first linear layer takes (an MLP's input), else the config's hidden size."""
    for submodule in model.modules():
        if isinstance(submodule, nn.Linear):
            return submodule.in_features
        if isinstance(submodule, nn.LayerNorm) and submodule.normalized_shape:
            return int(submodule.normalized_shape[-1])
    return hidden


def _rotary_class(module: ModuleType) -> type | None:
    for cls in module_classes(module):
        if "Rotary" in cls.__name__ and "Embedding" in cls.__name__:
            return cls
    return None


def _position_embeddings(module: ModuleType, config: Any, hidden_states: torch.Tensor, file: Path) -> Any:
    rotary_class = _rotary_class(module)
    if rotary_class is None:
        return None
    try:
        rotary = rotary_class(config=config)
        positions = torch.arange(hidden_states.shape[1]).unsqueeze(0)
        with torch.no_grad():
            return rotary(hidden_states, positions)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: computing position_embeddings with {rotary_class.__name__} failed ({type(error).__name__}: "
            f"{error_line(error)}); pass --recipe"
        ) from None
