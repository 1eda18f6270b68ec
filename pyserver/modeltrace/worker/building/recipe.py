"""The recipe strategy: a Python file with `build_model()` and `build_inputs(model)`, for anything else."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.assemble import jsonable
from modeltrace.worker.building.built import BuiltModel


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
        raise ModelTraceError(
            f"{error.filename}:{error.lineno}: syntax error: {error.msg}", error.filename, error.lineno
        ) from None
    for function_name in ("build_model", "build_inputs"):
        if not callable(getattr(module, function_name, None)):
            # NOTE: placed on the recipe's first line, so that the editor shows it in the recipe
            raise ModelTraceError(
                f"{recipe}: defines no {function_name}() (a recipe needs build_model() and build_inputs(model))",
                str(recipe),
                1,
            )
    torch.manual_seed(seed)
    model = module.build_model()
    if not isinstance(model, nn.Module):
        raise ModelTraceError(
            f"{recipe}: build_model() returned {type(model).__name__}, not an nn.Module",
            str(recipe),
            _line_of(module.build_model),
        )
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
            "arguments or a tuple of positional ones",
            str(recipe),
            _line_of(module.build_inputs),
        )
    config = getattr(model, "config", None)
    return BuiltModel(
        model=model,
        args=args,
        kwargs=kwargs,
        model_class=type(model).__name__,
        config=jsonable(config.to_dict()) if hasattr(config, "to_dict") else {},
        notes={"config_class": type(config).__name__} if hasattr(config, "to_dict") else {},
    )


def _line_of(function: Any) -> int:
    """The `def` line of a recipe's function (1 when it has no code object: a callable object)."""
    code = getattr(function, "__code__", None)
    return code.co_firstlineno if code is not None else 1
