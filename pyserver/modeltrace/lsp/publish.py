"""What the server pushes to the client about the sessions: diagnostics, gutter marks and its status.

Features change a session, then say here which URIs or files to send again; the state sent is always read
from the sessions, so a cleared session sends nothing. `modelTrace/status` params:
`{state: "idle" | "tracing" | "stale" | "error", message?: str, uri?: str, ran?: str, sizes?: "traced" | "full"}`,
sent on every change: `ran` says what ran (`trace/ran.py`), `sizes` which sizes the hints show.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path

from modeltrace.lsp import methods
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.session import DocumentSession


class ServerState(str, Enum):
    IDLE = "idle"
    TRACING = "tracing"
    STALE = "stale"
    ERROR = "error"


def notify_status(
    ls: ModelTraceServer,
    state: ServerState,
    message: str | None = None,
    uri: str | None = None,
    *,
    ran: str | None = None,
    sizes: str | None = None,
) -> None:
    params: dict[str, Any] = {"state": state.value}
    if message is not None:
        params["message"] = message
    if uri is not None:
        params["uri"] = uri
    if ran is not None:
        params["ran"] = ran
    if sizes is not None:
        params["sizes"] = sizes
    ls.protocol.notify(methods.STATUS, params)


def file_uri(ls: ModelTraceServer, file: str) -> str:
    """The URI the client knows a file by: its open document's, else the file's own."""
    document = ls.open_document(file)
    return document.uri if document is not None else from_fs_path(file)


def publish_diagnostics(ls: ModelTraceServer, uris: Iterable[str]) -> None:
    """Send again every diagnostic the sessions hold on each of `uris` (none: the URI's are removed)."""
    sessions = list(ls.sessions)
    for uri in set(uris):
        # NOTE: a publish replaces all of a URI's diagnostics, and several traced files can fail in one shared
        # file: each publish gathers all sessions' (failures first, then divergences, then notes).
        located = [session.failure for session in sessions] + [session.divergence for session in sessions]
        located += [note for session in sessions for note in session.source_notes]
        diagnostics = [item[1] for item in located if item is not None and item[0] == uri]
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics))


def notify_line_marks(ls: ModelTraceServer, file: str, lines: list[dict[str, Any]]) -> None:
    """`modelTrace/lineStatus`: a file's gutter marks (an empty list removes them)."""
    ls.protocol.notify(methods.LINE_STATUS, {"uri": file_uri(ls, file), "lines": lines})


def withdraw(ls: ModelTraceServer, session: DocumentSession) -> None:
    """Take back from the client everything a session showed (it was cleared): diagnostics, gutters, hints."""
    uris = {uri for uri, _ in session.diagnostics()}
    files = session.diff.files if session.diff is not None else set()
    session.failure = session.divergence = session.diff = None
    session.source_notes = []
    publish_diagnostics(ls, uris)
    for file in files:
        notify_line_marks(ls, file, [])
    ls.refresh_views()
