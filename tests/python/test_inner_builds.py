"""Unaligned modules inside the first divergence are compared by how they were built (issue 30, items 2 and 5): a
bottleneck port that strides its 1x1 convolution where the reference strides the 3x3 one. The strided 1x1 has an
output of another shape than the reference's 1x1, so the alignment leaves both unaligned; the diff pairs them by
class and parameter shapes inside the diverging pair and names the stride at the line of the port that passes it
(the keyword argument of the `ConvLayer(...)` call, followed up from `nn.Conv2d(..., stride=stride)`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from modeltrace.worker.client import WorkerClient

from small_models import diff_json, first_divergence, trace_builds

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


    class SelfAttention(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.scaling = dim ** -0.5
            self.q_proj = nn.Linear(dim, dim)
            self.k_proj = nn.Linear(dim, dim)
            self.v_proj = nn.Linear(dim, dim)

        def forward(self, x):
            scores = self.q_proj(x) @ self.k_proj(x).transpose(-1, -2) * self.scaling
            return torch.softmax(scores, dim=-1) @ self.v_proj(x)


    class DecoderLayer(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.self_attn = SelfAttention(dim)

        def forward(self, x):
            return x + self.self_attn(x)


    class Attention(nn.Module):
        def __init__(self, dim, power):
            super().__init__()
            self.wq = nn.Linear(dim, dim)
            self.wk = nn.Linear(dim, dim)
            self.wv = nn.Linear(dim, dim)
            self.scale = dim ** power

        def forward(self, x):
            scores = self.wq(x) @ self.wk(x).transpose(-1, -2) * self.scale
            return torch.softmax(scores, dim=-1) @ self.wv(x)


    class TransformerBlock(nn.Module):
        def __init__(self, dim, power):
            super().__init__()
            self.attention = Attention(dim, power)

        def forward(self, x):
            return x + self.attention.forward(x)


    class GatedMLP(nn.Module):
        def __init__(self, dim, swapped=False):
            super().__init__()
            self.swapped = swapped
            self.gate_proj = nn.Linear(dim, 2 * dim, bias=False)
            self.up_proj = nn.Linear(dim, 2 * dim, bias=False)
            self.down_proj = nn.Linear(2 * dim, dim, bias=False)

        def forward(self, x):
            if self.swapped:
                gate = self.up_proj(x)
            else:
                gate = self.gate_proj(x)
            return self.down_proj(torch.nn.functional.gelu(gate) * self.up_proj(x))


    def mlp(swapped):
        torch.manual_seed(0)
        return GatedMLP(8, swapped).eval()


    def reference():
        torch.manual_seed(0)
        return Bottleneck(8, 2).eval()


    def decoder_reference():
        torch.manual_seed(0)
        return DecoderLayer(8).eval()


    def decoder_port(power):
        original = decoder_reference()
        model = TransformerBlock(8, power)
        with torch.no_grad():
            for mine, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")):
                getattr(model.attention, mine).load_state_dict(getattr(original.self_attn, theirs).state_dict())
        return model.eval()


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


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    builds = {
        "reference": ("models.reference()", "1, 8, 8, 8"),
        "clean": ("models.port(False)", "1, 8, 8, 8"),
        "stride_on_1x1": ("models.port(True)", "1, 8, 8, 8"),
        "decoder_reference": ("models.decoder_reference()", "1, 5, 8"),
        "decoder_scale_inverted": ("models.decoder_port(0.5)", "1, 5, 8"),
        "mlp": ("models.mlp(False)", "1, 5, 8"),
        "mlp_swapped": ("models.mlp(True)", "1, 5, 8"),
    }
    return trace_builds(tmp_path_factory.mktemp("inner-builds"), worker, MODELS, builds)


def test_the_clean_port_matches(traced: dict[str, Path], capsys) -> None:
    code, document = diff_json(traced["reference"], traced["clean"], capsys)
    assert code == 0, document.get("first_divergence")


def test_a_stride_moved_to_an_unaligned_convolution_is_named_where_the_port_passes_it(
    traced: dict[str, Path], capsys
) -> None:
    first = first_divergence(traced["reference"], traced["stride_on_1x1"], capsys)
    strides = [setting for setting in first["settings"] if setting["name"] == "stride"]
    assert strides, first["settings"]
    setting = strides[0]
    assert (setting["reference"], setting["candidate"], setting["path"]) == ([1, 1], [2, 2], "layer.0.convolution")
    source = (traced["reference"].parent / "models.py").read_text().splitlines()
    line = source[setting["assigned_at"]["line"] - 1].strip()
    assert line == "channels, channels // 2, kernel_size=1, stride=stride if on_1x1 else 1"


def test_a_child_called_through_forward_is_compared_with_the_module_of_its_kind(
    traced: dict[str, Path], capsys
) -> None:
    """The port's block calls `self.attention.forward(x)`: its attention has no module call, so nothing aligns with
    the reference's; inside the diverging block the two attentions pair by kind, and the port's `self.scale`
    (sqrt(dim) where the reference scales by 1/sqrt(dim)) is named at the line that assigns it."""
    first = first_divergence(traced["decoder_reference"], traced["decoder_scale_inverted"], capsys)
    [setting] = [setting for setting in first["settings"] if setting["name"] == "scaling"]
    assert setting["path"] == "attention"
    source = (traced["reference"].parent / "models.py").read_text().splitlines()
    assert source[setting["assigned_at"]["line"] - 1].strip() == "self.scale = dim ** power"


def test_a_module_called_in_the_place_of_one_never_called_is_named_at_its_call(
    traced: dict[str, Path], capsys
) -> None:
    """`gate = self.up_proj(x)` where the reference calls `gate_proj`: the port built `gate_proj` (with the
    reference's weights) and never calls it; the line named is the call that stands in its place."""
    first = first_divergence(traced["mlp"], traced["mlp_swapped"], capsys)
    source = (traced["reference"].parent / "models.py").read_text().splitlines()
    assert source[first["line"]["line"] - 1].strip() == "gate = self.up_proj(x)"
    assert "never calls" in first["line"]["reason"]
