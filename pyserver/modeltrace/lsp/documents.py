"""Document sync: hints, gutter marks and diagnostics follow each edit, a changed trace is marked stale, a closed
document is its file again.

pygls has already applied a change when `didChange` arrives; the hints still refer to the text before it
(`FileHints.lines`), gutter marks and diagnostics to the text last seen (`followed_text`), so the diff between the
two moves them (`stale`: marks and diagnostics on changed lines are dropped, the others say they are stale).
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.project_files import recheck_project_file
from modeltrace.lsp.publish import ServerState, notify_status
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.stale import follow_shown
from modeltrace.lsp.store import read_lines
from modeltrace.project import PROJECT_FILE_NAME, PYPROJECT_NAME


def _follow(ls: ModelTraceServer, uri: str, lines: list[str] | None, closed: bool = False) -> None:
    """Move the document's hints, gutter marks and diagnostics to `lines`; any change makes its trace stale."""
    path = ls.document_path(uri)
    if path is not None and lines is not None:
        previous = ls.followed_text.pop(path, None) if closed else ls.followed_text.get(path)
        if not closed:
            ls.followed_text[path] = lines
        follow_shown(ls, path, previous, lines)
    hints = ls.sessions.hints(path) if path else None
    if hints is None or lines is None or not hints.follow(lines):
        return
    loaded = ls.sessions.trace_of(hints.owner)
    if loaded is not None and not loaded.stale:
        loaded.stale = True
        notify_status(
            ls,
            ServerState.STALE,
            f"{loaded.model_class}: the code changed since the last trace",
            loaded.uri,
            ran=loaded.ran,
        )


def did_open(ls: ModelTraceServer, params: types.DidOpenTextDocumentParams) -> None:
    """Follow the opened document; a model file in a trusted workspace starts the worker for its first trace."""
    _follow(ls, params.text_document.uri, split_lines(params.text_document.text))
    ls.start_worker_ahead([params.text_document.uri])


def did_change(ls: ModelTraceServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    _follow(ls, uri, split_lines(ls.workspace.get_text_document(uri).source))


def did_close(ls: ModelTraceServer, params: types.DidCloseTextDocumentParams) -> None:
    """A closed document is the file on disk again (unsaved edits are gone); what was parsed from it goes."""
    uri = params.text_document.uri
    ls.parsed.pop(uri, None)
    path = ls.document_path(uri)
    if path is not None:
        _follow(ls, uri, read_lines(path), closed=True)


def did_change_watched_files(ls: ModelTraceServer, params: types.DidChangeWatchedFilesParams) -> None:
    """`workspace/didChangeWatchedFiles` (the client watches `modeltrace.toml` and `pyproject.toml`): a project
    file's diagnostics follow its edits without waiting for the next trace."""
    for change in params.changes:
        path = ls.uri_to_path(change.uri)
        if path is not None and Path(path).name in (PROJECT_FILE_NAME, PYPROJECT_NAME):
            recheck_project_file(ls, path)
