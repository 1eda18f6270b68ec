"""One trace, run inside a forked worker child: build the model, run it under capture, write the trace.

`run_trace_job` takes the request frame and returns the result frame; `describe_failure` turns any exception
into the structured error frame, located at the innermost frame of the user's own code.
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


from modeltrace.errors import ModelTraceError
from modeltrace.worker.assemble import assemble_trace, discarded_on_error, start_stream, write_captured
from modeltrace.worker.build import BuiltModel, build_from_request
from modeltrace.worker.builds import ConstructionRecorder, record_builds
from modeltrace.worker.backward import run_backward
from modeltrace.worker.capture import ModuleCapture, iter_tensor_leaves
from modeltrace.worker.generation import check_can_generate, choose_generating_class, run_generation
from modeltrace.worker.lines import LineCapture
from modeltrace.worker.protocol import (
    DEFAULT_KEEP_CALLS_MB,
    DEFAULT_MAX_TENSOR_MB,
    DEFAULT_MAX_TRACE_MB,
    DEFAULT_TENSOR_MEMORY_MB,
)
from modeltrace.worker.replay import keep_candidate
from modeltrace.worker.source_map import real_path
from modeltrace.worker.stats import summarize


ProgressCallback = Callable[[str], None]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _build(request: dict[str, Any]) -> BuiltModel:
    # Recipe, local checkpoint, --config, shape-only and the unaided build: all decided in build.py.
    return build_from_request(request)


def _move(built: BuiltModel, device: str, dtype_name: str) -> None:
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        raise ModelTraceError(f"--dtype {dtype_name!r}: choose one of {', '.join(_DTYPES)}")
    try:
        target = torch.device(device)
    except RuntimeError:
        raise ModelTraceError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None
    built.model.to(device=target, dtype=dtype)

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device=target, dtype=dtype) if value.is_floating_point() else value.to(target)
        return value

    built.args = tuple(move(value) for value in built.args)
    built.kwargs = {name: move(value) for name, value in built.kwargs.items()}


def run_trace_job(request: dict[str, Any], progress: ProgressCallback) -> dict[str, Any]:
    """Build, run and write one trace; returns the `result` frame. A request carrying `replay` is a replay of
    suspect modules for a diff instead (`worker/replay.py`): it writes no trace."""
    if request.get("replay"):
        from modeltrace.worker.replay import run_replay_job

        return run_replay_job(request, progress)
    try:
        return _run_trace(request, progress)
    finally:
        if request.get("offload_folder"):  # accelerate's disk offload of a `--device-map` run
            import shutil

            shutil.rmtree(request["offload_folder"], ignore_errors=True)


def _run_trace(request: dict[str, Any], progress: ProgressCallback) -> dict[str, Any]:
    started = time.perf_counter()
    source = request.get("recipe") or request["file"]
    if request.get("generate") and request.get("backward"):
        raise ModelTraceError("--generate and --backward: choose one (a generation trace, or a forward + backward)")
    if request.get("generate"):
        choose_generating_class(request)
    progress(f"building the model from {Path(source).name}")
    # NOTE: where each submodule was assigned, seen while it is built (a registration hook, nothing per call)
    with ConstructionRecorder() as constructions:
        built = _build(request)
    # Remembered on the request so that a failure from here on names the class (`describe_failure`).
    request["model_class"] = built.model_class
    if built.notes.get("unverified"):
        request["advice"] = built.notes["unverified"]
    # NOTE: a shape-only model stays on the meta device, built in the requested dtype; one loaded with a device
    # map is where accelerate put it (its hooks move the inputs), in the dtype it was loaded in
    if not built.shape_only and not request.get("device_map"):
        _move(built, request.get("device") or "cpu", request.get("dtype") or "float32")
    built_at = time.perf_counter()
    generate_steps = int(request.get("generate") or 0)
    if generate_steps:
        check_can_generate(built.model, request)
    progress(
        f"running {built.model_class}."
        + (
            f"generate ({generate_steps} decode steps)"
            if generate_steps
            else "forward + backward"
            if request.get("backward")
            else "forward"
        )
    )
    line_files = [request["file"], *(request.get("follow") or [])] if request.get("lines") else []
    generation = gradients = None
    # NOTE: full tensors stream to the trace's temporary folder during the forward (`worker/tensor_stream.py`)
    stream = (
        start_stream(Path(request["out"]), _limit_bytes(request, "tensor_memory_mb", DEFAULT_TENSOR_MEMORY_MB))
        if request.get("full_tensors") and not built.shape_only
        else None
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(discarded_on_error(stream))
        if not request.get("backward"):
            stack.enter_context(torch.no_grad())
        stack.enter_context(built.forward_context())
        capture = stack.enter_context(
            ModuleCapture(
                built.model,
                full_tensors=bool(request.get("full_tensors")),
                max_tensor_bytes=_limit_bytes(request, "max_tensor_mb", DEFAULT_MAX_TENSOR_MB),
                max_trace_bytes=_limit_bytes(request, "max_trace_mb", DEFAULT_MAX_TRACE_MB),
                # NOTE: not a model spread by a device map: its offload folder goes when this job ends
                retain_calls_bytes=(
                    _limit_bytes(request, "keep_calls_mb", DEFAULT_KEEP_CALLS_MB)
                    if request.get("keep_for_replay") and not built.shape_only and not request.get("device_map")
                    else None
                ),
                stream=stream,
            )
        )
        line_capture = None
        if line_files:
            line_capture = stack.enter_context(
                LineCapture(line_files, capture.summary_cache, capture.pending, capture.call_stack)
            )
        if generate_steps:
            generation = run_generation(
                built.model, built.args, built.kwargs, generate_steps, capture, request, progress
            )
        elif request.get("backward"):
            gradients = run_backward(built, capture, request)
        else:
            built.model(*built.args, **built.kwargs)
    finished_at = time.perf_counter()
    if request.get("device_map"):
        # NOTE: accelerate leaves a model that fits one device whole without hooks (nor, on a CPU-only machine,
        # a device map): its calls ran where their outputs are
        for record in capture.records:
            if record.device is None and record.outputs:
                record.device = record.outputs[0].device
    # NOTE: after the forward, so that the capture's tensor limits favour the activations over the weights
    from modeltrace.worker.placement import onloaded

    # weights accelerate offloaded: fingerprinted for real, then offloaded again; they go to the stream too
    with onloaded(built.model), discarded_on_error(stream):
        builds = record_builds(built.model, constructions, capture._keep_unless_meta if capture.full_tensors else None)
    constructions.clear()
    builds_at = time.perf_counter()
    trace = assemble_trace(
        {
            "class": built.model_class,
            "file": real_path(request["file"]),
            "recipe": real_path(request["recipe"]) if request.get("recipe") else None,
            "config": built.config,
            "inputs": [summary.to_json() for summary in _input_summaries(built)],
            "options": trace_options(request, built, **_placement_options(request, built)),
            "build": _jsonable_notes(built.notes),
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
    if request.get("backward"):
        trace.model["options"]["backward"] = True
    progress("writing the trace")
    # NOTE: not durable here: the zygote's child flushes the trace to disk after answering (`sync_trace`).
    destination = write_captured(trace, capture, Path(request["out"]), durable=False)
    if capture.retained is not None:
        keep_candidate(built, capture.retained, destination)
    return {
        "type": "result",
        "kept_for_replay": capture.retained is not None,
        "trace": str(destination),
        "model_class": built.model_class,
        "modules": len(trace.modules),
        "seconds": time.perf_counter() - started,
    }


def trace_options(request: dict[str, Any], built: BuiltModel, **extra: Any) -> dict[str, Any]:
    """The trace header's `options`: how the model was built and run (what a replay rebuilds it from)."""
    return {
        "seed": int(request.get("seed", 0)),
        "device": request.get("device") or "cpu",
        "dtype": request.get("dtype") or "float32",
        "full_tensors": bool(request.get("full_tensors")),
        "attention": request.get("attention") or "eager",
        "shape_only": built.shape_only,
        "checkpoint": request.get("checkpoint") or None,
        **extra,
    }


def _placement_options(request: dict[str, Any], built: BuiltModel) -> dict[str, Any]:
    """The header's record of a model spread over devices: the map asked for and the one accelerate made."""
    if not request.get("device_map"):
        return {}
    placed = getattr(built.model, "hf_device_map", None) or {}
    return {"device_map": request["device_map"], "placed": {str(name): str(device) for name, device in placed.items()}}


def _limit_bytes(request: dict[str, Any], name: str, default_mb: float) -> int:
    """A size limit of the request in MB (absent or None: the default) as bytes."""
    value = request.get(name)
    megabytes = default_mb if value is None else float(value)
    if not megabytes >= 0:  # also NaN
        raise ModelTraceError(f"{name.replace('_', '-')} must be a number of megabytes >= 0, not {value!r}")
    return int(megabytes * 2**20)


def _jsonable_notes(notes: dict[str, Any]) -> dict[str, Any]:
    """How the model was built (shrink level, input set, shape-only approximations), msgpack-safe."""
    return {str(key): (dict(value) if isinstance(value, dict) else value) for key, value in notes.items()}


def _input_summaries(built: BuiltModel) -> list:
    named = [(f"args.{position}", value) for position, value in enumerate(built.args)] + list(built.kwargs.items())
    return [summarize(tensor, key) for name, value in named for key, tensor in iter_tensor_leaves(value, name)]


def describe_failure(error: BaseException, request: dict[str, Any]) -> dict[str, Any]:
    """The `error` frame for an exception: type, message, and the file/line inside the user's code."""
    roots = [str(Path(request[name]).resolve().parent) for name in ("file", "recipe") if request.get(name)]
    file, line = None, None
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
    return {
        "type": "error",
        "error": {
            "type": "ModelTraceError" if isinstance(error, ModelTraceError) else type(error).__name__,
            "message": str(error),
            "file": file,
            "line": line,
            "model_class": request.get("model_class"),
            "advice": request.get("advice"),
            "traceback": "".join(traceback.format_exception(error)),
        },
    }


def flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
