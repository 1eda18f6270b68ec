"""Hover on a traced line: the line's tables (`markdown`), the generation steps and gradients of its calls
(`steps`), and with a reference, how each call compared (the session's diff). On a modular file, the generated
line a traced line runs as, and on a class line the methods it inherits (`modular`)."""

from __future__ import annotations

from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.full_sizes import full_size_line
from modeltrace.lsp.markdown import line_markdown, reference_markdown
from modeltrace.lsp.modular import class_hover, twin_line_markdown
from modeltrace.lsp.steps import hover_markdown


def hover(ls: ModelTraceServer, params: types.HoverParams) -> types.Hover | None:
    path = ls.document_path(params.text_document.uri)
    hints = ls.sessions.hints(path) if path else None
    traced = hints.by_line.get(params.position.line) if hints else None
    if hints is None or traced is None:
        # NOTE: a modular class line tells which methods run as generated, traced or not
        inherited = class_hover(ls, params.text_document.uri, params.position.line) if path else None
        if inherited is None:
            return None
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=inherited))
    session = ls.sessions.get(hints.owner)
    loaded = session.trace if session is not None else None
    text = hints.lines[params.position.line] if params.position.line < len(hints.lines) else ""
    markdown = line_markdown(
        traced.entry,
        bool(loaded and loaded.stale),
        loaded.ran if loaded is not None else None,
        full_size_line(ls, hints, traced),
    )
    extra = hover_markdown(loaded.trace, traced.entry, ls.settings.gradient_hints) if loaded is not None else None
    if extra:
        markdown += "\n\n" + extra
    twin = twin_line_markdown(ls, params.text_document.uri, params.position.line)
    if twin:
        markdown += "\n\n" + twin
    if session is not None and session.diff is not None:
        compared = reference_markdown(session.diff, [*traced.entry.calls, *traced.entry.inner_calls])
        if compared:
            markdown += "\n\n" + compared
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown),
        range=types.Range(
            start=types.Position(line=params.position.line, character=0),
            end=types.Position(
                line=params.position.line, character=ls.workspace.position_codec.client_num_units(text)
            ),
        ),
    )
