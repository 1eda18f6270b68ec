"""The gradients a backward trace records (`trace --backward`) are torch's own: each recorded statistic is
checked against the `.grad` that autograd gives, on the same model, inputs and loss, outside the worker.

Two recipes: one with a shared parameter (the head's weight is the embedding's) and a module called twice, one
with a detached residual (a module whose output only reaches the loss through `.detach()` gets no gradient,
and neither do its parameters). On the autograd side, module outputs keep their gradient with `retain_grad()`;
an input's gradient through one call only (the trace's definition, `GradientCall`) is the `.grad` of a view
of the input made for that call, so that a residual bypassing the call is not counted in it.
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from modeltrace.trace.records import TensorSummary, Trace
from modeltrace.trace.storage import read_trace
from modeltrace.worker.building.recipe import build_from_recipe
from modeltrace.worker.capture import forward_parameter_names
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

SEED = 0
# NOTE: the gradients are the same float32 numbers on both sides (same CPU kernels, same order), so min, max,
# abs_max, the positive fraction and the counts are compared exactly; mean and std are sums taken in another
# order (the trace's kernels, torch's float64 reductions here): they agree to 1e-6 of the gradient's largest
# magnitude (a mean that cancels to ~0, as a softmax's gradient does, has no relative precision of its own).
TOLERANCE = 1e-6

TIED_RECIPE = '''
"""A shared parameter (the head's weight is the embedding's) and a module called twice."""
import torch
from torch import nn


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.mix = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, used by two modules

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        hidden = hidden + torch.tanh(self.mix(hidden))
        hidden = hidden + torch.tanh(self.mix(hidden))  # the same module, a second call
        return self.head(self.norm(hidden))


def build_model() -> nn.Module:
    return Tied()


def build_inputs(model: nn.Module) -> dict:
    return {"input_ids": torch.randint(0, 11, (2, 5))}


def build_loss(outputs: torch.Tensor) -> torch.Tensor:
    return outputs.logsumexp(-1).mean() - outputs[..., 3].mean()
'''

DETACHED_RECIPE = '''
"""A residual whose skip path is detached, and a module whose output reaches the loss only detached."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.detach() + torch.relu(self.inner(hidden))  # the residual, detached


class Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.block = Block()
        self.side = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.block(self.first(x))
        return self.head(hidden + self.side(x).detach())  # `side` gets no gradient


def build_model() -> nn.Module:
    return Detached()


def build_inputs(model: nn.Module) -> dict:
    return {"x": torch.randn(3, 8)}


def build_loss(outputs: torch.Tensor) -> torch.Tensor:
    return (outputs * torch.arange(4.0)).sum() + 0.5 * outputs.pow(2).mean()
'''


@dataclass
class AutogradCall:
    """One module call on the autograd side: the tensors whose `.grad` backward fills."""

    path: str
    call_index: int
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class AutogradRun:
    """The model after `loss.backward()`, with its calls in the order they started, and the loss."""

    model: nn.Module
    calls: list[AutogradCall]
    loss: float


def _autograd_run(recipe: Path) -> AutogradRun:
    """The recipe's model, inputs and loss, built as the worker builds them (same seed), and backward in plain
    torch: forward hooks keep each call's output (`retain_grad`) and a view of each input for that call."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        built = build_from_recipe(recipe, SEED)
    finally:  # NOTE: the worker's builder registers the recipe as a module: this process forgets it after
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            if getattr(sys.modules[name], "__file__", None) == str(recipe.resolve()):
                del sys.modules[name]
    build_loss = runpy.run_path(str(recipe))["build_loss"]
    names = {module: name for name, module in built.model.named_modules()}
    seen: dict[str, int] = {}
    calls: list[AutogradCall] = []
    stack: list[AutogradCall] = []

    def tap(call: AutogradCall, key: str, value: Any) -> Any:
        if not (isinstance(value, torch.Tensor) and value.requires_grad):
            return value
        view = value.view_as(value)  # NOTE: this call's own input: its .grad is what flows through this call
        view.retain_grad()
        call.inputs[key] = view
        return view

    def before(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        path = names[module]
        call = AutogradCall(path, seen.get(path, 0))
        seen[path] = call.call_index + 1
        calls.append(call)
        stack.append(call)
        parameter_names = forward_parameter_names(module)
        tapped_args = tuple(tap(call, parameter_names[position], value) for position, value in enumerate(args))
        return tapped_args, {key: tap(call, key, value) for key, value in kwargs.items()}

    def after(module: nn.Module, args: tuple, output: Any) -> None:
        call = stack.pop()
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.retain_grad()
            call.outputs[""] = output

    handles = []
    for module in built.model.modules():
        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after))
    try:
        loss = build_loss(built.model(*built.args, **built.kwargs))
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return AutogradRun(built.model, calls, loss.item())


def _traced(worker: WorkerClient, tmp_path: Path, name: str, text: str) -> tuple[Path, Trace]:
    recipe = tmp_path / f"recipe_{name}.py"
    recipe.write_text(text)
    request = TraceRequest(
        file=str(recipe), recipe=str(recipe), out=str(tmp_path / f"{name}.mtrace"), backward=True, seed=SEED
    )
    return recipe, read_trace(Path(worker.trace(request).trace))


def _assert_statistics(summary: TensorSummary, gradient: torch.Tensor, where: str) -> None:
    """The recorded statistics of one gradient against torch's own, computed in float64."""
    values = gradient.detach().double().reshape(-1)
    assert summary.shape == list(gradient.shape), where
    assert summary.dtype == "float32" and gradient.dtype == torch.float32, where
    assert (summary.nan_count, summary.inf_count) == (0, 0), where
    assert summary.min == values.min().item() and summary.max == values.max().item(), where
    assert summary.abs_max == values.abs().max().item(), where
    assert summary.positive_fraction == (values > 0).double().mean().item(), where
    expected = {"mean": values.mean().item(), "std": values.std().item()}
    recorded = {"mean": summary.mean, "std": summary.std}
    scale = values.abs().max().item()
    assert recorded == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE * scale), where


def _compare(loaded: Trace, run: AutogradRun) -> dict[str, int]:
    """Every recorded gradient against autograd's; returns how many of each kind were compared."""
    gradients = loaded.gradients
    assert gradients is not None and gradients.loss_source == "recipe"
    assert [(record.path, record.call_index) for record in loaded.modules] == [
        (call.path, call.call_index) for call in run.calls
    ], "the trace and the autograd run saw the same calls"
    recorded_calls = {call.module_call: call for call in gradients.calls}
    compared = {"outputs": 0, "inputs": 0, "parameters": 0}
    for index, call in enumerate(run.calls):
        where = f"{call.path or '(root)'} call {call.call_index}"
        recorded = recorded_calls.get(index)
        for side in ("outputs", "inputs"):
            expected = {key: tensor.grad for key, tensor in getattr(call, side).items() if tensor.grad is not None}
            summaries = {summary.key: summary for summary in (getattr(recorded, side) if recorded else [])}
            assert list(summaries) == list(expected), (
                f"{where}: {side} recorded {list(summaries)}, torch {list(expected)}"
            )
            for key, gradient in expected.items():
                _assert_statistics(summaries[key], gradient, f"{where}: {side} {key!r}")
                compared[side] += 1
    parameters = dict(run.model.named_parameters())
    assert [parameter.name for parameter in gradients.parameters] == list(parameters)
    for recorded_parameter in gradients.parameters:
        gradient = parameters[recorded_parameter.name].grad
        assert recorded_parameter.requires_grad
        if gradient is None:
            assert recorded_parameter.summary is None, recorded_parameter.name
            continue
        assert recorded_parameter.summary is not None and recorded_parameter.statistics_stride == 1
        _assert_statistics(recorded_parameter.summary, gradient, f"parameter {recorded_parameter.name}")
        compared["parameters"] += 1
    assert gradients.loss.mean == pytest.approx(run.loss, rel=TOLERANCE)
    return compared


def test_gradients_of_a_shared_parameter_and_a_module_called_twice(worker: WorkerClient, tmp_path: Path) -> None:
    recipe, loaded = _traced(worker, tmp_path, "tied", TIED_RECIPE)
    run = _autograd_run(recipe)
    compared = _compare(loaded, run)
    assert compared == {"outputs": 6, "inputs": 4, "parameters": 5}, compared
    # the shared parameter is listed once, under its first name, and its gradient sums both uses (the head's
    # matmul and the embedding's lookup): autograd's `.grad` of the one tensor, compared above
    names = [parameter.name for parameter in loaded.gradients.parameters]
    assert "embed.weight" in names and "head.weight" not in names
    assert run.model.head.weight is run.model.embed.weight
    # the module called twice has two calls, each with its own output gradient (checked above), and they differ
    mix_calls = [call for call in run.calls if call.path == "mix"]
    assert [call.call_index for call in mix_calls] == [0, 1]
    assert not torch.equal(mix_calls[0].outputs[""].grad, mix_calls[1].outputs[""].grad)


def test_gradients_through_a_detached_residual(worker: WorkerClient, tmp_path: Path) -> None:
    recipe, loaded = _traced(worker, tmp_path, "detached", DETACHED_RECIPE)
    run = _autograd_run(recipe)
    compared = _compare(loaded, run)
    assert compared == {"outputs": 5, "inputs": 3, "parameters": 6}, compared
    # upstream of the detach: `side`'s output reaches the loss only detached, so autograd leaves its `.grad`
    # None, and the trace records no gradient for the call nor for its parameters
    (side,) = [call for call in run.calls if call.path == "side"]
    assert side.outputs[""].grad is None and run.model.side.weight.grad is None
    side_index = run.calls.index(side)
    assert side_index not in {call.module_call for call in loaded.gradients.calls}
    recorded = {parameter.name: parameter for parameter in loaded.gradients.parameters}
    assert recorded["side.weight"].summary is None and recorded["side.bias"].summary is None
    # the block's input gradient flows through `inner` only (its residual is detached): in the trace as in
    # autograd, it is `inner`'s input gradient, and `first`'s output gradient (which feeds nothing else)
    by_path = {loaded.modules[call.module_call].path: call for call in loaded.gradients.calls}
    assert by_path["block"].inputs == [replace(summary, key="hidden") for summary in by_path["block.inner"].inputs]
    (first,) = [call for call in run.calls if call.path == "first"]
    (block,) = [call for call in run.calls if call.path == "block"]
    assert torch.equal(block.inputs["hidden"].grad, first.outputs[""].grad)
