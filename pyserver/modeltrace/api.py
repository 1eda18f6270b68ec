"""ModelTrace as a library, for scripts and notebooks: capture a forward pass in the caller's own process, load a
trace, diff two traces.

    import modeltrace

    with modeltrace.capture(model, "ref.mtrace", full_tensors=True) as session:
        model(**inputs)
    trace = modeltrace.load("ref.mtrace")            # shows itself as HTML in Jupyter
    result = modeltrace.diff("ref.mtrace", "port.mtrace", replay=False)
    result.match, result.first_divergence            # the data of `modeltrace diff --format json`

`capture` uses the worker's capture engine (`ModuleCapture`, `LineCapture`, `record_builds`) and writes with
the worker's own assembly (`worker/assemble.py`): the `.mtrace` is the one the CLI writes, with the same
overheads, and only torch is needed (transformers when the model is a transformers model). Every forward pass
run inside the block, nested or repeated, is recorded: a second call of the model is the root's call 1. Any
nn.Module works (a model defined in a notebook cell too: `lines` needs a source file, the rest does not).
`diff` is `modeltrace diff` (`diff_view.py`: `diff.diff_paths`, `diff.to_json`): no second code path for
the numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeltrace.diff_view import DiffView, diff
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import Trace
from modeltrace.worker.protocol import DEFAULT_MAX_TENSOR_MB, DEFAULT_MAX_TRACE_MB, DEFAULT_TENSOR_MEMORY_MB


# NOTE: the library's diff lives in `diff_view.py`, below this module and the `diff` package both (the package
# answers `modeltrace.diff(...)` too, once imported); offered here with the rest of the library
__all__ = ["CaptureSession", "DiffView", "TraceView", "capture", "diff", "load"]


@dataclass
class CaptureSession:
    """What `capture` yields: after the block, `path` is the trace folder written and `trace` the trace."""

    path: Path
    trace: Trace | None = None

    def load(self) -> TraceView:
        if self.trace is None:
            raise ModelTraceError(f"{self.path}: the capture has not finished (use it after the `with` block)")
        return TraceView(self.trace, self.path)


@contextlib.contextmanager
def capture(
    model: Any,
    path: str | Path,
    *,
    full_tensors: bool = False,
    lines: bool = False,
    files: list[str | Path] | None = None,
    max_tensor_mb: float = DEFAULT_MAX_TENSOR_MB,
    max_trace_mb: float = DEFAULT_MAX_TRACE_MB,
    tensor_memory_mb: float = DEFAULT_TENSOR_MEMORY_MB,
    parameters: bool = True,
) -> Iterator[CaptureSession]:
    """Record every module call of `model` run inside the block, then write the trace folder `path`.

    `full_tensors` keeps each tensor (within `max_tensor_mb` per tensor and `max_trace_mb` in all, as the CLI),
    written to disk while the block runs, with at most `tensor_memory_mb` of them waiting in memory;
    `lines` records the tensors each line assigns in the model class's source file and in `files`. An exception
    inside the block still writes what was recorded until then, marked `incomplete` in the header, and then
    propagates unchanged. The folder is written atomically (a trace already there is replaced only by a whole
    one), and flushed to the disk when the interpreter exits (`storage.sync_later`).

    With `full_tensors`, the model's parameters go to the shared parameter store (`trace/parameter_store.py`),
    written once per content and referred to by every trace of the same weights; `parameters=False` leaves
    them out (the activations alone). What does not depend on the forward (source files, config, construction
    records, the parameters' digest) is worked out at the first capture of a model and reused while it is
    unchanged (`worker/reuse.py`)."""
    from torch import nn

    from modeltrace.trace.storage import sync_later
    from modeltrace.worker.assemble import assemble_trace, discarded_on_error, start_stream, write_captured
    from modeltrace.worker.capture import ModuleCapture
    from modeltrace.worker.lines import LineCapture
    from modeltrace.worker.reuse import model_facts
    from modeltrace.worker.reuse import model_files as model_files_of
    from modeltrace.worker.source_map import real_path

    if not isinstance(model, nn.Module):
        raise ModelTraceError(f"modeltrace.capture: expected a torch.nn.Module, got {type(model).__name__}")
    for name, value in (
        ("max_tensor_mb", max_tensor_mb),
        ("max_trace_mb", max_trace_mb),
        ("tensor_memory_mb", tensor_memory_mb),
    ):
        if not (isinstance(value, (int, float)) and value >= 0):
            raise ModelTraceError(f"modeltrace.capture: {name} must be a number of megabytes >= 0, not {value!r}")
    if not isinstance(parameters, bool):
        raise ModelTraceError(f"modeltrace.capture: parameters must be True or False, not {parameters!r}")
    destination = Path(path).absolute()
    if destination.exists() and not destination.is_dir():
        raise ModelTraceError(f"{destination}: exists and is not a folder; give a NAME.mtrace folder to write")
    # NOTE: the model's files are needed before the forward only to record lines; the header's `file` comes from
    # the facts worked out after it (one walk of the modules fewer on a tiny model's 2 ms forward)
    model_files = model_files_of(list(model.modules())) if lines else []
    line_files = model_files + [str(Path(item).resolve()) for item in files or []]
    if lines and not line_files:
        raise ModelTraceError(
            f"modeltrace.capture: lines=True, but {type(model).__name__} has no source file "
            "to record lines of; pass files=[...]"
        )
    session = CaptureSession(destination)
    failure: BaseException | None = None
    # NOTE: full tensors stream into the trace's temporary folder while the block runs (`worker/tensor_stream.py`)
    stream = start_stream(destination, int(tensor_memory_mb * 2**20)) if full_tensors else None
    with contextlib.ExitStack() as stack:
        stack.enter_context(discarded_on_error(stream))
        module_capture = stack.enter_context(
            ModuleCapture(
                model,
                full_tensors=full_tensors,
                max_tensor_bytes=int(max_tensor_mb * 2**20),
                max_trace_bytes=int(max_trace_mb * 2**20),
                stream=stream,
            )
        )
        line_capture = None
        if lines:
            line_capture = stack.enter_context(
                LineCapture(
                    line_files,
                    module_capture.summary_cache,
                    module_capture.pending,
                    module_capture.call_stack,
                    keep=module_capture.keep_line_value if full_tensors else None,
                )
            )
        try:
            yield session
        except BaseException as error:  # noqa: BLE001 - written down, then raised again unchanged
            failure = error
    # NOTE: after the block (a training step inside it changes the weights): what does not depend on the forward
    # is reused from an earlier capture of this model when its change check is equal (`worker/reuse.py`)
    with discarded_on_error(stream):
        facts = model_facts(model)
        builds, stored = _builds(model, facts, full_tensors and parameters, int(max_tensor_mb * 2**20))
    first_parameter = next(model.parameters(), None)
    config = getattr(model, "config", None)
    root_inputs = module_capture.records[0].inputs if module_capture.records else []
    header = {
        "class": type(model).__name__,
        "file": real_path(facts.files[0]) if facts.files else None,
        "recipe": None,
        "config": facts.config,
        "inputs": [summary.to_json() for summary in root_inputs],
        "options": {
            "device": str(first_parameter.device) if first_parameter is not None else "cpu",
            "dtype": str(first_parameter.dtype).removeprefix("torch.") if first_parameter is not None else None,
            "full_tensors": full_tensors,
            "attention": getattr(config, "_attn_implementation", None),
            "shape_only": False,
            "checkpoint": None,
            **({"parameters": parameters} if full_tensors else {}),
        },
        "build": {"source": "library: modeltrace.capture"},
        "seconds": {},
        **({"parameters": stored} if stored is not None else {}),
    }
    if failure is not None:
        # NOTE: what ran before the exception is often what the user needs to see: kept, and said to be partial
        header["incomplete"] = f"{type(failure).__name__}: {failure}"
    trace = assemble_trace(header, module_capture, line_capture, builds)
    trace.builds_json = facts.builds_json(builds, stored)
    # NOTE: flushed to the disk once, at exit, after the rename (`storage.sync_later`): the caller does not wait
    # for the disk
    session.path = write_captured(trace, module_capture, destination, durable=False)
    sync_later(session.path)
    session.trace = trace
    if failure is not None:
        raise failure


def _builds(
    model: Any, facts: Any, store_parameters_too: bool, max_tensor_bytes: int
) -> tuple[list, dict[str, Any] | None]:
    """The model's construction records (reused while the model is unchanged) and, with full tensors, its
    parameters' reference in the shared store (`worker/parameter_store.py`: written there once per content)."""
    from modeltrace.worker.builds import record_builds
    from modeltrace.worker.parameter_store import store_parameters

    key = (store_parameters_too, max_tensor_bytes if store_parameters_too else None)
    builds = facts.builds.get(key)
    if builds is None:
        builds = facts.builds[key] = record_builds(model)
    # NOTE: asked of the store every time (its digest reused, its file checked by a stat): a store file deleted
    # or damaged since the last capture is written again
    stored = store_parameters(model, builds, max_tensor_bytes) if store_parameters_too else None
    return builds, stored


@dataclass
class TraceView:
    """A loaded trace: `trace` (records), `to_json()` (the `modeltrace.trace/1` document), and in Jupyter the
    annotated source of the traced lines."""

    trace: Trace
    path: Path

    @property
    def modules(self) -> list:
        return self.trace.modules

    @property
    def lines(self) -> list:
        return self.trace.lines

    def to_json(self) -> dict[str, Any]:
        return self.trace.to_json()

    def __repr__(self) -> str:
        return (
            f"<modeltrace trace of {self.trace.model.get('class', '?')}: {len(self.trace.modules)} module "
            f"calls, {len(self.trace.lines)} line records, {self.path}>"
        )

    def _repr_html_(self) -> str:
        from modeltrace.trace.html import trace_html

        return trace_html(self.trace, self.path)


def load(path: str | Path) -> TraceView:
    """Read a trace folder (`.mtrace`)."""
    from modeltrace.trace.storage import read_trace

    return TraceView(read_trace(path), Path(path))
