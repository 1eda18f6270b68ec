"""Generation steps and gradients in the editor: the extra inline hint and hover sections of a traced line.

A generation trace (`Trace generate`) labels each line by step: `prefill [1,7,64] · decode [1,1,64] ×3`. A
backward trace (`Trace forward + backward`) adds a gradient row when `modelTrace.gradientHints` is on:
`∇ [1,7,64] max|g| 0.41`, with `⚠ NaN`, `⚠ Inf` or `⚠ all zero` where the gradient is one. The hover lists the
calls per step and the gradients of each call (outputs, inputs, own parameters). No torch here.
"""

from __future__ import annotations

from modeltrace.trace.lines import (
    HINT_MAX_LENGTH,
    HintDetail,
    LineEntry,
    compact_shape,
    compact_values,
    format_number,
    layer_label,
)
from modeltrace.trace.records import GradientCall, ModuleCall, ParameterGradient, TensorSummary, Trace


GRADIENT_PREFIX = "∇ "
MAX_ROWS = 24


def step_label(trace: Trace, entry: LineEntry, model_dtype: str | None) -> str | None:
    """`prefill [1,7,64] · decode [1,1,64] ×3` (3 decode steps) for a line of a generation trace; else None."""
    if trace.generation is None or not entry.calls:
        return None
    prefill = [list(record.outputs) for record in entry.calls if trace.step_of(record.index) == 0]
    decode = [list(record.outputs) for record in entry.calls if trace.step_of(record.index) > 0]
    # NOTE: ×N counts decode steps, not calls: a layer's line runs once per layer in each step
    decode_steps = len({trace.step_of(record.index) for record in entry.calls} - {0})
    parts = []
    budget = (HINT_MAX_LENGTH - 12) // 2
    if prefill and any(prefill):
        parts.append("prefill " + compact_values(prefill, HintDetail.SHAPE, model_dtype, budget))
    if decode and any(decode):
        parts.append("decode " + compact_values(decode, HintDetail.SHAPE, model_dtype, budget) + f" ×{decode_steps}")
    return " · ".join(parts) or None


def _problem(summary: TensorSummary) -> str | None:
    if summary.nan_count:
        return "⚠ NaN"
    if summary.inf_count:
        return "⚠ Inf"
    if summary.abs_max == 0:
        return "⚠ all zero"
    return None


def gradient_calls(trace: Trace) -> dict[int, GradientCall]:
    return {call.module_call: call for call in trace.gradients.calls} if trace.gradients is not None else {}


def gradient_label(trace: Trace, entry: LineEntry) -> str | None:
    """`∇ [1,7,64] max|g| 0.41` (the line's last call's output gradient), flagged when NaN/Inf/all zero."""
    calls = gradient_calls(trace)
    gradients = [
        calls[record.index] for record in entry.calls if record.index in calls and calls[record.index].outputs
    ]
    if not gradients:
        return None
    flags = {
        problem
        for call in gradients
        for summary in (*call.outputs, *call.inputs)
        if (problem := _problem(summary)) is not None
    }
    first = gradients[-1].outputs[0]
    label = f"{GRADIENT_PREFIX}{compact_shape(first.shape)} max|g| {format_number(first.abs_max)}"
    return label + (" " + " ".join(sorted(flags)) if flags else "")


def _summary_cells(summaries: list[TensorSummary]) -> str:
    if not summaries:
        return "—"
    return "<br>".join(
        f"{summary.key or 'out'} {compact_shape(summary.shape)} max {format_number(summary.abs_max)} "
        f"mean {format_number(summary.mean)}" + (f" {problem}" if (problem := _problem(summary)) else "")
        for summary in summaries[:3]
    )


def _parameter_cells(parameters: list[ParameterGradient]) -> str:
    cells = []
    for parameter in parameters[:3]:
        name = parameter.name.rpartition(".")[2]
        if parameter.summary is None:
            cells.append(f"{name}: none ({'frozen' if not parameter.requires_grad else 'unused'})")
        else:
            problem = _problem(parameter.summary)
            cells.append(f"{name} max {format_number(parameter.summary.abs_max)}" + (f" {problem}" if problem else ""))
    return "<br>".join(cells) or "—"


def hover_markdown(trace: Trace, entry: LineEntry, show_gradients: bool) -> str | None:
    """The hover sections a generation or backward trace adds for a line (None for a plain forward trace)."""
    parts = []
    records: list[ModuleCall] = entry.calls
    if trace.generation is not None and records:
        rows = ["| step | call | output shape |", "|---|---|---|"]
        for record in records[:MAX_ROWS]:
            step = trace.step_of(record.index)
            name = "prefill" if step == 0 else f"decode {step}"
            shape = compact_shape(record.outputs[0].shape) if record.outputs else "(no tensor)"
            rows.append(f"| {name} | `{layer_label(record)}` | {shape} |")
        parts.append(
            f"**Generation steps** ({trace.generation.steps} steps: the prefill and "
            f"{trace.generation.steps - 1} decode steps)\n\n" + "\n".join(rows)
        )
    calls = gradient_calls(trace)
    if show_gradients and trace.gradients is not None and records:
        by_owner: dict[str, list[ParameterGradient]] = {}
        for parameter in trace.gradients.parameters:
            by_owner.setdefault(parameter.name.rpartition(".")[0], []).append(parameter)
        rows = ["| call | ∇ outputs | ∇ inputs | ∇ parameters |", "|---|---|---|---|"]
        for record in records[:MAX_ROWS]:
            call = calls.get(record.index)
            rows.append(
                f"| `{layer_label(record)}` | {_summary_cells(call.outputs if call else [])} | "
                f"{_summary_cells(call.inputs if call else [])} | "
                f"{_parameter_cells(by_owner.get(record.path, []))} |"
            )
        parts.append(
            f"**Gradients** (loss {format_number(trace.gradients.loss.mean)}: "
            f"{trace.gradients.loss_description})\n\n" + "\n".join(rows)
        )
    return "\n\n".join(parts) or None
