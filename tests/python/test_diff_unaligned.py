"""A module on one side only (`diff/unaligned.py`, issue 30 item 2): the reference builds its tokens, pools and
projects inline (as timm and open_clip do), the port does it in modules of its own (as transformers does). The
port's `Embeddings` and `Body` have no counterpart; a bug inside them is first seen in the root's outputs, and the
search used to stop there. They are searched through the tensors crossing their boundary (and, with line records,
their lines), so the verdict names the module that holds the bug; the clean port still matches, and a module whose
values the reference computes too is not blamed for its caller's code.
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

BUG = {bug!r}  # None, "class_token_last", "class_token_last_inside", "pool_mean", "mlp_scale", "residual_dropped"
# the port's Embeddings normalise the tokens themselves (else its Body does, right after them)
INSIDE = BUG == "class_token_last_inside"
SIDE = {side!r}  # "reference" (inline code) or "port" (modules of its own)
DIM, INPUTS, TOKENS, CLASSES = 16, 8, 6, 4


class RefBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 2 * DIM)
        self.fc2 = nn.Linear(2 * DIM, DIM)

    def forward(self, hidden):
        update = self.fc2(torch.relu(self.fc1(self.norm(hidden)))) * 0.5
        return hidden + update


class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_norm = nn.LayerNorm(INPUTS)
        self.patch = nn.Linear(INPUTS, DIM)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, TOKENS + 1, DIM))
        self.pre_norm = nn.LayerNorm(DIM)
        self.blocks = nn.ModuleList(RefBlock() for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.proj = nn.Parameter(torch.randn(DIM, CLASSES))

    def forward(self, x):
        hidden = self.patch(self.input_norm(x))
        hidden = torch.cat([self.cls, hidden], dim=1)
        hidden = self.pre_norm(hidden + self.pos)
        for block in self.blocks:
            hidden = block(hidden)
        hidden = self.norm(hidden)
        pooled = hidden[:, 0]
        return pooled @ self.proj


class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(INPUTS, DIM)
        self.cls = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos = nn.Parameter(torch.zeros(1, TOKENS + 1, DIM))
        if INSIDE:
            self.ln_pre = nn.LayerNorm(DIM)

    def forward(self, x):
        patches = self.patch(x)
        if BUG in ("class_token_last", "class_token_last_inside"):
            tokens = torch.cat([patches, self.cls], dim=1)
        else:
            tokens = torch.cat([self.cls, patches], dim=1)
        if INSIDE:
            return self.ln_pre(tokens + self.pos)
        return tokens + self.pos


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(DIM, 2 * DIM)
        self.fc2 = nn.Linear(2 * DIM, DIM)

    def forward(self, hidden):
        scale = 0.25 if BUG == "mlp_scale" else 0.5
        return self.fc2(torch.relu(self.fc1(hidden))) * scale


class PortBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = Mlp()

    def forward(self, hidden):
        update = self.mlp(self.norm(hidden))
        if BUG == "residual_dropped":
            return update
        return hidden + update


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(Embeddings())  # a library container around the port's own module
        if not INSIDE:
            self.ln_pre = nn.LayerNorm(DIM)
        self.layers = nn.ModuleList(PortBlock() for _ in range(2))
        self.final_norm = nn.LayerNorm(DIM)

    def forward(self, x):
        hidden = self.stem(x)
        if not INSIDE:
            hidden = self.ln_pre(hidden)
        for block in self.layers:
            hidden = block(hidden)
        hidden = self.final_norm(hidden)
        if BUG == "pool_mean":
            pooled = hidden.mean(dim=1)
        else:
            pooled = hidden[:, 0]
        return pooled


class Port(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_norm = nn.LayerNorm(INPUTS)
        self.body = Body()
        self.proj = nn.Parameter(torch.zeros(DIM, CLASSES))

    def forward(self, x):
        return self.body(self.input_norm(x)) @ self.proj


def build_model():
    torch.manual_seed(0)
    reference = Reference().eval()
    if SIDE == "reference":
        return reference
    port = Port().eval()
    state = {{}}
    for name, value in reference.state_dict().items():
        name = name.replace(".fc1", ".mlp.fc1").replace(".fc2", ".mlp.fc2").replace("blocks.", "layers.")
        name = name.replace("pre_norm.", "ln_pre.")
        if name.startswith("norm."):
            name = "final_" + name
        if name.startswith(("patch", "cls", "pos")) or (INSIDE and name.startswith("ln_pre")):
            name = "stem.0." + name
        state[name if name.startswith(("proj", "input_norm")) else "body." + name] = value
    port.load_state_dict(state)
    return port


def build_inputs(model):
    torch.manual_seed(1)
    return (torch.randn(1, TOKENS, INPUTS),)
"""

MAPS = (
    r"^body\.stem\.0\.patch$=>patch",
    r"^body\.(?:stem\.0\.)?ln_pre$=>pre_norm",
    r"^body\.layers\.(\d+)\.mlp\.(fc\d)$=>blocks.\1.\2",
    r"^body\.layers\.(\d+)=>blocks.\1",
    r"^body\.final_norm$=>norm",
)


def _trace(worker: WorkerClient, folder: Path, name: str, side: str, bug: str | None, lines: bool) -> Path:
    recipe = folder / f"recipe_{name}.py"
    recipe.write_text(textwrap.dedent(MODELS.format(bug=bug, side=side)))
    out = folder / f"{name}.mtrace"
    request = TraceRequest(
        file=str(recipe), recipe=str(recipe), out=str(out), full_tensors=True, lines=lines, timeout=120
    )
    worker.trace(request)
    return out


CASES = {
    "clean": None,
    "class_token_last": "class_token_last",
    "class_token_last_inside": "class_token_last_inside",
    "pool_mean": "pool_mean",
    "mlp_scale": "mlp_scale",
    "residual_dropped": "residual_dropped",
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[tuple[str, bool], Path]:
    folder = tmp_path_factory.mktemp("unaligned")
    found = {}
    for lines in (False, True):
        suffix = "-lines" if lines else ""
        found[("reference", lines)] = _trace(worker, folder, f"reference{suffix}", "reference", None, lines)
        for name, bug in CASES.items():
            found[(name, lines)] = _trace(worker, folder, f"{name}{suffix}", "port", bug, lines)
    return found


def _diff(traces: dict[tuple[str, bool], Path], name: str, lines: bool) -> tuple[int, dict]:
    options = [option for rule in MAPS for option in ("--map", rule)]
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "diff",
            str(traces[("reference", lines)]),
            str(traces[(name, lines)]),
            "--format",
            "json",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode in (0, 1, 2), completed.stderr
    return completed.returncode, json.loads(completed.stdout)


@pytest.mark.parametrize("lines", [False, True], ids=["full", "lines"])
def test_the_clean_port_with_modules_on_one_side_matches(traces: dict, lines: bool) -> None:
    code, document = _diff(traces, "clean", lines)
    assert code == 0 and document["verdict"] == "match", document["first_divergence"]
    unaligned = {module["path"] for module in document["modules"] if module["status"] == "not_compared"}
    assert {"body", "body.stem", "body.stem.0"} <= unaligned  # the modules on one side only stay unaligned


@pytest.mark.parametrize("lines", [False, True], ids=["full", "lines"])
def test_a_module_on_one_side_inside_an_aligned_block_is_named_by_its_line(traces: dict, lines: bool) -> None:
    """The MLP's scale halved inside `Mlp`, which the reference computes inline in its block: the block is aligned,
    its `norm`, `fc1` and `fc2` match, and `Mlp`'s output goes into the block's own residual sum, which no call
    compares. With line records, the first differing line (`return ... * scale`, against the reference's `update`)
    ran in `Mlp`, whose input is the block's matching `norm` output: `Mlp` is the divergence. Without them, the
    block, which holds both, is as far as the data goes (its parameter `hidden`, recorded on `Mlp`'s `def` line,
    is an argument, not a value `Mlp` computed: it is not the differing line)."""
    code, document = _diff(traces, "mlp_scale", lines)
    first = document["first_divergence"]
    assert code == 1
    assert first["path"] == ("body.layers.0.mlp" if lines else "body.layers.0"), first
    if lines:
        assert "* scale" in Path(first["line"]["file"]).read_text().splitlines()[first["line"]["line"] - 1]
        assert first["compared_in"] == "body.layers.0"


@pytest.mark.parametrize("lines", [False, True], ids=["full", "lines"])
def test_a_module_on_one_side_is_searched_through_an_aligned_call_inside_it(traces: dict, lines: bool) -> None:
    """The class token appended last in `Embeddings`, which the reference builds inline: before, the root was the
    first divergence (its outputs differ; its aligned calls are deep inside `Body`). `Body`'s input is the
    root's matching `input_norm` output, and `blocks.0` inside it receives a differing tensor: the difference
    arises in `Body`. Inside it, through the `nn.Sequential` stem (a library container: looked through, never
    blamed), `Embeddings`' own `ln_pre` (aligned) receives a differing tensor while its `patch` matches: the
    divergence is `Embeddings`, between those two calls, with or without line records."""
    code, document = _diff(traces, "class_token_last_inside", lines)
    first = document["first_divergence"]
    assert code == 1
    assert first["path"] == "body.stem.0", first
    # NOTE: entered from the root, or from `body` where the chain rule (diff/chains.py) pairs it with its run
    assert first["inputs_match"] is True and first["compared_in"] in ("", "body", None)
    if first["compared_in"] is None:  # paired itself, with the reference's inline run (a chain): compared directly
        assert "max abs diff" in first["reason"]
    else:
        assert "no counterpart in the reference" in first["reason"] and "ln_pre" in first["reason"]
    assert first["after"]["path"] == "body.stem.0.patch" and first["before"]["path"] == "body.stem.0.ln_pre"
    assert first["max_abs_diff"] > 0.1  # the comparison that shows it: ln_pre's input
    module = next(module for module in document["modules"] if module["path"] == first["path"])
    assert module["status"] == "divergence"
    root = next(module for module in document["modules"] if module["path"] == "")
    assert root["status"] == "mismatch"


@pytest.mark.parametrize("lines", [False, True], ids=["full", "lines"])
def test_a_module_on_one_side_is_named_by_its_output_where_the_reference_never_computes_it(
    traces: dict, lines: bool
) -> None:
    """The same bug, with the tokens normalised by `Body` right after `Embeddings` (as transformers' CLIP does
    with `pre_layrnorm`): `Embeddings`' output is the differing input of the aligned `ln_pre`. With line
    records, the reference's values show it never computes those tokens: `Embeddings` is the divergence. Without
    them, its caller could as well be passing it where something else belongs: `Body`, as far as the data goes."""
    code, document = _diff(traces, "class_token_last", lines)
    first = document["first_divergence"]
    assert code == 1
    assert first["path"] == ("body.stem.0" if lines else "body"), first
    assert first["compared_in"] == ""
    if lines:
        assert "its output" in first["reason"] and "body.ln_pre" in first["reason"]
        assert first["after"]["path"] == "body.stem.0.patch"
        # the tokens joined in another order hold the reference's numbers: their statistics match, and the small
        # value the line assigns, stored on both sides, differs element by element (`lines.FullValues`)
        line = Path(first["line"]["file"]).read_text().splitlines()[first["line"]["line"] - 1]
        assert "torch.cat([patches, self.cls]" in line, first["line"]
    else:
        assert first["before"]["path"] == "body.ln_pre"


def test_a_line_inside_a_module_on_one_side_names_it(traces: dict) -> None:
    """The port pools the mean where the reference takes the class token, both inline in a `forward`: no
    compared tensor crosses `Body`'s boundary after the pooling (the root's projection is a bare parameter).
    With line records, the first differing line (`pooled = hidden.mean(dim=1)`) ran in `Body`, whose input
    matches: `Body` is the divergence, with that line; without them the root stays the divergence."""
    code, document = _diff(traces, "pool_mean", True)
    first = document["first_divergence"]
    assert code == 1 and first["path"] == "body", first
    assert (
        first["line"]["name"] == "pooled"
        and "mean" in Path(first["line"]["file"]).read_text().splitlines()[first["line"]["line"] - 1]
    )
    assert first["compared_in"] == ""
    code, document = _diff(traces, "pool_mean", False)
    assert code == 1 and document["first_divergence"]["path"] == ""


@pytest.mark.parametrize("lines", [False, True], ids=["full", "lines"])
def test_a_module_whose_values_the_reference_computes_is_not_blamed_for_its_caller(traces: dict, lines: bool) -> None:
    """The block drops its residual: `Mlp`'s output (no counterpart) goes straight to the next block, whose
    input differs. `Mlp` computed what the reference computes inline (its line `update = ...`): its caller's code
    is the cause, and the block stays the first divergence."""
    code, document = _diff(traces, "residual_dropped", lines)
    assert code == 1 and document["first_divergence"]["path"] == "body.layers.0", document["first_divergence"]
    assert document["first_divergence"]["compared_in"] is None
