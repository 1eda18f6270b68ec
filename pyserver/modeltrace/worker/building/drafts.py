"""Recipe drafts: what a failed build tried (the constructor arguments, the config, the inputs), as Python source.

When a class can only be traced with a recipe, the worker says what it had got to (`messages.RecipeDraft`, carried
by `errors.NeedsRecipe` into `WorkerError.recipe`), and the editor's "Create recipe…" writes a recipe from it
(`modeltrace/recipe_writer.py`). Values become expressions a recipe can hold: numbers as they are, tensors as
`torch.randn(1, 7, 64)` of their shape and dtype; what has no such expression is a placeholder to fill in.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import torch

from modeltrace.worker.messages import RecipeArgument, RecipeDraft


def expression_of(value: Any) -> str | None:
    """A Python expression that makes a value like `value` (a tensor of its shape and dtype), or None."""
    if value is None or isinstance(value, bool | str):
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, torch.Tensor):
        sizes = tuple(int(size) for size in value.shape)
        if value.dtype == torch.bool:
            return f"torch.ones({sizes!r}, dtype=torch.bool)"
        if not value.is_floating_point():
            high = max(int(value.max()) + 1 if value.numel() else 2, 2)
            dtype = "" if value.dtype == torch.long else f", dtype={value.dtype}"
            return f"torch.randint(0, {high}, {sizes!r}{dtype})"
        dtype = "" if value.dtype == torch.float32 else f", dtype={value.dtype}"
        return f"torch.randn({sizes!r}{dtype})"
    if isinstance(value, tuple | list):
        items = [expression_of(item) for item in value]
        if any(item is None for item in items):
            return None
        inner = ", ".join(items) + ("," if isinstance(value, tuple) and len(items) == 1 else "")
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return None


def argument(name: str, value: Any, note: str = "") -> RecipeArgument:
    """A draft argument for a value the build chose; a placeholder when it has no expression."""
    expression = expression_of(value)
    if expression is None:
        return RecipeArgument(name, "None", guessed=False, note=note or f"a {type(value).__name__}")
    return RecipeArgument(name, expression, guessed=True, note=note)


def placeholder(name: str, note: str) -> RecipeArgument:
    """An argument ModelTrace could not choose: `None` in the recipe, with what is known about it."""
    return RecipeArgument(name, "None", guessed=False, note=note)


def draft(
    model_class: type,
    module: ModuleType | None,
    file: str,
    reason: str,
    arguments: tuple[RecipeArgument, ...] = (),
    inputs: tuple[RecipeArgument, ...] = (),
    config: Any = None,
) -> RecipeDraft:
    """The draft of a class's recipe: its constructor arguments, the inputs, and the config (its class and the
    fields that differ from the class's defaults), when there is one."""
    config_class = type(config) if config is not None else None
    fields: tuple[RecipeArgument, ...] = ()
    if config is not None:
        fields = tuple(argument(name, value) for name, value in _changed_fields(config).items())
    return RecipeDraft(
        model_class=model_class.__name__,
        file=file,
        module=module.__name__ if module is not None else model_class.__module__,
        reason=reason,
        config_class=config_class.__name__ if config_class is not None else None,
        config_module=config_class.__module__ if config_class is not None else None,
        config=tuple(item for item in fields if item.guessed),
        arguments=arguments,
        inputs=inputs,
    )


def _changed_fields(config: Any) -> dict[str, Any]:
    """The config's plain fields (numbers, strings, lists of them) that differ from its class's defaults."""
    try:
        defaults = type(config)().to_dict()
        values = config.to_dict()
    except Exception:  # noqa: BLE001 - a config whose defaults do not build: every plain field is written
        defaults, values = {}, getattr(config, "__dict__", {})
    return {
        name: value
        for name, value in values.items()
        if not name.startswith("_")
        and name not in ("transformers_version", "architectures", "model_type")
        and isinstance(value, int | float | str | bool | list)
        and defaults.get(name, object()) != value
    }
