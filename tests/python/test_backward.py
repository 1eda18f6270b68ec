"""Backward traces (`trace --backward`) and the gradient diff, on copies of transformers' Llama and GPT-2.

Each training-only bug leaves the forward pass as it was: a `detach()` in one residual, a loss scaled by 0.5, a
frozen layer. The gradient diff must find it in the right place, in backward order. Recipes cover the loss a
user defines (`build_loss`), the NaN loss (flagged, not a crash) and the bad inputs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modeltrace.diff import close_result, diff_paths, to_json
from modeltrace.errors import TraceFailed
from modeltrace.trace.storage import read_trace
from modeltrace.worker.client import WorkerClient

from test_generation import copy_model, trace


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backward-references")
    return {
        "llama": trace(
            worker, copy_model("llama", root), root / "llama.mtrace", model="LlamaForCausalLM", backward=True
        ),
        "gpt2": trace(worker, copy_model("gpt2", root), root / "gpt2.mtrace", model="GPT2LMHeadModel", backward=True),
    }


MODELS = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}
# (model, bug, text replaced, replacement, what the first gradient divergence must name)
BUGS = [
    (
        "llama",
        "detach in one residual",
        "        hidden_states = residual + hidden_states\n",
        "        hidden_states = residual.detach() + hidden_states\n",
        "model.layers.1",
    ),
    (
        "gpt2",
        "detach in one residual",
        "hidden_states = attn_output + residual",
        "hidden_states = attn_output + residual.detach()",
        "transformer.h.1",
    ),
    (
        "llama",
        "frozen layer",
        "        self.gradient_checkpointing = False\n\n        # Initialize weights and apply "
        "final processing\n        self.post_init()\n",
        "        self.gradient_checkpointing = False\n        self.post_init()\n"
        "        self.layers[1].mlp.requires_grad_(False)\n",
        "model.layers.1.mlp.down_proj",
    ),
    (
        "llama",
        "loss scaled by 0.5",
        "loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)",
        "loss = 0.5 * self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)",
        "(loss)",
    ),
]


def test_backward_trace_records_gradients_per_call_and_parameter(references: dict[str, Path]) -> None:
    loaded = read_trace(references["llama"])
    gradients = loaded.gradients
    assert gradients is not None and gradients.loss_source == "model" and gradients.loss.mean > 0
    by_path = {loaded.modules[call.module_call].path: call for call in gradients.calls}
    down_proj = by_path["model.layers.0.mlp.down_proj"]
    assert down_proj.outputs[0].shape == loaded.modules[down_proj.module_call].outputs[0].shape
    assert down_proj.inputs and down_proj.inputs[0].key == "input"
    # backward order: the last layer's backward finishes before the first layer's, a block's children before it
    assert by_path["model.layers.1"].backward_order < by_path["model.layers.0"].backward_order
    assert by_path["model.layers.0.mlp"].backward_order < by_path["model.layers.0"].backward_order
    parameters = {parameter.name: parameter for parameter in gradients.parameters}
    assert all(parameter.summary is not None and parameter.requires_grad for parameter in parameters.values())
    assert not gradients.flags
    document = loaded.to_json()
    assert document["gradients"]["loss_source"] == "model" and document["model"]["options"]["backward"] is True


def test_identical_backward_traces_match(references: dict[str, Path], worker: WorkerClient, tmp_path: Path) -> None:
    again = trace(
        worker, copy_model("gpt2", tmp_path), tmp_path / "again.mtrace", model="GPT2LMHeadModel", backward=True
    )
    result = diff_paths(references["gpt2"], again)
    try:
        assert result.match and result.gradients is not None and result.gradients.match
        assert to_json(result)["gradients"]["first_divergence"] is None
    finally:
        close_result(result)


@pytest.mark.parametrize(("model", "bug", "old", "new", "expected"), BUGS, ids=[f"{row[0]}: {row[1]}" for row in BUGS])
def test_training_only_bug_is_found_in_backward_order(
    model: str,
    bug: str,
    old: str,
    new: str,
    expected: str,
    references: dict[str, Path],
    worker: WorkerClient,
    tmp_path: Path,
) -> None:
    buggy = trace(
        worker, copy_model(model, tmp_path, old, new), tmp_path / "buggy.mtrace", model=MODELS[model], backward=True
    )
    result = diff_paths(references[model], buggy)
    try:
        document = to_json(result)
        if expected != "(loss)":  # the forward pass is unchanged: only gradients differ
            assert all(module["status"] in ("match", "not_compared") for module in document["modules"]), bug
        assert not result.match
        divergence = document["gradients"]["first_divergence"]
        if expected == "(loss)":
            # the model's own loss: computed in the root's forward, where the diff points
            assert divergence["kind"] == "loss" and divergence["path"] == "", divergence
            assert "in the reference" in divergence["reason"] and divergence["class"] == "LlamaForCausalLM"
        else:
            assert divergence["kind"] == "module" and divergence["outputs_match"], divergence
            assert divergence["path"] == expected, divergence
    finally:
        close_result(result)


RECIPE = """
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))){suffix}


def build_model() -> nn.Module:
    return Tiny()


def build_inputs(model: nn.Module) -> dict:
    return {{"x": torch.randn(2, 8)}}
"""


def recipe(tmp_path: Path, suffix: str = "", extra: str = "") -> Path:
    file = tmp_path / "recipe_tiny.py"
    file.write_text(RECIPE.format(suffix=suffix) + extra)
    return file


def test_recipe_build_loss_and_default_loss(worker: WorkerClient, tmp_path: Path) -> None:
    file = recipe(tmp_path)
    default = read_trace(trace(worker, file, tmp_path / "default.mtrace", recipe=str(file), backward=True))
    assert default.gradients.loss_source == "default" and "mean(output ** 2)" in default.gradients.loss_description
    file = recipe(tmp_path, extra="\n\ndef build_loss(outputs):\n    return outputs.sum()\n")
    own = read_trace(trace(worker, file, tmp_path / "own.mtrace", recipe=str(file), backward=True))
    assert own.gradients.loss_source == "recipe"
    second = next(call for call in own.gradients.calls if own.modules[call.module_call].path == "second")
    assert second.outputs[0].mean == pytest.approx(1.0) and second.outputs[0].std == pytest.approx(0.0)


def test_a_nan_loss_is_traced_and_flagged(worker: WorkerClient, tmp_path: Path) -> None:
    file = recipe(tmp_path, extra="\n\ndef build_loss(outputs):\n    return outputs.sum() * float('nan')\n")
    loaded = read_trace(trace(worker, file, tmp_path / "nan.mtrace", recipe=str(file), backward=True))
    flags = loaded.gradients.flags
    assert any(flag.where == "loss" and flag.problem == "nan" for flag in flags)
    assert any(flag.where == "parameter" and flag.name == "second.weight" and flag.problem == "nan" for flag in flags)


def test_an_all_zero_gradient_is_flagged(worker: WorkerClient, tmp_path: Path) -> None:
    file = recipe(tmp_path, extra="\n\ndef build_loss(outputs):\n    return outputs.sum() * 0.0\n")
    loaded = read_trace(trace(worker, file, tmp_path / "zero.mtrace", recipe=str(file), backward=True))
    assert {flag.name for flag in loaded.gradients.flags if flag.problem == "zero"} >= {"first.weight", "second"}


def test_backward_bad_input_gets_a_clear_message(worker: WorkerClient, tmp_path: Path) -> None:
    file = recipe(tmp_path, suffix=".argmax(-1)")
    with pytest.raises(TraceFailed, match="no output of Tiny is differentiable"):
        trace(worker, file, tmp_path / "ints.mtrace", recipe=str(file), backward=True)
    llama = copy_model("llama", tmp_path)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "trace",
            str(llama),
            "--shape-only",
            "--backward",
            "--out",
            str(tmp_path / "meta.mtrace"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 2 and "--backward needs real tensors" in completed.stderr, completed.stderr
    assert "meta device" in completed.stderr
