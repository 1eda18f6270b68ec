"""The ModelTrace language server's wiring: every feature module's handlers registered on one server, and
`serve()` (stdio).

The server object and its state are in `context` (and `session`); each feature module takes them and none
imports another, so this is the one module that knows them all. Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError

from modeltrace.lsp import (
    codelens,
    commands,
    configuration,
    documents,
    hints,
    hover,
    methods,
    plot,
    recorders,
)
from modeltrace.errors import ModelTraceError
from modeltrace.lsp.context import ModelTraceServer


logger = logging.getLogger(__name__)


def one_line_error(name: str, error: Exception) -> JsonRpcException:
    """The answer to a request whose handler raised `error`: one line, no traceback (that goes to the log).

    A `ModelTraceError` (a bad file, a bad argument) is the request failing as the user asked it
    (`RequestFailed`); anything else is a bug in ModelTrace (`InternalError`), named by its type and first line.
    """
    if isinstance(error, ModelTraceError):
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return JsonRpcException(
            message if message.startswith("ModelTrace") else f"ModelTrace: {message}",
            code=types.LSPErrorCodes.RequestFailed,
        )
    logger.error("%s failed inside ModelTrace", name, exc_info=error)
    first_line = next(iter(str(error).strip().splitlines()), "")
    return JsonRpcInternalError(f"ModelTrace: internal error in {name} ({type(error).__name__}: {first_line[:200]})")


def answered(name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
    """`handler` (a request's) with its failures answered by `one_line_error`, never a traceback."""
    if asyncio.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def answer_async(*arguments: Any) -> Any:
            try:
                return await handler(*arguments)
            except JsonRpcException:
                raise
            except Exception as error:  # noqa: BLE001 - every failure becomes one line
                raise one_line_error(name, error) from None

        return answer_async

    @functools.wraps(handler)
    def answer(*arguments: Any) -> Any:
        try:
            return handler(*arguments)
        except JsonRpcException:
            raise
        except Exception as error:  # noqa: BLE001 - every failure becomes one line
            raise one_line_error(name, error) from None

    return answer


def create_server() -> ModelTraceServer:
    """A server with every feature registered; each request's failure is answered in one line (`answered`)."""
    server = ModelTraceServer()
    server.feature(types.INITIALIZE)(configuration.initialize)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(configuration.did_change_configuration)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(documents.did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(documents.did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(documents.did_close)
    server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)(documents.did_change_watched_files)
    server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))(commands.trace_on_save)
    server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=True))(
        answered(types.TEXT_DOCUMENT_INLAY_HINT, hints.inlay_hints)
    )
    server.feature(types.INLAY_HINT_RESOLVE)(answered(types.INLAY_HINT_RESOLVE, hints.resolve_inlay_hint))
    server.feature(types.TEXT_DOCUMENT_HOVER)(answered(types.TEXT_DOCUMENT_HOVER, hover.hover))
    server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))(
        answered(types.TEXT_DOCUMENT_CODE_LENS, codelens.code_lenses)
    )
    server.command(methods.TRACE)(answered(methods.TRACE, commands.trace_command))
    server.command(methods.CLEAR)(answered(methods.CLEAR, commands.clear_command))
    server.command(methods.TRACE_GENERATE)(answered(methods.TRACE_GENERATE, commands.trace_generate_command))
    server.command(methods.TRACE_BACKWARD)(answered(methods.TRACE_BACKWARD, commands.trace_backward_command))
    server.command(methods.LOAD_TRACE)(answered(methods.LOAD_TRACE, commands.load_trace_command))
    server.command(methods.SET_REFERENCE)(answered(methods.SET_REFERENCE, commands.set_reference_command))
    server.command(methods.PIN_REFERENCE)(answered(methods.PIN_REFERENCE, commands.pin_reference_command))
    server.command(methods.TRACE_REGENERATED)(answered(methods.TRACE_REGENERATED, commands.trace_regenerated_command))
    server.command(methods.CREATE_RECIPE)(answered(methods.CREATE_RECIPE, commands.create_recipe_command))
    server.command(methods.FULL_SIZES)(answered(methods.FULL_SIZES, commands.full_sizes_command))
    server.feature(methods.DIFF_PLOT)(answered(methods.DIFF_PLOT, plot.diff_plot))
    server.feature(types.TEXT_DOCUMENT_DIAGNOSTIC, recorders.DIAGNOSTIC_OPTIONS)(
        answered(types.TEXT_DOCUMENT_DIAGNOSTIC, recorders.document_diagnostics)
    )
    server.feature(types.TEXT_DOCUMENT_CODE_ACTION, recorders.CODE_ACTION_OPTIONS)(
        answered(types.TEXT_DOCUMENT_CODE_ACTION, recorders.code_actions)
    )
    server.feature(types.SHUTDOWN)(_shutdown)
    return server


def _shutdown(ls: ModelTraceServer, params: None) -> None:
    ls.close_worker()
    # NOTE: the folders modular files were regenerated into are ModelTrace's own: none outlives the server
    ls.regenerated.clear()
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
    logging.getLogger("pygls.protocol.json_rpc").addFilter(drop_routine_cancels)
    create_server().start_io()


def drop_routine_cancels(record: logging.LogRecord) -> bool:
    """False for pygls' warning about a `$/cancelRequest` of a request already answered: VS Code cancels inlay
    hint, code lens and hover requests as the user scrolls and types, and most were answered before the cancel
    came (dozens per minute in the log, none a problem)."""
    return not str(record.msg).startswith("Cancel notification for unknown message id")
