"""What goes stale on an edit besides hints: gutter marks and diagnostics follow the text as hints do.

Everything the server shows about a trace refers to the lines of the text it was shown against. On each edit of
a document, the gutter marks (`modelTrace/lineStatus`) and the diagnostics (a trace's failure, the first
divergence, the notes on changed files) on that file move with their unchanged lines and say they are stale; those
on lines the edit changed are dropped, since the code they describe is gone (a fixed line loses its RuntimeError at
once). A fresh trace replaces them all (`reference.show_diff`, `diagnostics.show_trace_diagnostics`).

Shown things are kept in the coordinates of the latest text of each file the server saw (`FollowedTexts`), which
is what each edit is diffed against (`remap`).
"""

from __future__ import annotations

from typing import Any

import attrs
from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.publish import notify_line_marks, publish_diagnostics
from modeltrace.lsp.remap import remap_lines
from modeltrace.lsp.session import DocumentSession, Located
from modeltrace.lsp.store import read_lines


STALE_NOTE = " (stale: the code changed since this trace)"


def follow_shown(ls: ModelTraceServer, path: str, old: list[str] | None, new: list[str]) -> None:
    """The file at `path` changed from `old` (None: as on disk) to `new`: move or drop what is shown on it."""
    sessions = [session for session in ls.sessions if _shows_on(ls, session, path)]
    if not sessions:
        return
    if old is None:
        old = read_lines(path)
    if old is None or old == new:
        return
    uris: set[str] = set()
    for session in sessions:
        _follow_marks(ls, session, path, old, new)
        uris |= _follow_diagnostics(ls, session, path, old, new)
    publish_diagnostics(ls, uris)


def _shows_on(ls: ModelTraceServer, session: DocumentSession, path: str) -> bool:
    if session.diff is not None and path in session.diff.shown:
        return True
    return any(ls.uri_to_path(uri) == path for uri, _ in session.diagnostics())


def _follow_marks(ls: ModelTraceServer, session: DocumentSession, path: str, old: list[str], new: list[str]) -> None:
    """Move the file's gutter marks with their lines, marked stale; a changed line loses its mark."""
    diff = session.diff
    if diff is None or path not in diff.shown:
        return
    moved = remap_lines(diff.shown[path], old, new)
    diff.shown[path] = {line: _stale_mark(mark, line) for line, mark in moved.items()}
    notify_line_marks(ls, path, sorted(diff.shown[path].values(), key=lambda item: item["line"]))


def _stale_mark(mark: dict[str, Any], line: int) -> dict[str, Any]:
    message = mark.get("message") or ""
    if not mark.get("stale"):
        message += STALE_NOTE
    return {**mark, "line": line, "message": message, "stale": True}


def _follow_diagnostics(
    ls: ModelTraceServer, session: DocumentSession, path: str, old: list[str], new: list[str]
) -> set[str]:
    """Move the session's diagnostics on the file, marked stale; one whose lines changed is dropped. The URIs
    whose diagnostics changed."""

    def follow(located: Located | None) -> Located | None:
        if located is None or ls.uri_to_path(located[0]) != path:
            return located
        touched.add(located[0])
        diagnostic = _moved(located[1], old, new, located[0])
        return (located[0], diagnostic) if diagnostic is not None else None

    touched: set[str] = set()
    session.failure = follow(session.failure)
    session.divergence = follow(session.divergence)
    notes = [follow(note) for note in session.source_notes]
    session.source_notes = [note for note in notes if note is not None]
    return touched


def _moved(
    diagnostic: types.Diagnostic, old: list[str], new: list[str], uri: str | None = None
) -> types.Diagnostic | None:
    """The diagnostic on the new text, said to be stale; None when a line it covers changed, or one of its related
    lines in the same document (`uri`): a failure's calling lines, where the fix of a code error often is."""
    start, end = diagnostic.range.start, diagnostic.range.end
    related = [item for item in diagnostic.related_information or [] if item.location.uri == uri]
    lines = {*range(start.line, end.line + 1), *(item.location.range.start.line for item in related)}
    moved = remap_lines({line: line for line in lines}, old, new)
    if len(moved) != len(lines):
        return None
    by_old = {old_line: new_line for new_line, old_line in moved.items()}
    message = diagnostic.message if diagnostic.message.endswith(STALE_NOTE) else diagnostic.message + STALE_NOTE
    return attrs.evolve(
        diagnostic,
        range=_shifted(diagnostic.range, by_old),
        message=message,
        related_information=[
            attrs.evolve(item, location=attrs.evolve(item.location, range=_shifted(item.location.range, by_old)))
            if item in related
            else item
            for item in diagnostic.related_information
        ]
        if diagnostic.related_information
        else diagnostic.related_information,
    )


def _shifted(where: types.Range, by_old: dict[int, int]) -> types.Range:
    """`where` on the new text: each end on its line's new number (a range on one line, as diagnostics here are)."""
    start_line = by_old[where.start.line]
    end_line = by_old.get(where.end.line, start_line + where.end.line - where.start.line)
    return types.Range(
        start=types.Position(line=start_line, character=where.start.character),
        end=types.Position(line=end_line, character=where.end.character),
    )
