"""Strategies: which way a spec's model is built, as rows (`STRATEGIES`), and the entry that runs the chosen one.

For a transformers-style modeling file nothing needs to be provided: the configuration class comes from the
model class (`config_class`), a copy of its defaults is shrunk and inputs come from the `forward` signature and
the config (the `shrunk` strategy, `candidates.py`). The other strategies:
- `recipe`: a recipe file (`build_model()` and `build_inputs(model)`) for anything else;
- `checkpoint`: a local folder saved with `save_pretrained`, loaded with `from_pretrained(local_files_only=True)`;
- `plain`: any non-model class of the file (`--model`), such as a decoder layer or an MLP;
- `shape-only`: the full-size config (`--config`, else the class defaults) built on the meta device;
- `config`: a config.json (or a folder holding one) used as it is, unshrunk.
A base model of the `shrunk` strategy that cannot be built, or whose inputs cannot be made (a head fed by a
backbone), gives way to another model class of the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from modeltrace.errors import ModelTraceError, NeedsRecipe
from modeltrace.worker.building import shrink as shrinking
from modeltrace.worker.building.built import BuiltModel, built_model
from modeltrace.worker.building.candidates import CannotSynthesise, NothingBuilt, build_shrunk
from modeltrace.worker.building.drafts import draft, placeholder
from modeltrace.worker.building.checkpoint import DEFAULT_TRIAL_BUDGET, build_checkpoint, check_checkpoint
from modeltrace.worker.building.configs import (
    config_class_of,
    default_config,
    error_line,
    read_config,
    set_attention,
)
from modeltrace.worker.building.inputs import InputSynthesizer
from modeltrace.worker.building.meta import TORCH_DTYPES, meta_inputs, torch_dtype
from modeltrace.worker.building.plain import build_plain_module
from modeltrace.worker.building.recipe import build_from_recipe
from modeltrace.worker.building.source import (
    choose_model_class,
    forbid_downloads,
    import_user_file,
    is_pretrained_model,
    other_models,
)
from modeltrace.worker.building.spec import BuildSpec
from modeltrace.worker.building.trials import construct, first_running_inputs


@dataclass(frozen=True)
class Strategy:
    """A way to build: chosen when `applies(spec, model class)` (the class is None for a recipe: no file is
    imported); the first row that applies is the strategy. `reason`: when a user wants it."""

    name: str
    applies: Callable[[BuildSpec, type | None], bool]
    reason: str


STRATEGIES = (
    Strategy("recipe", lambda spec, cls: spec.recipe is not None, "a model ModelTrace cannot build from a file"),
    Strategy("checkpoint", lambda spec, cls: spec.checkpoint is not None, "real weights, saved locally"),
    Strategy(
        "plain",
        lambda spec, cls: cls is not None and not is_pretrained_model(cls),
        "one part of a model (a decoder layer, an MLP), built from the file's shrunk config",
    ),
    Strategy("shape-only", lambda spec, cls: spec.shape_only, "a full-size model's shapes, without its weights"),
    Strategy("config", lambda spec, cls: spec.config is not None, "the sizes of a given config.json, unshrunk"),
    Strategy("shrunk", lambda spec, cls: True, "a transformers modeling file with nothing else given"),
)


def choose_strategy(spec: BuildSpec, model_class: type | None) -> str:
    """The name of the first of `STRATEGIES` that applies to `spec` and the class it builds."""
    return next(strategy.name for strategy in STRATEGIES if strategy.applies(spec, model_class))


def build_from_request(request: Any, offload_folder: str | None = None) -> BuiltModel:
    """Build what a trace request (see `job.run_trace_job`) asks for: the one entry of the building pipeline.

    `request` is a `TraceRequest` (or a dict or object with the same names); it is read once, into a
    `BuildSpec`, and never changed. `offload_folder`: where accelerate offloads the weights of a `--device-map`
    run to disk, made and removed by the job; a caller that gives none gets a temporary folder of its own.
    """
    spec = BuildSpec.from_request(request)
    if offload_folder is not None:
        spec = dataclasses.replace(spec, offload_folder=offload_folder)
    elif spec.device_map and spec.checkpoint is not None and spec.offload_folder is None:
        # NOTE: where accelerate writes the weights it offloads to disk (those the checkpoint's own safetensors
        # cannot serve).
        spec = dataclasses.replace(spec, offload_folder=tempfile.mkdtemp(prefix="modeltrace-offload-"))
    return build(spec)


def build(spec: BuildSpec, trial_budget: float | None = None) -> BuiltModel:
    """The model `spec` asks for, built by the strategy `choose_strategy` picks; `trial_budget`: seconds the
    builder may spend trying candidates (default: half the trace's timeout, at most `DEFAULT_TRIAL_BUDGET`)."""
    budget = trial_budget if trial_budget is not None else min(DEFAULT_TRIAL_BUDGET, spec.timeout / 2)
    if spec.recipe is not None:
        if spec.shape_only:
            raise ModelTraceError("--shape-only works on a modeling file's classes, not with --recipe")
        return build_from_recipe(spec.recipe, spec.seed)
    if spec.file is None:
        raise ModelTraceError("the trace request names no file to build a model from (and no recipe)")
    forbid_downloads()
    file = Path(spec.file)
    if spec.checkpoint is not None:
        check_checkpoint(spec.checkpoint)
    module = import_user_file(file)
    model_class = choose_model_class(module, spec.model, file)
    strategy = choose_strategy(spec, model_class)
    if strategy == "checkpoint":
        return build_checkpoint(
            model_class, Path(spec.checkpoint), spec.seed, spec.attention, file, _load_options(spec)
        )
    if spec.device_map or spec.tp_plan:
        names = [name for name, value in (("device_map", spec.device_map), ("tp_plan", spec.tp_plan)) if value]
        raise ModelTraceError(
            f"{', '.join('--' + name.replace('_', '-') for name in names)} loads a checkpoint: give the "
            "local folder saved with save_pretrained (--checkpoint DIR, or the checkpoint setting)"
        )
    if strategy == "plain":
        return build_plain_module(
            module, model_class, spec.config, spec.seed, spec.attention, file, spec.shape_only, spec.dtype
        )
    try:
        config_class = config_class_of(model_class, module, file)
    except ModelTraceError as error:
        # NOTE: a model whose config cannot be found is built by a recipe: "Create recipe…" starts one
        reason = f"{model_class.__name__} names no config class"
        raise NeedsRecipe(
            str(error), draft(model_class, module, str(file), reason, (placeholder("config", "its config"),))
        ) from None
    if strategy == "shape-only":
        config = (
            read_config(config_class, Path(spec.config))
            if spec.config
            else shrinking.shrink(default_config(config_class, file), "default")
        )
        return _build_shape_only(model_class, config, spec.seed, spec.attention, file, spec.dtype)
    if strategy == "config":
        return _build_from_config(model_class, config_class, spec, file, budget)
    return _build_shrunk_or_another(module, model_class, config_class, spec, file, budget)


def build_from_file(
    file: Path,
    model_name: str | None,
    config_path: Path | None,
    seed: int,
    attention: str = "eager",
    *,
    checkpoint: Path | str | None = None,
    shape_only: bool = False,
    dtype: str = "float32",
    trial_budget: float = DEFAULT_TRIAL_BUDGET,
) -> BuiltModel:
    """The file's model (or `model_name`) ready to run, with synthesised inputs: `build` of the spec these
    arguments make (a shorthand for tests, benchmarks and the ranks of a parallel run)."""
    spec = BuildSpec(
        file=Path(file),
        model=model_name,
        config=Path(config_path) if config_path is not None else None,
        checkpoint=str(checkpoint) if checkpoint is not None else None,
        seed=seed,
        dtype=dtype,
        attention=attention,
        shape_only=shape_only,
    )
    return build(spec, trial_budget)


def _load_options(spec: BuildSpec) -> dict[str, Any] | None:
    """`from_pretrained` options for a model spread over devices (`device_map`) or ranks (`tp_plan`)."""
    options: dict[str, Any] = {}
    if spec.device_map:
        from modeltrace.worker.placement import parse_device_map

        options["device_map"] = parse_device_map(spec.device_map)
        if spec.offload_folder is not None:
            options["offload_folder"] = spec.offload_folder
        options["dtype"] = TORCH_DTYPES.get(spec.dtype, torch.float32)
    if spec.tp_plan:
        options["tp_plan"] = spec.tp_plan
        options["dtype"] = TORCH_DTYPES.get(spec.dtype, torch.float32)
    return options or None


def _build_from_config(
    model_class: type, config_class: type, spec: BuildSpec, file: Path, trial_budget: float
) -> BuiltModel:
    config = read_config(config_class, Path(spec.config))
    set_attention(config, spec.attention)
    model = construct(model_class, config, spec.seed, file)
    synthesizer = InputSynthesizer(model, config, spec.seed)
    deadline = time.monotonic() + trial_budget
    ran = first_running_inputs(model, synthesizer, contextlib.nullcontext, deadline, [], "config", always_try=False)
    return built_model(model, model_class, config, ran, synthesizer, {"config": str(spec.config)})


def _build_shrunk_or_another(
    module: ModuleType, model_class: type, config_class: type, spec: BuildSpec, file: Path, trial_budget: float
) -> BuiltModel:
    try:
        return build_shrunk(
            model_class, default_config(config_class, file), spec.seed, spec.attention, file, trial_budget
        )
    except (NothingBuilt, CannotSynthesise) as error:
        if spec.model:
            raise
        # The base model cannot even be constructed from its class's defaults (a composite whose default parts
        # disagree), or its forward takes inputs that cannot be synthesised (a table-recognition head fed by a
        # backbone, a detection model whose image input is named `hidden_states`): another model class of the
        # file may do, its task head included (`…ForObjectDetection` takes `pixel_values`).
        reason = getattr(error, "reason", None) or str(error).split(": ", 1)[-1]
        for other in other_models(module, model_class)[:3]:
            try:
                other_config_class = config_class_of(other, module, file)
                built = build_shrunk(
                    other, default_config(other_config_class, file), spec.seed, spec.attention, file, trial_budget / 2
                )
            except ModelTraceError:
                continue
            built.notes["instead_of"] = f"{model_class.__name__} ({reason})"
            return built
        raise


def _build_shape_only(model_class: type, config: Any, seed: int, attention: str, file: Path, dtype: str) -> BuiltModel:
    from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

    dtype_of_floats = torch_dtype(dtype)
    set_attention(config, attention)
    mode = ShapeOnlyMode()
    torch.manual_seed(seed)
    try:
        with mode, meta_device():
            model = model_class(config)
            model.to(dtype=dtype_of_floats)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__} on the meta device failed: {type(error).__name__}: "
            f"{error_line(error)}"
        ) from error
    model.eval()
    synthesizer = InputSynthesizer(
        model, config, seed, convert=lambda value: meta_inputs(mode, value, dtype_of_floats), context=lambda: mode
    )
    deadline = time.monotonic() + DEFAULT_TRIAL_BUDGET
    ran = first_running_inputs(model, synthesizer, lambda: mode, deadline, [], "shape-only", always_try=False)
    built = built_model(model, model_class, config, ran, synthesizer, {"shape_only": True})
    built.shape_only = True
    built.forward_context = lambda: mode
    built.notes["approximations"] = mode.approximations
    return built
