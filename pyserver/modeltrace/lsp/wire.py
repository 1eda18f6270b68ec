"""How the server's answers are turned into JSON: pygls's converter, with inlay hints serialised once.

A whole-file `textDocument/inlayHint` answer is ~1,500 hints; turning each `InlayHint` object into its JSON
dict (cattrs) took about as long as building them, on every request, although a line's hints only change
with the text (`store.FileHints.hint_cache` keeps them until then). A `CachedInlayHint` keeps the dict it was
serialised to and hands it back on the next request; any other `InlayHint` is serialised as pygls does.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs
from lsprotocol import types
from pygls.protocol import default_converter


@attrs.define(eq=False)
class CachedInlayHint(types.InlayHint):
    """An inlay hint that is never changed once built, so that its JSON can be kept with it."""

    serialised: dict[str, Any] | None = attrs.field(default=None, init=False, repr=False)


def converter() -> cattrs.Converter:
    """pygls's converter, serialising a `CachedInlayHint` once (for `LanguageServer(converter_factory=...)`)."""
    made = default_converter()
    plain = made.get_unstructure_hook(types.InlayHint)

    def unstructure_hint(hint: types.InlayHint) -> dict[str, Any]:
        if type(hint) is not CachedInlayHint:
            return plain(hint)
        if hint.serialised is None:
            hint.serialised = plain(hint)
        return hint.serialised

    # NOTE: registered before any answer is serialised: cattrs builds the hooks of the answers that hold
    # hints (a list of them, the response message) on first use, from the hook registered for `InlayHint`.
    made.register_unstructure_hook(types.InlayHint, unstructure_hint)
    return made
