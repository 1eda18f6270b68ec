"""The markdown of a traced line (its hover, and the tooltip of its inlay hints): what the line assigned first,
then the module calls it made, with statistics.

The first table holds the values the line assigns (line capture), the names the inline hints show, so its
first row is the shape the hint shows; then the calls that produced the line's value; then calls nested on the
same line (`self.up_proj(x)` inside `self.down_proj(...)`). Shapes are written without spaces (`[1,7,4,16]`)
so a narrow hover never wraps them. With a reference trace, the hover adds a "vs reference" table: each call's
diff status and differences. Plain text from plain data: no server here.
"""

from __future__ import annotations

from pathlib import Path

from modeltrace.lsp.session import DocumentDiff
from modeltrace.trace.lines import LineEntry, compact_shape, format_number, is_discarded, layer_label, run_count
from modeltrace.trace.records import LineRecord, ModuleCall, TensorSummary


# NOTE: a line inside a 96-layer decoder makes 96 calls; past this many rows a table stops being readable.
MAX_ROWS = 40


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _has_bad_values(summaries: list[TensorSummary]) -> bool:
    return any(summary.nan_count or summary.inf_count for summary in summaries)


def _table(header: list[str], rows: list[list[str]], more: int, what: str) -> str:
    align = ["--:" if name in ("run", "mean", "std", "min", "max", "NaN/Inf") else ":--" for name in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(lines)
    if more:
        text += f"\n\n… and {more} more {what}"
    return text


def _statistics(summary: TensorSummary, bad_values: bool) -> list[str]:
    cells = [format_number(value) for value in (summary.mean, summary.std, summary.min, summary.max)]
    return cells + ([f"{summary.nan_count} / {summary.inf_count}"] if bad_values else [])


def _ranks(summary: TensorSummary) -> str:
    """How the ranks of a tensor-parallel trace held the tensor: each rank's local shape of a shard."""
    placement = summary.placement
    if not placement:
        return ""
    if placement.get("kind") == "shard":
        shards = ", ".join(
            f"rank {rank} {compact_shape(shape)}" for rank, shape in enumerate(placement.get("local_shapes") or [])
        )
        return _cell(f" · sharded on dim {placement.get('dim')}: {shards}")
    return _cell(f" · whole on each of {placement.get('ranks')} ranks")


def calls_table(records: list[ModuleCall]) -> str:
    """One row per output of each call: `call` (module path and class), shape, dtype, statistics."""
    outputs = [(record, summary) for record in records for summary in (record.outputs or [None])]
    shown = outputs[:MAX_ROWS]
    bad_values = _has_bad_values([summary for _, summary in shown if summary is not None])
    header = ["call", "shape", "dtype", "mean", "std", "min", "max"] + (["NaN/Inf"] if bad_values else [])
    rows = []
    for record, summary in shown:
        call = f"`{_cell(layer_label(record))}`"
        if summary is None:
            rows.append([f"{call} {_cell(record.class_name)}", "(no tensor)", *[""] * (len(header) - 2)])
            continue
        name = f"{call}[{_cell(summary.key)}]" if summary.key else call
        ran_on = f" on {_cell(record.device)}" if record.device else ""  # a model spread over devices
        rows.append(
            [
                f"{name} {_cell(record.class_name)}{ran_on}",
                compact_shape(summary.shape) + _ranks(summary),
                summary.dtype,
                *_statistics(summary, bad_values),
            ]
        )
    return _table(header, rows, len(outputs) - len(shown), "outputs")


def variables_table(variables: list[LineRecord]) -> str:
    """One row per value the line assigned, per run of the line (line-level capture); the names the inline hints
    show come first (in the order assigned), discarded ones (`_`) last."""
    ordered = sorted(variables, key=lambda record: is_discarded(record.name.split(".", 1)[0]))
    shown = ordered[:MAX_ROWS]
    bad_values = _has_bad_values([record.tensor for record in shown])
    header = ["assigned", "run", "shape", "dtype", "mean", "std", "min", "max"] + (["NaN/Inf"] if bad_values else [])
    rows = [
        [
            f"`{_cell(record.name)}`",
            str(record.call_index),
            compact_shape(record.tensor.shape),
            record.tensor.dtype,
            *_statistics(record.tensor, bad_values),
        ]
        for record in shown
    ]
    return _table(header, rows, len(variables) - len(shown), "values")


def line_markdown(
    entry: LineEntry, stale: bool, ran: str | None = None, full_size: tuple[str, str] | None = None
) -> str:
    """The hover text of a traced line: what ran (`ran`, `trace/ran.py`), its assigned values, its calls, the calls
    nested in them; `full_size`: (the line's label at full size, what that run was) when the hints show it."""
    runs = run_count(entry)
    title = "**ModelTrace**"
    if runs > 1:
        # NOTE: the inline hints leave the count out (it costs room every line would repeat); it is said here.
        title += (
            f" · ×{runs}: this line ran {runs} times in the traced forward (once per call of its function, "
            "for example once per layer); each run is a row below"
        )
    parts = [title]
    if ran:
        parts.append(f"Ran: {ran}")
    if full_size is not None:
        label, full_ran = full_size
        parts.append(
            f"The hints show the full-size model, marked `(full)`: `{label}` ({full_ran}). "
            "The values below are the traced run's."
        )
    elif ran:
        parts.append("The hints show the traced run's sizes.")
    if stale:
        parts.append("_The file changed since this trace: trace again to refresh it._")
    if entry.variables:
        parts.append("**Assigned on this line**")
        parts.append(variables_table(entry.variables))
    if entry.calls:
        count = len(entry.calls)
        parts.append(f"**Module call{'s' if count != 1 else ''} on this line** ({count})")
        parts.append(calls_table(entry.calls))
    if entry.inner_calls:
        parts.append("**Inner calls**")
        parts.append(calls_table(entry.inner_calls))
    return "\n\n".join(parts)


def reference_markdown(diff: DocumentDiff, calls: list[ModuleCall]) -> str:
    """The hover's "vs reference" section for a line's calls, or "" when none was compared."""
    # NOTE: imported here: `modeltrace.diff` loads numpy (~14 MB), which the server needs only once a
    # reference is set (and a diff exists to show).
    from modeltrace.diff import DIVERGENCE

    rows = []
    for record in calls:
        compared = diff.calls.get((record.path, record.call_index))
        if compared is None:
            continue
        status = "**first divergence**" if compared.status == DIVERGENCE else compared.status.replace("_", " ")
        name = record.path if record.call_index == 0 else f"{record.path}#{record.call_index}"
        if compared.reference_path is not None:
            counterpart = f"`{compared.reference_path or '(root)'}`"
            counterpart += f" ({compared.aligned_by})" if compared.aligned_by else ""
        else:
            counterpart = "same path"
        rows.append(
            f"| `{name}` | {counterpart} | {status} | {format_number(compared.max_abs_diff)} "
            f"| {format_number(compared.max_rel_diff)} | {compared.check or '–'} |"
        )
    if not rows:
        return ""
    header = "| call | reference | status | max abs diff | max rel diff | check |\n|:--|:--|:--|--:|--:|:--|"
    # NOTE: a call compared by statistics says why: the notes name the modules whose tensors were not stored
    why = (
        [f"\n\n_{note}_" for note in diff.notes if "not stored in full" in note]
        if any("| statistics |" in row for row in rows)
        else []
    )
    return f"**vs reference** `{Path(diff.reference).name}`\n\n" + header + "\n" + "\n".join(rows) + "".join(why)
