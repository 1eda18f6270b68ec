"""Unaligned modules inside the first divergence are compared by how they were built (issue 30, items 2 and 5): a
bottleneck port that strides its 1x1 convolution where the reference strides the 3x3 one. The strided 1x1 has an
output of another shape than the reference's 1x1, so the alignment leaves both unaligned; the diff pairs them by
class and parameter shapes inside the diverging pair and names the stride at the line of the port that passes it
(the keyword argument of the `ConvLayer(...)` call, followed up from `nn.Conv2d(..., stride=stride)`)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from modeltrace.cli import main
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

MODELS = textwrap.dedent("""
    import torch
    from torch import nn


    class Bottleneck(nn.Module):
        def __init__(self, channels, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, channels // 2, 1, bias=False)
            self.conv2 = nn.Conv2d(channels // 2, channels // 2, 3, stride=stride, padding=1, bias=False)
            self.conv3 = nn.Conv2d(channels // 2, channels, 1, bias=False)
            self.shortcut = nn.Conv2d(channels, channels, 1, stride=stride, bias=False)

        def forward(self, x):
            y = torch.relu(self.conv1(x))
            y = torch.relu(self.conv2(y))
            return torch.relu(self.conv3(y) + self.shortcut(x))


    class ConvLayer(nn.Module):
        def __init__(self, cin, cout, kernel_size=3, stride=1):
            super().__init__()
            self.convolution = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=kernel_size // 2, bias=False)

        def forward(self, x):
            return torch.relu(self.convolution(x))


    class PortBottleneck(nn.Module):
        def __init__(self, channels, stride, on_1x1):
            super().__init__()
            self.layer = nn.Sequential(
                ConvLayer(
                    channels, channels // 2, kernel_size=1, stride=stride if on_1x1 else 1
                ),
                ConvLayer(channels // 2, channels // 2, stride=1 if on_1x1 else stride),
            )
            self.last = nn.Conv2d(channels // 2, channels, 1, bias=False)
            self.shortcut = nn.Conv2d(channels, channels, 1, stride=stride, bias=False)

        def forward(self, x):
            return torch.relu(self.last(self.layer(x)) + self.shortcut(x))


    def reference():
        torch.manual_seed(0)
        return Bottleneck(8, 2).eval()


    def port(on_1x1):
        original = reference()
        model = PortBottleneck(8, 2, on_1x1)
        with torch.no_grad():
            model.layer[0].convolution.weight.copy_(original.conv1.weight)
            model.layer[1].convolution.weight.copy_(original.conv2.weight)
            model.last.weight.copy_(original.conv3.weight)
            model.shortcut.weight.copy_(original.shortcut.weight)
        return model.eval()
""")


def _recipe(folder: Path, name: str, build: str) -> Path:
    path = folder / f"recipe_{name}.py"
    path.write_text(
        "import sys\nimport torch\n"
        f"sys.path.insert(0, {str(folder)!r})\nimport models\n\n"
        f"def build_model():\n    return {build}\n\n"
        "def build_inputs(model):\n    return (torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(1)),)\n"
    )
    return path


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inner-builds")
    (folder / "models.py").write_text(MODELS)
    builds = {"reference": "models.reference()", "clean": "models.port(False)", "stride_on_1x1": "models.port(True)"}
    found = {}
    for name, build in builds.items():
        out = folder / f"{name}.mtrace"
        worker.trace(
            TraceRequest(
                file=str(folder / "models.py"),
                recipe=str(_recipe(folder, name, build)),
                out=str(out),
                full_tensors=True,
            )
        )
        found[name] = out
    return found


def _diff(reference: Path, candidate: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["diff", str(reference), str(candidate), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_clean_port_matches(traced: dict[str, Path], capsys) -> None:
    code, document = _diff(traced["reference"], traced["clean"], capsys)
    assert code == 0, document.get("first_divergence")


def test_a_stride_moved_to_an_unaligned_convolution_is_named_where_the_port_passes_it(
    traced: dict[str, Path], capsys
) -> None:
    code, document = _diff(traced["reference"], traced["stride_on_1x1"], capsys)
    assert code == 1
    first = document["first_divergence"]
    strides = [setting for setting in first["settings"] if setting["name"] == "stride"]
    assert strides, first["settings"]
    setting = strides[0]
    assert (setting["reference"], setting["candidate"], setting["path"]) == ([1, 1], [2, 2], "layer.0.convolution")
    source = (traced["reference"].parent / "models.py").read_text().splitlines()
    line = source[setting["assigned_at"]["line"] - 1].strip()
    assert line == "channels, channels // 2, kernel_size=1, stride=stride if on_1x1 else 1"
