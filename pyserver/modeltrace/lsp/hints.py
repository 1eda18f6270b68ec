"""Inlay hints: one per traced line, at its end, `→ [1, 7, 64] float32 ×2`; the tooltip is the hover table.

Requests name a range of 0-based LSP lines; a hint sits at the end of its line, so it is inside the range
when its end-of-line position is (the last line only counts up to the range's end character).
"""

from __future__ import annotations

from lsprotocol import types

from modeltrace.lsp.hover import line_markdown
from modeltrace.lsp.server import ModelTraceServer


HINT_PREFIX = "→ "


def _units(ls: ModelTraceServer, text: str) -> int:
    # NOTE: counting UTF-16 units walks every character; ASCII lines (nearly all code) have as many as chars.
    return len(text) if text.isascii() else ls.workspace.position_codec.client_num_units(text)


def inlay_hints(ls: ModelTraceServer, params: types.InlayHintParams) -> list[types.InlayHint]:
    path = ls.document_path(params.text_document.uri)
    hints = ls.store.files.get(path) if path else None
    if hints is None:
        return []
    detail = ls.settings.hint_detail
    last, last_character = params.range.end.line, params.range.end.character
    found = []
    for line, traced in hints.between(params.range.start.line, last):
        hint = hints.hint_cache.get((detail, line))
        if hint is None:
            text = hints.lines[line] if line < len(hints.lines) else ""
            hint = hints.hint_cache[(detail, line)] = types.InlayHint(
                position=types.Position(line=line, character=_units(ls, text)),
                label=HINT_PREFIX + traced.label(detail),
                padding_left=True,
                data=f"{hints.key}:{traced.entry.line}",
            )
        if line == last and hint.position.character > last_character:
            continue
        found.append(hint)
    return found


def resolve_inlay_hint(ls: ModelTraceServer, hint: types.InlayHint) -> types.InlayHint:
    """Add the hover table as the tooltip (computed only for the hint the user points at)."""
    key, _, line = str(hint.data).partition(":")
    if not (key.isdigit() and line.isdigit()):
        return hint
    hints = ls.store.by_key.get(int(key))
    traced = hints.by_trace_line.get(int(line)) if hints else None
    if hints is None or traced is None:
        return hint
    loaded = ls.store.traces.get(hints.owner)
    hint.tooltip = types.MarkupContent(
        kind=types.MarkupKind.Markdown, value=line_markdown(traced.entry, bool(loaded and loaded.stale))
    )
    return hint
