"""The ModelTrace language server's wiring: every feature module's handlers registered on one server, and
`serve()` (stdio).

The server object and its state are in `context` (and `session`); each feature module takes them and none
imports another, so this is the one module that knows them all. Nothing here imports torch.
"""

from __future__ import annotations

import logging

from lsprotocol import types

from modeltrace.lsp import (
    codelens,
    commands,
    configuration,
    documents,
    hints,
    hover,
    methods,
    modular,
    plot,
    recorders,
)
from modeltrace.lsp.context import ModelTraceServer


def create_server() -> ModelTraceServer:
    """A server with every feature registered."""
    server = ModelTraceServer()
    server.feature(types.INITIALIZE)(configuration.initialize)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(configuration.did_change_configuration)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(documents.did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(documents.did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(documents.did_close)
    server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))(commands.trace_on_save)
    server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=True))(hints.inlay_hints)
    server.feature(types.INLAY_HINT_RESOLVE)(hints.resolve_inlay_hint)
    server.feature(types.TEXT_DOCUMENT_HOVER)(hover.hover)
    server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))(codelens.code_lenses)
    server.command(methods.TRACE)(commands.trace_command)
    server.command(methods.CLEAR)(commands.clear_command)
    server.command(methods.TRACE_GENERATE)(commands.trace_generate_command)
    server.command(methods.TRACE_BACKWARD)(commands.trace_backward_command)
    server.command(methods.LOAD_TRACE)(commands.load_trace_command)
    server.command(methods.SET_REFERENCE)(commands.set_reference_command)
    server.command(methods.PIN_REFERENCE)(commands.pin_reference_command)
    server.feature(methods.DIFF_PLOT)(plot.diff_plot)
    server.feature(types.TEXT_DOCUMENT_DIAGNOSTIC, recorders.DIAGNOSTIC_OPTIONS)(_document_diagnostics)
    server.feature(types.TEXT_DOCUMENT_CODE_ACTION, recorders.CODE_ACTION_OPTIONS)(recorders.code_actions)
    server.feature(types.SHUTDOWN)(_shutdown)
    return server


def _document_diagnostics(
    ls: ModelTraceServer, params: types.DocumentDiagnosticParams
) -> types.FullDocumentDiagnosticReport:
    """The pulled (static) diagnostics: recorder problems, and a modular file's out-of-date generated twin."""
    report = recorders.document_diagnostics(ls, params)
    report.items.extend(modular.staleness_diagnostics(ls, params.text_document.uri))
    return report


def _shutdown(ls: ModelTraceServer, params: None) -> None:
    ls.close_worker()
    # NOTE: pygls cancels the requests still awaiting the client while iterating over them, and each
    # cancellation removes its entry: with any pending (an unanswered refresh, say) shutdown fails with
    # "dictionary changed size during iteration". Cancelling them first, over a copy, avoids that.
    current = ls.protocol.msg_id
    for message_id, future in list(ls.protocol._request_futures.items()):
        if message_id != current and not future.done():
            future.cancel()


def serve() -> None:
    """Run the server over stdin/stdout until the client says `exit`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    # NOTE: pygls logs every message at INFO; its warnings are enough in the client's output channel.
    logging.getLogger("pygls").setLevel(logging.WARNING)
    create_server().start_io()
