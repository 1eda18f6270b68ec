"""What a diff shows: the JSON of the CLI contract, the readable report, per-line statuses, the plot's series.

`to_json` follows DESIGN.md (`{"match", "first_divergence", "modules"}`, plus alignment details);
`render_text` is the terminal report; `line_marks` / `line_statuses` give each (file, line) of the candidate that
called a module the worst status of its calls and what decides it, for gutters; `plot_data` gives the max abs
difference of every module in the order the calls finished, and per numbered layer, for the plot of error per layer.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from modeltrace.diff.compare import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    DiffResult,
    Divergence,
    ModuleResult,
)
from modeltrace.trace.records import SourceLocation


STATUS_RANK = {NOT_COMPARED: 0, MATCH: 1, MISMATCH: 2, DIVERGENCE: 3}


def _number(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _location(location: SourceLocation | None) -> dict[str, Any] | None:
    return location.to_json() if location is not None else None


def _describe(loaded) -> dict[str, Any]:
    model = loaded.trace.model
    return {
        "path": str(loaded.path),
        "kind": loaded.kind,
        "class": model.get("class"),
        "modules": len(loaded.trace.modules),
        "full_tensors": loaded.tensors is not None,
    }


def module_json(module: ModuleResult) -> dict[str, Any]:
    record = module.candidate
    data: dict[str, Any] = {
        "path": record.path,
        "call_index": record.call_index,
        "class": record.class_name,
        "status": module.status,
        "check": module.check,
        "max_abs_diff": _number(module.max_abs_diff),
        "max_rel_diff": _number(module.max_rel_diff),
        "inputs": module.inputs,
        "outputs": module.outputs,
        "called_at": _location(record.called_at),
        "defined_at": _location(record.defined_at),
        "finish_order": record.finish_order,
    }
    if module.reason:
        data["reason"] = module.reason
    if module.atol is not None:
        data["atol"], data["rtol"] = module.atol, module.rtol
    if module.reference is not None and module.reference.path != record.path:
        data["reference_path"] = module.reference.path
    if module.status in (MISMATCH, DIVERGENCE):
        data["differing"] = [
            {"side": side, "key": leaf.key, "check": leaf.check, "reason": leaf.reason,
             "max_abs_diff": _number(leaf.max_abs_diff)}
            for side, leaves in (("inputs", module.input_leaves), ("outputs", module.output_leaves))
            for leaf in leaves
            if leaf.status == MISMATCH
        ][:16]
    return data


def _brief(module: ModuleResult | None) -> dict[str, Any] | None:
    if module is None:
        return None
    return {"path": module.candidate.path, "call_index": module.candidate.call_index,
            "called_at": _location(module.candidate.called_at)}


def divergence_json(divergence: Divergence | None) -> dict[str, Any] | None:
    if divergence is None:
        return None
    module = divergence.module
    record = module.candidate
    return {
        "path": record.path,
        "called_at": _location(record.called_at),
        "defined_at": _location(record.defined_at),
        "max_abs_diff": _number(module.max_abs_diff),
        "max_rel_diff": _number(module.max_rel_diff),
        "call_index": record.call_index,
        "class": record.class_name,
        "check": module.check,
        "inputs_match": divergence.inputs_match,
        "inferred": divergence.inferred,
        "reason": module.reason,
        "after": _brief(divergence.last_matching_child),
        "before": _brief(divergence.first_differing_child),
    }


def to_json(result: DiffResult) -> dict[str, Any]:
    """The `diff --format json` document."""
    alignment = result.alignment
    cand_records = result.candidate.trace.modules
    ref_records = result.reference.trace.modules
    counts: dict[str, int] = {}
    for module in result.modules:
        counts[module.status] = counts.get(module.status, 0) + 1
    return {
        "match": result.match,
        "first_divergence": divergence_json(result.first_divergence),
        "modules": [module_json(module) for module in result.modules],
        "reference": _describe(result.reference),
        "candidate": _describe(result.candidate),
        "tolerance": {
            "atol": DEFAULT_ATOL if result.options.atol is None else result.options.atol,
            "rtol": DEFAULT_RTOL if result.options.rtol is None else result.options.rtol,
            # rtol left to its default follows half precision (float16 1e-3, bfloat16 1.6e-2)
            "dtype_aware": result.options.rtol is None,
        },
        "counts": counts,
        "aligned": alignment.aligned_count,
        "unaligned": {
            "reference": [_label(ref_records[index]) for index in alignment.unaligned_reference],
            "candidate": [_label(cand_records[index]) for index in alignment.unaligned_candidate],
        },
        "pruned": [_label(cand_records[index]) for index in sorted(alignment.pruned)],
        "notes": result.notes,
    }


def _label(record) -> str:
    return record.path if record.call_index == 0 else f"{record.path}#{record.call_index}"


@dataclass(frozen=True, slots=True)
class LineMark:
    """What a gutter mark says about one source line of the candidate: the worst `status` of the calls made there
    (divergence > mismatch > match > not_compared), and `message`, its hover: the call that decides it (the
    layer) and how the line's other calls compare."""

    status: str
    message: str


def _call_name(module: ModuleResult) -> str:
    record = module.candidate
    return (record.path or "(root)") + (f"#{record.call_index}" if record.call_index else "")


def _mark_message(worst: ModuleResult, calls: list[ModuleResult]) -> str:
    name, difference = _call_name(worst), _format_number(worst.max_abs_diff)
    if worst.status == DIVERGENCE:
        text = f"First divergence from the reference: {name} ({worst.candidate.class_name}), max abs diff {difference}"
        text += "; its inputs match, its outputs differ" if worst.inputs != MISMATCH else ""
    elif worst.status == MISMATCH:
        text = f"Differs from the reference: {name}, max abs diff {difference}"
        if worst.inputs == MISMATCH:
            text += " (its inputs already differ: the difference comes from earlier)"
    elif worst.status == MATCH:
        text = f"Matches the reference: {name}, max abs diff {difference}"
    else:
        text = f"Not compared with the reference: {name}" + (f" ({worst.reason})" if worst.reason else "")
    others = [module for module in calls if module is not worst]
    if others:
        counts: dict[str, list[str]] = {}
        for module in others:
            counts.setdefault(module.status, []).append(_call_name(module))
        text += "; other calls on this line: " + ", ".join(
            f"{len(names)} {status.replace('_', ' ')} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
            for status, names in sorted(counts.items(), key=lambda item: -STATUS_RANK[item[0]])
        )
    return text


def line_marks(result: DiffResult) -> dict[tuple[str, int], LineMark]:
    """Per (file, 1-based line) of the candidate: the gutter mark of the line, decided by its worst call.

    When the diff drilled down to a line inside the diverging module (`first_divergence.line`, from line
    records), that line is marked as the divergence too: it is the edited line, not only the call site."""
    by_line: dict[tuple[str, int], list[ModuleResult]] = {}
    for module in result.modules:
        location = module.candidate.called_at
        if location is not None:
            by_line.setdefault((location.file, location.line), []).append(module)
    marks: dict[tuple[str, int], LineMark] = {}
    for key, calls in by_line.items():
        # NOTE: max keeps the first of equal ranks: calls are in call order, so layer 0 decides before layer 1.
        worst = max(calls, key=lambda module: STATUS_RANK[module.status])
        marks[key] = LineMark(worst.status, _mark_message(worst, calls))
    divergence = result.first_divergence
    drilled = getattr(divergence, "line", None) if divergence is not None else None
    if drilled is not None and getattr(drilled, "file", None) and getattr(drilled, "line", None):
        what = f"`{drilled.name}`" if getattr(drilled, "name", None) else "the value assigned here"
        difference = _format_number(getattr(drilled, "max_abs_diff", None))
        reason = getattr(drilled, "reason", None)
        marks[(drilled.file, int(drilled.line))] = LineMark(
            DIVERGENCE,
            f"First line that differs inside {_call_name(divergence.module)}: {what}, max abs diff {difference}"
            + (f" ({reason})" if reason else ""),
        )
    return marks


def line_statuses(result: DiffResult) -> dict[tuple[str, int], str]:
    """Per (file, line) of the candidate where modules are called: the worst status of the calls made there
    (divergence > mismatch > match > not_compared); see `line_marks` for the message of each."""
    return {key: mark.status for key, mark in line_marks(result).items()}


def line_statuses_for_file(result: DiffResult, file: str) -> dict[int, str]:
    return {line: status for (path, line), status in line_statuses(result).items() if path == file}


_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def plot_data(result: DiffResult) -> dict[str, Any]:
    """Series for the plot of error per module and per layer, in the order module calls finished.

    `points`: one per compared candidate module call ({"x", "path", "call_index", "max_abs_diff", "status",
    "check", "called_at"}); `layers`: the largest difference inside each numbered block (`layers.3`), in order;
    `atol`: the tolerance line; `first_divergence`: the x of the first divergence or None."""
    points = []
    layers: dict[str, dict[str, Any]] = {}
    divergence_x = None
    for module in result.finish_ordered():
        record = module.candidate
        if module.reference is None:
            continue
        x = len(points)
        if module.status == DIVERGENCE:
            divergence_x = x
        points.append({
            "x": x,
            "path": record.path,
            "call_index": record.call_index,
            "max_abs_diff": _number(module.max_abs_diff),
            "status": module.status,
            "check": module.check,
            "called_at": _location(record.called_at),
        })
        match = _LAYER.match(record.path)
        if match and module.max_abs_diff is not None:
            layer = layers.setdefault(match.group(1), {"layer": match.group(1), "max_abs_diff": 0.0,
                                                       "status": MATCH})
            layer["max_abs_diff"] = max(layer["max_abs_diff"], _number(module.max_abs_diff) or 0.0)
            if STATUS_RANK[module.status] > STATUS_RANK[layer["status"]]:
                layer["status"] = module.status
    atol = result.options.atol
    return {
        "points": points,
        "layers": list(layers.values()),
        "atol": atol if atol is not None else 1e-3,
        "first_divergence": divergence_x,
    }


# ------------------------------------------------------------------------------------------------- text


def _short(file: str | None) -> str:
    if not file:
        return "?"
    try:
        relative = os.path.relpath(file)
    except ValueError:
        return file
    return relative if not relative.startswith("..") else file


def _where(location: SourceLocation | None) -> str:
    return f"{_short(location.file)}:{location.line}" if location is not None else "-"


def _format_number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"


def _kind(loaded) -> str:
    what = "ModelTrace trace" if loaded.kind == "modeltrace" else "transformers debugger output"
    tensors = "full tensors" if loaded.tensors is not None else "statistics only"
    return f"{what} of {loaded.trace.model.get('class') or '?'}, {len(loaded.trace.modules)} module calls, {tensors}"


def render_text(result: DiffResult, verbose: bool = True) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"reference  {_short(str(result.reference.path))}  ({_kind(result.reference)})")
    add(f"candidate  {_short(str(result.candidate.path))}  ({_kind(result.candidate)})")
    options = result.options
    atol = "1e-3" if options.atol is None else f"{options.atol:g}"
    rtol = "0 (dtype-aware for half precision)" if options.rtol is None else f"{options.rtol:g}"
    alignment = result.alignment
    add(f"aligned    {alignment.aligned_count} of {len(result.modules)} candidate module calls; "
        f"atol {atol}, rtol {rtol}")
    for note in result.notes:
        add(f"note       {note}")
    root = next((module for module in result.modules if not module.candidate.path and module.reference), None)
    if root is not None and root.inputs == MISMATCH:
        add("note       the model's inputs differ: trace both with the same inputs (and seed) to compare them")
    add("")
    divergence = result.first_divergence
    if result.match:
        checks = [module.check for module in result.modules if module.status == MATCH]
        weaker = [f"{checks.count(name)} on {what}" for name, what in
                  (("statistics", "statistics only, a weaker check"), ("shape", "shapes and dtypes only"))
                  if checks.count(name)]
        add("MATCH: every compared module agrees within tolerance" + (f" ({'; '.join(weaker)})." if weaker else "."))
    elif divergence is not None:
        module = divergence.module
        record = module.candidate
        title = "FIRST DIVERGENCE" if divergence.inputs_match else "DIVERGENCE (inputs already differ)"
        label = record.path or "(root)"
        call = f", call {record.call_index}" if record.call_index else ""
        add(f"{title}: {label} ({record.class_name or '?'}{call})")
        add(f"  called at   {_where(record.called_at)}")
        add(f"  defined at  {_where(record.defined_at)}")
        if divergence.inferred:
            add("  inputs match; its outputs are not in the reference, but a module it calls receives differing "
                "inputs")
        else:
            inputs = "inputs match" if divergence.inputs_match else "inputs differ"
            check = {"full": "full tensors", "statistics": "statistics only, a weaker check",
                     "shape": "shapes only"}.get(module.check or "", "")
            add(f"  {inputs}, outputs differ: max abs diff {_format_number(module.max_abs_diff)}, "
                f"max rel diff {_format_number(module.max_rel_diff)}" + (f" ({check})" if check else ""))
            if module.reason:
                add(f"  {module.reason}")
        after, before = divergence.last_matching_child, divergence.first_differing_child
        if after is not None or before is not None:
            parts = []
            if after is not None:
                parts.append(f"after {after.candidate.path} (line {_line(after)}) still matches")
            if before is not None:
                parts.append(f"{before.candidate.path} (line {_line(before)}) already receives differing inputs")
            where = _between(after, before)
            add("  inside it: " + "; ".join(parts) + (f": look at {where}" if where else ""))
    unaligned_ref = [result.reference.trace.modules[index] for index in alignment.unaligned_reference]
    unaligned_cand = [result.candidate.trace.modules[index] for index in alignment.unaligned_candidate]
    if unaligned_ref:
        add(f"not aligned in the reference ({len(unaligned_ref)}): " + _listing(unaligned_ref))
    if unaligned_cand:
        add(f"not aligned in the candidate ({len(unaligned_cand)}): " + _listing(unaligned_cand))
    if alignment.pruned:
        add(f"pruned from the reference ({len(alignment.pruned)} module calls, do_prune_layers)")
    if verbose:
        add("")
        add(f"  {'status':<11} {'check':<10} {'max abs':>9}  {'module':<44} called at")
        for module in result.finish_ordered():
            if module.reference is None:
                continue
            record = module.candidate
            label = (record.path or "(root)") + (f" #{record.call_index}" if record.call_index else "")
            status = module.status.upper() if module.status == DIVERGENCE else module.status
            add(f"  {status:<11} {module.check or '-':<10} {_format_number(module.max_abs_diff):>9}  "
                f"{label:<44} {_where(record.called_at)}")
    counts: dict[str, int] = {}
    for module in result.modules:
        counts[module.status] = counts.get(module.status, 0) + 1
    add("")
    add(", ".join(f"{counts.get(status, 0)} {status.replace('_', ' ')}"
                  for status in (MATCH, DIVERGENCE, MISMATCH, NOT_COMPARED)))
    return "\n".join(lines) + "\n"


def _line(module: ModuleResult) -> str:
    location = module.candidate.called_at
    return str(location.line) if location is not None else "?"


def _between(after: ModuleResult | None, before: ModuleResult | None) -> str | None:
    first = after.candidate.called_at if after is not None else None
    last = before.candidate.called_at if before is not None else None
    if first is not None and last is not None and first.file == last.file:
        return f"{_short(first.file)} lines {first.line}-{last.line}"
    if first is not None:
        return f"{_short(first.file)} after line {first.line}"
    if last is not None:
        return f"{_short(last.file)} before line {last.line}"
    return None


def _listing(records, limit: int = 6) -> str:
    labels = [_label(record) or "(root)" for record in records[:limit]]
    more = f", … (+{len(records) - limit})" if len(records) > limit else ""
    return ", ".join(labels) + more
