""" "Regenerate into a temporary folder and trace": the code action of a modular file whose generated twin is out of
date (or missing), when a transformers checkout holds the file (`modular/regenerate.py`).

The action runs `modelTrace.traceRegenerated [uri]`: the checkout's converter writes a fresh generated file beside a
copy of the model folder in a temporary folder (a child process, with the worker's Python: the model adder's
environment), the copy of the modular file is traced, and the client is asked to open that copy, whose lines carry
the hints. The user's generated file is never written. Both run the checkout's code, so only in trusted workspaces.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path

from modeltrace.errors import ModelTraceError
from modeltrace.lsp import methods
from modeltrace.lsp.commands import UNTRUSTED_MESSAGE, _refuse, _Refused, _traceable_path, run_trace
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.modular import staleness_diagnostics
from modeltrace.modular.regenerate import find_checkout, no_checkout_message, regenerate_copy
from modeltrace.modular.twins import is_modular_file

TITLE = "Regenerate into a temporary folder and trace"

logger = logging.getLogger(__name__)


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
            title=TITLE,
            kind=types.CodeActionKind.QuickFix,
            diagnostics=stale,
            command=types.Command(title=TITLE, command=methods.TRACE_REGENERATED, arguments=[uri]),
        )
    ]


async def trace_regenerated_command(ls: ModelTraceServer, *arguments: Any) -> dict[str, Any]:
    """`modelTrace.traceRegenerated [uri, model class?]`: regenerate the modular file's twin into a temporary
    folder, trace the copy there, and open it."""
    if not ls.workspace_trusted:
        return _refuse(ls, UNTRUSTED_MESSAGE, types.MessageType.Warning)
    uri = arguments[0] if arguments else None
    try:
        path = _traceable_path(ls, uri)
    except _Refused as refusal:
        return _refuse(ls, str(refusal))
    if not is_modular_file(path):
        return _refuse(ls, f"ModelTrace: {path}: regenerating is for a modular file (modular_<name>.py)")
    checkout = find_checkout(path)
    if checkout is None:
        return _refuse(ls, f"ModelTrace: {no_checkout_message(path)}")
    try:
        copy = await asyncio.to_thread(regenerate_copy, path, checkout, ls.worker().python)
    except ModelTraceError as error:
        return _refuse(ls, f"ModelTrace: {error}")
    copy_uri = from_fs_path(str(copy)) or str(copy)
    model = arguments[1] if len(arguments) > 1 and isinstance(arguments[1], str) and arguments[1] else None
    result = await run_trace(ls, copy_uri, str(copy), model)
    if result.get("ok"):
        await _open(ls, copy_uri)
    return {**result, "regenerated": str(copy)}


async def _open(ls: ModelTraceServer, uri: str) -> None:
    """Ask the client to show the traced copy (LSP `window/showDocument`), when it can."""
    window = ls.client_capabilities.window
    if window is None or window.show_document is None or not window.show_document.support:
        return
    try:
        await ls.window_show_document_async(types.ShowDocumentParams(uri=uri, take_focus=True))
    except Exception as error:  # noqa: BLE001 - the trace is done either way; the copy can be opened by hand
        logger.warning("the client did not open %s: %s", uri, error)
