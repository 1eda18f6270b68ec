"""The server's converter (`lsp/wire.py`): a cached inlay hint is sent exactly as pygls sends a plain one, on its
first answer and on every later one (its JSON is kept), inside the `textDocument/inlayHint` response."""

from __future__ import annotations

import json

from lsprotocol import types
from pygls.protocol import default_converter

from modeltrace.lsp.wire import CachedInlayHint, converter


def hint_fields(line: int) -> dict:
    return {
        "position": types.Position(line=line, character=17),
        "label": ": [1,4,7,16]",
        "kind": types.InlayHintKind.Type,
        "padding_left": line % 2 == 0,
        "data": f"3:{line + 1}",
    }


def test_a_cached_hint_is_sent_as_a_plain_one_every_time() -> None:
    cached = [CachedInlayHint(**hint_fields(line)) for line in range(5)]
    plain = [types.InlayHint(**hint_fields(line)) for line in range(5)]
    expected = json.dumps(default_converter().unstructure(types.InlayHintResponse(id=7, result=plain)))
    ours = converter()
    first = json.dumps(ours.unstructure(types.InlayHintResponse(id=7, result=cached)))
    again = json.dumps(ours.unstructure(types.InlayHintResponse(id=7, result=cached)))
    assert first == expected and again == expected
    assert "serialised" not in first
    assert all(hint.serialised is not None for hint in cached)
    # a hint the client sent back (resolved with its tooltip) is not cached: it is serialised as it is now
    resolved = types.InlayHint(**hint_fields(0))
    resolved.tooltip = types.MarkupContent(kind=types.MarkupKind.Markdown, value="**ModelTrace**")
    assert ours.unstructure(resolved) == default_converter().unstructure(resolved)
    assert ours.unstructure(resolved)["tooltip"]["value"] == "**ModelTrace**"
