"""The plain-module strategy: a non-model class of the file (a decoder layer, an attention block, an MLP).

Built from the file's shrunk config (its text part), with `layer_idx=0` where its `__init__` wants one, and fed
hidden states, rotary position embeddings from the file's rotary class, and so on (`--model CLASS`). A class whose
`__init__` takes no config (`TinyBlock(dim, hidden, num_heads=8)`) is built with small values its arguments' names
and annotations call for (`plain_arguments.py`), with or without a config class in the file. What cannot be
guessed is a `NeedsRecipe` carrying what was tried (`drafts.py`), for the editor's "Create recipe…".
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError, NeedsRecipe
from modeltrace.plain_arguments import guess_argument, is_config_argument
from modeltrace.worker.assemble import jsonable
from modeltrace.worker.building import shrink as shrinking
from modeltrace.worker.building.built import BuiltModel, own_sizes
from modeltrace.worker.building.drafts import argument, draft, placeholder
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
from modeltrace.worker.messages import RecipeArgument


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
    """A non-model class of the file (a decoder layer, an attention block, an MLP) from the file's config, or from
    small values for its arguments when it takes no config."""
    try:
        config_class = config_class_of(model_class, module, file)
    except ModelTraceError as error:
        if config_path is not None or _takes_config(model_class):
            raise NeedsRecipe(
                str(error), draft(model_class, module, str(file), f"{model_class.__name__} names no config class")
            ) from None
        # NOTE: no config anywhere (a plain file of nn.Modules): the arguments' names and annotations are all
        config_class = None
    notes: dict[str, Any] = {"plain_module": True}
    text_config = None
    if config_class is not None:
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
        notes["config_class"] = type(config).__name__
    torch.manual_seed(seed)
    mode = None
    if shape_only:
        from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

        mode = ShapeOnlyMode()
        with mode, meta_device():
            model, arguments = _construct_plain(module, model_class, text_config, file)
            model.to(dtype=TORCH_DTYPES.get(dtype, torch.float32))
    else:
        model, arguments = _construct_plain(module, model_class, text_config, file)
    model.eval()
    kwargs = _plain_inputs(module, model, text_config, seed, file, arguments)
    if mode is not None:
        kwargs = {
            name: meta_inputs(mode, value, TORCH_DTYPES.get(dtype, torch.float32)) for name, value in kwargs.items()
        }
    built = BuiltModel(
        model=model,
        kwargs=kwargs,
        model_class=model_class.__name__,
        config=jsonable(text_config.to_dict()) if text_config is not None else {},
        notes=notes,
        shape_only=shape_only,
    )
    # NOTE: a forward that fails on guessed arguments (a size the code expects otherwise) can be traced with a
    # recipe that starts from them; one built from the file's config has nothing guessed to fix
    built.recipe_draft = (
        None
        if config_class is not None
        else draft(
            model_class,
            module,
            str(file),
            f"{model_class.__name__} built with guessed arguments",
            arguments,
            tuple(argument(name, value) for name, value in kwargs.items()),
        )
    )
    if mode is not None:
        built.forward_context = lambda: mode
    return built


def _takes_config(model_class: type) -> bool:
    parameters = list(inspect.signature(model_class.__init__).parameters.values())[1:]
    return any(
        is_config_argument(parameter.name, parameter.default is not inspect.Parameter.empty)
        for parameter in parameters
    )


def _annotation_text(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _construct_plain(
    module: ModuleType, model_class: type, config: Any, file: Path
) -> tuple[nn.Module, tuple[RecipeArgument, ...]]:
    """The class built with the config's values where its arguments name them, else small values their names and
    annotations call for; also each argument as a recipe would write it. `NeedsRecipe` when one cannot be chosen."""
    parameters = inspect.signature(model_class.__init__).parameters
    arguments: dict[str, Any] = {}
    drafted: list[RecipeArgument] = []
    unknown = []
    hidden = _hidden_size(config)
    for name, parameter in list(parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        has_default = parameter.default is not inspect.Parameter.empty
        guess = guess_argument(name, _annotation_text(parameter.annotation))
        if config is not None and is_config_argument(name, has_default):
            arguments[name] = config
            drafted.append(placeholder(name, f"a {type(config).__name__}"))
        elif name in ("layer_idx", "layer_id", "layer_index", "layer_number", "block_idx"):
            arguments[name] = 0
        elif has_default and not (guess is not None and guess.by_name and _is_number(parameter.default)):
            # NOTE: a default is kept, unless it is a size the name says can be small (`dim=4096`)
            continue
        elif config is not None and name in ("hidden_size", "dim", "embed_dim", "d_model", "hidden_dim"):
            arguments[name] = hidden
        elif config is not None and isinstance(getattr(config, name, None), (int, float, str)):
            arguments[name] = getattr(config, name)
        elif guess is not None:
            arguments[name] = guess.value
        else:
            unknown.append(name)
            annotation = _annotation_text(parameter.annotation)
            drafted.append(
                placeholder(
                    name, f"annotated {annotation}" if annotation else "no annotation, and its name says no size"
                )
            )
            continue
        if name in arguments and not (config is not None and arguments[name] is config):
            drafted.append(argument(name, arguments[name]))
    drafted_arguments = tuple(drafted)
    if unknown:
        raise NeedsRecipe(
            f"{file}: {model_class.__name__}.__init__ needs {', '.join(unknown)}, which ModelTrace cannot guess "
            "from a name or an annotation; pass --recipe with build_model() and build_inputs(model)",
            draft(
                model_class,
                module,
                str(file),
                f"cannot guess {', '.join(unknown)}",
                drafted_arguments,
                _draft_inputs(model_class, arguments),
            ),
            # NOTE: on the `def __init__` line that takes them, where the editor shows it
            *_init_location(model_class),
        )
    try:
        return model_class(**arguments), drafted_arguments
    except Exception as error:  # noqa: BLE001
        raise NeedsRecipe(
            f"{file}: building {model_class.__name__}({_call_text(arguments, config)}) failed: "
            f"{type(error).__name__}: {error_line(error)}; pass --recipe",
            draft(
                model_class,
                module,
                str(file),
                f"{model_class.__name__}({_call_text(arguments, config)}) raised {type(error).__name__}",
                drafted_arguments,
            ),
        ) from error


def _draft_inputs(model_class: type, arguments: dict[str, Any]) -> tuple[RecipeArgument, ...]:
    """The inputs a recipe would give `forward` when the class could not be built: hidden states of the width
    its arguments say (else 64), placeholders for the rest."""
    widths = [value for name, value in arguments.items() if _is_number(value) and name in _WIDTH_ARGUMENTS]
    width = int(widths[0]) if widths else WIDTH
    drafted = []
    for name, parameter in list(inspect.signature(model_class.forward).parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in _HIDDEN_INPUTS:
            drafted.append(argument(name, torch.zeros(BATCH_SIZE, SEQUENCE_LENGTH, width)))
        elif parameter.default is inspect.Parameter.empty:
            drafted.append(placeholder(name, f"an input of {model_class.__name__}.forward"))
    return tuple(drafted)


# The arguments whose value is the width of the hidden states a module takes.
_WIDTH_ARGUMENTS = ("dim", "hidden_size", "d_model", "embed_dim", "hidden_dim", "in_features", "input_dim", "width")


def _init_location(model_class: type) -> tuple[str | None, int | None]:
    """(file, line) of the class's own `def __init__`, when it has one in Python source."""
    code = getattr(model_class.__dict__.get("__init__"), "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else (None, None)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _call_text(arguments: dict[str, Any], config: Any) -> str:
    """`dim=64, hidden=128` (a config argument by name only)."""
    return ", ".join(
        name if value is config and config is not None else f"{name}={value!r}" for name, value in arguments.items()
    )


def _hidden_size(config: Any) -> int:
    for name in (*HIDDEN_WIDTH_NAMES, "dim"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return WIDTH


def _plain_inputs(
    module: ModuleType,
    model: nn.Module,
    config: Any,
    seed: int,
    file: Path,
    arguments: tuple[RecipeArgument, ...] = (),
) -> dict[str, Any]:
    """Inputs for the module's `forward` by their names (hidden states, position embeddings...); `NeedsRecipe`,
    with the constructor `arguments` and what was synthesised, when a required one has no rule."""
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
        elif name == "position_embeddings" and config is not None and (required or _rotary_class(module) is not None):
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
        drafted_inputs = tuple(argument(name, value) for name, value in inputs.items()) + tuple(
            placeholder(name, f"an input of {type(model).__name__}.forward") for name in missing
        )
        raise NeedsRecipe(
            f"{file}: {type(model).__name__}.forward needs {', '.join(missing)}, which ModelTrace cannot synthesise "
            "for a plain module; pass --recipe with build_model() and build_inputs(model)",
            draft(
                type(model), module, str(file), f"cannot synthesise {', '.join(missing)}", arguments, drafted_inputs
            ),
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
