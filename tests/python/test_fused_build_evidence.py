"""A fused pair gets the build comparison one-to-one pairs get (issue 30, item 4): a reference attention with one
fused `qkv` projection against a port with `q`, `k`, `v`, whose `k` was built without the bias the fused
projection has. The diff's first divergence is the fused pair, and it names the missing parameter and the line
that built the port's `k` (the construction line), as it would for a one-to-one pair."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from modeltrace.worker.client import WorkerClient

from small_models import diff_json, trace_builds

MODELS = textwrap.dedent("""
    import torch
    from torch import nn


    class FusedAttention(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
            return self.proj(weights @ v)


    class SplitAttention(nn.Module):
        def __init__(self, dim, k_bias=True):
            super().__init__()
            self.q = nn.Linear(dim, dim)
            self.k = nn.Linear(dim, dim, bias=k_bias)
            self.v = nn.Linear(dim, dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
            return self.proj(weights @ v)


    def reference():
        torch.manual_seed(0)
        model = FusedAttention(8)
        with torch.no_grad():
            model.qkv.bias.copy_(torch.randn(24) * 0.5)
        return model.eval()


    def port(k_bias):
        fused = reference()
        model = SplitAttention(8, k_bias=k_bias)
        with torch.no_grad():
            for index, name in enumerate("qkv"):
                linear = getattr(model, name)
                linear.weight.copy_(fused.qkv.weight[8 * index : 8 * (index + 1)])
                if linear.bias is not None:
                    linear.bias.copy_(fused.qkv.bias[8 * index : 8 * (index + 1)])
            model.proj.load_state_dict(fused.proj.state_dict())
        return model.eval()
""")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    builds = {"reference": "models.reference()", "clean": "models.port(True)", "k_bias_dropped": "models.port(False)"}
    shaped = {name: (build, "1, 5, 8") for name, build in builds.items()}
    return trace_builds(tmp_path_factory.mktemp("fused-builds"), worker, MODELS, shaped)


def test_the_clean_split_port_matches_the_fused_reference(traced: dict[str, Path], capsys) -> None:
    code, document = diff_json(traced["reference"], traced["clean"], capsys)
    assert code == 0, document.get("first_divergence")
    fused = [module for module in document["modules"] if " + " in module["path"]]
    assert [module["path"] for module in fused] == ["q + k + v"] and fused[0]["reference_path"] == "qkv"


def test_a_bias_dropped_from_a_fused_member_is_named_with_its_construction_line(
    traced: dict[str, Path], capsys
) -> None:
    code, document = diff_json(traced["reference"], traced["k_bias_dropped"], capsys)
    assert code == 1
    first = document["first_divergence"]
    assert first["path"] == "q + k + v"
    assert [(item["name"], item["status"], item["path"]) for item in first["parameters"]] == [("bias", "missing", "k")]
    source = (traced["reference"].parent / "models.py").read_text().splitlines()
    assert source[first["built_at"]["line"] - 1].strip() == "self.k = nn.Linear(dim, dim, bias=k_bias)"
