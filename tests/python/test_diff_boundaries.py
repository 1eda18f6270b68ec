"""Boundary differences (`diff/divergence.find_divergence`): two implementations cut the model into modules at
different places. One scales the embedding inside its embedding module (as Gemma's reference does with √d), the
other right after it, in its caller's `forward`: the embeddings' outputs differ by a constant factor and every
module after them matches. That is not a divergence: the diff reports it as a boundary difference, and a real
bug after it is still found.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

MODEL = """
import math
import torch
from torch import nn

SCALE = {scale!r}  # where the embedding is scaled: "inside" its module, in the "caller", or "nowhere"
BUG_LAYER = {bug_layer}


class ScaledEmbedding(nn.Embedding):
    def forward(self, ids):
        hidden = super().forward(ids)
        if SCALE == "inside":
            hidden = hidden * math.sqrt(self.embedding_dim)
        return hidden


class Block(nn.Module):
    def __init__(self, dim, position):
        super().__init__()
        self.position = position
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, hidden):
        update = self.fc(self.norm(hidden))
        if self.position == BUG_LAYER:
            update = torch.relu(update)  # the bug: an activation the reference does not apply
        return hidden + update


class Model(nn.Module):
    def __init__(self, vocab=32, dim=16, layers=4):
        super().__init__()
        self.embed = ScaledEmbedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, position) for position in range(layers))
        self.final_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        hidden = self.embed(ids)
        if SCALE == "caller":
            hidden = hidden * math.sqrt(self.embed.embedding_dim)  # the same scale, in the caller
        for layer in self.layers:
            hidden = layer(hidden)
        return self.head(self.final_norm(hidden))


def build_model():
    torch.manual_seed(0)
    return Model().eval()


def build_inputs(model):
    return (torch.tensor([[1, 5, 9, 30, 2, 7]]),)
"""


def _trace(worker: WorkerClient, folder: Path, name: str, scale: str, bug_layer: int | None) -> Path:
    recipe = folder / f"recipe_{name}.py"
    recipe.write_text(textwrap.dedent(MODEL.format(scale=scale, bug_layer=bug_layer)))
    out = folder / f"{name}.mtrace"
    worker.trace(TraceRequest(file=str(recipe), recipe=str(recipe), out=str(out), full_tensors=True, timeout=120))
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("boundaries")
    return {
        "reference": _trace(worker, folder, "reference", scale="inside", bug_layer=None),
        "clean": _trace(worker, folder, "clean", scale="caller", bug_layer=None),
        "bug": _trace(worker, folder, "bug", scale="caller", bug_layer=2),
        "bug_only": _trace(worker, folder, "bug_only", scale="inside", bug_layer=2),
        "unscaled": _trace(worker, folder, "unscaled", scale="nowhere", bug_layer=None),
    }


def _diff(reference: Path, candidate: Path) -> tuple[int, dict, str]:
    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(reference), str(candidate), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode in (0, 1, 2), completed.stderr
    text = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(reference), str(candidate)],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    return completed.returncode, json.loads(completed.stdout), text


def test_a_difference_absorbed_at_a_boundary_is_not_a_divergence(traces: dict[str, Path]) -> None:
    """The clean port: the embeddings differ (by √16 = 4, cosine 1), every module after them matches. A match,
    exit 0, with the embedding reported as a boundary difference naming both sides' call lines."""
    code, document, text = _diff(traces["reference"], traces["clean"])
    embed = next(module for module in document["modules"] if module["path"] == "embed")
    assert embed["outputs"] == "mismatch" and embed["inputs"] == "match"  # the difference is real
    assert code == 0, text
    assert document["verdict"] == "match" and document["first_divergence"] is None
    [boundary] = document["boundary_differences"]
    assert boundary["path"] == "embed" and boundary["reference_path"] == "embed"
    assert boundary["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert boundary["scale"] == pytest.approx(4.0, rel=1e-4)  # the reference scales by √16
    assert boundary["absorbed_by"]["path"] == "layers.0"
    assert boundary["called_at"]["line"] > 0 and boundary["reference_called_at"]["line"] > 0
    assert embed["boundary"] is True
    assert "boundary   embed:" in text and "not a divergence" in text
    assert "×4 the candidate's" in text and "layers.0" in text


def test_a_boundary_difference_never_hides_a_bug_after_it(traces: dict[str, Path]) -> None:
    """The same boundary difference plus a bug two layers later: the bug is the first divergence (exit 1), the
    embedding is still reported as a boundary difference, never as the divergence."""
    code, document, _ = _diff(traces["reference"], traces["bug"])
    assert code == 1 and document["verdict"] == "divergence"
    assert document["first_divergence"]["path"] == "layers.2"
    assert [boundary["path"] for boundary in document["boundary_differences"]] == ["embed"]
    # the same bug without the boundary difference: the same verdict, no boundary difference
    code, alone, _ = _diff(traces["reference"], traces["bug_only"])
    assert code == 1 and alone["first_divergence"]["path"] == "layers.2"
    assert alone["boundary_differences"] == []


def test_a_difference_that_stays_is_a_divergence(traces: dict[str, Path]) -> None:
    """The scale left out altogether (a real porting bug at the same place): the next layer's inputs differ too,
    so the embedding is the first divergence, not a boundary difference."""
    code, document, _ = _diff(traces["reference"], traces["unscaled"])
    assert code == 1 and document["first_divergence"]["path"] == "embed"
    assert document["boundary_differences"] == []
