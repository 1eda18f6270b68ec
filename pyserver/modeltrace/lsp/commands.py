"""`workspace/executeCommand`: trace a document through the worker (and again on save, with `traceOnSave`), clear
its session, load a trace from disk, set or pin the reference trace it is compared with.

A trace runs in a thread (the worker call blocks) under `$/progress` work-done progress; cancelling the
progress stops the worker. On success the trace is read back, indexed and the client asked to redraw hints
and lenses; on failure the user gets a diagnostic at the failing line and one message, never a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from modeltrace.lsp.full_sizes import compute_full_sizes, showing_full_sizes, sizes_shown
from modeltrace.lsp.diagnostics import DIAGNOSTIC_SOURCE, editor_wording, publish_failure, show_trace_diagnostics
from modeltrace.lsp.loading import load_trace, load_trace_here, release_free_heap, run_load, settle_memory
from modeltrace.lsp.modular import generated_classes
from modeltrace.lsp.project_files import (
    TraceSources,
    create_recipe,
    publish_project_error,
    recipe_uri,
    trace_sources,
)
from modeltrace.lsp.publish import ServerState, notify_status, withdraw
from modeltrace.lsp.reference import forget_diff, load_checked_reference, update_diff, workspace_path
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.session import DocumentDiff, DocumentSession, LastRequest, Located
from modeltrace.lsp.settings import HintSizes
from modeltrace.lsp.store import DocumentTrace, load_message, show_on, tensors_held
from modeltrace.modular.regenerate import (
    find_checkout,
    no_checkout_message,
    regenerate_copy,
    regenerated_root,
    remove_regenerated,
)
from modeltrace.modular.twins import is_modular_file, resolve_generated
from modeltrace.project import ProjectFileError
from modeltrace.trace.relocate import SourceMatch
from modeltrace.trace.storage import TRACE_SUFFIX
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
    ls: ModelTraceServer,
    uri: str,
    path: str,
    model: str | None,
    mode: str = "forward",
    full_tensors: bool = False,
    regenerated: Path | None = None,
) -> dict[str, Any]:
    """Trace `path` (one trace at a time: the worker runs one) and install the result; `mode` "forward",
    "generate" or "backward"; `full_tensors` keeps every tensor even without a reference (to pin it). With
    `regenerated` (a regenerated copy of the modular file `path`, `modular/regenerate.py`), the worker runs the
    copy and its hints show on `path`."""
    session = ls.sessions.open(path, uri)
    session.last_request = LastRequest(uri=uri, model=model, mode=mode, regenerate=regenerated is not None)
    session.waiting = True
    async with ls.trace_lock:
        session.waiting = False
        return await _trace_now(ls, uri, path, model, mode, full_tensors, regenerated)


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


def _report_progress(ls: ModelTraceServer, token: str | None, message: str) -> None:
    if token is not None:
        ls.work_done_progress.report(token, types.WorkDoneProgressReport(message=message))


def _end_progress(ls: ModelTraceServer, token: str | None, message: str) -> None:
    if token is None:
        return
    ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
    ls.work_done_progress.tokens.pop(token, None)


def _request(
    ls: ModelTraceServer,
    path: str,
    sources: TraceSources,
    mode: str = "forward",
    full_tensors: bool = False,
) -> messages.TraceRequest:
    settings = ls.settings
    # NOTE: with a reference (or to pin), full tensors make the diff compare every value, not only statistics;
    # without one a trace keeps them within `fullTensorsMB`, so that pinning it needs no second trace
    wanted = full_tensors or path in ls.references
    return messages.TraceRequest(
        file=path,
        out=str(trace_path_for(ls, path)),
        model=sources.model,
        generate=settings.generate_steps if mode == "generate" else 0,
        backward=mode == "backward",
        shape_only=settings.shape_only,
        checkpoint=settings.checkpoint,
        # NOTE: the project file's recipe and config, else the settings' (`project_files.trace_sources`)
        recipe=sources.recipe,
        config=sources.config,
        device_map=settings.device_map,
        full_tensors=(wanted or settings.full_tensors_mb > 0) and not settings.shape_only,
        # NOTE: the diff against that reference follows, and its replay runs on the model this trace keeps alive
        keep_for_replay=path in ls.references and settings.diff_replay and not settings.shape_only,
        max_tensor_mb=settings.max_tensor_mb,
        max_trace_mb=settings.max_trace_mb if wanted else min(settings.max_trace_mb, settings.full_tensors_mb),
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
    ls: ModelTraceServer,
    uri: str,
    path: str,
    model: str | None,
    mode: str = "forward",
    full_tensors: bool = False,
    regenerated: Path | None = None,
) -> dict[str, Any]:
    if not ls.workspace_trusted:
        # NOTE: checked again here: trust can be withdrawn while a trace waited for the one before it
        # (trace-on-save queues behind a running trace).
        return _refuse(ls, UNTRUSTED_MESSAGE, types.MessageType.Warning)
    if is_modular_file(path) and regenerated is None:
        # NOTE: a modular file runs as its generated twin; without a usable one no worker needs to start
        try:
            resolve_generated(path)
        except ModelTraceError as error:
            return _fail(ls, uri, None, f"ModelTrace: {error}")
    try:
        sources = trace_sources(ls, path, model)
    except ProjectFileError as error:
        # NOTE: on the project file's offending line; the trace on view stays, no worker starts
        publish_project_error(ls, path, error)
        return _fail(ls, uri, None, f"ModelTrace: {error}")
    except ModelTraceError as error:
        return _fail(ls, uri, None, f"ModelTrace: {error}")
    session = ls.sessions.open(path, uri)
    session.recipe = str(Path(sources.recipe).resolve()) if sources.recipe else None
    name = _model_to_build(ls, uri, path, sources.model)
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

    request = _request(ls, path, sources, mode, full_tensors)
    if regenerated is not None:
        # NOTE: the worker runs the regenerated copy (its twin is fresh); the hints are the user's file's
        request = dataclasses.replace(request, file=str(regenerated))
    try:
        result = await asyncio.to_thread(worker.trace, request, on_progress)
        loaded = await run_load(result.trace, load_trace, path, uri, result.trace)
        if regenerated is not None:
            show_on(loaded, str(regenerated), path)
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
    # NOTE: before the views are redrawn: the document's hovers and lenses read the regenerated twin held
    # (`modular.shown_map`); a plain trace replaces a regenerated one, whose folder is no longer shown
    root = regenerated_root(regenerated) if regenerated is not None else None
    if root is not None:
        await asyncio.to_thread(ls.regenerated.hold, path, root)
    else:
        await asyncio.to_thread(ls.regenerated.release, path)
    session.full_sizes = session.full_sizes_note = None
    install(ls, session, loaded, [])
    summary = (
        f"{loaded.model_class}: {loaded.call_count} module calls on "
        f"{sum(len(hints.by_trace_line) for hints in loaded.files.values())} lines ({result.seconds:.1f} s)"
    )
    # NOTE: still under the trace lock: the next trace cannot overwrite this trace folder while it is compared.
    diff = await update_diff(ls, session)
    if diff is not None:
        summary += "; matches the reference" if diff.matched else "; differs from the reference"
    if ls.settings.hint_sizes == HintSizes.FULL or session.show_full_sizes:
        _report_progress(ls, token, f"{loaded.model_class} at full size, shape-only")
        if await compute_full_sizes(ls, session, request, uri) is None:
            ls.refresh_views()
    _end_progress(ls, token, summary)
    ran = loaded.ran
    sizes = sizes_shown(ls, session)
    # NOTE: one line per trace in the log, as each failure gets one (its traceback)
    why = f" (no full sizes: {session.full_sizes_note})" if session.full_sizes_note else ""
    ls.log(f"traced {path}: {summary}; ran {ran}; hints at {sizes} sizes{why}", types.MessageType.Info)
    notify_status(ls, ServerState.IDLE, summary, uri, ran=ran, sizes=sizes)
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
    session = ls.sessions.open(path, uri)
    # NOTE: what the worker tried, when only a recipe can build the class: "Create recipe…" starts from it
    session.recipe_draft = error.recipe
    # NOTE: the cause as data (`WorkerError.cause`), for clients that act on it rather than on the message
    message = _worker_start_message(error, python) or f"ModelTrace: {editor_wording(str(failure))}"
    if error.recipe is None:
        return {**_fail(ls, uri, token, message), "cause": error.cause}
    message += f"; {CREATE_RECIPE_ACTION} writes one for {error.recipe.model_class} from what ModelTrace tried"
    _end_progress(ls, token, "failed")
    notify_status(ls, ServerState.ERROR, message, uri)
    window = ls.client_capabilities.window
    if window is not None and window.show_message is not None:
        _offer_recipe(ls, uri, message, error.recipe.model_class)
    else:
        # NOTE: a client that declares no `window.showMessage` (message actions) gets the message; the lens offers
        # "Create recipe…"
        ls.show_message(message, types.MessageType.Error)
    ls.refresh_views()  # NOTE: the class's lens now offers "Create recipe…"
    return {"ok": False, "message": message, "cause": error.cause, "needsRecipe": error.recipe.model_class}


CREATE_RECIPE_ACTION = "Create recipe…"


def _offer_recipe(ls: ModelTraceServer, uri: str, message: str, model_class: str) -> None:
    """Show the failure with a "Create recipe…" button (`window/showMessageRequest`); a click runs the command.
    NOTE: in a task of its own: the trace's answer does not wait for the user."""

    async def ask() -> None:
        try:
            chosen = await ls.window_show_message_request_async(
                types.ShowMessageRequestParams(
                    type=types.MessageType.Error,
                    message=message,
                    actions=[types.MessageActionItem(title=CREATE_RECIPE_ACTION)],
                )
            )
        except Exception as error:  # noqa: BLE001 - a client that cannot ask still has the lens
            logger.info("the client did not show the Create recipe… button: %s", error)
            return
        if chosen is not None and chosen.title == CREATE_RECIPE_ACTION:
            await create_recipe_command(ls, uri, model_class)

    task = asyncio.get_running_loop().create_task(ask())
    ls.background_tasks.add(task)
    task.add_done_callback(ls.background_tasks.discard)


def install(ls: ModelTraceServer, session: DocumentSession, loaded: DocumentTrace, notes: list[Located]) -> None:
    """Show a new trace of the session's document: its files' hints follow the open documents' current text, the
    previous trace's failure and notes give way to this one's `notes`, then clients redraw. (Its diff is the
    caller's: `update_diff` replaces or takes back the previous one.)"""
    ls.sessions.install(session, loaded)
    session.recipe_draft = None
    show_trace_diagnostics(ls, session, notes)
    for path, hints in loaded.files.items():
        document = ls.open_document(path)
        if document is not None:
            hints.follow(split_lines(document.source))
    settle_memory(loaded)
    ls.refresh_views()


async def full_sizes_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.fullSizes [uri, show?]`: the document's hints at the model's full sizes (`lsp/full_sizes.py`),
    or back at the traced sizes; without `show`, a toggle. Answers `{ok, sizes: "full" | "traced", message?}`."""
    target = _trace_target(ls, arguments[:1])
    if isinstance(target, dict):
        return target
    uri, path, _ = target
    session = ls.sessions.get(ls.sessions.owner_of(path))
    if session is None or session.trace is None:
        return _refuse(
            ls,
            "ModelTrace: trace this file first (▶ Trace forward), then show its hints at full size",
            types.MessageType.Info,
        )
    show = arguments[1] if len(arguments) > 1 and isinstance(arguments[1], bool) else None
    wanted = not showing_full_sizes(ls, session) if show is None else show
    loaded = session.trace
    if wanted and session.full_sizes is None:
        try:
            # NOTE: the config the project file (or the setting) names is the one to show at full size
            sources = trace_sources(ls, session.owner, loaded.model_class)
        except ModelTraceError as error:
            return _refuse(ls, f"ModelTrace: {error}")
        async with ls.trace_lock:
            notify_status(ls, ServerState.TRACING, f"{loaded.model_class} at full size, shape-only", uri)
            reason = await compute_full_sizes(ls, session, _request(ls, session.owner, sources), uri)
        if reason is not None:
            notify_status(
                ls,
                ServerState.IDLE,
                f"{loaded.model_class}: hints at the traced sizes",
                uri,
                ran=loaded.ran,
                sizes="traced",
            )
            return {
                **_refuse(ls, f"ModelTrace: no hints at full size: {reason}", types.MessageType.Info),
                "sizes": "traced",
            }
    session.show_full_sizes = wanted
    ls.refresh_views()
    sizes = sizes_shown(ls, session)
    message = None
    if not wanted and sizes == "full":
        message = "ModelTrace: modelTrace.hintSizes is full: the hints stay at full size"
        ls.show_message(message, types.MessageType.Info)
    full_ran = session.full_sizes.ran if session.full_sizes is not None and sizes == "full" else None
    notify_status(
        ls,
        ServerState.STALE if loaded.stale else ServerState.IDLE,
        f"{loaded.model_class}: hints at {'full size (' + full_ran + ')' if full_ran else 'the traced sizes'}",
        uri,
        ran=loaded.ran,
        sizes=sizes,
    )
    return {"ok": True, "sizes": sizes, **({"message": message} if message else {})}


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
        await asyncio.to_thread(ls.regenerated.release, session.owner)
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
    message = load_message(trace_path, loaded, shown)
    if message is not None:
        ls.show_message(
            message, types.MessageType.Warning if loaded.stale or loaded.parameters_note else types.MessageType.Info
        )
    notify_status(
        ls,
        ServerState.STALE if loaded.stale else ServerState.IDLE,
        f"{loaded.model_class}: loaded {trace_path}",
        uri,
        ran=loaded.ran,
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

    A trace without every full tensor (over the editor's `fullTensorsMB`, or taken with it 0) is traced again with
    full tensors first when it can be (trusted workspace, not shape-only), so that the reference compares every value; otherwise the
    statistics are pinned and the answer (`tensors`, `message`) and the notification say so."""
    uri = arguments[0] if arguments else None
    path = ls.uri_to_path(uri) if isinstance(uri, str) else None
    if path is None:
        return _refuse(ls, "ModelTrace: modelTrace.pinReference needs the URI of a traced document")
    loaded = ls.sessions.trace_showing(path)
    if loaded is None:
        return _refuse(ls, f"ModelTrace: {Path(path).name} has no trace to pin; trace it first")
    retraced = False
    held, why = tensors_held(loaded)
    # NOTE: a trace over the editor's budget (`fullTensorsMB`) holds some tensors: traced again within maxTraceMB
    blocked = _why_not_retraced(ls, loaded) if held != "full" else None
    if held != "full" and blocked is not None:
        why = blocked if held == "statistics" else why
    elif held != "full":
        session = ls.sessions.showing(path)
        request = session.last_request if session is not None else None
        result = await run_trace(
            ls,
            request.uri if request is not None else loaded.uri,
            loaded.owner,
            request.model if request is not None else None,
            request.mode if request is not None else "forward",
            full_tensors=True,
            # NOTE: a regenerated trace is pinned as it is shown: traced again from the same regenerated copy
            regenerated=ls.regenerated.copy_of(loaded.owner) if request is not None and request.regenerate else None,
        )
        if not result.get("ok"):
            # NOTE: the failed trace said why (message, diagnostic); nothing is pinned from a trace no longer shown
            return {**result, "message": f"ModelTrace: nothing pinned: {result.get('message')}"}
        loaded = ls.sessions.trace_showing(path) or loaded
        retraced = True
        held, why = tensors_held(loaded)
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
    """`textDocument/didSave`: a saved recipe traces again the documents last traced with it; with `traceOnSave`,
    repeat the last request of the session whose trace the saved file shows (the same class and kind), if any."""
    if not ls.workspace_trusted:
        return
    path = ls.document_path(params.text_document.uri)
    if path is None:
        return
    # NOTE: a recipe is saved to be used: the documents traced with it are traced again, whatever traceOnSave says
    for recipe_user in [session for session in ls.sessions if session.recipe == str(Path(path).resolve())]:
        _repeat_last_request(ls, recipe_user)
    if not ls.settings.trace_on_save:
        return
    session = ls.sessions.showing(path)
    request = session.last_request if session is not None else None
    if session is None or request is None or session.waiting:
        # NOTE: a trace still waiting for the worker reads the file when it starts: it sees this save too.
        return
    _repeat_last_request(ls, session)


def _repeat_last_request(ls: ModelTraceServer, session: DocumentSession) -> None:
    """Trace the session's document again as it was last asked for (in the background; regenerated again when
    it was a regenerated trace)."""
    request = session.last_request
    if request is None or session.waiting:
        return
    repeat = (
        _trace_regenerated(ls, request.uri, session.owner, request.model)
        if request.regenerate
        else run_trace(ls, request.uri, session.owner, request.model, request.mode)
    )
    task = asyncio.get_running_loop().create_task(repeat)
    # NOTE: the loop keeps only weak references to tasks; hold this one until it is done.
    ls.background_tasks.add(task)
    task.add_done_callback(ls.background_tasks.discard)


async def trace_regenerated_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.traceRegenerated [uri, model class?]`: regenerate the modular file's twin into a temporary
    folder, trace the copy there, and open it."""
    target = _trace_target(ls, arguments)
    if isinstance(target, dict):
        return target
    uri, path, model = target
    if not is_modular_file(path):
        return _refuse(ls, f"ModelTrace: {path}: regenerating is for a modular file (modular_<name>.py)")
    return await _trace_regenerated(ls, uri, path, model)


async def _trace_regenerated(ls: ModelTraceServer, uri: str, path: str, model: str | None) -> dict[str, Any]:
    """Regenerate the modular file `path` into a temporary folder and trace the copy, its hints on `path`'s
    document. The folder stays while that trace is shown (hovers and lenses open the regenerated file, the diff's
    replay reruns it): a later trace of the document, a clear, shutdown or newer folders remove it
    (`ls.regenerated`); a failed trace removes it at once."""
    checkout = find_checkout(path)
    if checkout is None:
        return _refuse(ls, f"ModelTrace: {no_checkout_message(path)}")
    try:
        copy = await asyncio.to_thread(regenerate_copy, path, checkout, ls.worker().python)
    except ModelTraceError as error:
        return _refuse(ls, f"ModelTrace: {error}")
    root = regenerated_root(copy)
    result: dict[str, Any] = {"ok": False}
    try:
        # NOTE: a trace that succeeds holds the folder (`_trace_now`)
        result = await run_trace(ls, uri, path, model, regenerated=copy)
    finally:
        # NOTE: also when the trace was cancelled: a folder no trace shows is removed at once
        if root is not None and not result.get("ok"):
            await asyncio.to_thread(remove_regenerated, root)
    return {**result, "regenerated": str(copy)}


async def _open_document(ls: ModelTraceServer, uri: str) -> None:
    """Ask the client to show a document (LSP `window/showDocument`: the written recipe), when it can."""
    window = ls.client_capabilities.window
    if window is None or window.show_document is None or not window.show_document.support:
        return
    try:
        await ls.window_show_document_async(types.ShowDocumentParams(uri=uri, take_focus=True))
    except Exception as error:  # noqa: BLE001 - the recipe is written either way; it can be opened by hand
        logger.warning("the client did not open %s: %s", uri, error)


async def create_recipe_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.createRecipe [uri, model class?]`: write a recipe for the class next to its file, from what the
    last failed trace tried (a trace runs first when there is none), register it in the project file and open it.
    With nothing left to fill in it is traced at once; otherwise saving it traces (`trace_on_save`)."""
    target = _trace_target(ls, arguments)
    if isinstance(target, dict):
        return target
    uri, path, model = target
    session = ls.sessions.open(path, uri)
    draft = session.recipe_draft
    if draft is None or (model is not None and draft.model_class != model):
        # NOTE: no failure to start from yet (the lens of a class that needs a recipe, before any trace): the
        # trace says what it tries, and fails with the draft, or runs and needs no recipe
        tried = await run_trace(ls, uri, path, model)
        draft = ls.sessions.open(path, uri).recipe_draft
        if tried.get("ok") or draft is None:
            message = (
                f"ModelTrace: {model or Path(path).name} traces without a recipe"
                if tried.get("ok")
                else f"ModelTrace: no recipe to write: {tried.get('message')}"
            )
            return _refuse(ls, message, types.MessageType.Info if tried.get("ok") else types.MessageType.Error)
    try:
        written = await asyncio.to_thread(create_recipe, ls, path, draft)
    except ProjectFileError as error:
        publish_project_error(ls, path, error)
        return _refuse(ls, f"ModelTrace: cannot register a recipe: {error}")
    except (ModelTraceError, OSError) as error:
        return _refuse(ls, f"ModelTrace: cannot write a recipe for {draft.model_class}: {error}")
    session = ls.sessions.open(path, uri)
    session.recipe = str(written.path.resolve())
    session.last_request = LastRequest(uri=uri, model=draft.model_class, mode="forward")
    await _open_document(ls, recipe_uri(written))
    answer: dict[str, Any] = {
        "ok": True,
        "recipe": str(written.path),
        "projectFile": str(written.project_file),
        "todo": list(written.todo_names),
        "todoLines": [line - 1 for line in written.todo_lines],
    }
    if written.todo_names:
        message = (
            f"ModelTrace: wrote {written.path.name} (registered in {written.project_file.name}): fill in "
            f"{', '.join(written.todo_names)}, then save it to trace {draft.model_class}"
        )
        ls.show_message(message, types.MessageType.Info)
        return {**answer, "message": message}
    traced = await run_trace(ls, uri, path, draft.model_class)
    message = f"ModelTrace: wrote {written.path.name} (registered in {written.project_file.name}) and traced with it"
    if traced.get("ok"):
        ls.show_message(message, types.MessageType.Info)
    return {**answer, "message": message, "trace": traced}
