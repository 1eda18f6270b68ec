"""`initialize` and `workspace/didChangeConfiguration`: the client's settings (`settings`) and workspace trust.

They arrive as `initializationOptions: {settings: {...}, workspaceTrusted, traceDirectory}` and then as
`workspace/didChangeConfiguration` (`settings: {"modelTrace": {...}}`, which may also carry `workspaceTrusted`
once the user trusts the folder).
"""

from __future__ import annotations

from collections.abc import Mapping

from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer


def initialize(ls: ModelTraceServer, params: types.InitializeParams) -> None:
    """Read settings, trust and the trace folder from `initializationOptions`."""
    options = params.initialization_options if isinstance(params.initialization_options, Mapping) else {}
    values = dict(options.get("settings") or {})
    if options.get("traceDirectory"):
        values["traceDirectory"] = options["traceDirectory"]
    ls.apply_settings(ls.settings.updated(values))
    # NOTE: clients without a notion of trust (Neovim, Helix) send nothing: their user opened the folder.
    ls.workspace_trusted = options.get("workspaceTrusted", True) is not False


def did_change_configuration(ls: ModelTraceServer, params: types.DidChangeConfigurationParams) -> None:
    """Apply `{"modelTrace": {...}}` (or the bare section); a new hint detail redraws the hints."""
    settings = params.settings if isinstance(params.settings, Mapping) else {}
    values = settings.get("modelTrace", settings)
    if not isinstance(values, Mapping):
        return
    if "workspaceTrusted" in values:
        ls.workspace_trusted = values["workspaceTrusted"] is not False
    ls.apply_settings(ls.settings.updated(values))
    # NOTE: a workspace trusted just now, another interpreter (a new worker) or the setting turned on: the model
    # files already open start the worker as opening them would have
    ls.start_worker_ahead()
