"""`modelTrace/diffPlot`: the plot data of a document's latest diff against its reference (`reference`).

The client draws it (max abs difference per module, the tolerance, the first divergence); nothing is computed
here: the diff kept it in the session.
"""

from __future__ import annotations

from typing import Any

from modeltrace.lsp.context import ModelTraceServer


def diff_plot(ls: ModelTraceServer, params: Any) -> dict[str, Any] | None:
    """`modelTrace/diffPlot {uri}`: the plot data of the document's latest diff, or null."""
    uri = getattr(params, "uri", None)
    if uri is None and isinstance(params, dict):
        uri = params.get("uri")
    path = ls.uri_to_path(uri) if isinstance(uri, str) else None
    if path is None:
        return None
    session = ls.sessions.showing(path)
    diff = session.diff if session is not None else None
    if diff is None:
        return None
    return {**diff.plot, "reference": diff.reference, "divergence": diff.divergence}
