"""Gradient diff of two backward traces (`trace --backward`): per module call and per parameter, and the first
divergence in backward order.

Module calls pair as the forward diff aligned them. Gradients compare by statistics, relative to their scale
(gradients are small numbers: an absolute tolerance would call anything a match). The first divergence is the
loss when the loss values differ; else the first module call, in the order its backward finished, whose output
gradients match and whose input gradients (through that call only) or own parameters' gradients differ: there the
backward pass of the candidate's code departs from the reference's (a `detach()`, a frozen parameter). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modeltrace.diff.steps import summaries_close
from modeltrace.trace.records import GradientCall, ModuleCall, ParameterGradient, TensorSummary


MATCH, MISMATCH, NONE = "match", "mismatch", "none"
# NOTE: relative to max |gradient| of both sides; per dtype, as the forward diff's relative errors.
GRADIENT_RELATIVE_TOLERANCE = {"float64": 1e-7, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}


@dataclass
class GradientResult:
    """One candidate module call's gradients against its reference counterpart's."""

    record: ModuleCall
    reference: ModuleCall | None
    backward_order: int
    outputs: str = NONE
    inputs: str = NONE
    parameters: str = NONE
    reasons: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return (
            MISMATCH
            if MISMATCH in (self.outputs, self.inputs, self.parameters)
            else (MATCH if MATCH in (self.outputs, self.inputs, self.parameters) else NONE)
        )

    def to_json(self, step: int | None = None) -> dict[str, Any]:
        data = {
            "path": self.record.path,
            "call_index": self.record.call_index,
            "index": self.record.index,
            "backward_order": self.backward_order,
            "status": self.status,
            "outputs": self.outputs,
            "inputs": self.inputs,
            "parameters": self.parameters,
            "reasons": self.reasons,
        }
        if step is not None:
            data["step"] = step
        return data


@dataclass
class GradientDivergence:
    """`kind` "loss" (the loss values differ) or "module" (`result`); `outputs_match` False for the fallback
    (no module whose output gradients match while its own differ: the first that differs at all)."""

    kind: str
    reason: str
    result: GradientResult | None = None
    outputs_match: bool = True

    def to_json(self) -> dict[str, Any]:
        record = self.result.record if self.result is not None else None

        def location(value: Any) -> dict[str, Any] | None:
            return value.to_json() if value is not None else None

        return {
            "kind": self.kind,
            "reason": self.reason,
            "outputs_match": self.outputs_match,
            "path": record.path if record else None,
            "class": record.class_name if record else None,
            "call_index": record.call_index if record else None,
            "called_at": location(record.called_at) if record else None,
            "defined_at": location(record.defined_at) if record else None,
        }


@dataclass
class GradientDiff:
    loss: str
    loss_reason: str | None
    modules: list[GradientResult]
    parameters: list[dict[str, Any]]
    first_divergence: GradientDivergence | None

    @property
    def match(self) -> bool:
        return self.first_divergence is None

    def to_json(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "loss": self.loss,
            "loss_reason": self.loss_reason,
            "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
            "modules": [module.to_json() for module in self.modules if module.status != NONE],
            "parameters": self.parameters,
        }


def _tolerance(summaries: list[TensorSummary]) -> float:
    dtypes = [summary.dtype.replace("torch.", "") for summary in summaries]
    return max((GRADIENT_RELATIVE_TOLERANCE.get(dtype, 1e-3) for dtype in dtypes), default=1e-3)


def _compare_leaves(
    reference: list[TensorSummary], candidate: list[TensorSummary], side: str, reasons: list[str]
) -> str:
    if not reference and not candidate:
        return NONE
    if not reference or not candidate:
        missing = "reference" if not reference else "candidate"
        reasons.append(f"{side}: no gradient in the {missing}")
        return MISMATCH
    by_key = {summary.key: summary for summary in reference}
    status = MATCH
    for position, summary in enumerate(candidate):
        other = by_key.get(summary.key) or (reference[position] if position < len(reference) else None)
        if other is None:
            continue
        if not summaries_close(other, summary, _tolerance([other, summary])):
            reasons.append(
                f"{side} {summary.key or 'gradient'}: abs-max {_number(other.abs_max)} in the reference, "
                f"{_number(summary.abs_max)} in the candidate (mean {_number(other.mean)} vs "
                f"{_number(summary.mean)})"
            )
            status = MISMATCH
    return status


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


def _parameters(
    reference: list[ParameterGradient], candidate: list[ParameterGradient], path_map: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Per candidate parameter: status and reason; and the mismatching parameters' reasons by owning module."""
    by_name = {parameter.name: parameter for parameter in reference}
    rows, by_owner = [], {}
    for parameter in candidate:
        owner = _owner(parameter.name)
        reference_owner = path_map.get(owner, owner)
        local = parameter.name[len(owner) + 1 :] if owner else parameter.name
        other = by_name.get(f"{reference_owner}.{local}" if reference_owner else local)
        if other is None:
            continue
        reason = None
        if (other.summary is None) != (parameter.summary is None):
            side, missing = ("candidate", parameter) if parameter.summary is None else ("reference", other)
            why = "requires_grad is False: frozen" if not missing.requires_grad else "not used by the loss"
            reason = f"{parameter.name}: no gradient in the {side} ({why})"
        elif (
            parameter.summary is not None
            and other.summary is not None
            and not summaries_close(other.summary, parameter.summary, _tolerance([other.summary, parameter.summary]))
        ):
            reason = (
                f"{parameter.name}: gradient abs-max {_number(other.summary.abs_max)} in the reference, "
                f"{_number(parameter.summary.abs_max)} in the candidate"
            )
        status = NONE if parameter.summary is None and other.summary is None else (MISMATCH if reason else MATCH)
        rows.append({"name": parameter.name, "reference_name": other.name, "status": status, "reason": reason})
        if reason:
            by_owner.setdefault(owner, []).append(reason)
    return rows, by_owner


def gradient_diff(result: Any) -> GradientDiff | None:
    """The gradient part of a diff result (None unless both traces are backward traces)."""
    reference_trace, candidate_trace = result.reference.trace, result.candidate.trace
    reference, candidate = reference_trace.gradients, candidate_trace.gradients
    if reference is None or candidate is None:
        return None
    reference_calls = {call.module_call: call for call in reference.calls}
    candidate_calls = {call.module_call: call for call in candidate.calls}
    reference_for = result.alignment.reference_for
    path_map: dict[str, str] = {}
    pairs: list[tuple[ModuleCall, ModuleCall | None]] = []
    for position, record in enumerate(candidate_trace.modules):
        ref_position = reference_for[position] if position < len(reference_for) else -1
        other = reference_trace.modules[ref_position] if ref_position >= 0 else None
        if other is not None:
            path_map.setdefault(record.path, other.path)
        pairs.append((record, other))
    parameter_rows, parameter_reasons = _parameters(reference.parameters, candidate.parameters, path_map)
    modules = []
    for record, other in pairs:
        mine = candidate_calls.get(record.index)
        theirs = reference_calls.get(other.index) if other is not None else None
        order = (
            mine.backward_order
            if mine is not None and mine.backward_order >= 0
            else (theirs.backward_order if theirs is not None else -1)
        )
        gradient = GradientResult(record, other, order)
        if other is not None:
            empty = GradientCall(-1, -1)
            gradient.outputs = _compare_leaves(
                (theirs or empty).outputs, (mine or empty).outputs, "output", gradient.reasons
            )
            gradient.inputs = _compare_leaves(
                (theirs or empty).inputs, (mine or empty).inputs, "input", gradient.reasons
            )
            if record.call_index == 0 and record.path in parameter_reasons:
                gradient.parameters = MISMATCH
                gradient.reasons.extend(parameter_reasons[record.path])
            elif record.call_index == 0 and any(
                _owner(row["name"]) == record.path and row["status"] == MATCH for row in parameter_rows
            ):
                gradient.parameters = MATCH
        modules.append(gradient)
    loss_status, loss_reason = MATCH, None
    if not summaries_close(reference.loss, candidate.loss, _tolerance([reference.loss, candidate.loss])):
        loss_status = MISMATCH
        losses = (
            f"both {candidate.loss_description}"
            if reference.loss_description == candidate.loss_description
            else f"{reference.loss_description} vs {candidate.loss_description}"
        )
        loss_reason = (
            f"the loss is {_number(reference.loss.mean)} in the reference, {_number(candidate.loss.mean)} "
            f"in the candidate ({losses})"
        )
    divergence = _first_divergence(modules, loss_reason)
    if divergence is not None and divergence.kind == "loss" and candidate.loss_source == "model":
        # NOTE: the model's own loss is computed in its forward: the root's call is where to look
        divergence.result = next((module for module in modules if module.record.path == ""), None)
    return GradientDiff(loss_status, loss_reason, modules, parameter_rows, divergence)


def _first_divergence(modules: list[GradientResult], loss_reason: str | None) -> GradientDivergence | None:
    if loss_reason is not None:
        return GradientDivergence("loss", loss_reason)
    ordered = sorted(
        (module for module in modules if module.reference is not None and module.backward_order >= 0),
        key=lambda module: module.backward_order,
    )
    for module in ordered:
        if module.outputs in (MATCH, NONE) and MISMATCH in (module.inputs, module.parameters):
            return GradientDivergence("module", "; ".join(module.reasons[:3]), module)
    for module in ordered:
        if module.status == MISMATCH:
            return GradientDivergence("module", "; ".join(module.reasons[:3]), module, outputs_match=False)
    return None
