"""The end of the building pipeline: a model ready to trace, its inputs, and notes on how it was made."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.assemble import jsonable
from modeltrace.worker.building.inputs import InputSynthesizer
from modeltrace.worker.building.trials import Ran
from modeltrace.worker.messages import RecipeDraft


@dataclass
class BuiltModel:
    """A model ready to trace, its inputs, and what the trace header says about them.

    `forward_context` wraps the traced forward pass (the shape-only mode's dispatch mode); `notes` say how the
    model was made (shrink level, input set, candidates that failed), for the header and for error messages.
    """

    model: nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    model_class: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    shape_only: bool = False
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # What a recipe would start from, when the build guessed (a plain module's arguments): a forward that fails
    # reports it (`WorkerError.recipe`), for the editor's "Create recipe…".
    recipe_draft: RecipeDraft | None = None


def cannot_synthesise(model_class: type, synthesizer: InputSynthesizer) -> ModelTraceError:
    return ModelTraceError(
        f"{model_class.__name__}.forward needs {', '.join(synthesizer.missing())}, which ModelTrace cannot "
        "synthesise; pass --recipe with build_model() and build_inputs(model)"
    )


def built_model(
    model: nn.Module,
    model_class: type,
    config: Any,
    ran: Ran | None,
    synthesizer: InputSynthesizer,
    notes: dict[str, Any],
) -> BuiltModel:
    """The `BuiltModel` of a model and the input variant it ran with (`ModelTraceError` when it has none)."""
    if ran is None:
        raise cannot_synthesise(model_class, synthesizer)
    return BuiltModel(
        model=model,
        kwargs=ran.fresh_inputs(),
        model_class=model_class.__name__,
        config=jsonable(config.to_dict()),
        notes={"config_class": type(config).__name__, **notes, "inputs": ran.variant.name},
    )


# NOTE: ids and flags are ints too, but not sizes: a shrunk vocabulary remaps token ids, which say nothing of size
_NOT_SIZES = ("_id", "_token_id", "_token_ids", "_index")


def own_sizes(defaults: Any, shrunk: Any) -> dict[str, list[int]]:
    """The sizes the shrink changed, `{field: [shrunk, the config's own]}`, the fields of sub-configs as
    `text_config.hidden_size`: what the trace header says ran against what the config class describes."""
    return _changed_sizes(defaults.to_dict(), shrunk.to_dict(), "")


def _changed_sizes(own: dict[str, Any], shrunk: dict[str, Any], prefix: str) -> dict[str, list[int]]:
    changed: dict[str, list[int]] = {}
    for name, value in shrunk.items():
        before = own.get(name)
        if isinstance(value, dict) and isinstance(before, dict):
            changed.update(_changed_sizes(before, value, f"{prefix}{name}."))
        elif type(value) is int and type(before) is int and value != before and not name.endswith(_NOT_SIZES):
            changed[prefix + name] = [value, before]
    return changed
