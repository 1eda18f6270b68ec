"""The `modelTrace/status` notification: what the server is doing, for a client's status item.

Params: `{state: "idle" | "tracing" | "stale" | "error", message?: str, uri?: str}`, sent on every change.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from modeltrace.lsp import methods
from modeltrace.lsp.server import ModelTraceServer


class ServerState(str, Enum):
    IDLE = "idle"
    TRACING = "tracing"
    STALE = "stale"
    ERROR = "error"


def notify_status(
    ls: ModelTraceServer, state: ServerState, message: str | None = None, uri: str | None = None
) -> None:
    params: dict[str, Any] = {"state": state.value}
    if message is not None:
        params["message"] = message
    if uri is not None:
        params["uri"] = uri
    ls.protocol.notify(methods.STATUS, params)
