"""Trials: build a candidate model, run its input variants, repair what an error names, keep what runs.

A trial run of a tiny model costs milliseconds, so the builder runs each candidate (`candidates.py`) on its input
variants (`inputs.InputSynthesizer.variants`) and keeps the first that runs. An error that names what the model
wants is acted on before the next variant: the rows of `REPAIRS` (the first that applies) and, for a multimodal
prompt, the placeholder count an error asks for (`inputs.InputSynthesizer.note_mismatch`); each repair gives a
new input spec (or, for a config repair, a new synthesiser over the repaired config) and the variant runs again.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building.config_tree import walk_configs
from modeltrace.worker.building.configs import NO_ATTRIBUTE, error_line, lend_attribute
from modeltrace.worker.building.input_spec import InputSpec, InputVariant
from modeltrace.worker.building.inputs import InputSynthesizer

# NOTE: a variant is run again at most this many times after repairs (each repair must change something).
MAX_RUNS_PER_VARIANT = 3


@dataclass(frozen=True)
class Attempt:
    """A candidate that failed: its shrink level (or strategy), its input variant ("-": none ran), why."""

    level: str
    inputs: str
    error: str
    # NOTE: the lines of the traced file in the error's traceback, innermost first (the line that raised, then
    # the lines that called into it): the same error at the same lines for every input set is the code's.
    lines: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.level} / {self.inputs}: {self.error}"


def lines_in_file(error: BaseException, file: Path | None) -> tuple[int, ...]:
    """The lines of `file` in `error`'s traceback, innermost first; empty without a file."""
    if file is None:
        return ()
    target = os.path.realpath(file)
    frames = traceback.extract_tb(error.__traceback__)
    return tuple(
        frame.lineno for frame in reversed(frames) if frame.lineno and os.path.realpath(frame.filename) == target
    )


def code_error(attempts: list[Attempt]) -> Attempt | None:
    """The attempt that stands for all when every input set that ran failed with the same error (numbers aside:
    sizes change with the level) at the same lines of the traced file: an error in the code, not in the inputs."""
    ran = [attempt for attempt in attempts if attempt.inputs != "-"]
    if not ran or not ran[0].lines:
        return None
    signatures = {(re.sub(r"\d+", "N", attempt.error), attempt.lines) for attempt in ran}
    return ran[0] if len(signatures) == 1 else None


def count_parameters_on_meta(build: Callable[[], nn.Module]) -> int | None:
    """How many parameters `build()` makes, built on the meta device (None: it cannot be built there)."""
    from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

    try:
        with ShapeOnlyMode(), meta_device():
            model = build()
    except Exception:  # noqa: BLE001 - a model whose __init__ needs real tensors: no estimate
        return None
    return sum(parameter.numel() for parameter in model.parameters())


def construct(model_class: type, config: Any, seed: int, file: Path) -> nn.Module:
    """`model_class(config)` with the seed set, in eval mode; a sub-config missing a field another config of the
    tree has gets it lent (`configs.lend_attribute`) and the model is built again."""
    torch.manual_seed(seed)
    try:
        try:
            model = model_class(config)
        except AttributeError as error:
            if not lend_attribute(config, error):
                raise
            torch.manual_seed(seed)
            model = model_class(config)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__} failed: {type(error).__name__}: {error_line(error)}"
        ) from error
    prepare(model)
    return model.eval()


def prepare(model: nn.Module) -> None:
    """What a model needs set before any forward pass: X-MOD's default language adapter."""
    languages = getattr(getattr(model, "config", None), "languages", None)
    if callable(getattr(model, "set_default_language", None)) and languages:
        try:
            model.set_default_language(list(languages)[0])
        except Exception:  # noqa: BLE001 - the forward pass says what is missing
            pass


def run(model: nn.Module, kwargs: dict[str, Any], context: Callable[[], contextlib.AbstractContextManager]) -> None:
    """One forward pass without gradients, inside `context` (the shape-only mode's dispatch mode)."""
    with torch.no_grad(), context():
        model(**kwargs)


# --- repairs: rows with their reason ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Repair:
    """After a failed run: `fix(synthesizer, spec, inputs, error)` gives the synthesiser and spec to run again
    (None: this row does not apply). `reason`: which models need the row."""

    fix: Callable[
        [InputSynthesizer, InputSpec, dict[str, Any], BaseException], tuple[InputSynthesizer, InputSpec] | None
    ]
    reason: str


def _lend_config_field(
    synthesizer: InputSynthesizer, spec: InputSpec, inputs: dict[str, Any], error: BaseException
) -> tuple[InputSynthesizer, InputSpec] | None:
    if not lend_attribute(synthesizer.config, error):
        return None
    # NOTE: the repaired config may change what the towers give: placeholder counts are asked again.
    return synthesizer.afresh(), InputSpec(spec.modalities, spec.style, spec.text_length, spec.feature_width)


def _give_token_id(
    synthesizer: InputSynthesizer, spec: InputSpec, inputs: dict[str, Any], error: BaseException
) -> tuple[InputSynthesizer, InputSpec] | None:
    match = NO_ATTRIBUTE.search(str(error))
    if not isinstance(error, AttributeError) or match is None or not match.group(2).endswith("_token_id"):
        return None
    owners = [node for node in walk_configs(synthesizer.config) if type(node).__name__ == match.group(1)]
    if not owners:
        return None
    token = int(synthesizer.text_tokens(synthesizer.draw(), 1)[0])
    for owner in owners:
        try:
            setattr(owner, match.group(2), token)
        except Exception:  # noqa: BLE001
            return None
    return synthesizer, spec


def _fit_prompt_length(
    synthesizer: InputSynthesizer, spec: InputSpec, inputs: dict[str, Any], error: BaseException
) -> tuple[InputSynthesizer, InputSpec] | None:
    fitted = synthesizer.fit_text_length(spec, inputs, error)
    return None if fitted is None else (synthesizer, fitted)


def _fit_frame_width(
    synthesizer: InputSynthesizer, spec: InputSpec, inputs: dict[str, Any], error: BaseException
) -> tuple[InputSynthesizer, InputSpec] | None:
    fitted = synthesizer.fit_feature_width(spec, inputs, error)
    return None if fitted is None else (synthesizer, fitted)


REPAIRS = (
    Repair(
        _lend_config_field,
        "a sub-config lacks a field the forward pass reads and another config of the tree has (DBRX's rope_theta)",
    ),
    Repair(
        _give_token_id,
        "a config lacks a special token id the forward pass reads (Qwen3-Omni's vision_start_token_id): an "
        "ordinary id no other special token uses",
    ),
    Repair(
        _fit_prompt_length,
        "a layer wants another prompt length ('size of tensor a (7) must match ... b (8)': one token per audio "
        "frame in a streaming model)",
    ),
    Repair(
        _fit_frame_width,
        "audio frames wider than the mel bins ('mat1 and mat2 shapes cannot be multiplied (64x80 and 320x64)': "
        "stacked frames)",
    ),
)
# Modalities whose placeholder count an error may name ("tokens: 3, features: 16"), applied after the row above.
PLACEHOLDER_MODALITIES = ("image", "video", "audio")


def _repaired(
    synthesizer: InputSynthesizer, variant: InputVariant, spec: InputSpec, inputs: dict[str, Any], error: BaseException
) -> tuple[InputSynthesizer, InputSpec] | None:
    """The synthesiser and spec to run `variant` again with after `error`, or None when nothing was repaired."""
    repaired = next(
        (fixed for fixed in (repair.fix(synthesizer, spec, inputs, error) for repair in REPAIRS) if fixed), None
    )
    if repaired is not None:
        synthesizer, spec = repaired
    changed = repaired is not None
    for modality in PLACEHOLDER_MODALITIES:
        if modality in variant.name and modality in str(error).lower():
            counted = synthesizer.note_mismatch(spec, modality, error)
            if counted is not None:
                spec, changed = counted, True
    return (synthesizer, spec) if changed else None


@dataclass(frozen=True)
class Ran:
    """The input variant a model ran with, the spec that made it run (with what repairs learnt), and the
    synthesiser over the (possibly repaired) config."""

    variant: InputVariant
    spec: InputSpec
    synthesizer: InputSynthesizer

    def fresh_inputs(self) -> dict[str, Any]:
        """The inputs again from the same seed (the trial run may have changed them in place)."""
        return self.synthesizer.inputs(self.spec)


def first_running_inputs(
    model: nn.Module,
    synthesizer: InputSynthesizer,
    context: Callable[[], contextlib.AbstractContextManager],
    deadline: float,
    attempts: list[Attempt],
    level: str,
    always_try: bool,
    file: Path | None = None,
) -> Ran | None:
    """The first input variant `model` runs with (after repairs), or None; each failure is added to `attempts`
    (with the lines of `file`, the traced file, where it was raised). With `always_try` False a single variant is
    taken without a trial run."""
    variants = list(synthesizer.variants())
    if not variants:
        attempts.append(Attempt(level, "-", f"forward needs {', '.join(synthesizer.missing())}"))
        return None
    if len(variants) == 1 and not always_try:
        return Ran(variants[0], variants[0].spec, synthesizer)
    # NOTE: placeholder counts an error named hold for every later variant; a prompt length or frame width
    # learnt from an error holds for its own variant only.
    counts: tuple[tuple[str, int], ...] = ()
    for variant in variants:
        spec = InputSpec(variant.spec.modalities, variant.spec.style, feature_counts=counts)
        kwargs = variant.inputs
        for _ in range(MAX_RUNS_PER_VARIANT):
            try:
                run(model, kwargs, context)
                return Ran(variant, spec, synthesizer)
            except Exception as error:  # noqa: BLE001 - the next candidate may run
                repaired = _repaired(synthesizer, variant, spec, kwargs, error)
                if repaired is None:
                    message = f"{type(error).__name__}: {error_line(error)}"
                    attempts.append(Attempt(level, variant.name, message, lines_in_file(error, file)))
                    break
                if repaired[0] is not synthesizer:
                    synthesizer = repaired[0]
                    _count_as_before(synthesizer, variant.name)
                synthesizer, spec = repaired
                counts = spec.feature_counts
                kwargs = synthesizer.inputs(spec)
                if time.monotonic() > deadline:
                    return None
    return None


def _count_as_before(synthesizer: InputSynthesizer, name: str) -> None:
    """Ask the towers for their placeholder counts as the variants before `name` asked them (the richest set
    first), so that a repaired synthesiser counts what the first one counted."""
    for variant in synthesizer.variants():
        if variant.name == name:
            return


_NOT_SIZE_ERRORS = (
    "NameError",
    "AttributeError",
    "TypeError",
    "KeyError",
    "ImportError",
    "ModuleNotFoundError",
    "NotImplementedError",
    "ZeroDivisionError",
    "UnboundLocalError",
    "SyntaxError",
)


def same_failure(current: list[Attempt], previous: list[Attempt]) -> bool:
    """Whether a level failed with exactly the errors of the level before, and not with size errors: a bug
    (a NameError, a missing attribute) that another size will not change."""
    if not current or not previous:
        return False
    signature = [re.sub(r"\d+", "N", attempt.error) for attempt in current]
    if signature != [re.sub(r"\d+", "N", attempt.error) for attempt in previous]:
        return False
    return all(attempt.error.split(":", 1)[0] in _NOT_SIZE_ERRORS for attempt in current)
