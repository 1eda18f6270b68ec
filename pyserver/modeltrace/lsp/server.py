"""The ModelTrace language server: its state, the wiring of the feature modules, and `serve()` (stdio).

The server never imports torch: tracing happens in the worker process (`modeltrace.worker`), started on
the first trace and kept warm; the server only reads the trace files it writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

import modeltrace
from modeltrace.lsp import methods
from modeltrace.lsp.classes import ModuleClass
from modeltrace.lsp.settings import Settings
from modeltrace.lsp.store import TraceRequest, TraceStore
from modeltrace.worker.client import WorkerClient


# NOTE: `reference` imports this module; the server only needs the name for type checkers.
if TYPE_CHECKING:
    from modeltrace.lsp.reference import DocumentDiff


logger = logging.getLogger(__name__)


class ModelTraceServer(LanguageServer):
    """A pygls server plus what ModelTrace keeps between requests."""

    def __init__(self) -> None:
        super().__init__(
            "modeltrace", modeltrace.__version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental
        )
        self.settings = Settings()
        self.workspace_trusted = True
        self.store = TraceStore()
        self.last_requests: dict[str, TraceRequest] = {}
        self.failures: dict[str, tuple[str, types.Diagnostic]] = {}
        # Reference traces by owner path (the traced document), the latest diff against each, its warning.
        self.references: dict[str, str] = {}
        self.diffs: dict[str, DocumentDiff] = {}
        self.divergences: dict[str, tuple[str, types.Diagnostic]] = {}
        # Notes on the files of a loaded trace that changed since it was captured ("Load Trace…"), by owner.
        self.source_notes: dict[str, list[tuple[str, types.Diagnostic]]] = {}
        self.class_cache: dict[str, tuple[int | None, list[ModuleClass]]] = {}
        self.background_tasks: set[asyncio.Task] = set()
        self.trace_lock = asyncio.Lock()
        self.waiting_traces: set[str] = set()
        self._worker: WorkerClient | None = None
        self._path_cache: dict[str, str | None] = {}

    def worker(self) -> WorkerClient:
        """The trace worker for the current `python` setting (started by its first trace)."""
        if self._worker is None:
            self._worker = WorkerClient(python=self.settings.python, on_log=self._worker_log)
        return self._worker

    def _worker_log(self, line: str) -> None:
        # NOTE: called from the worker's stderr thread; prints and warnings of the model code land here.
        logger.info("worker: %s", line)

    def close_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            # NOTE: closing waits up to seconds for the worker to exit; never on the event loop.
            threading.Thread(target=worker.close, name="modeltrace-worker-close", daemon=True).start()

    def apply_settings(self, settings: Settings) -> None:
        previous, self.settings = self.settings, settings
        if settings.python != previous.python:
            self.close_worker()
        if (settings.hint_detail, settings.hint_placement) != (previous.hint_detail, previous.hint_placement):
            self.refresh_views()

    def uri_to_path(self, uri: str) -> str | None:
        """The resolved absolute path of a `file:` URI (traces name files by their real path), else None."""
        if uri not in self._path_cache:
            path = to_fs_path(uri) if uri.startswith("file:") else None
            self._path_cache[uri] = os.path.realpath(path) if path else None
        return self._path_cache[uri]

    def document_path(self, uri: str) -> str | None:
        """The path of a Python file behind `uri`; None for untitled, remote and non-Python documents."""
        path = self.uri_to_path(uri)
        if path is None:
            return None
        document = self.workspace.text_documents.get(uri)
        language = document.language_id if document is not None else None
        if language == "python" or (language is None and Path(path).suffix in (".py", ".pyi")):
            return path
        return None

    def open_document(self, path: str) -> TextDocument | None:
        for uri, document in self.workspace.text_documents.items():
            if self.uri_to_path(uri) == path:
                return document
        return None

    def show_message(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def log(self, message: str, kind: types.MessageType = types.MessageType.Log) -> None:
        logger.info("%s", message)
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    def refresh_views(self) -> None:
        """Ask the client to request hints and lenses again, where it says it can."""
        workspace = self.client_capabilities.workspace
        if workspace is None:
            return
        if workspace.inlay_hint is not None and workspace.inlay_hint.refresh_support:
            self.workspace_inlay_hint_refresh(None)
        if workspace.code_lens is not None and workspace.code_lens.refresh_support:
            self.workspace_code_lens_refresh(None)


def create_server() -> ModelTraceServer:
    """A server with every feature registered."""
    # NOTE: the feature modules import ModelTraceServer for their signatures, so they come in once it exists.
    from modeltrace.lsp import codelens, commands, documents, hints, hover, recorders, reference, settings

    server = ModelTraceServer()
    server.feature(types.INITIALIZE)(settings.initialize)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(settings.did_change_configuration)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(documents.did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(documents.did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(documents.did_close)
    server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))(documents.did_save)
    server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=True))(hints.inlay_hints)
    server.feature(types.INLAY_HINT_RESOLVE)(hints.resolve_inlay_hint)
    server.feature(types.TEXT_DOCUMENT_HOVER)(hover.hover)
    server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))(codelens.code_lenses)
    server.command(methods.TRACE)(commands.trace_command)
    server.command(methods.CLEAR)(commands.clear_command)
    server.command(methods.TRACE_GENERATE)(commands.trace_generate_command)
    server.command(methods.TRACE_BACKWARD)(commands.trace_backward_command)
    server.command(methods.LOAD_TRACE)(commands.load_trace_command)
    server.command(methods.SET_REFERENCE)(commands.set_reference_command)
    server.command(methods.PIN_REFERENCE)(commands.pin_reference_command)
    server.feature(methods.DIFF_PLOT)(reference.diff_plot)
    server.feature(types.TEXT_DOCUMENT_DIAGNOSTIC, recorders.DIAGNOSTIC_OPTIONS)(recorders.document_diagnostics)
    server.feature(types.TEXT_DOCUMENT_CODE_ACTION, recorders.CODE_ACTION_OPTIONS)(recorders.code_actions)
    server.feature(types.SHUTDOWN)(_shutdown)
    return server


def _shutdown(ls: ModelTraceServer, params: None) -> None:
    ls.close_worker()
    # NOTE: pygls cancels the requests still awaiting the client while iterating over them, and each
    # cancellation removes its entry: with any pending (an unanswered refresh, say) shutdown fails with
    # "dictionary changed size during iteration". Cancelling them first, over a copy, avoids that.
    current = ls.protocol.msg_id
    for message_id, future in list(ls.protocol._request_futures.items()):
        if message_id != current and not future.done():
            future.cancel()


def serve() -> None:
    """Run the server over stdin/stdout until the client says `exit`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    # NOTE: pygls logs every message at INFO; its warnings are enough in the client's output channel.
    logging.getLogger("pygls").setLevel(logging.WARNING)
    create_server().start_io()
