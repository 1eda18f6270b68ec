"""The ModelTrace language server object: the pygls server plus what ModelTrace keeps between requests.

Settings, workspace trust, the sessions of the traced documents (`session`), what is parsed from open documents
and the trace worker. The server never imports torch: tracing happens in the worker process
(`modeltrace.worker`), started when a model file opens in a trusted workspace (`start_worker_ahead`), else by
the first trace, and kept warm; the server only reads the trace files it writes. The features (one module each,
wired in `server`) take this object; none imports another.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

import modeltrace
from modeltrace.lsp.classes import ModuleClass, find_module_classes
from modeltrace.lsp.session import Sessions
from modeltrace.lsp.settings import Settings
from modeltrace.errors import ModelTraceError, TraceFailed
from modeltrace.lsp.wire import converter
from modeltrace.modular.regenerate import RegeneratedFolders
from modeltrace.worker.client import WorkerClient


if TYPE_CHECKING:
    from modeltrace.modular.mapping import ModularMap
    from modeltrace.recorders.static import Analysis


logger = logging.getLogger(__name__)


class UntrustedWorkspace(ModelTraceError):
    """The worker was asked for while the workspace is not trusted: whatever would use it runs the workspace's
    code (a trace imports the model file; a replay rebuilds the model from it)."""


class ModelTraceServer(LanguageServer):
    """A pygls server plus what ModelTrace keeps between requests."""

    def __init__(self) -> None:
        super().__init__(
            "modeltrace",
            modeltrace.__version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            converter_factory=converter,
        )
        self.settings = Settings()
        self.workspace_trusted = True
        self.sessions = Sessions()
        self.parsed: dict[str, ParsedDocument] = {}
        self.background_tasks: set[asyncio.Task] = set()
        # NOTE: the worker runs one trace at a time, and a diff reads a trace folder the next trace would replace.
        self.trace_lock = asyncio.Lock()
        self._worker: WorkerClient | None = None
        # The worker `start_worker_ahead` last started (or tried to): each worker is started ahead at most once.
        self._started_ahead: WorkerClient | None = None
        self._path_cache: dict[str, str | None] = {}
        # The latest text of each open document, by path: what gutter marks and diagnostics on it refer to, and
        # what the next edit is diffed against to move them (`stale`).
        self.followed_text: dict[str, list[str]] = {}
        # The temporary folders modular files were regenerated into, while their traces are shown
        # (`modelTrace.traceRegenerated`); removed when replaced, cleared, beyond a few, and at shutdown.
        self.regenerated = RegeneratedFolders()

    @property
    def references(self) -> Mapping[str, str]:
        """Each traced document's reference by owner path (read from the sessions)."""
        return self.sessions.references()

    def worker(self) -> WorkerClient:
        """The trace worker for the current `python` setting (started by its first trace).

        Every path that runs the workspace's code goes through here (a trace of any kind, the diff's replay), so
        this is the one gate that holds whatever feature asks: untrusted, it raises `UntrustedWorkspace`. The
        features check trust first to say so in their own words; this catches any that would not.
        """
        if not self.workspace_trusted:
            raise UntrustedWorkspace(
                "ModelTrace: this would run the workspace's model code, and the workspace is not trusted"
            )
        if self._worker is None:
            self._worker = WorkerClient(python=self.settings.python, on_log=self._worker_log)
        return self._worker

    def start_worker_ahead(self, uris: list[str] | None = None) -> None:
        """Start the worker now, on a thread, when one of the documents `uris` (default: every open one) holds a
        module class and the workspace is trusted (`startWorkerOnOpen`).

        Importing torch and transformers takes 3-5 s here (more on a cold disk): started when the user opens a
        model file, the worker is ready by the time they ask for a trace, which then takes a fraction of a
        second instead. Once per worker: one that could not start, or has stopped since, is started by the next
        trace, which says why it cannot. An untrusted workspace never gets here (`worker()` is its gate: the
        interpreter may be the workspace's own)."""
        if not (self.workspace_trusted and self.settings.start_worker_on_open):
            return
        worker = self.worker()
        if worker is self._started_ahead or worker.running:
            return
        candidates = list(self.workspace.text_documents) if uris is None else uris
        if not any(self._holds_module_class(uri) for uri in candidates):
            return
        self._started_ahead = worker
        task = asyncio.get_running_loop().create_task(self._start_ahead(worker))
        # NOTE: the loop keeps only weak references to tasks; hold this one until it is done.
        self.background_tasks.add(task)
        task.add_done_callback(self.background_tasks.discard)

    async def _start_ahead(self, worker: WorkerClient) -> None:
        started = time.monotonic()
        try:
            await asyncio.to_thread(worker.start)
        except (TraceFailed, OSError) as error:
            # NOTE: no message box: nothing was asked for yet, and the first trace reports the same failure; a
            # worker stopped meanwhile (another interpreter set) is not a failure to report at all
            if worker is self._worker:
                self.log(f"ModelTrace: the trace worker ({worker.python}) did not start ahead of a trace: {error}")
            return
        self.log(
            f"ModelTrace: trace worker ready ({worker.python}, {time.monotonic() - started:.1f} s), "
            "started when a model file opened"
        )

    def _holds_module_class(self, uri: str) -> bool:
        """A Python file on disk with an `nn.Module` class (what the "Trace forward" lens is shown on)."""
        return self.document_path(uri) is not None and bool(self.document_classes(uri))

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
        # NOTE: the recipe setting changes the "Trace forward" lens of a class only a recipe builds
        if (settings.hint_detail, settings.hint_placement, settings.hint_sizes, bool(settings.recipe)) != (
            previous.hint_detail,
            previous.hint_placement,
            previous.hint_sizes,
            bool(previous.recipe),
        ):
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

    def parsed_document(self, uri: str) -> ParsedDocument:
        """What was parsed from an open document (kept until it closes)."""
        parsed = self.parsed.get(uri)
        if parsed is None:
            parsed = self.parsed[uri] = ParsedDocument()
        return parsed

    def document_classes(self, uri: str) -> list[ModuleClass]:
        """The module classes of an open document, parsed once per version; while the user types code that does
        not parse, those of the last version that did."""
        document = self.workspace.get_text_document(uri)
        parsed = self.parsed_document(uri)
        cached = parsed.classes
        if cached is not None and cached[0] == document.version and document.version is not None:
            return cached[1]
        try:
            classes = find_module_classes(document.source)
        except (SyntaxError, ValueError):
            return cached[1] if cached is not None else []
        parsed.classes = (document.version, classes)
        return classes

    def show_message(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def log(self, message: str, kind: types.MessageType = types.MessageType.Log) -> None:
        # NOTE: once, to the client's log (window/logMessage): the server's stderr reaches the same output
        # channel, so logging it there as well printed every message, tracebacks included, twice.
        logger.debug("%s", message)
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


@dataclass(frozen=True, slots=True)
class MapKey:
    """What a modular document's map was computed from (`lsp.modular`): its version and text, and its generated
    twin's modification time (and path: the twin beside it, or a regenerated copy's)."""

    version: int | None
    source: str
    twin_mtime_ns: int
    twin: str = ""


@dataclass(slots=True)
class ParsedDocument:
    """What is parsed from an open document's text, with the version it was parsed from; dropped on close."""

    classes: tuple[int | None, list[ModuleClass]] | None = None
    # (version, source, recorder analysis) of `lsp.recorders`
    recorders: tuple[int | None, str, Analysis] | None = None
    # (what it was computed from, the map or None) of a modular document (`lsp.modular`)
    modular: tuple[MapKey, ModularMap | None] | None = None
    # the same onto the regenerated twin whose trace the document shows (`lsp.modular.shown_map`)
    shown_modular: tuple[MapKey, ModularMap | None] | None = None
    # (modification time, module classes) of a modular document's generated twin (`lsp.modular`)
    generated_classes: tuple[int, list[ModuleClass]] | None = None
