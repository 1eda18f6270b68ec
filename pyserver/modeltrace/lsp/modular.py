"""A modular file in the editor (`modular_x.py`): its map onto the generated twin, the lenses and hovers of the
methods its classes inherit unchanged, and the diagnostic that says the twin is out of date.

Static (`ast` + `difflib`, `modeltrace.modular`): it works before any trace and in untrusted workspaces. The map is
computed from the open document's text and the generated file on disk, once per document version and twin
version. A trace's hints reach the modular lines through the same map (`store.modular_hints`).
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types
from pygls.uris import from_fs_path

from modeltrace.lsp import methods
from modeltrace.lsp.classes import ModuleClass, find_module_classes
from modeltrace.lsp.context import MapKey, ModelTraceServer
from modeltrace.modular.annotate import inlined_note
from modeltrace.modular.mapping import InheritedMethod, ModularMap, map_modular, sibling_definitions
from modeltrace.modular.regenerate import find_checkout
from modeltrace.modular.twins import generated_path, is_modular_file, regenerate_command

SOURCE = "ModelTrace modular"
# NOTE: a client command (`extension.ts`): opens a document at a 0-based line; any other client shows the title.
GO_TO_LINE = "modelTrace.goToLine"


def _twin_of(ls: ModelTraceServer, uri: str, shown: bool = False) -> tuple[str, Path, int] | None:
    """(path, generated twin, its modification time) of an open modular document; None for any other document or
    without a twin on disk. `shown`: the twin of the regenerated copy whose trace the document shows, when there is
    one (`modelTrace.traceRegenerated`), else the twin beside it."""
    path = ls.document_path(uri)
    if path is None or not is_modular_file(path):
        return None
    copy = ls.regenerated.copy_of(path) if shown else None
    twin = generated_path(copy if copy is not None else path)
    try:
        return path, twin, twin.stat().st_mtime_ns
    except OSError:
        return None


def document_map(ls: ModelTraceServer, uri: str) -> ModularMap | None:
    """The map of an open modular document onto its generated twin (the file beside it, as on disk: staleness,
    recorder checks); None for any other document, without a twin, or when either does not parse."""
    return _map(ls, uri, shown=False)


def shown_map(ls: ModelTraceServer, uri: str) -> ModularMap | None:
    """The map of an open modular document onto the generated file its shown hints come from: a regenerated copy's
    twin while a regenerated trace is shown (hovers and lenses then open the file that ran), else `document_map`."""
    path = ls.document_path(uri)
    if path is None or ls.regenerated.copy_of(path) is None:
        return document_map(ls, uri)
    return _map(ls, uri, shown=True)


def _map(ls: ModelTraceServer, uri: str, shown: bool) -> ModularMap | None:
    found = _twin_of(ls, uri, shown)
    if found is None:
        return None
    path, twin, mtime = found
    document = ls.workspace.get_text_document(uri)
    source = document.source
    key = MapKey(document.version, source, mtime, str(twin))
    parsed = ls.parsed_document(uri)
    cached = parsed.shown_modular if shown else parsed.modular
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        mapping: ModularMap | None = map_modular(
            source, twin.read_text(encoding="utf-8"), path, twin, sibling_definitions(Path(path))
        )
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        mapping = None
    if shown:
        parsed.shown_modular = (key, mapping)
    else:
        parsed.modular = (key, mapping)
    return mapping


def generated_classes(ls: ModelTraceServer, uri: str) -> list[ModuleClass] | None:
    """The module classes of an open modular document's generated twin (where its base model is: a modular file
    often leaves `XModel` to the converter); None for any other document or without a twin that parses."""
    found = _twin_of(ls, uri)
    if found is None:
        return None
    _, twin, mtime = found
    parsed = ls.parsed_document(uri)
    if parsed.generated_classes is not None and parsed.generated_classes[0] == mtime:
        return parsed.generated_classes[1]
    try:
        classes = find_module_classes(twin.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    parsed.generated_classes = (mtime, classes)
    return classes


def _generated_name(mapping: ModularMap) -> str:
    return Path(mapping.generated).name


def inherited_lenses(ls: ModelTraceServer, uri: str) -> list[types.CodeLens]:
    """A lens on each modular class line per method it inherits unchanged, opening the generated method, and one on
    each `super()` call line, opening the parent body inlined there."""
    mapping = shown_map(ls, uri)
    if mapping is None:
        return []
    lenses = []
    generated_uri = from_fs_path(mapping.generated)
    for inherited in mapping.inherited:
        line = inherited.class_line - 1
        lenses.append(
            types.CodeLens(
                range=types.Range(types.Position(line, 0), types.Position(line, 0)),
                command=types.Command(
                    title=f"↳ {inherited.method}: {inherited.describe(_generated_name(mapping))}",
                    command=GO_TO_LINE,
                    arguments=[generated_uri, inherited.generated_start - 1],
                ),
            )
        )
    # NOTE: a `super().forward(...)` line stands for the parent body the converter inlined: a lens opens it
    for modular_line in sorted(mapping.lines):
        note = inlined_note(mapping, modular_line)
        if note is not None:
            line = modular_line - 1
            lenses.append(
                types.CodeLens(
                    range=types.Range(types.Position(line, 0), types.Position(line, 0)),
                    command=types.Command(
                        title=f"↳ {note}",
                        command=GO_TO_LINE,
                        arguments=[generated_uri, mapping.generated_lines(modular_line)[0] - 1],
                    ),
                )
            )
    return lenses


def _inherited_markdown(mapping: ModularMap, inherited: list[InheritedMethod]) -> str:
    generated_uri = from_fs_path(mapping.generated)
    rows = [
        f"- `{item.method}`: inherited from `{item.parent}.{item.method}`, {item.line_count} lines: "
        f"[{_generated_name(mapping)}:{item.generated_start}]({generated_uri}#L{item.generated_start})"
        for item in inherited
    ]
    return "\n".join([f"**{inherited[0].class_name}** runs these methods as generated:", *rows])


def class_hover(ls: ModelTraceServer, uri: str, line: int) -> str | None:
    """Markdown for a modular class line (0-based): the methods it inherits, with links into the generated file."""
    mapping = shown_map(ls, uri)
    if mapping is None:
        return None
    inherited = [item for item in mapping.inherited if item.class_line == line + 1]
    if inherited:
        return _inherited_markdown(mapping, inherited)
    return None


def twin_line_markdown(ls: ModelTraceServer, uri: str, line: int) -> str | None:
    """ "Runs as modeling_x.py:NN" for a mapped modular line (0-based), linking the generated line."""
    mapping = shown_map(ls, uri)
    if mapping is None:
        return None
    generated = mapping.generated_lines(line + 1)
    if not generated:
        return None
    generated_uri = from_fs_path(mapping.generated)
    name = _generated_name(mapping)
    where = (
        f"[{name}:{generated[0]}]({generated_uri}#L{generated[0]})"
        if len(generated) == 1
        else f"[{name}:{generated[0]}–{generated[-1]}]({generated_uri}#L{generated[0]}) (the inlined parent body)"
    )
    return f"Runs as {where}"


def staleness_diagnostics(ls: ModelTraceServer, uri: str) -> list[types.Diagnostic]:
    """A Warning on the modular file when its generated twin is missing or out of date, naming the command that
    regenerates it (on the first stale line, else at the top)."""
    path = ls.document_path(uri)
    if path is None or not is_modular_file(path):
        return []
    twin = generated_path(path)
    mapping = document_map(ls, uri)
    if not twin.is_file():
        message = (
            f"{twin.name} does not exist: ModelTrace traces a modular file through the modeling file transformers "
            f"generates from it; from a transformers checkout run `{regenerate_command(path)}`"
        )
        line = 0
    elif mapping is None:
        message = (
            f"{twin.name} or this file does not parse: nothing maps onto the generated file; regenerate it from a "
            f"transformers checkout: `{regenerate_command(path)}`"
        )
        line = 0
    elif mapping.is_stale:
        message = mapping.staleness() or ""
        line = mapping.stale[0].line - 1 if mapping.stale else 0
    else:
        return []
    if find_checkout(path) is not None:
        # NOTE: the code action of `regenerate_actions` below (trusted workspaces)
        message += "; or regenerate it into a temporary folder and trace that (quick fix)"
    return [
        types.Diagnostic(
            range=types.Range(types.Position(line, 0), types.Position(line + 1, 0)),
            message=message,
            severity=types.DiagnosticSeverity.Warning,
            code="modular-stale",
            source=SOURCE,
        )
    ]


# NOTE: the quick fix on the out-of-date warning inside a transformers checkout: `modelTrace.traceRegenerated` (in
# `commands`) regenerates the twin into a temporary folder and traces the copy; it runs the checkout's code.
REGENERATE_TITLE = "Regenerate into a temporary folder and trace"


def regenerate_actions(ls: ModelTraceServer, uri: str, path: str, first: int, last: int) -> list[types.CodeAction]:
    """The action on the out-of-date warning (`modular.staleness_diagnostics`) when it sits on lines `first`..`last`
    (1-based), in a trusted workspace, inside a checkout."""
    if not ls.workspace_trusted or find_checkout(path) is None:
        return []
    stale = [
        diagnostic for diagnostic in staleness_diagnostics(ls, uri) if first <= diagnostic.range.start.line + 1 <= last
    ]
    if not stale:
        return []
    return [
        types.CodeAction(
            title=REGENERATE_TITLE,
            kind=types.CodeActionKind.QuickFix,
            diagnostics=stale,
            command=types.Command(title=REGENERATE_TITLE, command=methods.TRACE_REGENERATED, arguments=[uri]),
        )
    ]
