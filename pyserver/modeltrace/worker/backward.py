"""Backward traces (`trace --backward`): the forward pass under capture, a loss, and its backward pass, with the
gradient of every module call's outputs and inputs and of every parameter.

The loss, in order of preference: the recipe's `build_loss(outputs)`; the model's own loss, with labels
synthesised for a language-model head (`LABEL_RULES`); else the default, half the mean square of every
differentiable floating output leaf (documented in docs/generation-and-training.md). Gradients are taken with tensor hooks: on each output
that requires grad, and on a view of each input made as the call starts, so that an input's gradient is the one
flowing through this call only (the residual that bypasses a block is not counted in the block's input gradient).
A NaN/Inf or all-zero gradient (or loss) is flagged, not raised. Runs inside the worker child.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import BackwardRecord, GradientCall, GradientFlag, ParameterGradient, TensorSummary
from modeltrace.worker.builds import MAX_EXACT_STATISTICS, STATISTICS_ELEMENTS
from modeltrace.worker.capture import ModuleCapture, forward_parameter_names, iter_tensor_leaves
from modeltrace.worker.generation import recipe_function
from modeltrace.worker.messages import TraceRequest
from modeltrace.worker.stats import PendingStats, summarize


# NOTE: heads whose own loss takes labels shaped like `input_ids` (next-token, masked and seq2seq language
# modelling): for these the labels are the input ids themselves. Other heads (classification: one label per
# row) get the default loss rather than labels guessed wrong.
LABEL_RULES = (
    ("ForCausalLM", "next-token prediction: labels are the input ids (the model shifts them)"),
    ("LMHeadModel", "next-token prediction: labels are the input ids (the model shifts them)"),
    ("ForMaskedLM", "masked language modelling: labels are the input ids"),
    ("ForConditionalGeneration", "sequence-to-sequence: labels are the input ids"),
)
DEFAULT_LOSS = "0.5 * mean(output ** 2), summed over every differentiable floating output leaf"


def synthesise_labels(model: nn.Module, kwargs: dict[str, Any]) -> str | None:
    """Add `labels` for a language-model head that takes them (see `LABEL_RULES`); returns why, or None."""
    name = type(model).__name__
    rule = next((reason for suffix, reason in LABEL_RULES if name.endswith(suffix)), None)
    input_ids = kwargs.get("input_ids")
    if rule is None or not isinstance(input_ids, torch.Tensor) or kwargs.get("labels") is not None:
        return None
    try:
        accepts = "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    if not accepts:
        return None
    kwargs["labels"] = input_ids.clone()
    return rule


def _is_differentiable(tensor: torch.Tensor) -> bool:
    return tensor.requires_grad and (tensor.is_floating_point() or tensor.is_complex())


class GradientRecorder:
    """Forward pre- and post-hooks on every module, with tensor hooks on what requires grad (see the module
    docstring); the record each hook belongs to is the capture's innermost running call."""

    def __init__(self, model: nn.Module, capture: ModuleCapture) -> None:
        self.model = model
        self.capture = capture
        self.pending = PendingStats()
        self.order = 0
        self.calls: dict[int, GradientCall] = {}
        self.parameter_orders: dict[str, int] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> GradientRecorder:
        for module in self.model.modules():
            self._handles.append(module.register_forward_pre_hook(self._before, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._after))
        for name, parameter in self.model.named_parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_hook(self._parameter_hook(name)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _call(self) -> GradientCall | None:
        stack = self.capture.call_stack
        if not stack:
            return None
        index = stack[-1]
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = GradientCall(index, -1)
        return call

    def _tap(self, tensor: Any, key: str, call: GradientCall) -> Any:
        if not isinstance(tensor, torch.Tensor) or not _is_differentiable(tensor):
            return tensor
        # NOTE: a view of its own: its gradient is what flows through this call only
        view = tensor.view_as(tensor)
        view.register_hook(self._gradient_hook(call, key, "inputs"))
        return view

    def _before(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        if not torch.is_grad_enabled():
            return None
        call = self._call()
        if call is None:
            return None
        names = forward_parameter_names(module)
        tapped_args = tuple(
            self._tap(value, names[position] if position < len(names) else f"args.{position}", call)
            for position, value in enumerate(args)
        )
        tapped_kwargs = {name: self._tap(value, name, call) for name, value in kwargs.items()}
        return tapped_args, tapped_kwargs

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        call = self._call()
        if call is None:
            return
        for key, tensor in iter_tensor_leaves(output):
            if _is_differentiable(tensor):
                tensor.register_hook(self._gradient_hook(call, key, "outputs"))

    def _gradient_hook(self, call: GradientCall, key: str, side: str):  # noqa: ANN202
        def hook(gradient: torch.Tensor) -> None:
            self.order += 1
            summary = summarize(gradient.detach(), key, self.pending)
            capture = self.capture
            if capture.full_tensors:
                capture._keep_unless_meta(gradient, summary, f"grad/{call.module_call}/{side}/{key}")
            getattr(call, side).append(summary)
            if side == "inputs" or call.backward_order < 0:
                call.backward_order = self.order

        return hook

    def _parameter_hook(self, name: str):  # noqa: ANN202
        def hook(gradient: torch.Tensor) -> None:
            self.order += 1
            self.parameter_orders[name] = self.order

        return hook


def compute_loss(model: nn.Module, outputs: Any, request: TraceRequest, labelled: str | None) -> tuple[Any, str, str]:
    """The loss to differentiate: `(loss, source, description)`; see the module docstring."""
    build_loss = recipe_function(request, "build_loss")
    if build_loss is not None:
        loss = build_loss(outputs)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ModelTraceError(
                f"{request.recipe}: build_loss(outputs) returned {type(loss).__name__}"
                f"{' of shape ' + str(list(loss.shape)) if isinstance(loss, torch.Tensor) else ''}; return one "
                "number as a tensor (a scalar)"
            )
        return loss.reshape(()), "recipe", "the recipe's build_loss(outputs)"
    own = outputs.get("loss") if isinstance(outputs, dict) else None
    if labelled and isinstance(own, torch.Tensor) and own.numel() == 1:
        return own.reshape(()), "model", f"{type(model).__name__}'s own loss ({labelled})"
    leaves = [tensor for _, tensor in iter_tensor_leaves(outputs) if _is_differentiable(tensor)]
    if not leaves:
        found = ", ".join(f"{key or 'output'} {tensor.dtype}" for key, tensor in iter_tensor_leaves(outputs)) or "none"
        raise ModelTraceError(
            f"--backward: no output of {type(model).__name__} is differentiable (tensor outputs: {found}); it needs a "
            "floating output computed from parameters that require grad, or a recipe build_loss(outputs)"
        )
    loss = sum(0.5 * tensor.float().pow(2).mean() for tensor in leaves)
    return loss, "default", DEFAULT_LOSS


def run_backward(built: Any, capture: ModuleCapture, request: TraceRequest) -> BackwardRecord:
    """Forward (under `capture`, already entered), loss and backward; returns what the trace adds."""
    model = built.model
    if built.shape_only or any(parameter.device.type == "meta" for parameter in model.parameters()):
        raise ModelTraceError(
            f"--backward needs real tensors; {type(model).__name__} is on the meta device (--shape-only): trace "
            "it without --shape-only (a shrunk config), or with --config of a small config.json"
        )
    labelled = synthesise_labels(model, built.kwargs) if recipe_function(request, "build_loss") is None else None
    with GradientRecorder(model, capture) as recorder:
        outputs = model(*built.args, **built.kwargs)
        loss, source, description = compute_loss(model, outputs, request, labelled)
        if not loss.requires_grad:
            raise ModelTraceError(
                f"--backward: the loss ({description}) does not depend on any parameter that requires grad"
            )
        loss.backward()
    recorder.pending.resolve()
    loss_summary = summarize(loss.detach(), "loss")
    parameters = []
    for name, parameter in model.named_parameters():
        gradient = parameter.grad
        summary, stride = _parameter_summary(gradient, name) if gradient is not None else (None, 1)
        if summary is not None and capture.full_tensors:
            capture._keep_unless_meta(gradient, summary, f"grad/parameters/{name}")
        parameters.append(
            ParameterGradient(name, parameter.requires_grad, summary, recorder.parameter_orders.get(name, -1), stride)
        )
    calls = sorted(recorder.calls.values(), key=lambda call: call.module_call)
    calls = [call for call in calls if call.outputs or call.inputs]
    return BackwardRecord(
        loss_summary, source, description, calls, parameters, gradient_flags(loss_summary, calls, parameters, capture)
    )


def _parameter_summary(gradient: torch.Tensor, name: str) -> tuple[TensorSummary, int]:
    """A parameter gradient's statistics; over evenly strided elements for a large one (the weights' own are
    runs of consecutive elements, `builds.statistics_sample`, read beside the forward; a gradient is read once,
    after the backward, where single elements reach more of it): the same elements for any tensor of its size,
    so two traces compare alike."""
    gradient = gradient.detach()
    count = gradient.numel()
    if count <= MAX_EXACT_STATISTICS:
        return summarize(gradient, name), 1
    stride = count // STATISTICS_ELEMENTS
    summary = summarize(gradient.reshape(-1)[::stride], name)
    summary.shape = list(gradient.shape)
    return summary, stride


def _problem(summary: TensorSummary) -> str | None:
    if summary.nan_count:
        return "nan"
    if summary.inf_count:
        return "inf"
    if summary.abs_max == 0:
        return "zero"
    return None


def gradient_flags(
    loss: TensorSummary, calls: list[GradientCall], parameters: list[ParameterGradient], capture: ModuleCapture
) -> list[GradientFlag]:
    """NaN/Inf or all-zero gradients (and a NaN/Inf loss), for hints and the report."""
    flags = []
    problem = _problem(loss)
    if problem in ("nan", "inf"):
        flags.append(GradientFlag(problem, "loss", "loss"))
    for call in calls:
        path = capture.records[call.module_call].path
        for side in (call.outputs, call.inputs):
            for summary in side:
                problem = _problem(summary)
                if problem is not None:
                    flags.append(GradientFlag(problem, "module", path, summary.key, call.module_call))
    for parameter in parameters:
        problem = _problem(parameter.summary) if parameter.summary is not None else None
        if problem is not None:
            flags.append(GradientFlag(problem, "parameter", parameter.name))
    return flags
