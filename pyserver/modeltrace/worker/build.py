"""Build what a trace runs: import the user's file, pick the model class, shrink its config, synthesise inputs.

For a transformers-style modeling file nothing needs to be provided: the configuration class comes from the
model class (`config_class`), a copy of its defaults is shrunk to a small size that keeps the config's own
rules (heads divide the hidden size, key/value heads divide the heads, special token ids stay inside the
vocabulary), and inputs come from the `forward` signature. A recipe file (`build_model()` and
`build_inputs(model)`) covers plain `nn.Module` code, local checkpoints and anything else.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError


SEQUENCE_LENGTH = 7
DECODER_SEQUENCE_LENGTH = 5
BATCH_SIZE = 1

# Target sizes for shrinking, applied to whichever of these names the config has. Names differ across
# families (Llama `hidden_size`, T5 `d_model`, GPT-2 `n_embd`) but the meaning is the same.
_HIDDEN = 64
_HEADS = 4
_KEY_VALUE_HEADS = 2
_SMALL_CONFIG = {
    "hidden_size": _HIDDEN, "d_model": _HIDDEN, "n_embd": _HIDDEN, "embed_dim": _HIDDEN,
    "intermediate_size": 2 * _HIDDEN, "d_ff": 2 * _HIDDEN, "n_inner": 2 * _HIDDEN, "ffn_dim": 2 * _HIDDEN,
    "encoder_ffn_dim": 2 * _HIDDEN, "decoder_ffn_dim": 2 * _HIDDEN,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "num_decoder_layers": 2,
    "encoder_layers": 2, "decoder_layers": 2,
    "num_attention_heads": _HEADS, "num_heads": _HEADS, "n_head": _HEADS,
    "encoder_attention_heads": _HEADS, "decoder_attention_heads": _HEADS,
    "head_dim": _HIDDEN // _HEADS, "d_kv": _HIDDEN // _HEADS,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": _HIDDEN // 2, "shared_expert_intermediate_size": _HIDDEN,
    "vocab_size": 128,
}
_MAX_POSITIONS = 512


@dataclass
class BuiltModel:
    """A model ready to trace, its inputs, and what the trace header says about them."""

    model: nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    model_class: str = ""
    config: dict[str, Any] = field(default_factory=dict)


def import_user_file(path: Path) -> ModuleType:
    """Import a modeling file as its package sees it, so relative imports (`.configuration_x`) work.

    The topmost folder of the chain of packages (folders with `__init__.py`) above the file is put on
    `sys.path` and the file imported under its dotted name; a file outside any package is imported by stem.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelTraceError(f"{path}: no such file")
    if path.suffix != ".py":
        raise ModelTraceError(f"{path}: not a Python file")
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module_name = ".".join(parts)
    try:
        return importlib.import_module(module_name)
    except SyntaxError as error:
        raise ModelTraceError(f"{error.filename}:{error.lineno}: syntax error: {error.msg}") from None


def module_classes(module: ModuleType) -> list[type[nn.Module]]:
    """The `nn.Module` subclasses defined in `module` itself (not imported into it), in source order."""
    found = [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, nn.Module) and value.__module__ == module.__name__
    ]
    return sorted(found, key=lambda cls: inspect.getsourcelines(cls)[1] if _has_source(cls) else 0)


def _has_source(cls: type) -> bool:
    try:
        inspect.getsourcelines(cls)
        return True
    except (OSError, TypeError):
        return False


def _is_pretrained_model(cls: type) -> bool:
    from transformers import PreTrainedModel

    return issubclass(cls, PreTrainedModel)


def choose_model_class(module: ModuleType, requested: str | None, file: Path) -> type[nn.Module]:
    """`requested` by name, else the file's base model: a PreTrainedModel that is neither the abstract
    `…PreTrainedModel` nor a head (`…ForCausalLM`); among several, the one named like `XModel`."""
    classes = module_classes(module)
    if requested:
        for cls in classes:
            if cls.__name__ == requested:
                return cls
        candidate = getattr(module, requested, None)
        if inspect.isclass(candidate) and issubclass(candidate, nn.Module):
            return candidate
        names = ", ".join(cls.__name__ for cls in classes) or "none"
        raise ModelTraceError(f"{file}: no nn.Module class named {requested!r} (classes in the file: {names})")
    if not classes:
        raise ModelTraceError(f"{file}: defines no nn.Module subclass to trace; pass --recipe to build one")
    models = [
        cls for cls in classes if _is_pretrained_model(cls) and not cls.__name__.endswith("PreTrainedModel")
    ]
    bases = [cls for cls in models if "For" not in cls.__name__]
    if bases:
        bases.sort(key=lambda cls: (not cls.__name__.endswith("Model"), len(cls.__name__)))
        return bases[0]
    if models:
        return models[0]
    raise ModelTraceError(
        f"{file}: defines nn.Module classes ({', '.join(cls.__name__ for cls in classes)}) but no transformers "
        "model (PreTrainedModel subclass) whose config ModelTrace could build; pass --recipe"
    )


def load_config(model_class: type[nn.Module], config_path: Path | None, file: Path) -> Any:
    """The config to build with: `config_path` as it is, else a shrunk copy of the config class's defaults."""
    config_class = getattr(model_class, "config_class", None)
    if config_class is None:
        raise ModelTraceError(
            f"{file}: {model_class.__name__} names no config class (`config_class` or a `config:` annotation); "
            "pass --config or --recipe"
        )
    if config_path is not None:
        return _read_config(config_class, Path(config_path))
    try:
        defaults = config_class()
    except Exception as error:  # noqa: BLE001 - any failure of user config code is reported, not raised
        raise ModelTraceError(
            f"{file}: cannot build {config_class.__name__}() with its defaults ({type(error).__name__}: {error}); "
            "pass --config or --recipe"
        ) from None
    return shrink_config(config_class, defaults, file)


def _read_config(config_class: type, config_path: Path) -> Any:
    if not config_path.exists():
        raise ModelTraceError(
            f"{config_path}: no such config file or folder (ModelTrace never downloads: give a local "
            "config.json or a folder saved with save_pretrained)"
        )
    config_file = config_path / "config.json" if config_path.is_dir() else config_path
    if not config_file.is_file():
        raise ModelTraceError(f"{config_path}: holds no config.json")
    try:
        return config_class.from_json_file(str(config_file))
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{config_file}: cannot be read as {config_class.__name__} ({type(error).__name__}: {error})"
        ) from None


def shrink_config(config_class: type, defaults: Any, file: Path) -> Any:
    """A small copy of `defaults`: hidden 64, 2 layers, 4 heads (2 key/value heads when grouped), vocab 128."""
    overrides: dict[str, Any] = {}
    for name, value in _SMALL_CONFIG.items():
        current = getattr(defaults, name, None)
        if isinstance(current, int) and not isinstance(current, bool):
            overrides[name] = min(current, value) if name in ("num_experts_per_tok",) else value
    heads = getattr(defaults, "num_attention_heads", None)
    key_value_heads = getattr(defaults, "num_key_value_heads", None)
    if isinstance(key_value_heads, int):
        # Grouped-query attention stays grouped, multi-head stays multi-head.
        overrides["num_key_value_heads"] = _HEADS if key_value_heads == heads else _KEY_VALUE_HEADS
    if "num_experts" in overrides and "num_experts_per_tok" in overrides:
        overrides["num_experts_per_tok"] = min(overrides["num_experts_per_tok"], overrides["num_experts"])
    positions = getattr(defaults, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > _MAX_POSITIONS:
        overrides["max_position_embeddings"] = _MAX_POSITIONS
    layers = overrides.get("num_hidden_layers") or overrides.get("num_layers")
    layer_types = getattr(defaults, "layer_types", None)
    if layers and isinstance(layer_types, list) and len(layer_types) > layers:
        overrides["layer_types"] = layer_types[:layers]
    vocab = overrides.get("vocab_size")
    if vocab:
        overrides.update(_special_tokens_inside(defaults, vocab))
    overrides["use_cache"] = False
    try:
        config = config_class(**{**_own_values(defaults), **overrides})
    except Exception as error:  # noqa: BLE001
        shown = ", ".join(f"{name}={value}" for name, value in overrides.items() if name != "use_cache")
        raise ModelTraceError(
            f"{file}: {config_class.__name__} rejects the shrunk sizes ({shown}): {type(error).__name__}: "
            f"{error}; pass --config or --recipe"
        ) from None
    return config


def _own_values(config: Any) -> dict[str, Any]:
    """The config's own fields as keyword arguments (minus derived and bookkeeping entries)."""
    values = config.to_dict()
    for derived in ("transformers_version", "model_type", "architectures", "_name_or_path", "dtype"):
        values.pop(derived, None)
    return values


def _special_tokens_inside(config: Any, vocab: int) -> dict[str, Any]:
    """Move special token ids that would fall outside the shrunk vocabulary to its last ids."""
    moved: dict[str, Any] = {}
    next_free = vocab - 1
    for name, value in config.to_dict().items():
        if not (name.endswith("_token_id") or name.endswith("_token_index")):
            continue
        if isinstance(value, int) and value >= vocab:
            moved[name], next_free = next_free, next_free - 1
        elif isinstance(value, list) and any(isinstance(item, int) and item >= vocab for item in value):
            remapped = []
            for item in value:
                if isinstance(item, int) and item >= vocab:
                    item, next_free = next_free, next_free - 1
                remapped.append(item)
            moved[name] = remapped
    return moved


def synthesize_inputs(model: nn.Module, config: Any, generator: torch.Generator) -> dict[str, Any]:
    """Keyword inputs for `model.forward`, from its signature and config (text models)."""
    vocab = int(getattr(config, "vocab_size", 128) or 128)
    parameters = inspect.signature(model.forward).parameters
    inputs: dict[str, Any] = {}
    shape = (BATCH_SIZE, SEQUENCE_LENGTH)
    if "input_ids" in parameters:
        inputs["input_ids"] = torch.randint(0, vocab, shape, generator=generator)
    if "attention_mask" in parameters:
        inputs["attention_mask"] = torch.ones(shape, dtype=torch.long)
    if "token_type_ids" in parameters and getattr(config, "type_vocab_size", None):
        inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.long)
    if "decoder_input_ids" in parameters and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(
            0, vocab, (BATCH_SIZE, DECODER_SEQUENCE_LENGTH), generator=generator
        )
    if "use_cache" in parameters:
        inputs["use_cache"] = False
    missing = [
        name
        for name, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        and name not in inputs
    ]
    if missing:
        raise ModelTraceError(
            f"{type(model).__name__}.forward needs {', '.join(missing)}, which ModelTrace cannot synthesise; "
            "pass --recipe with build_inputs(model)"
        )
    return inputs


def build_from_file(
    file: Path,
    model_name: str | None,
    config_path: Path | None,
    seed: int,
    attention: str = "eager",
) -> BuiltModel:
    """The file's model (or `model_name`) built from a shrunk config, eval mode, with synthesised inputs."""
    module = import_user_file(file)
    model_class = choose_model_class(module, model_name, file)
    if not _is_pretrained_model(model_class):
        raise ModelTraceError(
            f"{file}: {model_class.__name__} is a plain nn.Module, not a transformers model with a config; "
            "trace the file's model instead, or pass --recipe to build it"
        )
    config = load_config(model_class, config_path, file)
    config._attn_implementation = attention
    torch.manual_seed(seed)
    try:
        model = model_class(config)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__} failed: {type(error).__name__}: {error}"
        ) from error
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    kwargs = synthesize_inputs(model, config, generator)
    return BuiltModel(
        model=model,
        kwargs=kwargs,
        model_class=model_class.__name__,
        config=_jsonable(config.to_dict()),
    )


def build_from_recipe(recipe: Path, seed: int) -> BuiltModel:
    """Call the recipe's `build_model()` and `build_inputs(model)` (with the seed set before each)."""
    recipe = Path(recipe).resolve()
    if not recipe.is_file():
        raise ModelTraceError(f"{recipe}: no such recipe file")
    spec = importlib.util.spec_from_file_location(f"modeltrace_recipe_{recipe.stem}", recipe)
    if spec is None or spec.loader is None:
        raise ModelTraceError(f"{recipe}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered like any import, so that inspect (and so `defined_at`) finds the recipe's classes.
    sys.modules[spec.name] = module
    sys.path.insert(0, str(recipe.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ModelTraceError(f"{error.filename}:{error.lineno}: syntax error: {error.msg}") from None
    for function_name in ("build_model", "build_inputs"):
        if not callable(getattr(module, function_name, None)):
            raise ModelTraceError(
                f"{recipe}: defines no {function_name}() (a recipe needs build_model() and build_inputs(model))"
            )
    torch.manual_seed(seed)
    model = module.build_model()
    if not isinstance(model, nn.Module):
        raise ModelTraceError(f"{recipe}: build_model() returned {type(model).__name__}, not an nn.Module")
    model.eval()
    torch.manual_seed(seed)
    inputs = module.build_inputs(model)
    args: tuple = ()
    kwargs: dict[str, Any] = {}
    if isinstance(inputs, dict):
        kwargs = dict(inputs)
    elif isinstance(inputs, tuple):
        args = inputs
    elif isinstance(inputs, torch.Tensor):
        args = (inputs,)
    else:
        raise ModelTraceError(
            f"{recipe}: build_inputs(model) returned {type(inputs).__name__}; return a dict of keyword "
            "arguments or a tuple of positional ones"
        )
    config = getattr(model, "config", None)
    return BuiltModel(
        model=model,
        args=args,
        kwargs=kwargs,
        model_class=type(model).__name__,
        config=_jsonable(config.to_dict()) if hasattr(config, "to_dict") else {},
    )


def _jsonable(value: Any) -> Any:
    """A copy of a config dict holding only msgpack/JSON-safe values."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
