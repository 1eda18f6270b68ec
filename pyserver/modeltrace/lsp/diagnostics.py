"""Trace failures as diagnostics: an Error at the line of the model code that raised, on that file's URI.

Each session keeps where its failure, its first divergence from a reference (see `reference`) and its notes on
changed files were published, so that the next trace (or a clear) removes them, whichever file they were on.
"""

from __future__ import annotations

import re

from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.publish import file_uri, publish_diagnostics
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.session import DocumentSession, Located
from modeltrace.lsp.store import read_lines
from modeltrace.worker.messages import WorkerError


DIAGNOSTIC_SOURCE = "ModelTrace"

# The worker's advice names the CLI's options; in the editor each names the setting that does the same. Rows:
# (the CLI's words, the editor's), the more specific first; each applies once to what the rows before left.
EDITOR_WORDING: tuple[tuple[str, str], ...] = (
    (r"pass --config or --recipe", "set modelTrace.config to a config.json or modelTrace.recipe to a recipe"),
    (r"pass --config with a small(er)? config\.json", r"set modelTrace.config to a small\1 config.json"),
    (r"pass --recipe\b", "set modelTrace.recipe to a recipe"),
    (r"pass --model CLASS", "use the ▶ Trace forward lens of the class to trace"),
    (r"pass --shape-only", "turn on modelTrace.shapeOnly"),
    (r"--config with a small(er)? config\.json", r"modelTrace.config set to a small\1 config.json"),
    (r"--recipe\b", "modelTrace.recipe set to a recipe"),
    (r"--config\b", "modelTrace.config"),
    (r"--shape-only\b", "modelTrace.shapeOnly"),
    (r"(trace )?--model \w+ --generate N", "the ▶ Trace generate lens of that class"),
    (r"--generate( N)?\b", "▶ Trace generate"),
    (r"--backward\b", "▶ Trace forward + backward"),
    (r"--device-map\b", "modelTrace.deviceMap"),
    (r"--checkpoint( DIR)?\b", "modelTrace.checkpoint"),
    (r"--timeout\b", "modelTrace.timeout"),
    (r"--dtype\b", "modelTrace.dtype"),
    (r"--device\b(?!-)", "modelTrace.device"),
    (r"--attention\b", "modelTrace.attention"),
    (r"--max-tensor-mb\b", "modelTrace.maxTensorMB"),
    (r"--max-trace-mb\b", "modelTrace.maxTraceMB"),
    (r"--tensor-memory-mb\b", "modelTrace.tensorMemoryMB"),
    (r"--full-tensors\b", "full tensors (a reference, or Pin Current Trace as Reference)"),
    (r"--model( CLASS)?\b", "the ▶ Trace forward lens of the class"),
)


def editor_wording(message: str) -> str:
    """`message` with the CLI options it advises named as the editor's settings (`EDITOR_WORDING`)."""
    for pattern, replacement in EDITOR_WORDING:
        message = re.sub(pattern, replacement, message)
    return message


def failure_diagnostic(ls: ModelTraceServer, error: WorkerError) -> Located | None:
    """`(uri, diagnostic)` for a worker error located in a file, or None when it has no location."""
    file, line = error.file, error.line
    if not file or line is None or line < 1:
        return None
    # NOTE: the worker names files by their real path; an open document may have been opened by another name.
    document = ls.open_document(file)
    uri = file_uri(ls, file)
    lines = split_lines(document.source) if document is not None else (read_lines(file) or [])
    text = lines[line - 1] if line - 1 < len(lines) else ""
    first_line = next(iter(error.message.strip().splitlines()), "")
    kind = error.kind
    return uri, types.Diagnostic(
        range=_line_range(ls, text, line),
        message=editor_wording(f"{kind}: {first_line}" if first_line else kind),
        severity=types.DiagnosticSeverity.Error,
        source=DIAGNOSTIC_SOURCE,
        related_information=_callers(ls, error) or None,
    )


def _line_range(ls: ModelTraceServer, text: str, line: int) -> types.Range:
    """The range of a 1-based line's code (its text without the indentation)."""
    units = ls.workspace.position_codec.client_num_units
    start = len(text) - len(text.lstrip())
    return types.Range(
        start=types.Position(line=line - 1, character=units(text[:start])),
        end=types.Position(line=line - 1, character=units(text)),
    )


def _callers(ls: ModelTraceServer, error: WorkerError) -> list[types.DiagnosticRelatedInformation]:
    """The user's lines that called into the failing one, nearest first: the nearest passed the arguments the
    error is about (an edit that passes the wrong tensor fails further in, where the tensor is used)."""
    related = []
    for frame in error.callers:
        document = ls.open_document(frame.file)
        lines = split_lines(document.source) if document is not None else (read_lines(frame.file) or [])
        text = lines[frame.line - 1] if 0 < frame.line <= len(lines) else ""
        related.append(
            types.DiagnosticRelatedInformation(
                location=types.Location(uri=file_uri(ls, frame.file), range=_line_range(ls, text, frame.line)),
                message=f"called from {frame.function}, line {frame.line}: {text.strip()}",
            )
        )
    return related


def publish_failure(ls: ModelTraceServer, owner: str, error: WorkerError) -> None:
    """Replace the failure diagnostic of `owner`'s session (if any) with this one."""
    session = ls.sessions.open(owner)
    previous, session.failure = session.failure, failure_diagnostic(ls, error)
    publish_diagnostics(ls, {located[0] for located in (previous, session.failure) if located is not None})


def publish_divergence(ls: ModelTraceServer, session: DocumentSession, located: Located | None) -> None:
    """Replace the session's first-divergence warning (None: remove it)."""
    previous, session.divergence = session.divergence, located
    publish_diagnostics(ls, {item[0] for item in (previous, located) if item is not None})


def show_trace_diagnostics(ls: ModelTraceServer, session: DocumentSession, notes: list[Located]) -> None:
    """A new trace is shown: the previous one's failure goes, its notes on changed files are replaced."""
    previous = [located for located in (session.failure, *session.source_notes) if located is not None]
    session.failure = None
    session.source_notes = list(notes)
    publish_diagnostics(ls, {uri for uri, _ in (*previous, *notes)})
