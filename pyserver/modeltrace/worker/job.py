"""One trace, run inside a forked worker child: build the model, run it under capture, write the trace.

`run_trace_job` takes the `TraceRequest` and returns the `TraceResult` (a replay's `ReplayAnswer`);
`describe_failure` turns any exception into the `WorkerError`, located at the innermost frame of the user's own
code, with its cause.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


from modeltrace.collector import collector_paused
from modeltrace.errors import ModelTraceError, NeedsRecipe
from modeltrace.modular.twins import is_modular_file, resolve_generated
from modeltrace.worker.assemble import assemble_trace, discarded_on_error, start_stream, write_captured
from modeltrace.worker.building import BuiltModel, build_from_request
from modeltrace.worker.build_identity import BuildInputs
from modeltrace.worker.builds import ConstructionRecorder, record_builds
from modeltrace.worker.backward import run_backward
from modeltrace.worker.capture import ModuleCapture, forget_wrappers, iter_tensor_leaves
from modeltrace.worker.generation import check_can_generate, choose_generating_class, run_generation
from modeltrace.worker.lines import LineCapture
from modeltrace.worker.messages import (
    CodeFrame,
    RecipeDraft,
    ReplayAnswer,
    TraceRequest,
    TraceResult,
    WorkerError,
    WorkerProtocolError,
)
from modeltrace.worker.moving import inputs_to_placed_model, move_built
from modeltrace.worker.parameter_store import WeightWork, store_parameters
from modeltrace.worker.replay import keep_candidate, run_replay_job
from modeltrace.worker.source_map import indexed_files, real_path
from modeltrace.worker.stats import summarize


ProgressCallback = Callable[[str], None]


class JobFailed(Exception):
    """An exception raised while a job ran, with what the job knew by then (`describe_failure` reports both):
    the phase (`build` or `forward`), the class it built and the advice its build left."""

    def __init__(
        self,
        error: BaseException,
        phase: str,
        model_class: str | None = None,
        advice: str | None = None,
        recipe: RecipeDraft | None = None,
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.phase = phase
        self.model_class = model_class
        self.advice = advice
        self.recipe = recipe


# The model of the last job that succeeded, kept until the next job starts or the process ends. A worker's child
# answers and ends with `os._exit`, freeing nothing: freeing the model's weights on the way out of the job only
# delayed the answer (~5 ms after a medium Llama's 95 ms forward, its memory handed back to the system).
_finished_models: list[BuiltModel] = []


def run_trace_job(request: TraceRequest, progress: ProgressCallback) -> TraceResult | ReplayAnswer:
    """Build, run and write one trace; returns its `TraceResult`. A request carrying `replay` is a replay of
    suspect modules for a diff instead (`worker/replay.py`): it writes no trace. Raises `JobFailed`. The built
    model stays referenced until the next job (`_finished_models`)."""
    _finished_models.clear()
    if request.replay is not None:
        return run_replay_job(request, progress)
    import dataclasses
    import tempfile

    # NOTE: a modular file runs as the file transformers generates from it (`modular/twins.py`): the build, the
    # line capture and the trace's `file` are the generated twin's; the header keeps the modular file
    modular = None
    if request.file and not request.recipe and is_modular_file(request.file):
        modular = str(Path(request.file).resolve())
        request = dataclasses.replace(request, file=str(resolve_generated(modular)))
    # NOTE: where accelerate writes the weights of a `--device-map` run it offloads to disk (those the
    # checkpoint's own safetensors cannot serve); removed when the trace is written or has failed
    offload_folder = tempfile.mkdtemp(prefix="modeltrace-offload-") if request.device_map else None
    try:
        result = _run_trace(request, progress, offload_folder, modular)
    finally:
        if offload_folder is not None:
            import shutil

            shutil.rmtree(offload_folder, ignore_errors=True)
    return result


def _run_trace(
    request: TraceRequest, progress: ProgressCallback, offload_folder: str | None, modular: str | None = None
) -> TraceResult:
    started = time.perf_counter()
    source = request.recipe or request.file
    if request.generate and request.backward:
        raise ModelTraceError("--generate and --backward: choose one (a generation trace, or a forward + backward)")
    try:
        if request.generate:
            request = choose_generating_class(request)
        progress(f"building the model from {Path(source).name}")
        # NOTE: what the build reads, when its weights go to the parameter store: a build the store remembers
        # names its stored weights without the byte match (`build_identity.py`)
        inputs = BuildInputs() if _stores_weights(request) else None
        # NOTE: where each submodule was assigned, seen while it is built (a registration hook, nothing per call)
        with ConstructionRecorder() as constructions, inputs or contextlib.nullcontext():
            # Recipe, local checkpoint, --config, shape-only and the unaided build: all decided in worker/building/.
            built = build_from_request(request, offload_folder)
        build_key = inputs.key(request) if inputs is not None and not built.shape_only else None
    except Exception as error:
        raise JobFailed(error, "build") from error
    try:
        # NOTE: the collector paused for the rest of the job, which ends a worker's child (the CLI's and the
        # editor's worker fork one per trace): what it makes from here on (the fingerprints' plan, the wrappers, the
        # records, the construction records, the trace's tables) holds no reference cycles, and goes when
        # `_run_built` returns. Each collection meanwhile walked all of it (a tiny Llama: 4 collections, ~0.3 ms
        # beside a 1.5 ms forward); resumed once that frame is gone, nothing of it is walked.
        with collector_paused():
            result = _run_built(request, progress, built, constructions, started, modular, build_key)
        _finished_models.append(built)
        return result
    except Exception as error:
        # NOTE: a failure from here on names the class that ran, and what to provide instead of a guessed build
        raise JobFailed(
            error, "forward", built.model_class, built.notes.get("unverified"), built.recipe_draft
        ) from error


def _run_built(
    request: TraceRequest,
    progress: ProgressCallback,
    built: BuiltModel,
    constructions: ConstructionRecorder,
    started: float,
    modular: str | None = None,
    build_key: str | None = None,
) -> TraceResult:
    # NOTE: a shape-only model stays on the meta device, built in the requested dtype; one loaded with a device
    # map is where accelerate put it (its hooks move the inputs), in the dtype it was loaded in
    if not built.shape_only and not request.device_map:
        move_built(built, request.device, request.dtype)
    elif request.device_map:
        inputs_to_placed_model(built)
    built_at = time.perf_counter()
    generate_steps = request.generate
    if generate_steps:
        check_can_generate(built.model, request)
    progress(
        f"running {built.model_class}."
        + (
            f"generate ({generate_steps} decode steps)"
            if generate_steps
            else "forward + backward"
            if request.backward
            else "forward"
        )
    )
    line_files = [request.file, *request.follow] if request.lines else []
    generation = gradients = None
    # NOTE: full tensors stream to the trace's temporary folder during the forward (`worker/tensor_stream.py`)
    stream = (
        start_stream(_output_folder(request), limit_bytes("tensor-memory-mb", request.tensor_memory_mb))
        if request.full_tensors and not built.shape_only
        else None
    )
    # NOTE: the parameters' fingerprints and digest do not depend on the forward: they are worked out on a
    # second thread, beside it and after it (`WeightWork`). Not for a model spread by a device map
    # (its offloaded weights are loaded for the fingerprints: `onloaded`) nor for a backward (it writes `.grad`).
    background = (
        WeightWork(
            built.model, request.max_tensor_mb if stream is not None and request.parameters else None, build_key
        )
        if not request.device_map and not request.backward
        else None
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(discarded_on_error(stream))
        if background is not None:
            stack.push(background.forward_exited)
        if not request.backward:
            stack.enter_context(torch.no_grad())
        stack.enter_context(built.forward_context())
        capture = stack.enter_context(
            ModuleCapture(
                built.model,
                full_tensors=request.full_tensors,
                max_tensor_bytes=limit_bytes("max-tensor-mb", request.max_tensor_mb),
                max_trace_bytes=limit_bytes("max-trace-mb", request.max_trace_mb),
                # NOTE: not a model spread by a device map: its offload folder goes when this job ends
                retain_calls_bytes=(
                    limit_bytes("keep-calls-mb", request.keep_calls_mb)
                    if request.keep_for_replay and not built.shape_only and not request.device_map
                    else None
                ),
                stream=stream,
            )
        )
        line_capture = None
        if line_files:
            line_capture = stack.enter_context(
                LineCapture(
                    line_files,
                    capture.summary_cache,
                    capture.pending,
                    capture.call_stack,
                    keep=capture.keep_line_value if capture.full_tensors else None,
                )
            )
        if generate_steps:
            generation = run_generation(
                built.model, built.args, built.kwargs, generate_steps, capture, request, progress
            )
        elif request.backward:
            gradients = run_backward(built, capture, request)
        else:
            built.model(*built.args, **built.kwargs)
    finished_at = time.perf_counter()
    forget_wrappers(built.model)  # NOTE: this job's model is captured once
    if request.device_map:
        # NOTE: accelerate leaves a model that fits one device whole without hooks (nor, on a CPU-only machine,
        # a device map): its calls ran where their outputs are
        for record in capture.records:
            if record.device is None and record.outputs:
                record.device = record.outputs[0].device
    # NOTE: after the forward, so that the capture's tensor limits favour the activations over the weights
    from modeltrace.worker.placement import onloaded

    # weights accelerate offloaded: fingerprinted for real, then offloaded again; they go to the stream too
    # (with full tensors, to the shared parameter store, once per content: `worker/parameter_store.py`)
    with onloaded(built.model), discarded_on_error(stream):
        builds = record_builds(
            built.model, constructions, parameters=background.fingerprints() if background is not None else None
        )
        stored = None
        if capture.full_tensors and request.parameters and not built.shape_only:
            if background is not None:
                background.wait()
            stored = store_parameters(built.model, builds, limit_bytes("max-tensor-mb", request.max_tensor_mb))
            if background is not None:
                background.remember(stored)
    constructions.clear()
    builds_at = time.perf_counter()
    trace = assemble_trace(
        {
            "class": built.model_class,
            "file": real_path(request.file),
            **({"modular": real_path(modular)} if modular else {}),
            "recipe": real_path(request.recipe) if request.recipe else None,
            "config": built.config,
            "inputs": [summary.to_json() for summary in _input_summaries(built)],
            "options": trace_options(request, built, **_placement_options(request, built)),
            "build": _jsonable_notes(built.notes),
            **({"parameters": stored} if stored is not None else {}),
            "seconds": {
                "build": built_at - started,
                "forward": finished_at - built_at,
                "builds": builds_at - finished_at,
            },
        },
        capture,
        line_capture,
        builds,
    )
    trace.generation, trace.gradients = generation, gradients
    if generate_steps:
        trace.model["options"]["generate"] = generate_steps
    if request.backward:
        trace.model["options"]["backward"] = True
    progress("writing the trace")
    # NOTE: not durable here: the zygote's child flushes the trace to disk after answering (`sync_trace`).
    destination = write_captured(trace, capture, _output_folder(request), durable=False)
    if capture.retained is not None:
        keep_candidate(built, capture.retained, destination)
    return TraceResult(
        trace=str(destination),
        model_class=built.model_class,
        modules=len(trace.modules),
        seconds=time.perf_counter() - started,
        kept_for_replay=capture.retained is not None,
        # NOTE: the files every module class came from too (a container never called is in no record)
        source_files=tuple(dict.fromkeys([*trace.model["source_hashes"], *indexed_files()])),
    )


def _stores_weights(request: TraceRequest) -> bool:
    """Whether the job's weights go to the parameter store through `WeightWork` (full tensors, parameters on;
    not a model spread by a device map, nor a backward)."""
    return (
        request.full_tensors
        and request.parameters
        and not request.shape_only
        and not request.device_map
        and not request.tp_plan
        and not request.backward
    )


def _output_folder(request: TraceRequest) -> Path:
    if not request.out:
        raise ModelTraceError(f"the trace request for {request.file} names no trace folder to write (out)")
    return Path(request.out)


def trace_options(request: TraceRequest, built: BuiltModel, **extra: Any) -> dict[str, Any]:
    """The trace header's `options`: how the model was built and run (what a replay rebuilds it from)."""
    return {
        "seed": request.seed,
        "device": request.device,
        "dtype": request.dtype,
        "full_tensors": request.full_tensors,
        "attention": request.attention,
        "shape_only": built.shape_only,
        "checkpoint": request.checkpoint or None,
        **({"parameters": request.parameters} if request.full_tensors else {}),
        **extra,
    }


def _placement_options(request: TraceRequest, built: BuiltModel) -> dict[str, Any]:
    """The header's record of a model spread over devices: the map asked for and the one accelerate made."""
    if not request.device_map:
        return {}
    placed = getattr(built.model, "hf_device_map", None) or {}
    return {"device_map": request.device_map, "placed": {str(name): str(device) for name, device in placed.items()}}


def limit_bytes(option: str, megabytes: float) -> int:
    """A size limit of the request in MB as bytes (`option` names it in the message when it is negative)."""
    if not megabytes >= 0:  # also NaN
        raise ModelTraceError(f"{option} must be a number of megabytes >= 0, not {megabytes!r}")
    return int(megabytes * 2**20)


def _jsonable_notes(notes: dict[str, Any]) -> dict[str, Any]:
    """How the model was built (shrink level, input set, shape-only approximations), msgpack-safe."""
    return {str(key): (dict(value) if isinstance(value, dict) else value) for key, value in notes.items()}


def _input_summaries(built: BuiltModel) -> list:
    named = [(f"args.{position}", value) for position, value in enumerate(built.args)] + list(built.kwargs.items())
    return [summarize(tensor, key) for name, value in named for key, tensor in iter_tensor_leaves(value, name)]


def describe_failure(error: BaseException, request: TraceRequest | None) -> WorkerError:
    """The `WorkerError` for an exception: its cause, type, message, and the file/line inside the user's code.

    A `JobFailed` says in which phase it happened (`build`, `forward`) and which class was being run; a
    `ModelTraceError` is bad input whatever the phase (its message is shown as it is)."""
    phase, model_class, advice, recipe = "forward", None, None, None
    if isinstance(error, JobFailed):
        phase, model_class, advice, recipe, error = (
            error.phase,
            error.model_class,
            error.advice,
            error.recipe,
            error.error,
        )
    if isinstance(error, NeedsRecipe):
        recipe = error.draft
    roots = [str(Path(name).resolve().parent) for name in (request.file, request.recipe) if name] if request else []
    file, line, callers = None, None, ()
    if isinstance(error, SyntaxError) and error.filename:
        file, line = real_path(error.filename), error.lineno
    elif isinstance(error, ModelTraceError):
        file, line = (real_path(error.file), error.line) if error.file else (None, None)
    else:
        frames = traceback.extract_tb(error.__traceback__)
        inside_user_code = [
            frame for frame in frames if any(real_path(frame.filename).startswith(root) for root in roots)
        ]
        chosen = inside_user_code[-1] if inside_user_code else (frames[-1] if frames else None)
        if chosen is not None:
            file, line = real_path(chosen.filename), chosen.lineno
        # NOTE: the line that raised is often not the one at fault: its callers name the arguments' source
        callers = tuple(
            CodeFrame(file=real_path(frame.filename), line=frame.lineno, function=frame.name)
            for frame in reversed(inside_user_code[:-1])
            if frame.lineno
        )
    if isinstance(error, WorkerProtocolError):
        kind, cause = "WorkerProtocolError", "protocol"
    elif isinstance(error, ModelTraceError):
        kind, cause = "ModelTraceError", "input"
    else:
        kind, cause = type(error).__name__, phase
    return WorkerError(
        kind=kind,
        cause=cause,
        message=str(error),
        file=file,
        line=line,
        model_class=model_class,
        advice=advice,
        traceback="".join(traceback.format_exception(error)),
        callers=callers,
        recipe=recipe,
    )


def flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
