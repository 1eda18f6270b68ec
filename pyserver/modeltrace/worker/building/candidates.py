"""Candidates of the shrunk strategy: shrink levels × input variants, tried in order, the first that runs kept.

No rule set fits several hundred model families, so the builder tries candidates: the shrink levels of
`shrink.shrink_candidates` (`tiny` to the config as it is; the size rules are the rows of `shrink_rules.py`)
and, for each model that builds, the input variants of `inputs.py` (every modality the model takes down to text
alone; the family layouts are the rows of `input_forms.py`), run by `trials.py`. When none runs, the first
candidate that built is returned, so that the trace fails where the model fails, with a note that says what to
provide instead (`--recipe`, `--config`).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building import shrink as shrinking
from modeltrace.worker.building.built import BuiltModel, built_model, own_sizes
from modeltrace.worker.building.drafts import argument, draft, placeholder
from modeltrace.worker.building.configs import set_attention
from modeltrace.worker.building.input_spec import InputVariant
from modeltrace.worker.building.inputs import InputSynthesizer
from modeltrace.worker.building.trials import (
    Attempt,
    Ran,
    code_error,
    construct,
    count_parameters_on_meta,
    first_running_inputs,
    same_failure,
)

# A model built for real (not on the meta device) above this many parameters is refused: it would take minutes
# and gigabytes on a laptop CPU. The shape-only mode has no such limit.
MAX_PARAMETERS = 300_000_000
_MISSING_LIBRARY = re.compile(r"requires the ([\w.-]+) library but it was not found")


@dataclass
class Candidate:
    """A model built from one shrunk config (`level`), with its synthesiser and first input variant (None: the
    synthesiser has none)."""

    model: nn.Module
    config: Any
    variant: InputVariant | None
    synthesizer: InputSynthesizer
    level: str

    @classmethod
    def of(cls, model: nn.Module, config: Any, synthesizer: InputSynthesizer, level: str) -> Candidate:
        return cls(model, config, next(iter(synthesizer.variants()), None), synthesizer, level)


class CannotSynthesise(ModelTraceError):
    """The model builds but its forward needs inputs ModelTrace cannot make (another class of the file may not)."""


class NothingBuilt(ModelTraceError):
    """No shrunk config of the class could even be constructed (as opposed to built and failed to run)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def build_shrunk(
    model_class: type, defaults: Any, seed: int, attention: str, file: Path, trial_budget: float
) -> BuiltModel:
    """The first candidate (shrink level × input variant) of `model_class` that runs; see the module docstring."""
    deadline = time.monotonic() + trial_budget
    attempts: list[Attempt] = []
    first: Candidate | None = None  # the first model that built, kept in case no input set runs unaided
    previous_failures: list[Attempt] = []
    rejected: list[str] = []
    try:
        levels = list(shrinking.shrink_candidates(defaults, rejected))
    except ModelTraceError as error:
        raise NothingBuilt(f"{file}: {error}", str(error)) from None
    for reason in rejected:
        level, _, error = reason.partition(": ")
        attempts.append(Attempt(level, "-", f"config rejected: {error}"))
    for level, config in levels:
        set_attention(config, attention)
        # NOTE: every level: a name the rules do not know can leave a huge table in a "tiny" config.
        count = count_parameters_on_meta(lambda: model_class(config))
        if count is not None and count > MAX_PARAMETERS:
            limit = f"{count / 1e6:.0f}M parameters, above the {MAX_PARAMETERS / 1e6:.0f}M limit"
            attempts.append(Attempt(level, "-", limit))
            continue
        try:
            model = construct(model_class, config, seed, file)
        except ModelTraceError as error:
            attempts.append(Attempt(level, "-", str(error).split(": ", 1)[-1]))
            if time.monotonic() > deadline:
                break
            continue
        synthesizer = InputSynthesizer(model, config, seed)
        failed_before = len(attempts)
        ran = first_running_inputs(
            model, synthesizer, contextlib.nullcontext, deadline, attempts, level, always_try=True, file=file
        )
        if ran is None and same_failure(attempts[failed_before:], previous_failures):
            # The same programming error at two sizes (a NameError, a missing attribute): a bug, not a size.
            first = first or Candidate.of(model, config, synthesizer, level)
            break
        previous_failures = attempts[failed_before:]
        if ran is not None:
            notes: dict[str, Any] = {"shrink": level, "own_sizes": own_sizes(defaults, config)}
            if attempts:
                notes["failed_candidates"] = [attempt.describe() for attempt in attempts]
            return built_model(model, model_class, config, ran, ran.synthesizer, notes)
        if first is None:
            first = Candidate.of(model, config, synthesizer, level)
        if time.monotonic() > deadline:
            break
    if first is None or first.variant is None:
        raise _no_candidate(model_class, defaults, file, first, attempts)
    notes = {
        "shrink": first.level,
        "own_sizes": own_sizes(defaults, first.config),
        "failed_candidates": [attempt.describe() for attempt in attempts],
    }
    tried = len({(attempt.level, attempt.inputs) for attempt in attempts})
    code = code_error(attempts)
    notes["unverified"] = _unverified(type(defaults).__name__, file, tried, code)
    # Rebuilt so that the traced run starts from the same weights and inputs as a fresh build.
    model = construct(model_class, first.config, seed, file)
    synthesizer = InputSynthesizer(model, first.config, seed)
    ran = Ran(first.variant, first.variant.spec, synthesizer)
    built = built_model(model, model_class, first.config, ran, synthesizer, notes)
    if code is not None:
        # NOTE: an error in the code, not in the inputs: a recipe would not help, so none is offered
        return built
    # NOTE: no input set ran: a recipe that starts from this config and these inputs is what the user can fix
    built.recipe_draft = draft(
        model_class,
        sys.modules.get(model_class.__module__),
        str(file),
        f"no shrunk {type(defaults).__name__} and synthesised input set ran",
        (placeholder("config", f"a {type(first.config).__name__}"),),
        tuple(argument(name, value) for name, value in built.kwargs.items()),
        first.config,
    )
    return built


def _unverified(config_name: str, file: Path, tried: int, code: Attempt | None) -> str:
    """What the failure of a build that never ran says after the error: a code error when every input set failed
    the same way at the same lines of the file (then what to provide, should the inputs be at fault after all),
    else that no shrunk config and input set ran, and what to provide."""
    provide = "pass --recipe with build_model() and build_inputs(model), or --config with a small config.json"
    if code is not None:
        called = f", called from line {code.lines[1]}" if len(code.lines) > 1 else ""
        return (
            f"every shrunk {config_name} and synthesised input set ({tried} tried) fails with this error at line "
            f"{code.lines[0]} of {file.name}{called}: an error in the code, not in the inputs (if the inputs are at "
            f"fault after all, {provide})"
        )
    return f"no shrunk {config_name} and synthesised input set ran unaided ({tried} tried); {provide}"


def _no_candidate(
    model_class: type, defaults: Any, file: Path, first: Candidate | None, attempts: list[Attempt]
) -> ModelTraceError:
    """The error when no candidate built, or the first that built has no input variant."""
    reasons = "; ".join(f"{attempt.level}: {attempt.error}" for attempt in attempts[:3]) or "no candidate"
    missing = first.synthesizer.missing() if first is not None else []
    if missing:
        return CannotSynthesise(
            f"{file}: {model_class.__name__}.forward needs {', '.join(missing)}, which ModelTrace cannot "
            "synthesise; pass --recipe with build_model() and build_inputs(model)"
        )
    message = (
        f"{file}: {model_class.__name__} could not be built from a shrunk {type(defaults).__name__}: {reasons}; "
        "pass --config with a small config.json, or --recipe"
    )
    libraries = [_MISSING_LIBRARY.search(attempt.error) for attempt in attempts]
    if first is None and attempts and all(libraries):
        # Not a size problem: a library the model (or a part of it, a timm backbone) imports is missing.
        message = (
            f"{file}: {model_class.__name__} needs the {libraries[0].group(1)} library, which is not installed "
            "here; install it, or pass --recipe with build_model() and build_inputs(model)"
        )
    if first is None:
        return NothingBuilt(message, attempts[0].error if attempts else "no candidate")
    return ModelTraceError(message)
