"""`load_reference`: open anything accepted where a trace is, with access to its full tensors.

Accepted: a `NAME.mtrace/` folder (or its `trace.msgpack`), with `tensors.safetensors` when it was traced with
`--full-tensors` (and its parameters from the shared store, `parameter_store.py`, when it refers to them); a transformers `model_addition_debugger_context` output (its folder, `*_SUMMARY.json` or
`*_FULL_TENSORS.json`, repr values or per-tensor safetensors files). No torch import (the language server
calls this for "Load Reference Trace…"); every problem is a `TraceFormatError` naming the file.
"""

from __future__ import annotations

from pathlib import Path

from modeltrace.errors import TraceFormatError
from modeltrace.trace.hf_debugger import is_debugger_file, read_debugger_output
from modeltrace.trace.parameter_store import parameters_file, parameters_note
from modeltrace.trace.records import TensorSummary, Trace
from modeltrace.trace.storage import TENSORS_FILE, TRACE_FILE, read_trace, require_readable, tensors_path
from modeltrace.trace.tensors import LoadedTrace, SafetensorsStore, shard_paths


def load_trace_folder(path: Path | str) -> LoadedTrace:
    """A ModelTrace trace folder with its tensors file (validated header, memory-mapped) when present."""
    path = Path(path)
    folder = path.parent if path.name == TRACE_FILE else path
    trace = read_trace(path)
    tensors_file = tensors_path(folder)
    # NOTE: the parameters live in the shared store (`parameter_store.py`): a missing or damaged store file
    # costs the parameters only, said in a note, never the activations
    parameters_problem = parameters_note(trace, folder)
    stored_parameters = parameters_file(trace) if parameters_problem is None else None
    files = ([tensors_file, *shard_paths(folder)[1:]] if tensors_file is not None else []) + (
        [stored_parameters] if stored_parameters is not None else []
    )
    store = SafetensorsStore(*files) if files else None
    if store is not None:
        missing = [
            summary.tensor
            for record in trace.modules
            for summary in (*record.inputs, *record.outputs)
            if summary.tensor is not None and summary.tensor not in store
        ]
        if missing:
            store.close()
            raise TraceFormatError(
                f"{tensors_file or folder}: lacks {len(missing)} tensor(s) the trace names (first: {missing[0]!r}); "
                "the trace folder is incomplete"
            )
    notes = [parameters_problem] if parameters_problem else []
    if tensors_file is None and any(summary.tensor for record in trace.modules for summary in record.outputs):
        notes.append(
            f"{folder.name}: its records name full tensors but the folder holds no {TENSORS_FILE}; "
            "comparing statistics only"
        )
    not_stored = [
        summary
        for record in trace.modules
        for summary in (*record.inputs, *record.outputs)
        if summary.not_stored is not None
    ]
    if not_stored:
        notes.append(_not_stored_note(folder, trace, not_stored))
    return LoadedTrace(trace=trace, tensors=store, path=folder, kind="modeltrace", notes=notes)


# NOTE: the module paths a note names before "and N more": enough to find where a limit started cutting.
NOTE_MODULES_SHOWN = 8


def _not_stored_note(folder: Path, trace: Trace, not_stored: list[TensorSummary]) -> str:
    """Which module calls have outputs that were not stored in full (a size limit, a tensor changed in place
    unseen), so are compared by statistics only, and why (the first reason)."""
    calls = [record for record in trace.modules if any(summary.not_stored for summary in record.outputs)]
    names = [(record.path or "(root)") + (f"#{record.call_index}" if record.call_index else "") for record in calls]
    shown = ", ".join(names[:NOTE_MODULES_SHOWN]) + (
        f" and {len(names) - NOTE_MODULES_SHOWN} more" if len(names) > NOTE_MODULES_SHOWN else ""
    )
    modules = (
        f"; the outputs of {len(names)} module call(s) are compared by statistics only: {shown}"
        if names
        else ("; they are compared by statistics only")
    )
    return (
        f"{folder.name}: {len(not_stored)} tensor(s) were not stored in full (first: {not_stored[0].not_stored})"
        + modules
    )


def load_reference(path: Path | str) -> LoadedTrace:
    """Open a trace or a transformers debugger output; see the module docstring for what is accepted."""
    path = Path(path).absolute()
    require_readable(path, "no such trace or debugger output")
    if path.is_dir():
        if (path / TRACE_FILE).exists():
            return load_trace_folder(path)
        return read_debugger_output(path)
    if path.name == TRACE_FILE:
        return load_trace_folder(path)
    if is_debugger_file(path) or path.suffix == ".json":
        return read_debugger_output(path)
    raise TraceFormatError(
        f"{path}: not a trace (a NAME.mtrace folder) nor a transformers debugger output (*_SUMMARY.json, "
        "*_FULL_TENSORS.json or their folder)"
    )
