"""Small values lines assign, stored with full tensors and compared element by element inside calls without
counterpart (issue 30): statistics do not see the order of the numbers.

The reference computes Swin's relative position bias inline (timm's `_get_rel_pos_bias`, a method, no module);
the port looks it up in a module of its own that takes no tensor (transformers' `SwinRelativePositionBias`). A
bias laid out key-by-query holds the reference's numbers in another order: its statistics match, and the first
value whose statistics differ is the attention's output. With full tensors and line records, the bias's `return`
is stored on both sides and compared element by element, so the module that holds the bug is named with its
line; a bug in the attention's own code (a scale) is not moved into the bias module, and the clean port matches.
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

MODELS = """
import torch
from torch import nn

BUG = {bug!r}  # None, "bias_transposed", "scale"
SIDE = {side!r}  # "reference" (the bias computed inline) or "port" (in a module of its own)
DIM, HEADS, WINDOW = 16, 2, 3
TOKENS = WINDOW * WINDOW
SCALE = (DIM // HEADS) ** -0.5


def relative_index():
    coords = torch.stack(torch.meshgrid([torch.arange(WINDOW), torch.arange(WINDOW)], indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += WINDOW - 1
    relative[:, :, 1] += WINDOW - 1
    relative[:, :, 0] *= 2 * WINDOW - 1
    return relative.sum(-1)


class RelativePositionBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn((2 * WINDOW - 1) ** 2, HEADS))
        self.register_buffer("index", relative_index().view(-1), persistent=False)

    def forward(self):
        bias = self.table[self.index].view(TOKENS, TOKENS, -1)
        order = (2, 1, 0) if BUG == "bias_transposed" else (2, 0, 1)
        return bias.permute(*order).contiguous().unsqueeze(0)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        if SIDE == "port":
            self.relative_position_bias = RelativePositionBias()
        else:
            self.table = nn.Parameter(torch.randn((2 * WINDOW - 1) ** 2, HEADS))
            self.register_buffer("index", relative_index().view(-1), persistent=False)

    def _bias(self):
        bias = self.table[self.index].view(TOKENS, TOKENS, -1)
        bias = bias.permute(2, 0, 1).contiguous()
        return bias.unsqueeze(0)

    def forward(self, x):
        batch = x.shape[0]
        q, k, v = self.qkv(x).reshape(batch, TOKENS, 3, HEADS, -1).permute(2, 0, 3, 1, 4).unbind(0)
        if SIDE == "port":
            bias = self.relative_position_bias()
            scale = SCALE * 2 if BUG == "scale" else SCALE
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        else:
            scores = (q * SCALE) @ k.transpose(-2, -1)
            scores = scores + self._bias()
            out = scores.softmax(-1) @ v
        out = out.transpose(1, 2).reshape(batch, TOKENS, -1)
        return self.proj(out)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attn = Attention()
        self.head = nn.Linear(DIM, 4)

    def forward(self, x):
        return self.head(self.attn(self.norm(x)).mean(1))


def build_model():
    # NOTE: both sides draw their parameters in the same order (norm, qkv, proj, the bias table, head): one seed
    # gives the port the reference's weights
    torch.manual_seed(0)
    return Model().eval()


def build_inputs(model):
    torch.manual_seed(1)
    return (torch.randn(1, TOKENS, DIM),)
"""


def _trace(worker: WorkerClient, folder: Path, name: str, side: str, bug: str | None) -> Path:
    recipe = folder / f"recipe_{name}.py"
    recipe.write_text(textwrap.dedent(MODELS.format(bug=bug, side=side)))
    out = folder / f"{name}.mtrace"
    request = TraceRequest(
        file=str(recipe), recipe=str(recipe), out=str(out), full_tensors=True, lines=True, timeout=120
    )
    worker.trace(request)
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("line-values")
    found = {"reference": _trace(worker, folder, "reference", "reference", None)}
    for bug in (None, "bias_transposed", "scale"):
        found[bug or "clean"] = _trace(worker, folder, bug or "clean", "port", bug)
    return found


def _diff(traces: dict[str, Path], name: str) -> tuple[int, dict]:
    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(traces["reference"]), str(traces[name]), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode in (0, 1, 2), completed.stderr
    return completed.returncode, json.loads(completed.stdout)


def test_the_clean_port_matches(traces: dict[str, Path]) -> None:
    code, document = _diff(traces, "clean")
    assert code == 0 and document["verdict"] == "match", document["first_divergence"]


def test_a_bias_module_that_takes_no_tensor_is_named_by_its_line_element_by_element(traces: dict[str, Path]) -> None:
    code, document = _diff(traces, "bias_transposed")
    first = document["first_divergence"]
    assert code == 1 and first["path"] == "attn.relative_position_bias", first
    assert first["compared_in"] == "attn"
    line = first["line"]
    source = Path(line["file"]).read_text().splitlines()[line["line"] - 1]
    assert "permute(*order)" in source and "element by element" in line["reason"]


def test_a_bug_of_the_attentions_own_code_stays_there(traces: dict[str, Path]) -> None:
    code, document = _diff(traces, "scale")
    first = document["first_divergence"]
    assert code == 1 and first["path"] == "attn", first
    assert first["compared_in"] is None


def test_small_line_values_are_stored_with_full_tensors(traces: dict[str, Path]) -> None:
    """The reference's inline bias (a line value, no module's tensor) is stored."""
    from modeltrace.trace.storage import read_trace

    trace = read_trace(traces["reference"])
    returned = [record for record in trace.lines if record.name == "return" and record.tensor.shape == [1, 2, 9, 9]]
    assert returned and all(record.tensor.tensor for record in returned)
