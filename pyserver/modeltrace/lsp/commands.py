"""`workspace/executeCommand`: trace a document through the worker (and again on save, with `traceOnSave`), clear
its session, load a trace from disk, set or pin the reference trace it is compared with.

A trace runs in a thread (the worker call blocks) under `$/progress` work-done progress; cancelling the
progress stops the worker. On success the trace is read back, indexed and the client asked to redraw hints
and lenses; on failure the user gets a diagnostic at the failing line and one message, never a traceback.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from modeltrace.errors import ModelTraceError, TraceFailed, TraceFormatError
from modeltrace.lsp.classes import base_model_name
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.diagnostics import DIAGNOSTIC_SOURCE, editor_wording, publish_failure, show_trace_diagnostics
from modeltrace.lsp.loading import load_trace, load_trace_here, release_free_heap, run_load, settle_memory
from modeltrace.lsp.modular import generated_classes
from modeltrace.lsp.publish import ServerState, notify_status, withdraw
from modeltrace.lsp.reference import forget_diff, load_checked_reference, update_diff, workspace_path
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.session import DocumentDiff, DocumentSession, LastRequest, Located
from modeltrace.lsp.store import DocumentTrace
from modeltrace.modular.regenerate import find_checkout, no_checkout_message, regenerate_copy
from modeltrace.modular.twins import is_modular_file, resolve_generated
from modeltrace.trace.relocate import AT_RECORDED_PATH, SourceMatch
from modeltrace.trace.storage import TRACE_SUFFIX, tensors_paths
from modeltrace.worker.client import WorkerClient
from modeltrace.worker import messages


logger = logging.getLogger(__name__)

UNTRUSTED_MESSAGE = "ModelTrace: tracing runs this workspace's model code; trust the workspace to enable it"


def trace_path_for(ls: ModelTraceServer, path: str) -> Path:
    """One trace folder per source file in the trace directory, replaced by each new trace of that file."""
    digest = hashlib.sha256(path.encode("utf-8")).hexdigest()[:16]
    return ls.settings.trace_directory / f"{Path(path).stem}-{digest}{TRACE_SUFFIX}"


def _refuse(ls: ModelTraceServer, message: str, kind: types.MessageType = types.MessageType.Error) -> dict[str, Any]:
    ls.show_message(message, kind)
    return {"ok": False, "message": message}


class _Refused(Exception):
    """A command that cannot run as asked; the message is shown to the user as it is."""


# What each kind of trace is called in progress and status messages.
TRACE_MODES = {"forward": "forward", "generate": "generate", "backward": "forward + backward"}


def _traceable_path(ls: ModelTraceServer, uri: Any) -> str:
    """The file to trace for a command's URI argument."""
    if not isinstance(uri, str) or not uri:
        raise _Refused("ModelTrace: modelTrace.trace needs the URI of a Python document")
    if not uri.startswith("file:"):
        raise _Refused(f"ModelTrace: {uri} is not a file on disk; save it as a .py file to trace it")
    path = ls.document_path(uri)
    if path is None:
        raise _Refused(f"ModelTrace: {ls.uri_to_path(uri)} is not a Python file; only Python model code can be traced")
    if not Path(path).is_file():
        raise _Refused(f"ModelTrace: {path}: no such file on disk; save it first")
    return path


async def trace_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.trace [uri, model class?, class to highlight?]`: trace and show the result."""
    return await _trace_command(ls, "forward", *arguments)


async def trace_generate_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.traceGenerate [uri, model class?]`: trace greedy generation (`modelTrace.generateSteps` decode
    steps after the prefill, with the model's cache)."""
    return await _trace_command(ls, "generate", *arguments)


async def trace_backward_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.traceBackward [uri, model class?]`: trace the forward pass, a loss and its backward pass."""
    return await _trace_command(ls, "backward", *arguments)


async def _trace_command(ls: ModelTraceServer, mode: str, *arguments: Any) -> dict[str, Any]:
    target = _trace_target(ls, arguments)
    if isinstance(target, dict):
        return target
    uri, path, model = target
    return await run_trace(ls, uri, path, model, mode)


def _trace_target(ls: ModelTraceServer, arguments: tuple[Any, ...]) -> tuple[str, str, str | None] | dict[str, Any]:
    """The (document URI, file path, model class or None) a trace command's `[uri, class?]` arguments name, or the
    answer refusing it: an untrusted workspace runs no workspace code, and only a file on disk can be traced."""
    if not ls.workspace_trusted:
        return _refuse(ls, UNTRUSTED_MESSAGE, types.MessageType.Warning)
    uri = arguments[0] if arguments else None
    try:
        path = _traceable_path(ls, uri)
    except _Refused as refusal:
        return _refuse(ls, str(refusal))
    model = arguments[1] if len(arguments) > 1 and isinstance(arguments[1], str) and arguments[1] else None
    return str(uri), path, model


async def run_trace(
    ls: ModelTraceServer, uri: str, path: str, model: str | None, mode: str = "forward", full_tensors: bool = False
) -> dict[str, Any]:
    """Trace `path` (one trace at a time: the worker runs one) and install the result; `mode` "forward",
    "generate" or "backward"; `full_tensors` keeps every tensor even without a reference (to pin it)."""
    session = ls.sessions.open(path, uri)
    session.last_request = LastRequest(uri=uri, model=model, mode=mode)
    session.waiting = True
    async with ls.trace_lock:
        session.waiting = False
        return await _trace_now(ls, uri, path, model, mode, full_tensors)


class _Cancellation:
    """Bridges a client's progress cancel (event loop) and the worker call (its own thread)."""

    def __init__(self, worker: WorkerClient) -> None:
        self.worker = worker
        self.requested = threading.Event()

    def cancel(self) -> None:
        self.requested.set()
        self.worker.cancel()

    def check(self) -> None:
        # NOTE: a cancel that arrives while the worker is still importing torch is lost by the worker;
        # repeating it at the first progress message of the trace stops the trace there.
        if self.requested.is_set():
            self.worker.cancel()


def _cancel_with_the_request(ls: ModelTraceServer, cancellation: _Cancellation) -> None:
    """Stop the trace when the client cancels the request that asked for it (`$/cancelRequest`).

    NOTE: pygls runs a command inside its `workspace/executeCommand` handler and, on `$/cancelRequest`, cancels
    only the future it answers the client with: the command itself ran on, and the worker with it (the request
    was answered "canceled" at once, and the next trace waited for this one). The progress bar's cancel and this
    one now stop the worker the same way.
    """
    answer = ls.protocol._request_futures.get(ls.protocol.msg_id)  # NOTE: pygls keeps no public handle on it
    if answer is not None:
        answer.add_done_callback(lambda future: cancellation.cancel() if future.cancelled() else None)


async def _begin_progress(ls: ModelTraceServer, message: str, cancellation: _Cancellation) -> str | None:
    """Create and begin a work-done progress when the client supports it; its token, or None."""
    window = ls.client_capabilities.window
    if window is None or not window.work_done_progress:
        return None
    token = f"modeltrace-{uuid.uuid4()}"
    try:
        await ls.work_done_progress.create_async(token)
    except Exception as error:  # noqa: BLE001 - the trace runs with or without a progress bar
        logger.warning("the client refused a progress token: %s", error)
        return None
    ls.work_done_progress.tokens[token].add_done_callback(
        lambda future: cancellation.cancel() if future.cancelled() else None
    )
    ls.work_done_progress.begin(
        token, types.WorkDoneProgressBegin(title="ModelTrace", message=message, cancellable=True)
    )
    return token


def _end_progress(ls: ModelTraceServer, token: str | None, message: str) -> None:
    if token is None:
        return
    ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
    ls.work_done_progress.tokens.pop(token, None)


def _request(
    ls: ModelTraceServer, path: str, model: str | None, mode: str = "forward", full_tensors: bool = False
) -> messages.TraceRequest:
    settings = ls.settings
    return messages.TraceRequest(
        file=path,
        out=str(trace_path_for(ls, path)),
        model=model,
        generate=settings.generate_steps if mode == "generate" else 0,
        backward=mode == "backward",
        shape_only=settings.shape_only,
        checkpoint=settings.checkpoint,
        recipe=workspace_path(ls, settings.recipe) if settings.recipe else None,
        config=workspace_path(ls, settings.config) if settings.config else None,
        device_map=settings.device_map,
        # NOTE: with a reference, full tensors make the diff compare every value, not only statistics.
        full_tensors=(full_tensors or path in ls.references) and not settings.shape_only,
        # NOTE: the diff against that reference follows, and its replay runs on the model this trace keeps alive
        keep_for_replay=path in ls.references and settings.diff_replay and not settings.shape_only,
        max_tensor_mb=settings.max_tensor_mb,
        max_trace_mb=settings.max_trace_mb,
        tensor_memory_mb=settings.tensor_memory_mb,
        lines=settings.lines,
        # NOTE: a relative path is the workspace's; the traced file itself is captured already
        follow=tuple(
            followed for followed in (workspace_path(ls, text) for text in settings.follow) if followed != path
        ),
        attention=settings.attention,
        device=settings.device,
        dtype=settings.dtype,
        timeout=settings.timeout,
    )


def _model_to_build(ls: ModelTraceServer, uri: str, path: str, model: str | None) -> str:
    """What the progress says is being traced: the class asked for, else the file's base model."""
    if model:
        return model
    return base_model_name(generated_classes(ls, uri) or ls.document_classes(uri)) or Path(path).name


async def _trace_now(
    ls: ModelTraceServer, uri: str, path: str, model: str | None, mode: str = "forward", full_tensors: bool = False
) -> dict[str, Any]:
    if not ls.workspace_trusted:
        # NOTE: checked again here: trust can be withdrawn while a trace waited for the one before it
        # (trace-on-save queues behind a running trace).
        return _refuse(ls, UNTRUSTED_MESSAGE, types.MessageType.Warning)
    if is_modular_file(path):
        # NOTE: a modular file runs as its generated twin; without a usable one no worker needs to start
        try:
            resolve_generated(path)
        except ModelTraceError as error:
            return _fail(ls, uri, None, f"ModelTrace: {error}")
    name = _model_to_build(ls, uri, path, model)
    if mode != "forward":
        name += f" ({TRACE_MODES[mode]})"
    loop = asyncio.get_running_loop()
    worker = ls.worker()
    cancellation = _Cancellation(worker)
    _cancel_with_the_request(ls, cancellation)
    token = await _begin_progress(ls, f"tracing {name}", cancellation)
    notify_status(ls, ServerState.TRACING, f"tracing {name}", uri)

    def on_progress(text: str) -> None:
        cancellation.check()
        if token is not None:
            loop.call_soon_threadsafe(ls.work_done_progress.report, token, types.WorkDoneProgressReport(message=text))

    try:
        result = await asyncio.to_thread(worker.trace, _request(ls, path, model, mode, full_tensors), on_progress)
        loaded = await run_load(result.trace, load_trace, path, uri, result.trace)
    except TraceFailed as failure:
        return _report_failure(ls, uri, path, failure, token, cancellation.requested.is_set(), worker.python)
    except TraceFormatError as error:
        return _fail(ls, uri, token, f"ModelTrace: {error}")
    except OSError as error:
        return _fail(ls, uri, token, f"ModelTrace: cannot run the trace worker with {worker.python}: {error}")
    except Exception as error:  # noqa: BLE001 - whatever breaks, the progress ends and the server goes on
        logger.exception("tracing %s failed inside ModelTrace", path)
        return _fail(ls, uri, token, f"ModelTrace: internal error while tracing ({type(error).__name__}: {error})")
    # NOTE: a clear while this trace ran closed the session it was asked from; the trace opens a new one.
    session = ls.sessions.open(path, uri)
    install(ls, session, loaded, [])
    summary = (
        f"{loaded.model_class}: {loaded.call_count} module calls on "
        f"{sum(len(hints.by_trace_line) for hints in loaded.files.values())} lines ({result.seconds:.1f} s)"
    )
    # NOTE: still under the trace lock: the next trace cannot overwrite this trace folder while it is compared.
    diff = await update_diff(ls, session)
    if diff is not None:
        summary += "; matches the reference" if diff.matched else "; differs from the reference"
    _end_progress(ls, token, summary)
    notify_status(ls, ServerState.IDLE, summary, uri)
    return {
        "ok": True,
        "trace": result.trace,
        "modelClass": loaded.model_class,
        "modules": loaded.call_count,
        "seconds": result.seconds,
        **({"diff": _diff_summary(diff)} if diff is not None else {}),
    }


def _diff_summary(diff: DocumentDiff) -> dict[str, Any]:
    return {
        "reference": diff.reference,
        "match": diff.matched,
        "firstDivergence": diff.divergence,
        "notes": list(diff.notes),
    }


def _fail(ls: ModelTraceServer, uri: str, token: str | None, message: str) -> dict[str, Any]:
    _end_progress(ls, token, "failed")
    notify_status(ls, ServerState.ERROR, message, uri)
    return _refuse(ls, message)


def _worker_start_message(error: messages.WorkerError, python: str) -> str | None:
    """A message naming the interpreter when the worker could not start at all (no torch, no packages)."""
    advice = "set modelTrace.python to a Python environment with torch and transformers"
    if error.cause == "import":
        return f"ModelTrace: the worker cannot import torch in {python} ({error.detail}); {advice}"
    if error.cause == "start":
        # NOTE: `detail` is the worker's last line of output: the reason it did not start
        return f"ModelTrace: the trace worker did not start with {python} ({error.detail or 'no output'}); {advice}"
    return None


def _report_failure(
    ls: ModelTraceServer,
    uri: str,
    path: str,
    failure: TraceFailed,
    token: str | None,
    cancelled: bool,
    python: str,
) -> dict[str, Any]:
    error = failure.error
    if cancelled or error.cause == "cancelled":
        _end_progress(ls, token, "cancelled")
        notify_status(ls, ServerState.IDLE, "trace cancelled", uri)
        return {"ok": False, "message": "ModelTrace: trace cancelled", "cancelled": True}
    if error.traceback:
        ls.log(f"trace of {path} failed:\n{error.traceback}", types.MessageType.Log)
    publish_failure(ls, path, error)
    # NOTE: the cause as data (`WorkerError.cause`), for clients that act on it rather than on the message
    message = _worker_start_message(error, python) or f"ModelTrace: {editor_wording(str(failure))}"
    return {**_fail(ls, uri, token, message), "cause": error.cause}


def install(ls: ModelTraceServer, session: DocumentSession, loaded: DocumentTrace, notes: list[Located]) -> None:
    """Show a new trace of the session's document: its files' hints follow the open documents' current text, the
    previous trace's failure and notes give way to this one's `notes`, then clients redraw. (Its diff is the
    caller's: `update_diff` replaces or takes back the previous one.)"""
    ls.sessions.install(session, loaded)
    show_trace_diagnostics(ls, session, notes)
    for path, hints in loaded.files.items():
        document = ls.open_document(path)
        if document is not None:
            hints.follow(split_lines(document.source))
    settle_memory(loaded)
    ls.refresh_views()


async def clear_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.clear [uri]`: forget the session of the document whose trace it shows (or its own) at once: the
    trace and its hints, the failure, the reference and its diff (gutters, divergence), the notes, the last request
    (trace-on-save no longer repeats it)."""
    uri = arguments[0] if arguments else None
    path = ls.document_path(uri) if isinstance(uri, str) else None
    if path is None:
        return {"ok": False, "message": "ModelTrace: modelTrace.clear needs the URI of a Python document"}
    session = ls.sessions.close(ls.sessions.owner_of(path))
    if session is not None:
        withdraw(ls, session)
    else:
        ls.refresh_views()
    notify_status(ls, ServerState.IDLE, "trace cleared", uri)
    return {"ok": True}


async def load_trace_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.loadTrace [uri, trace folder]`: show an existing trace (from the CLI, CI, a script's
    `modeltrace.capture`, a colleague).

    The trace's source files are looked for here (`trace.relocate`: by content hash, then by path and name), so
    a trace captured in another folder or on another machine shows its hints on this workspace's copies; a file
    that changed since the capture gets a note (an Information diagnostic), and the trace is marked stale. The
    result lists where each recorded file was found (`files`). Reading a trace runs no code, so this works in
    untrusted workspaces too.
    """
    if len(arguments) != 2 or not all(isinstance(argument, str) for argument in arguments):
        return _refuse(ls, "ModelTrace: modelTrace.loadTrace needs a document URI and the path of a .mtrace folder")
    uri, text = arguments
    path = ls.uri_to_path(uri)
    if path is None:
        return _refuse(ls, f"ModelTrace: {uri} is not a file on disk")
    trace_path = workspace_path(ls, text)
    roots = [to_fs_path(folder.uri) for folder in ls.workspace.folders.values()] + [str(Path(path).parent)]
    open_texts = {
        document_path: document.source
        for document_uri, document in list(ls.workspace.text_documents.items())
        if (document_path := ls.uri_to_path(document_uri)) is not None
    }
    try:
        loaded, matches = await run_load(
            trace_path, load_trace_here, path, uri, trace_path, [root for root in roots if root], open_texts
        )
    except TraceFormatError as error:
        # NOTE: what the refused load had read is garbage now; its pages go back to the system
        release_free_heap()
        return _refuse(ls, f"ModelTrace: {error}")
    session = ls.sessions.open(path, uri)
    shown = [match for match in matches if match.found in loaded.files]
    install(ls, session, loaded, [_changed_note(ls, trace_path, match) for match in shown if match.changed])
    # NOTE: the diff on view was of the trace this one replaces; a loaded trace is compared at its next trace.
    forget_diff(ls, session)
    message = _load_message(trace_path, loaded, shown)
    if message is not None:
        ls.show_message(
            message, types.MessageType.Warning if loaded.stale or loaded.parameters_note else types.MessageType.Info
        )
    notify_status(
        ls, ServerState.STALE if loaded.stale else ServerState.IDLE, f"{loaded.model_class}: loaded {trace_path}", uri
    )
    return {
        "ok": True,
        "modelClass": loaded.model_class,
        "modules": loaded.call_count,
        "files": [match.to_json() for match in matches],
        "modelFile": _found_model_file(loaded, matches),
        **({"parameters": loaded.parameters_note} if loaded.parameters_note else {}),
    }


def _found_model_file(loaded: DocumentTrace, matches: list[SourceMatch]) -> str | None:
    """The traced model's file here (relocated with the records), when it was found."""
    model_file = loaded.trace.model.get("file")
    found = {match.found for match in matches if match.found is not None}
    return model_file if isinstance(model_file, str) and model_file in found else None


def _changed_note(ls: ModelTraceServer, trace_path: str, match: SourceMatch) -> Located:
    """An Information diagnostic on the first line of a file that differs from the one the trace captured."""
    document = ls.open_document(str(match.found))
    uri = document.uri if document is not None else from_fs_path(str(match.found))
    recorded = "" if match.recorded == match.found else f" (recorded as {match.recorded})"
    return uri, types.Diagnostic(
        range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)),
        message=(
            f"This file changed since {Path(trace_path).name} was captured{recorded}: its hints sit on the "
            "lines the trace recorded, which edits may have moved. Trace it again for exact hints."
        ),
        severity=types.DiagnosticSeverity.Information,
        source=DIAGNOSTIC_SOURCE,
    )


def _load_message(trace_path: str, loaded: DocumentTrace, shown: list[SourceMatch]) -> str | None:
    """What the user is told after a load when its files were not simply where the trace recorded them."""
    moved = [match for match in shown if match.how != AT_RECORDED_PATH]
    changed = [match for match in shown if match.changed]
    if not moved and not changed and not loaded.parameters_note:
        return None
    parts = [f"ModelTrace: loaded {Path(trace_path).name} ({loaded.model_class})"]
    if loaded.parameters_note:
        parts.append(loaded.parameters_note)
    if moved:
        parts.append("found " + ", ".join(f"{Path(match.recorded).name} here by {match.how}" for match in moved))
    if changed:
        parts.append(
            f"{', '.join(Path(str(match.found)).name for match in changed)} changed since the capture: "
            "hints may be off by the lines edited since (marked stale)"
        )
    return "; ".join(parts)


async def set_reference_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.setReference [uri, path]`: compare the document's traces with a trace or debugger output.

    Reading a reference runs no code, so this works in untrusted workspaces too. A bad path changes nothing.
    """
    if len(arguments) != 2 or not all(isinstance(argument, str) and argument for argument in arguments):
        return _refuse(
            ls,
            "ModelTrace: modelTrace.setReference needs a document URI and the path of a reference "
            "trace (a .mtrace folder or a transformers debugger output)",
        )
    uri, text = arguments
    path = ls.uri_to_path(uri)
    if path is None:
        return _refuse(ls, f"ModelTrace: {uri} is not a file on disk")
    reference = workspace_path(ls, text)
    try:
        await run_load(reference, load_checked_reference, reference)
    except (TraceFormatError, OSError) as error:
        release_free_heap()
        return _refuse(ls, f"ModelTrace: cannot use {reference} as a reference: {error}")
    return await _use_reference(ls, uri, ls.sessions.owner_of(path), reference)


async def _use_reference(ls: ModelTraceServer, uri: str, owner: str, reference: str) -> dict[str, Any]:
    session = ls.sessions.open(owner, uri)
    session.reference = reference
    diff = None
    async with ls.trace_lock:
        # NOTE: under the lock, so that no trace replaces the trace folder while it is compared.
        if session.trace is not None:
            diff = await update_diff(ls, session)
    notify_status(ls, ServerState.IDLE, f"reference: {reference}", uri)
    return {"ok": True, "reference": reference, "diff": _diff_summary(diff) if diff is not None else None}


def pinned_path_for(ls: ModelTraceServer, path: str) -> Path:
    """Where a document's pinned reference is kept: next to its trace, never overwritten by a trace."""
    trace_path = trace_path_for(ls, path)
    return trace_path.with_name(f"{trace_path.name.removesuffix(TRACE_SUFFIX)}-reference{TRACE_SUFFIX}")


def _copy_trace(source: str, destination: Path) -> None:
    shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(source, destination)


# NOTE: what a statistics-only reference means for the user, said wherever such a reference is pinned
STATISTICS_ONLY = (
    "a statistics-only reference: the diff compares each call's shape, mean, std, min and max, not every value, "
    "so a small difference can pass unseen and the first divergence is placed less precisely"
)


def _tensors_held(loaded: DocumentTrace) -> tuple[str, str | None]:
    """What a trace holds for a diff: "full" (every tensor), "partial" (some not stored: over a size limit) or
    "statistics" (no tensors); and, when not full, why."""
    options = loaded.trace.model.get("options") or {}
    if options.get("shape_only"):
        return "statistics", "the trace is shape-only (modelTrace.shapeOnly or a checkpoint on the meta device)"
    if not tensors_paths(Path(loaded.trace_path)):
        return "statistics", "the trace kept no full tensors"
    skipped = loaded.trace.model.get("tensors_not_stored")
    if skipped:
        return "partial", f"{skipped} tensor(s) were over modelTrace.maxTensorMB / modelTrace.maxTraceMB"
    return "full", None


def _why_not_retraced(ls: ModelTraceServer, loaded: DocumentTrace) -> str | None:
    """Why the document cannot be traced again with full tensors before pinning, or None when it can."""
    if not ls.workspace_trusted:
        return "the workspace is not trusted, so it cannot be traced again with full tensors"
    if ls.settings.shape_only or (loaded.trace.model.get("options") or {}).get("shape_only"):
        return "shape-only traces keep no values (modelTrace.shapeOnly or a checkpoint on the meta device)"
    if not Path(loaded.owner).is_file():
        return f"{loaded.owner} is not on disk to trace again"
    return None


async def pin_reference_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.pinReference [uri]`: keep the document's current trace as its reference.

    A trace without full tensors (a plain trace keeps statistics only) is traced again with full tensors first
    when it can be (trusted workspace, not shape-only), so that the reference compares every value; otherwise the
    statistics are pinned and the answer (`tensors`, `message`) and the notification say so."""
    uri = arguments[0] if arguments else None
    path = ls.uri_to_path(uri) if isinstance(uri, str) else None
    if path is None:
        return _refuse(ls, "ModelTrace: modelTrace.pinReference needs the URI of a traced document")
    loaded = ls.sessions.trace_showing(path)
    if loaded is None:
        return _refuse(ls, f"ModelTrace: {Path(path).name} has no trace to pin; trace it first")
    retraced = False
    held, why = _tensors_held(loaded)
    blocked = _why_not_retraced(ls, loaded) if held == "statistics" else None
    if held == "statistics" and blocked is not None:
        why = blocked
    elif held == "statistics":
        session = ls.sessions.showing(path)
        request = session.last_request if session is not None else None
        result = await run_trace(
            ls,
            request.uri if request is not None else loaded.uri,
            loaded.owner,
            request.model if request is not None else None,
            request.mode if request is not None else "forward",
            full_tensors=True,
        )
        if not result.get("ok"):
            # NOTE: the failed trace said why (message, diagnostic); nothing is pinned from a trace no longer shown
            return {**result, "message": f"ModelTrace: nothing pinned: {result.get('message')}"}
        loaded = ls.sessions.trace_showing(path) or loaded
        retraced = True
        held, why = _tensors_held(loaded)
    pinned = pinned_path_for(ls, loaded.owner)
    async with ls.trace_lock:
        try:
            await asyncio.to_thread(_copy_trace, loaded.trace_path, pinned)
        except OSError as error:
            return _refuse(ls, f"ModelTrace: cannot copy the trace {loaded.trace_path} to {pinned}: {error}")
    answer = await _use_reference(ls, str(uri), loaded.owner, str(pinned))
    name = Path(loaded.owner).name
    if held == "full":
        message = f"ModelTrace: pinned {name} as its reference with full tensors" + (
            " (traced again with full tensors to pin it)" if retraced else ""
        )
        ls.show_message(message, types.MessageType.Info)
    else:
        kind = "a reference with some tensors missing" if held == "partial" else STATISTICS_ONLY
        message = f"ModelTrace: pinned {name} as {kind} ({why})"
        ls.show_message(message, types.MessageType.Warning)
    return {**answer, "tensors": held, "retraced": retraced, "message": message}


def trace_on_save(ls: ModelTraceServer, params: types.DidSaveTextDocumentParams) -> None:
    """`textDocument/didSave`: with `traceOnSave`, repeat the last request of the session whose trace the saved file
    shows (the same class and kind), if there is one."""
    if not ls.settings.trace_on_save or not ls.workspace_trusted:
        return
    path = ls.document_path(params.text_document.uri)
    if path is None:
        return
    session = ls.sessions.showing(path)
    request = session.last_request if session is not None else None
    if session is None or request is None or session.waiting:
        # NOTE: a trace still waiting for the worker reads the file when it starts: it sees this save too.
        return
    task = asyncio.get_running_loop().create_task(
        run_trace(ls, request.uri, session.owner, request.model, request.mode)
    )
    # NOTE: the loop keeps only weak references to tasks; hold this one until it is done.
    ls.background_tasks.add(task)
    task.add_done_callback(ls.background_tasks.discard)


async def trace_regenerated_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.traceRegenerated [uri, model class?]`: regenerate the modular file's twin into a temporary
    folder, trace the copy there, and open it."""
    target = _trace_target(ls, arguments)
    if isinstance(target, dict):
        return target
    _, path, model = target
    if not is_modular_file(path):
        return _refuse(ls, f"ModelTrace: {path}: regenerating is for a modular file (modular_<name>.py)")
    checkout = find_checkout(path)
    if checkout is None:
        return _refuse(ls, f"ModelTrace: {no_checkout_message(path)}")
    try:
        copy = await asyncio.to_thread(regenerate_copy, path, checkout, ls.worker().python)
    except ModelTraceError as error:
        return _refuse(ls, f"ModelTrace: {error}")
    copy_uri = from_fs_path(str(copy)) or str(copy)
    result = await run_trace(ls, copy_uri, str(copy), model)
    if result.get("ok"):
        await _open_document(ls, copy_uri)
    return {**result, "regenerated": str(copy)}


async def _open_document(ls: ModelTraceServer, uri: str) -> None:
    """Ask the client to show the traced copy (LSP `window/showDocument`), when it can."""
    window = ls.client_capabilities.window
    if window is None or window.show_document is None or not window.show_document.support:
        return
    try:
        await ls.window_show_document_async(types.ShowDocumentParams(uri=uri, take_focus=True))
    except Exception as error:  # noqa: BLE001 - the trace is done either way; the copy can be opened by hand
        logger.warning("the client did not open %s: %s", uri, error)
