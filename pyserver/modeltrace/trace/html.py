"""HTML views of a trace and of a diff, for Jupyter (`_repr_html_` of `modeltrace.load` and `modeltrace.diff`).

Self-contained markup: inline styles that read on light and dark notebook themes (VS Code's notebook view,
JupyterLab), no scripts, an inline SVG for the difference plot; every text from a trace is escaped. A trace
shows the annotated source of its modeling file (the listing `modeltrace show` prints, the annotations set
apart); a diff shows its verdict, the first divergence, the table of compared modules with the divergence
highlighted, and the largest difference per module in the order calls finished, on a log scale with the
tolerance.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from modeltrace.errors import ModelTraceError
from modeltrace.trace.listing import render_listing
from modeltrace.trace.records import Trace


_BOX = "font-family: var(--jp-code-font-family, monospace); font-size: 12px; line-height: 1.4;"
_COLOURS = {"match": "#2e7d32", "mismatch": "#ef6c00", "divergence": "#c62828", "not_compared": "#757575"}
_PLOT_WIDTH, _PLOT_HEIGHT, _MARGIN = 640, 180, 36


def trace_html(trace: Trace, path: Path | str | None = None) -> str:
    """The trace's header and its annotated listing (annotations after `#  ` in the listing, dimmed code)."""
    title = (
        f"<b>{html.escape(str(trace.model.get('class') or '?'))}</b>: {len(trace.modules)} module calls, "
        f"{len(trace.lines)} line records" + (f" &middot; <code>{html.escape(str(path))}</code>" if path else "")
    )
    try:
        listing = render_listing(trace)
    except ModelTraceError as error:
        return f"<div style='{_BOX}'>{title}<br><i>{html.escape(str(error))}</i></div>"
    rows = []
    for text in listing.splitlines():
        code, marker, annotation = text.partition("  # ")
        if marker and annotation:
            rows.append(
                f"<span style='opacity:0.75'>{html.escape(code)}</span>  "
                f"<span style='color:#1565c0;font-weight:600'># {html.escape(annotation)}</span>"
            )
        else:
            rows.append(f"<span style='opacity:0.6'>{html.escape(text)}</span>")
    return (
        f"<div style='{_BOX}'><div>{title}</div><pre style='margin:4px 0;max-height:480px;overflow:auto'>"
        + "\n".join(rows)
        + "</pre></div>"
    )


def diff_html(document: dict[str, Any]) -> str:
    """The verdict, the first divergence, the module table and the difference plot of a diff document."""
    parts = [f"<div style='{_BOX}'>", _verdict(document)]
    divergence = document.get("first_divergence")
    if divergence:
        parts.append(_divergence(divergence))
    parts.append(_plot(document))
    parts.append(_table(document))
    parts.append("</div>")
    return "".join(parts)


def _verdict(document: dict[str, Any]) -> str:
    tolerance = document.get("tolerance") or {}
    aligned = document.get("aligned")
    if document.get("match"):
        word, colour = "MATCH", _COLOURS["match"]
    elif document.get("first_divergence"):
        word, colour = "FIRST DIVERGENCE", _COLOURS["divergence"]
    elif document.get("verdict") == "not_comparable":
        word, colour = "NOT COMPARABLE", _COLOURS["mismatch"]
        details = document.get("not_comparable") or ""
        return (
            f"<div><span style='color:{colour};font-weight:700'>{word}</span> "
            f"<span style='opacity:0.8'>{html.escape(details)}</span></div>"
        )
    else:
        word, colour = "DIFFERENT", _COLOURS["mismatch"]
    details = f"aligned {aligned} module calls; atol {tolerance.get('atol')}, rtol {tolerance.get('rtol')}"
    return (
        f"<div><span style='color:{colour};font-weight:700'>{word}</span> "
        f"<span style='opacity:0.8'>{html.escape(details)}</span></div>"
    )


def _location(location: dict[str, Any] | None) -> str:
    if not location:
        return "–"
    return f"{html.escape(Path(str(location.get('file', ''))).name)}:{location.get('line')}"


def _divergence(divergence: dict[str, Any]) -> str:
    rows = [
        (
            "module",
            f"<b>{html.escape(divergence.get('path') or '(root)')}</b> ({html.escape(str(divergence.get('class') or '?'))})",
        ),
        ("called at", _location(divergence.get("called_at"))),
        ("defined at", _location(divergence.get("defined_at"))),
        ("max abs diff", _number(divergence.get("max_abs_diff"))),
    ]
    lines = divergence.get("lines")
    if lines:
        rows.append(("look at", f"{html.escape(Path(str(lines['file'])).name)} lines {lines['start']}–{lines['end']}"))
    line = divergence.get("line")
    if line:
        rows.append(
            (
                "first line that differs",
                f"{html.escape(Path(str(line['file'])).name)}:{line['line']}"
                + (f" (<code>{html.escape(str(line['name']))}</code>)" if line.get("name") else ""),
            )
        )
    built_at = divergence.get("built_at")
    if divergence.get("settings") and (built_at or any(item.get("assigned_at") for item in divergence["settings"])):
        # NOTE: a setting its `__init__` computes is located at its assignment, the others at the parent's line
        settings = ", ".join(
            f"{html.escape(str(item['name']))} {html.escape(str(item['reference']))} → "
            f"{html.escape(str(item['candidate']))}"
            + (f" ({_location(item['assigned_at'])})" if item.get("assigned_at") else "")
            for item in divergence["settings"]
        )
        passed = any(not item.get("assigned_at") for item in divergence["settings"])
        rows.append(("built differently", settings + (f" ({_location(built_at)})" if built_at and passed else "")))
    if divergence.get("reason"):
        rows.append(("why", html.escape(str(divergence["reason"]))))
    body = "".join(
        f"<tr><td style='padding:1px 8px 1px 0;opacity:0.7'>{name}</td><td>{value}</td></tr>" for name, value in rows
    )
    return (
        f"<table style='margin:6px 0;border-left:3px solid {_COLOURS['divergence']};padding-left:6px'>{body}</table>"
    )


def _number(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if isinstance(value, (int, float)) else html.escape(str(value))


def _table(document: dict[str, Any], limit: int = 200) -> str:
    modules = sorted(
        document.get("modules") or [],
        key=lambda item: (item.get("finish_order", -1) < 0, item.get("finish_order", -1)),
    )
    rows = []
    for module in modules[:limit]:
        status = str(module.get("status"))
        colour = _COLOURS.get(status, "inherit")
        highlight = f"background:{_COLOURS['divergence']}22;font-weight:600" if status == "divergence" else ""
        reference = module.get("reference_path")
        rows.append(
            f"<tr style='{highlight}'><td style='color:{colour}'>{html.escape(status.replace('_', ' '))}</td>"
            f"<td>{html.escape(module.get('path') or '(root)')}"
            + (f" <span style='opacity:0.6'>↔ {html.escape(reference or '(root)')}</span>" if reference else "")
            + f"</td><td style='text-align:right'>{_number(module.get('max_abs_diff'))}</td>"
            f"<td>{html.escape(str(module.get('check') or '–'))}</td>"
            f"<td>{_location(module.get('called_at'))}</td></tr>"
        )
    more = (
        f"<div style='opacity:0.7'>… {len(modules) - limit} more (the JSON document has them all)</div>"
        if len(modules) > limit
        else ""
    )
    header = (
        "<tr style='text-align:left;opacity:0.7'><th>status</th><th>module</th><th>max abs diff</th>"
        "<th>check</th><th>called at</th></tr>"
    )
    return (
        f"<details open><summary>{len(modules)} module calls, in the order they finished</summary>"
        f"<table style='border-collapse:collapse'>{header}{''.join(rows)}</table>{more}</details>"
    )


def _plot(document: dict[str, Any]) -> str:
    """Max abs difference per compared module in finishing order (log scale), the tolerance as a line, the
    first divergence marked."""
    modules = sorted(
        (
            item
            for item in document.get("modules") or []
            if item.get("max_abs_diff") is not None and item.get("finish_order", -1) >= 0
        ),
        key=lambda item: item["finish_order"],
    )
    if not modules:
        return ""
    values = [max(float(item["max_abs_diff"]), 1e-12) for item in modules]
    atol = float((document.get("tolerance") or {}).get("atol") or 1e-3)
    low = math.floor(math.log10(min(min(values), atol)))
    high = math.ceil(math.log10(max(max(values), atol))) + (1 if min(values) == max(values) else 0)
    span = max(high - low, 1)

    def y(value: float) -> float:
        return _MARGIN / 2 + (_PLOT_HEIGHT - _MARGIN) * (1 - (math.log10(value) - low) / span)

    step = (_PLOT_WIDTH - 2 * _MARGIN) / max(len(values) - 1, 1)
    points = " ".join(f"{_MARGIN + index * step:.1f},{y(value):.1f}" for index, value in enumerate(values))
    marks = []
    for index, (item, value) in enumerate(zip(modules, values)):
        colour = _COLOURS.get(str(item.get("status")), "#757575")
        radius = 4 if item.get("status") == "divergence" else 2
        marks.append(
            f"<circle cx='{_MARGIN + index * step:.1f}' cy='{y(value):.1f}' r='{radius}' fill='{colour}'>"
            f"<title>{html.escape(item.get('path') or '(root)')}: {value:.3g}</title></circle>"
        )
    ticks = "".join(
        f"<text x='2' y='{y(10.0**exponent) + 3:.1f}' font-size='9' fill='currentColor'>1e{exponent}</text>"
        for exponent in range(low, high + 1)
    )
    tolerance = (
        f"<line x1='{_MARGIN}' x2='{_PLOT_WIDTH - _MARGIN}' y1='{y(atol):.1f}' y2='{y(atol):.1f}' "
        f"stroke='#1565c0' stroke-dasharray='4 3'><title>atol {atol:g}</title></line>"
    )
    return (
        f"<svg width='{_PLOT_WIDTH}' height='{_PLOT_HEIGHT}' style='display:block;margin:6px 0' "
        f"role='img' aria-label='max abs difference per module'>{ticks}{tolerance}"
        f"<polyline points='{points}' fill='none' stroke='currentColor' stroke-opacity='0.35'/>{''.join(marks)}"
        "</svg>"
    )
