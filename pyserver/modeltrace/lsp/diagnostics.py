"""Trace failures as diagnostics: an Error at the line of the model code that raised, on that file's URI.

Each traced document remembers where its failure (and its first divergence from a reference, see
`reference`) was published, so that the next trace (or a clear) removes it, whichever file it was on.
"""

from __future__ import annotations

from lsprotocol import types
from pygls.uris import from_fs_path

from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.server import ModelTraceServer
from modeltrace.lsp.store import read_lines
from modeltrace.worker.messages import WorkerError


DIAGNOSTIC_SOURCE = "ModelTrace"


def failure_diagnostic(ls: ModelTraceServer, error: WorkerError) -> tuple[str, types.Diagnostic] | None:
    """`(uri, diagnostic)` for a worker error located in a file, or None when it has no location."""
    file, line = error.file, error.line
    if not file or line is None or line < 1:
        return None
    # NOTE: the worker names files by their real path; an open document may have been opened by another name.
    document = ls.open_document(file)
    uri = document.uri if document is not None else from_fs_path(file)
    lines = split_lines(document.source) if document is not None else (read_lines(file) or [])
    text = lines[line - 1] if line - 1 < len(lines) else ""
    start = len(text) - len(text.lstrip())
    first_line = next(iter(error.message.strip().splitlines()), "")
    kind = error.kind
    units = ls.workspace.position_codec.client_num_units
    return uri, types.Diagnostic(
        range=types.Range(
            start=types.Position(line=line - 1, character=units(text[:start])),
            end=types.Position(line=line - 1, character=units(text)),
        ),
        message=f"{kind}: {first_line}" if first_line else kind,
        severity=types.DiagnosticSeverity.Error,
        source=DIAGNOSTIC_SOURCE,
    )


def publish_failure(ls: ModelTraceServer, owner: str, error: WorkerError) -> None:
    """Replace the owner's previous failure diagnostic (if any) with this one."""
    clear_failure(ls, owner)
    located = failure_diagnostic(ls, error)
    if located is not None:
        ls.failures[owner] = located
        _publish(ls, located[0])


def clear_failure(ls: ModelTraceServer, owner: str) -> None:
    located = ls.failures.pop(owner, None)
    if located is not None:
        _publish(ls, located[0])


def publish_divergence(ls: ModelTraceServer, owner: str, located: tuple[str, types.Diagnostic] | None) -> None:
    """Replace the owner's first-divergence warning (None: remove it)."""
    previous = ls.divergences.pop(owner, None)
    if located is not None:
        ls.divergences[owner] = located
    for uri in {item[0] for item in (previous, located) if item is not None}:
        _publish(ls, uri)


def publish_source_notes(ls: ModelTraceServer, owner: str, located: list[tuple[str, types.Diagnostic]]) -> None:
    """Replace the owner's notes on files changed since its trace was captured (an empty list: remove them)."""
    previous = ls.source_notes.pop(owner, [])
    if located:
        ls.source_notes[owner] = located
    for uri in {where for where, _ in (*previous, *located)}:
        _publish(ls, uri)


def _publish(ls: ModelTraceServer, uri: str) -> None:
    # NOTE: a publish replaces all of a URI's diagnostics, and several traced files can fail in one shared file.
    notes = [item for items in ls.source_notes.values() for item in items]
    diagnostics = [
        diagnostic for where, diagnostic in (*ls.failures.values(), *ls.divergences.values(), *notes) if where == uri
    ]
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics))
