"""Per-line view of a trace: which module calls each source line made, and the one-line label shown for it.

A line that runs many times (the decoder layer's lines, once per layer) gets one entry aggregating all its
calls: `[1, 7, 64] float32 ×2`. The editor's inline hints use the compact form (`compact_*`): one short label
per assigned variable, `[1,4,7,16]`, the dtype only where it is not the model's, no call count, and never
longer than VS Code's default `editor.inlayHints.maximumLength` (a label is shortened by dropping whole parts,
never by cutting a shape). Where one line makes several calls
(`self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`) the label shows the call that runs last
on the line (the outermost one: what the line produced); the others stay available for hovers. Used by both
the CLI listing and the language server, so the terminal and the editor always say the same thing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum

from modeltrace.trace.records import LineRecord, ModuleCall, TensorSummary, Trace


class HintDetail(str, Enum):
    """How much a line label says: the `modelTrace.hintDetail` setting."""

    SHAPE = "shape"
    DTYPE = "dtype"
    STATS = "stats"


@dataclass(slots=True)
class LineEntry:
    """Everything traced on one source line: `calls` produced the line's value, `inner_calls` fed it, and
    `variables` are the tensors the line assigned to local variables (line-level capture)."""

    file: str
    line: int
    calls: list[ModuleCall] = field(default_factory=list)
    inner_calls: list[ModuleCall] = field(default_factory=list)
    variables: list[LineRecord] = field(default_factory=list)


def index_module_calls(trace: Trace) -> dict[str, dict[int, LineEntry]]:
    """Group the trace's module calls (by `called_at`) and line records by file and line:
    `{file: {line: LineEntry}}`."""
    by_line: dict[tuple[str, int], list[ModuleCall]] = defaultdict(list)
    for record in trace.modules:
        if record.called_at is not None:
            by_line[(record.called_at.file, record.called_at.line)].append(record)
    index: dict[str, dict[int, LineEntry]] = defaultdict(dict)
    for (file, line), records in by_line.items():
        last_site = max(_site(record) for record in records)
        entry = LineEntry(file=file, line=line)
        for record in records:
            (entry.calls if _site(record) == last_site else entry.inner_calls).append(record)
        index[file][line] = entry
    for variable in trace.lines:
        entries = index[variable.file]
        entry = entries.get(variable.line)
        if entry is None:
            entry = entries[variable.line] = LineEntry(file=variable.file, line=variable.line)
        entry.variables.append(variable)
    return dict(index)


def _site(record: ModuleCall) -> int:
    return record.call_site if record.call_site is not None else -1


def format_shape(shape: list[int]) -> str:
    return "[" + ", ".join(str(size) for size in shape) + "]"


def format_number(value: float | None) -> str:
    """Compact, fixed-width-ish number for labels and tables (`0.0123`, `-1.2e+05`, `nan`)."""
    if value is None:
        return "–"
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.2e}"


def format_tensor(summary: TensorSummary, detail: HintDetail) -> str:
    """`[1, 7, 64] float32` (with `μ… σ…` at stats detail) for one tensor leaf."""
    text = format_shape(summary.shape)
    if detail != HintDetail.SHAPE:
        text += f" {summary.dtype}"
    if detail == HintDetail.STATS and summary.mean is not None:
        text += f" μ={format_number(summary.mean)} σ={format_number(summary.std)}"
    if summary.nan_count or summary.inf_count:
        text += f" ⚠ {summary.nan_count} NaN {summary.inf_count} Inf"
    return text


def format_outputs(record: ModuleCall, detail: HintDetail) -> str:
    """All tensor outputs of one call, comma-separated; `(no tensor)` when it returned none."""
    if not record.outputs:
        return "(no tensor)"
    return ", ".join(format_tensor(summary, detail) for summary in record.outputs)


def line_label(entry: LineEntry, detail: HintDetail = HintDetail.DTYPE) -> str:
    """The label for a line: what its variables received when line capture ran (what the reader sees
    assigned), else what its module calls returned."""
    if entry.variables:
        return variables_label(entry.variables, detail)
    return calls_label(entry, detail)


def variables_label(variables: list[LineRecord], detail: HintDetail = HintDetail.DTYPE) -> str:
    """`[1, 4, 7, 16] float32 ×2` for one variable; `q: [1, 4, 7, 16]  k: [1, 2, 7, 16]` for several.

    Leaves of one variable (`cos, sin = …` are two variables; `position_embeddings.0` / `.1` one) are
    joined with commas; repeated runs of the line count once per signature.
    """
    by_variable: dict[str, dict[int, list[TensorSummary]]] = {}
    for record in variables:
        name = record.name.split(".", 1)[0]
        by_variable.setdefault(name, {}).setdefault(record.call_index, []).append(record.tensor)
    parts = []
    for name, runs in by_variable.items():
        signatures: dict[str, int] = {}
        for tensors in runs.values():
            text = ", ".join(format_tensor(tensor, detail) for tensor in tensors)
            signatures[text] = signatures.get(text, 0) + 1
        text = " | ".join(signature + (f" ×{count}" if count > 1 else "") for signature, count in signatures.items())
        parts.append(text if len(by_variable) == 1 else f"{name}: {text}")
    return "  ".join(parts)


def calls_label(entry: LineEntry, detail: HintDetail = HintDetail.DTYPE) -> str:
    """Distinct output signatures of the line's calls in first-seen order, each with `×N` when repeated.

    At stats detail, calls are not merged (their statistics differ); the first call's statistics are shown
    and the count tells how many calls the hover lists.
    """
    signature_detail = HintDetail.DTYPE if detail == HintDetail.STATS else detail
    groups: dict[str, list[ModuleCall]] = {}
    for record in entry.calls:
        groups.setdefault(format_outputs(record, signature_detail), []).append(record)
    parts = []
    for signature, records in groups.items():
        text = format_outputs(records[0], detail) if detail == HintDetail.STATS else signature
        parts.append(text + (f" ×{len(records)}" if len(records) > 1 else ""))
    return " | ".join(parts)


def layer_label(record: ModuleCall) -> str:
    """How a call is named in per-call tables: its module path, with the call number when a module ran twice."""
    name = record.path or "(root)"
    return f"{name} #{record.call_index}" if record.call_index else name


# ------------------------------------------------------------------------------------------------ compact labels

# NOTE: VS Code's default `editor.inlayHints.maximumLength`: a longer label is cut with "…" wherever the 43rd
# character falls, inside a shape too (`[1, 7, 1…`), which reads as a wrong shape.
HINT_MAX_LENGTH = 43
ELLIPSIS = "…"
# pylint's default `dummy-variables-rgx`: the names Python code uses for values it throws away (`_`, `_unused`).
DISCARDED_NAME = re.compile(r"^(_+|(_[a-zA-Z0-9_]*[a-zA-Z0-9]+?)|dummy|ignored_.*|unused_.*)$")


def is_discarded(name: str) -> bool:
    """`_`, `__`, `_unused`, `dummy`, ...: a name assigned only to be thrown away gets no hint."""
    return bool(DISCARDED_NAME.match(name))


def compact_shape(shape: list[int]) -> str:
    """`[1,4,7,16]`: the shape without spaces (it never wraps, and four of them fit in a hint)."""
    return "[" + ",".join(str(size) for size in shape) + "]"


def _compact_tensor(summary: TensorSummary, detail: HintDetail, model_dtype: str | None, level: int) -> str:
    """One tensor's compact text at a level of detail: 0 everything the setting asks for; 1 without statistics;
    2 the shape and a NaN/Inf warning only (what is dropped first when a label is too long)."""
    parts = [compact_shape(summary.shape)]
    if summary.nan_count or summary.inf_count:
        parts.append("⚠" + ("NaN" if summary.nan_count else "Inf"))
    if level < 2 and detail != HintDetail.SHAPE and summary.dtype != model_dtype:
        parts.append(summary.dtype)
    if level < 1 and detail == HintDetail.STATS and summary.mean is not None:
        parts.append(f"μ={format_number(summary.mean)} σ={format_number(summary.std)}")
    return " ".join(parts)


def fit_parts(parts: list[str], separator: str, budget: int) -> str | None:
    """`parts` joined by `separator` within `budget` characters; when they do not all fit, as many leading parts
    as fit followed by `…`; None when not even the first part fits. Parts are never cut."""
    joined = separator.join(parts)
    if len(joined) <= budget:
        return joined
    text = ""
    for part in parts:
        candidate = part if not text else text + separator + part
        if len(candidate) + len(separator) + len(ELLIPSIS) > budget:
            break
        text = candidate
    return text + separator + ELLIPSIS if text else None


def _leaf_texts(tensors: list[TensorSummary], detail: HintDetail, model_dtype: str | None, level: int) -> list[str]:
    return [_compact_tensor(tensor, detail, model_dtype, level) for tensor in tensors]


def compact_values(
    runs: list[list[TensorSummary]], detail: HintDetail, model_dtype: str | None, budget: int = HINT_MAX_LENGTH
) -> str:
    """The compact text of one value over the runs of its line: `[1,7,64]`; the leaves of a tuple comma-joined
    (`[1,7,16], [1,7,16]`); distinct shapes of different runs joined by ` | `. Never over `budget`: statistics
    and dtype are dropped first, then trailing leaves and runs (replaced by `…`), never part of a shape."""
    signatures: list[list[TensorSummary]] = []
    seen: set[str] = set()
    for tensors in runs:
        # NOTE: runs differ in their statistics (each layer's own); they count as one when shapes and dtypes agree,
        # and the first run's statistics are shown (the hover lists every run).
        key = ", ".join(_leaf_texts(tensors, detail, model_dtype, 1))
        if key not in seen:
            seen.add(key)
            signatures.append(tensors)
    if not signatures or not signatures[0]:
        return "(no tensor)"
    for level in (0, 1, 2):
        texts = dict.fromkeys(", ".join(_leaf_texts(tensors, detail, model_dtype, level)) for tensors in signatures)
        joined = " | ".join(texts)
        if len(joined) <= budget:
            return joined
    leaves = _leaf_texts(signatures[0], detail, model_dtype, 2)
    more_runs = len(signatures) > 1
    text = fit_parts(leaves, ", ", budget - (len(" | …") if more_runs else 0))
    if text is None:
        return f"{len(signatures[0][0].shape)}-d tensor"
    return text + (" | …" if more_runs and not text.endswith(ELLIPSIS) else "")


def compact_variables(variables: list[LineRecord]) -> dict[str, list[list[TensorSummary]]]:
    """The line's variables in the order first assigned: `{name: [tensors of run 0, tensors of run 1, ...]}`;
    the leaves of one value (`position_embeddings.0`, `.1`) belong to its name."""
    by_variable: dict[str, dict[int, list[TensorSummary]]] = {}
    for record in variables:
        name = record.name.split(".", 1)[0]
        by_variable.setdefault(name, {}).setdefault(record.call_index, []).append(record.tensor)
    return {name: list(runs.values()) for name, runs in by_variable.items()}


def compact_calls(entry: LineEntry, detail: HintDetail, model_dtype: str | None, budget: int = HINT_MAX_LENGTH) -> str:
    """The compact text of what the line's (outermost) module calls returned, over all their calls."""
    runs = [list(record.outputs) for record in entry.calls]
    return compact_values(runs, detail, model_dtype, budget) if any(runs) else "(no tensor)"


def run_count(entry: LineEntry) -> int:
    """How many times the line ran in the trace (its outermost calls, else its variables' runs)."""
    if entry.calls:
        return len(entry.calls)
    return len({record.call_index for record in entry.variables})
