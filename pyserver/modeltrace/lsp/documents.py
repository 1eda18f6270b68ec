"""Document sync: hints follow each edit, a changed trace is marked stale, a save may trace again.

pygls has already applied a change when `didChange` arrives; the hints still refer to the text before it
(`FileHints.lines`), so the diff between the two moves them.
"""

from __future__ import annotations

import asyncio

from lsprotocol import types

from modeltrace.lsp.commands import run_trace
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.server import ModelTraceServer
from modeltrace.lsp.status import ServerState, notify_status
from modeltrace.lsp.store import read_lines


def _follow(ls: ModelTraceServer, uri: str, lines: list[str] | None) -> None:
    """Move the document's hints to `lines`; any change makes its trace stale."""
    path = ls.document_path(uri)
    hints = ls.store.files.get(path) if path else None
    if hints is None or lines is None or not hints.follow(lines):
        return
    loaded = ls.store.traces.get(hints.owner)
    if loaded is not None and not loaded.stale:
        loaded.stale = True
        notify_status(
            ls, ServerState.STALE, f"{loaded.model_class}: the code changed since the last trace", loaded.uri
        )


def did_open(ls: ModelTraceServer, params: types.DidOpenTextDocumentParams) -> None:
    _follow(ls, params.text_document.uri, split_lines(params.text_document.text))


def did_change(ls: ModelTraceServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    _follow(ls, uri, split_lines(ls.workspace.get_text_document(uri).source))


def did_close(ls: ModelTraceServer, params: types.DidCloseTextDocumentParams) -> None:
    """A closed document is the file on disk again (unsaved edits are gone)."""
    uri = params.text_document.uri
    ls.class_cache.pop(uri, None)
    path = ls.document_path(uri)
    if path is not None:
        _follow(ls, uri, read_lines(path))


def did_save(ls: ModelTraceServer, params: types.DidSaveTextDocumentParams) -> None:
    """With `traceOnSave`, trace the saved file's trace again (the same class), if it has been traced."""
    if not ls.settings.trace_on_save or not ls.workspace_trusted:
        return
    path = ls.document_path(params.text_document.uri)
    if path is None:
        return
    showing = ls.store.trace_showing(path)
    owner = showing.owner if showing is not None else path
    request = ls.last_requests.get(owner)
    if request is None or owner in ls.waiting_traces:
        # NOTE: a trace still waiting for the worker reads the file when it starts: it sees this save too.
        return
    task = asyncio.get_running_loop().create_task(run_trace(ls, request.uri, owner, request.model, request.mode))
    # NOTE: the loop keeps only weak references to tasks; hold this one until it is done.
    ls.background_tasks.add(task)
    task.add_done_callback(ls.background_tasks.discard)
