"""Hover on a traced line: a markdown table of the calls the line made, with their outputs' statistics.

The same tables are the tooltip of the line's inlay hint. Calls that produced the line's value come first;
calls nested on the same line (`self.up_proj(x)` inside `self.down_proj(...)`) are listed below them. With a
reference trace, the hover adds a "vs reference" table: each call's diff status and differences.
"""

from __future__ import annotations

from lsprotocol import types

from modeltrace.lsp.reference import reference_markdown
from modeltrace.lsp.server import ModelTraceServer
from modeltrace.trace.lines import LineEntry, format_number, format_shape, layer_label
from modeltrace.trace.records import LineRecord, ModuleCall


# NOTE: a line inside a 96-layer decoder makes 96 calls; past this many rows a table stops being readable.
MAX_ROWS = 40
_HEADER = "| call | class | shape | dtype | mean | std | min | max | NaN/Inf |\n|:--|:--|:--|:--|--:|--:|--:|--:|--:|"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _rows(record: ModuleCall) -> list[str]:
    call = f"`{_cell(layer_label(record))}`"
    if not record.outputs:
        return [f"| {call} | {_cell(record.class_name)} | (no tensor) | | | | | | |"]
    rows = []
    for summary in record.outputs:
        name = f"{call}[{_cell(summary.key)}]" if summary.key else call
        numbers = " | ".join(format_number(value) for value in (summary.mean, summary.std, summary.min, summary.max))
        rows.append(
            f"| {name} | {_cell(record.class_name)} | {format_shape(summary.shape)} | {summary.dtype} | {numbers} "
            f"| {summary.nan_count} / {summary.inf_count} |"
        )
    return rows


def calls_table(records: list[ModuleCall]) -> str:
    rows = [row for record in records for row in _rows(record)]
    shown = rows[:MAX_ROWS]
    text = _HEADER + "\n" + "\n".join(shown)
    if len(rows) > len(shown):
        text += f"\n\n… and {len(rows) - len(shown)} more outputs"
    return text


_VARIABLES_HEADER = (
    "| variable | run | shape | dtype | mean | std | min | max | NaN/Inf |\n|:--|--:|:--|:--|--:|--:|--:|--:|--:|"
)


def variables_table(variables: list[LineRecord]) -> str:
    """One row per variable per run of the line (line-level capture)."""
    rows = []
    for record in variables[:MAX_ROWS]:
        summary = record.tensor
        numbers = " | ".join(format_number(value) for value in (summary.mean, summary.std, summary.min, summary.max))
        rows.append(
            f"| `{_cell(record.name)}` | {record.call_index} | {format_shape(summary.shape)} | {summary.dtype} "
            f"| {numbers} | {summary.nan_count} / {summary.inf_count} |"
        )
    text = _VARIABLES_HEADER + "\n" + "\n".join(rows)
    if len(variables) > MAX_ROWS:
        text += f"\n\n… and {len(variables) - MAX_ROWS} more values"
    return text


def line_markdown(entry: LineEntry, stale: bool) -> str:
    """The hover text of a traced line: its calls, the calls nested in them, and its variables."""
    count = len(entry.calls)
    parts = [f"**ModelTrace** · {count} call{'s' if count != 1 else ''} on this line"]
    if stale:
        parts.append("_The file changed since this trace: trace again to refresh it._")
    if entry.calls:
        parts.append(calls_table(entry.calls))
    if entry.inner_calls:
        parts.append("**Inner calls**")
        parts.append(calls_table(entry.inner_calls))
    if entry.variables:
        parts.append("**Variables assigned on this line**")
        parts.append(variables_table(entry.variables))
    return "\n\n".join(parts)


def hover(ls: ModelTraceServer, params: types.HoverParams) -> types.Hover | None:
    path = ls.document_path(params.text_document.uri)
    hints = ls.store.files.get(path) if path else None
    traced = hints.by_line.get(params.position.line) if hints else None
    if hints is None or traced is None:
        return None
    loaded = ls.store.traces.get(hints.owner)
    text = hints.lines[params.position.line] if params.position.line < len(hints.lines) else ""
    markdown = line_markdown(traced.entry, bool(loaded and loaded.stale))
    compared = reference_markdown(ls, hints.owner, [*traced.entry.calls, *traced.entry.inner_calls])
    if compared is not None:
        markdown += "\n\n" + compared
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown),
        range=types.Range(
            start=types.Position(line=params.position.line, character=0),
            end=types.Position(
                line=params.position.line, character=ls.workspace.position_codec.client_num_units(text)
            ),
        ),
    )
