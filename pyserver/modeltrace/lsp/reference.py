"""Reference traces: diff a document's trace against its reference and show where they part ways.

After each trace of a document with a reference (and right after the reference is set), the diff runs in a
thread; the server then sends `modelTrace/lineStatus` for every file the diff touches (gutters, each line with
the message of the call that decides its mark), a Warning diagnostic at the first divergence's call site,
`modelTrace/diffResult` (the client's notification and status bar), keeps the numbers for hovers and the plot
for `modelTrace/diffPlot` (`plot`). The diff is the session's (`session.DocumentDiff`); only plain data is kept: the
tensors of both traces are closed once compared.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from lsprotocol import types

from modeltrace.errors import ModelTraceError
from modeltrace.lsp import methods
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.diagnostics import publish_divergence
from modeltrace.lsp.publish import file_uri, notify_line_marks
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.session import CallDiff, DocumentDiff, DocumentSession, Located
from modeltrace.lsp.store import read_lines
from modeltrace.project import ProjectChoices, project_choices
from modeltrace.trace.lines import format_number


logger = logging.getLogger(__name__)

DIFF_DIAGNOSTIC_SOURCE = "ModelTrace diff"
UNTRUSTED_REPLAY_NOTE = (
    "replay not run: it would run this workspace's model code, and the workspace is not trusted (plain comparison)"
)


def load_checked_reference(path: str) -> None:
    """Open and close a reference once, so that a bad path fails when it is set, not at the next trace."""
    from modeltrace.diff import load_reference  # NOTE: imported late: see `compute_diff`

    load_reference(path).close()


def compute_diff(
    reference: str,
    candidate: str,
    atol: float | None,
    rtol: float | None,
    maps: tuple[str, ...],
    replay: bool = False,
    worker: Any = None,
    mapping: str | None = None,
) -> DocumentDiff:
    """Diff the candidate trace folder against the reference (CPU and file work: run it in a thread). With
    `replay` and a reference holding full tensors, the first modules whose outputs differ are re-run on the
    reference's inputs in `worker` (the server's trace worker, the candidate's environment; the caller holds
    the trace lock), and the verdict uses that (`diff.replay`). `mapping`: a mapping file to align by."""
    # NOTE: imported here, not at the top: `modeltrace.diff` loads numpy (~14 MB), which a server that only
    # shows hints never needs; it is imported once a reference is set.
    from modeltrace.diff import WHEN_POSSIBLE, close_result, diff_paths, plot_data
    from modeltrace.diff.report import divergence_json, line_marks, line_status

    result = diff_paths(
        reference,
        candidate,
        atol,
        rtol,
        maps,
        replay=WHEN_POSSIBLE if replay else False,
        client=worker,
        mapping=mapping,
    )
    try:
        calls = {
            # NOTE: a call's status as its gutter says it: a difference only inherited through the inputs is
            # "inherited" in the hover too
            (module.candidate.path, module.candidate.call_index): CallDiff(
                line_status(module),
                module.check,
                module.max_abs_diff,
                module.max_rel_diff,
                module.reference.path
                if module.reference is not None and module.reference.path != module.candidate.path
                else None,
                _alignment_text(module),
            )
            for module in result.modules
        }
        return DocumentDiff(
            reference=reference,
            statuses=line_marks(result),
            calls=calls,
            divergence=divergence_json(result.first_divergence),
            plot=plot_data(result),
            # NOTE: too little aligned is not a match (the CLI's exit 2): the reason goes first in the notes
            matched=result.match and not result.not_comparable,
            notes=([f"not comparable: {result.not_comparable}"] if result.not_comparable else []) + list(result.notes),
        )
    finally:
        close_result(result)


def _project_choices(ls: ModelTraceServer, path: str, model_class: str | None) -> ProjectChoices:
    """The project file's tolerances, maps and mapping for the traced file (DESIGN: the project file: they win over
    the `diff*` settings); none from a broken project file, which the trace that reads it shows on its line."""
    explicit = Path(workspace_path(ls, ls.settings.project_file)) if ls.settings.project_file else None
    try:
        return project_choices(Path(path), model_class, explicit)
    except ModelTraceError:
        return ProjectChoices()


async def update_diff(ls: ModelTraceServer, session: DocumentSession) -> DocumentDiff | None:
    """Diff the session's trace against its reference (if any) and show the result; None when nothing ran (the
    previous trace's diff is then taken back: it is not this trace's)."""
    reference, loaded = session.reference, session.trace
    if reference is None or loaded is None:
        forget_diff(ls, session)
        return None
    settings = ls.settings
    # NOTE: the replay re-runs the candidate's modules, which imports (or rebuilds) the workspace's model code:
    # like a trace, it needs a trusted workspace. Untrusted, the plain comparison stands and the notes say why.
    replay = settings.diff_replay and ls.workspace_trusted
    project = _project_choices(ls, session.owner, loaded.model_class)
    mapping = str(project.mapping) if project.mapping else None
    if mapping is None and settings.diff_mapping:
        mapping = workspace_path(ls, settings.diff_mapping)
    try:
        diff = await asyncio.to_thread(
            compute_diff,
            reference,
            loaded.trace_path,
            project.atol if project.atol is not None else settings.diff_atol,
            project.rtol if project.rtol is not None else settings.diff_rtol,
            project.maps or settings.diff_maps,
            replay,
            ls.worker() if replay else None,
            mapping,
        )
    except ModelTraceError as error:
        forget_diff(ls, session)
        ls.show_message(f"ModelTrace: comparing with the reference failed: {error}", types.MessageType.Error)
        return None
    except Exception as error:  # noqa: BLE001 - a broken diff never takes the trace down with it
        logger.exception("diff of %s against %s failed", loaded.trace_path, reference)
        forget_diff(ls, session)
        ls.show_message(
            f"ModelTrace: internal error while comparing with the reference ({error})", types.MessageType.Error
        )
        return None
    if settings.diff_replay and not replay:
        diff.notes.append(UNTRUSTED_REPLAY_NOTE)
    show_diff(ls, session, diff)
    return diff


def _current_lines(ls: ModelTraceServer, file: str) -> dict[int, int]:
    """1-based trace line -> 0-based current line of a file's traced lines (they move with edits)."""
    hints = ls.sessions.hints(file)
    if hints is None:
        return {}
    now = {id(traced): line for line, traced in hints.by_line.items()}
    return {line: now[id(traced)] for line, traced in hints.by_trace_line.items() if id(traced) in now}


def show_diff(ls: ModelTraceServer, session: DocumentSession, diff: DocumentDiff) -> None:
    """Replace what the previous diff of this document showed: gutters, the divergence warning, hovers."""
    previous, session.diff = session.diff, diff
    by_file: dict[str, list[dict[str, Any]]] = {}
    current_lines: dict[str, dict[int, int]] = {}
    loaded = session.trace
    for (traced_file, traced_line), mark in diff.statuses.items():
        # NOTE: a generated file's marks also go on the modular lines that map onto it (`modular`)
        twins = loaded.modular_lines(traced_file, traced_line) if loaded is not None else []
        for file, line in [(traced_file, traced_line), *twins]:
            if file not in current_lines:
                current_lines[file] = _current_lines(ls, file)
            current = current_lines[file].get(line, line - 1)
            by_file.setdefault(file, []).append({"line": current, "status": mark.status, "message": mark.message})
    for file, lines in by_file.items():
        # NOTE: kept as sent, so that an edit moves them with their lines and marks them stale (`stale`)
        diff.shown[file] = {item["line"]: item for item in lines}
        notify_line_marks(ls, file, sorted(lines, key=lambda item: item["line"]))
    if previous is not None:
        for file in previous.files - set(by_file):
            notify_line_marks(ls, file, [])
    publish_divergence(ls, session, divergence_diagnostic(ls, diff.divergence, session))
    ls.protocol.notify(methods.DIFF_RESULT, diff_result_params(ls, session.uri, diff, session))


def diff_result_params(
    ls: ModelTraceServer, uri: str, diff: DocumentDiff, session: DocumentSession | None = None
) -> dict[str, Any]:
    """`modelTrace/diffResult`: whether the document's trace matches its reference and, when not, where to look
    (the line that assigns a setting built differently, else the line that first differs inside the diverging
    module when known, else the module's call site). A traced modular file's location is its own line that maps
    onto that generated line, when one does (as the divergence diagnostic's)."""
    divergence = diff.divergence
    where = None
    if divergence is not None:
        drilled = divergence.get("line") or {}
        # NOTE: a setting its `__init__` computes differently is the cause: "Go to Line" goes to its assignment
        assigned = next(
            (item["assigned_at"] for item in divergence.get("settings") or [] if item.get("assigned_at")), None
        )
        location = (
            assigned
            if assigned
            else {"file": drilled["file"], "line": drilled["line"]}
            if drilled.get("file") and drilled.get("line")
            else divergence.get("called_at")
        )
        if location and location.get("file"):
            file, trace_line = _owned_line(session, str(location["file"]), int(location["line"]))
            line = _current_lines(ls, file).get(trace_line, trace_line - 1)
            where = {"uri": file_uri(ls, file), "line": line}
    return {
        "uri": uri,
        "reference": diff.reference,
        "match": diff.matched,
        "divergence": None
        if divergence is None
        else {
            "path": divergence.get("path") or "",
            "className": divergence.get("class") or "",
            "maxAbsDiff": divergence.get("max_abs_diff"),
            "location": where,
        },
        # what limited the comparison (a replay not run and why, statistics-only pairs, maps that align nothing)
        "notes": list(diff.notes),
    }


def forget_diff(ls: ModelTraceServer, session: DocumentSession) -> None:
    """Take a session's diff out of view (its trace was replaced by one that was not compared)."""
    previous, session.diff = session.diff, None
    if previous is None:
        return
    for file in previous.files:
        notify_line_marks(ls, file, [])
    publish_divergence(ls, session, None)


def divergence_diagnostic(
    ls: ModelTraceServer, divergence: dict[str, Any] | None, session: DocumentSession | None = None
) -> Located | None:
    """`(uri, Warning)` at the first divergence's first differing line when the diff found one (line records on
    both sides), else at its call site, with its numbers and what differs in how it was built; None without one.
    A traced modular file gets it on its line that maps onto that generated line, when one does."""
    called_at = (divergence or {}).get("line") or (divergence or {}).get("called_at")
    if divergence is None or not called_at or not called_at.get("file"):
        return None
    file, trace_line = _owned_line(session, called_at["file"], int(called_at["line"]))
    line = _current_lines(ls, file).get(trace_line, trace_line - 1)
    document = ls.open_document(file)
    lines = split_lines(document.source) if document is not None else (read_lines(file) or [])
    text = lines[line] if 0 <= line < len(lines) else ""
    start = len(text) - len(text.lstrip())
    units = ls.workspace.position_codec.client_num_units
    check = divergence.get("check")
    from modeltrace.diff.tolerances import scale_measures  # NOTE: imported late, as `compute_diff`'s

    scale = scale_measures(divergence.get("rel_err"), divergence.get("cosine"), format_number)
    message = (
        f"First divergence from the reference: {divergence['path']} ({divergence['class']}): "
        f"max abs diff {format_number(divergence.get('max_abs_diff'))}, "
        f"max rel diff {format_number(divergence.get('max_rel_diff'))}{scale}" + (f" ({check} check)" if check else "")
    )
    span = divergence.get("lines")
    if span and span["start"] != span["end"] and not (divergence.get("after") and divergence.get("before")):
        message += f"; look at {Path(span['file']).name} lines {span['start']}-{span['end']}"
    if divergence.get("after") and divergence.get("before"):
        message += (
            f"; it arises after {_named(divergence['after'])} (still matches) and before "
            f"{_named(divergence['before'])} (already differs)"
        )
    message += _evidence_message(divergence)
    return file_uri(ls, file), types.Diagnostic(
        range=types.Range(
            start=types.Position(line=line, character=units(text[:start])),
            end=types.Position(line=line, character=units(text)),
        ),
        message=message,
        severity=types.DiagnosticSeverity.Warning,
        source=DIFF_DIAGNOSTIC_SOURCE,
    )


def _owned_line(session: DocumentSession | None, file: str, trace_line: int) -> tuple[str, int]:
    """(file, trace line) where a generated file's line is shown: the traced modular file's line that maps onto it,
    when the session's document is that modular file and one does (`modular`); else the line itself."""
    if session is not None and session.trace is not None:
        owned = [twin for twin in session.trace.modular_lines(file, trace_line) if twin[0] == session.trace.owner]
        if owned:
            return owned[0]
    return file, trace_line


def _evidence_message(divergence: dict[str, Any]) -> str:
    """The first differing line's reason and the settings / parameters that differ, with the construction line."""
    parts = []
    line = divergence.get("line")
    if line:
        parts.append(f"first differing line: {line['reason']}")
    # NOTE: a setting its `__init__` computes names the line that assigns it; the others the parent's line
    settings = divergence.get("settings") or []
    assigned = [
        f"{item['name']} {item['reference']!r} (reference) vs {item['candidate']!r} (candidate), assigned at line "
        f"{item['assigned_at']['line']}"
        for item in settings
        if item.get("assigned_at")
    ]
    differences = [
        f"{item['name']} {item['reference']!r} (reference) vs {item['candidate']!r} (candidate)"
        for item in settings
        if not item.get("assigned_at")
    ]
    differences += [f"{item['name']} {item['status']}" for item in divergence.get("parameters") or []]
    if differences:
        built_at = divergence.get("built_at")
        where = f", built at line {built_at['line']}" if built_at else ""
        assigned.append("; ".join(differences) + where)
    if assigned:
        parts.append("built differently: " + "; ".join(assigned))
    return "".join(f"; {part}" for part in parts)


def _named(call: dict[str, Any]) -> str:
    called_at = call.get("called_at")
    return f"{call['path']} (line {called_at['line']})" if called_at else call["path"]


def _alignment_text(module: Any) -> str | None:
    """How a call was aligned when names did not do it: "aligned automatically, 0.95" / "mapping line 12"."""
    pair = module.pair
    if pair is None:
        return {"map": "by --map", "prefix": "by prefix"}.get(module.aligned_by or "")
    if module.aligned_by == "mapping":
        return f"mapping line {pair.line}" if pair.line else "mapping"
    return f"aligned automatically, confidence {pair.confidence:.2f}" + (" (fused)" if pair.fused else "")


def workspace_path(ls: ModelTraceServer, text: str) -> str:
    """An absolute path; a relative one is taken from the workspace root."""
    path = Path(text).expanduser()
    if not path.is_absolute() and ls.workspace.root_path:
        path = Path(ls.workspace.root_path) / path
    return str(path.absolute())
