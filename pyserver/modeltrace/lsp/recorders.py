"""Recorder problems (`_can_record_outputs`) as pull diagnostics, and their quick fixes as code actions (a modular
file's are its generated twin's, on the modular lines, `modular.recorders`; their fixes edit the modular file and
say that the generated file must be regenerated, `modular.fixes`).

Static only (stdlib `ast` to read, libcst to edit; no model run), so it works in untrusted workspaces too. Diagnostics are served through
`textDocument/diagnostic` (the client pulls them on open and on each change) so that they never replace the
trace failures and divergences the server pushes with `publishDiagnostics` on the same file.
"""

from __future__ import annotations

import difflib
import logging

from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.modular import document_map, regenerate_actions, staleness_diagnostics
from modeltrace.modular.recorders import analyze_modular
from modeltrace.modular.twins import is_modular_file
from modeltrace.recorders import analyze_source
from modeltrace.recorders.static import Analysis, Problem

SOURCE = "ModelTrace recorders"
DIAGNOSTIC_OPTIONS = types.DiagnosticOptions(
    inter_file_dependencies=False, workspace_diagnostics=False, identifier="modeltrace-recorders"
)
CODE_ACTION_OPTIONS = types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix])

logger = logging.getLogger(__name__)


def _analysis(ls: ModelTraceServer, uri: str) -> tuple[str, Analysis] | None:
    """The document's source and its analysis, once per version (kept with the open document: `context`)."""
    path = ls.document_path(uri)
    if path is None:
        return None
    document = ls.workspace.get_text_document(uri)
    source = document.source
    if "capture_outputs" not in source and "_can_record_outputs" not in source and not is_modular_file(path):
        return source, Analysis(None, {}, set(), [], [], [])
    parsed = ls.parsed_document(uri)
    cached = parsed.recorders
    if cached is None or cached[0] != document.version or cached[1] != source:
        # NOTE: a modular file is checked as its generated twin (`modular.recorders`), read from disk each version
        analysis = (
            analyze_modular(source, path, document_map(ls, uri))
            if is_modular_file(path)
            else analyze_source(source, path)
        )
        cached = parsed.recorders = (document.version, source, analysis)
    return cached[1], cached[2]


def _line_range(source: str, line: int) -> types.Range:
    lines = source.splitlines()
    index = max(0, min(line - 1, len(lines) - 1)) if lines else 0
    text = lines[index] if lines else ""
    start = len(text) - len(text.lstrip())
    # NOTE: characters counted in UTF-16 units would differ only past non-ASCII text; these lines are code.
    return types.Range(types.Position(index, start), types.Position(index, len(text)))


def _diagnostic(source: str, problem: Problem) -> types.Diagnostic:
    return types.Diagnostic(
        range=_line_range(source, problem.line),
        message=problem.message,
        severity=types.DiagnosticSeverity.Information
        if problem.severity == "hint"
        else types.DiagnosticSeverity.Warning,
        code=problem.code,
        source=SOURCE,
        data={"key": problem.key, "code": problem.code, "line": problem.line},
    )


def document_diagnostics(
    ls: ModelTraceServer, params: types.DocumentDiagnosticParams
) -> types.FullDocumentDiagnosticReport:
    """The pulled (static) diagnostics: recorder problems, and a modular file's out-of-date generated twin."""
    found = _analysis(ls, params.text_document.uri)
    items = [] if found is None else [_diagnostic(found[0], p) for p in found[1].problems]
    items.extend(staleness_diagnostics(ls, params.text_document.uri))
    return types.FullDocumentDiagnosticReport(items=items)


def _text_edits(old: str, new: str) -> list[types.TextEdit]:
    """Line-based edits turning `old` into `new` (whole lines, so independent of the position encoding)."""
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    edits = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        edits.append(
            types.TextEdit(
                range=types.Range(types.Position(i1, 0), types.Position(i2, 0)),
                new_text="".join(new_lines[j1:j2]),
            )
        )
    return edits


def code_actions(ls: ModelTraceServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    uri = params.text_document.uri
    found = _analysis(ls, uri)
    if found is None:
        return None
    source, analysis = found
    wanted = params.context.only
    if wanted and not any(kind.startswith(types.CodeActionKind.QuickFix) for kind in wanted):
        return None
    try:
        from modeltrace.recorders.fixes import apply_fixes
    except ImportError as error:
        # NOTE: libcst missing from the interpreter (the extension names it and offers to install it): the
        # problems stay diagnostics, without their fixes.
        logger.warning("no quick fixes: %s", error)
        return None
    first, last = params.range.start.line + 1, params.range.end.line + 1
    path = ls.document_path(uri)
    if path is not None and is_modular_file(path):
        return [
            *_modular_actions(uri, path, source, analysis, first, last),
            *regenerate_actions(ls, uri, path, first, last),
        ]
    actions = []
    fixable = [p for p in analysis.problems if p.fix_json() is not None]
    for problem in fixable:
        if not (first <= problem.line <= last):
            continue
        fixed, applied = apply_fixes(source, [problem], analysis)
        if not applied or fixed == source:
            continue
        fix = problem.fix_json() or {}
        title = (
            f"Record {fix['key']!r} with {fix['entry']}"
            if "entry" in fix
            else f"Add _can_record_outputs to {fix.get('class')}"
        )
        diagnostic = _diagnostic(source, problem)
        actions.append(
            types.CodeAction(
                title=title,
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diagnostic],
                is_preferred=True,
                edit=types.WorkspaceEdit(changes={uri: _text_edits(source, fixed)}),
            )
        )
    if len(fixable) > 1 and actions:
        fixed, applied = apply_fixes(source, None, analysis)
        if len(applied) > 1:
            actions.append(
                types.CodeAction(
                    title="Fix all _can_record_outputs problems",
                    kind=types.CodeActionKind.QuickFix,
                    edit=types.WorkspaceEdit(changes={uri: _text_edits(source, fixed)}),
                )
            )
    return actions


def _modular_actions(
    uri: str, path: str, source: str, analysis: Analysis, first: int, last: int
) -> list[types.CodeAction]:
    """The quick fixes of a modular file's problems on lines `first`..`last`: edits of the modular file only."""
    from modeltrace.modular.fixes import ModularFixError, fix_title, generated_problem, modular_fixes

    actions = []
    for problem in analysis.problems:
        if not (first <= problem.line <= last) or generated_problem(problem) is None:
            continue
        try:
            fixed, applied = modular_fixes(source, path, [problem])
        except (ModularFixError, OSError, SyntaxError, UnicodeDecodeError) as error:
            logger.info("no modular fix for %s: %s", problem.message, error)
            continue
        if not applied or fixed == source:
            continue
        actions.append(
            types.CodeAction(
                title=fix_title(problem, path),
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[_diagnostic(source, problem)],
                is_preferred=True,
                edit=types.WorkspaceEdit(changes={uri: _text_edits(source, fixed)}),
            )
        )
    return actions
