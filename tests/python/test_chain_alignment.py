"""Alignment where the two implementations cut one computation into modules differently (issue 30, coverage):
a module on one side that computes what a run of modules on the other side computes in sequence pairs with that
run (a chain, `diff/chains.py`), where names align most modules, evidence pairs what names left (a fused
projection beside shared names, `align._fill_by_evidence`), and a pair that the pairs inside it contradict, with
outputs that differ, is dropped (`diff/nesting.py`).

The models are small torch modules written the two ways (timm's `Bottleneck` calls `conv1`, `bn1`, `act1` itself,
transformers' `ResNetConvLayer` wraps convolution, norm and activation), captured with `modeltrace.capture`,
the port's weights copied from the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from modeltrace import capture
from modeltrace.diff import align_modules, close_result, diff_paths, read_mapping, render_mapping
from modeltrace.diff.chains import chain_runs
from modeltrace.diff.compare import decide
from modeltrace.diff.nesting import contradicted
from modeltrace.diff.unaligned import forget_moved_into
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import ModuleCall, TensorSummary, Trace
from modeltrace.trace.storage import read_trace


class Stem(nn.Module):
    """timm's way: the block calls its convolutions, norms and activations itself."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))


class ConvLayer(nn.Module):
    """transformers' way: convolution, norm and activation in one module."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int, activation: bool, shift: float = 0.0):
        super().__init__()
        self.convolution = nn.Conv2d(channels_in, channels_out, kernel, padding=kernel // 2, bias=False)
        self.normalization = nn.BatchNorm2d(channels_out)
        self.activation = nn.ReLU() if activation else nn.Identity()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.normalization(self.convolution(x)) + self.shift)


class Port(nn.Module):
    def __init__(self, shift: float = 0.0) -> None:
        super().__init__()
        self.layer = nn.Sequential(ConvLayer(3, 8, 3, True, shift), ConvLayer(8, 8, 1, False))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x).mean(dim=(2, 3)))


def _ported(reference: Stem, shift: float = 0.0) -> Port:
    port = Port(shift)
    names = {"conv1": "0.convolution", "bn1": "0.normalization", "conv2": "1.convolution", "bn2": "1.normalization"}
    with torch.no_grad():
        for old, new in names.items():
            port.layer.get_submodule(new).load_state_dict(reference.get_submodule(old).state_dict())
        port.head.load_state_dict(reference.head.state_dict())
    return port.eval()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    reference = Stem().eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        for norm in (reference.bn1, reference.bn2):
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
    folder = tmp_path_factory.mktemp("chains")
    image = torch.randn(1, 3, 6, 6)
    found = {}
    for name, model in (("reference", reference), ("port", _ported(reference)), ("bug", _ported(reference, 0.5))):
        found[name] = folder / f"{name}.mtrace"
        with torch.no_grad(), capture(model, found[name], full_tensors=True):
            model(image)
    return found


def test_a_module_pairs_with_the_run_it_computes_in_sequence(traces: dict[str, Path], tmp_path: Path) -> None:
    reference, port = read_trace(traces["reference"]), read_trace(traces["port"])
    mapping = align_modules(reference, port)
    chains = {pair.candidate[0]: pair.reference for pair in mapping.pairs if pair.chain}
    assert chains == {
        "layer.0": ["conv1", "bn1", "act1"],
        "layer.1": ["conv2", "bn2"],
        "layer": ["conv1", "bn1", "act1", "conv2", "bn2"],  # built on its children's runs
    }
    # the run's members keep their own pairs
    one_to_one = {pair.candidate[0]: pair.reference[0] for pair in mapping.pairs if not pair.chain}
    assert one_to_one["layer.0.activation"] == "act1" and one_to_one["layer.1.normalization"] == "bn2"
    # the mapping file writes a chain with '->' and reads it back as one
    written = tmp_path / "mapping.txt"
    written.write_text(render_mapping(mapping, "reference", "port"))
    assert "conv1 -> bn1 -> act1 => layer.0" in written.read_text()
    again = read_mapping(written, reference, port)
    assert {pair.candidate[0]: pair.reference for pair in again.pairs if pair.chain} == chains
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("conv1 -> bn1 + act1 => layer.0\n")
    with pytest.raises(ModelTraceError, match=r"mixed.txt:1: a pair is a fused run \('\+'\) or a chain"):
        read_mapping(mixed, reference, port)


def test_a_chain_is_judged_on_the_runs_first_input_and_last_output(traces: dict[str, Path]) -> None:
    result = diff_paths(traces["reference"], traces["port"])
    try:
        assert result.first_divergence is None and result.not_comparable is None
        layer = next(module for module in result.modules if module.candidate.path == "layer.0")
        assert layer.reference is not None and layer.reference.path == "conv1 -> bn1 -> act1"
        assert layer.status == "match"
    finally:
        close_result(result)
    # a shift added in the layer's own forward, between its children: the layer is where it diverges (its input
    # is conv1's and matches, its output is act1's and differs), not its parent
    result = diff_paths(traces["reference"], traces["bug"])
    try:
        assert result.first_divergence is not None
        assert result.first_divergence.module.candidate.path == "layer.0"
        assert result.first_divergence.inputs_match
    finally:
        close_result(result)


def _summary(mean: float, shape: list[int] | None = None) -> TensorSummary:
    return TensorSummary(key="", shape=shape or [1, 4, 8], dtype="float32", mean=mean, std=1.0)


def _record(index: int, path: str, parent: int, finish: int, inputs: list[float], output: float) -> ModuleCall:
    return ModuleCall(
        index=index,
        path=path,
        class_name="Linear",
        defined_at=None,
        called_at=None,
        call_index=0,
        parent=parent,
        finish_order=finish,
        inputs=[_summary(mean) for mean in inputs],
        outputs=[_summary(output)],
    )


def _trace(rows: list[tuple[str, int, int, float, float]]) -> Trace:
    """A trace from (path, parent, finish order, input mean, output mean) rows, the root first."""
    return Trace({}, [_record(index, *row[:3], [row[3]], row[4]) for index, row in enumerate(rows)])


def test_parallel_branches_and_extra_inputs_are_no_chain() -> None:
    """q, k and v take one input side by side: a module that calls them and returns the last one's output is no
    chain of them; nor is a module whose children also take a tensor the module made (a mask, a rotary table),
    which a chain's record (its first member's inputs) would leave uncompared."""
    parallel_reference = _trace(
        [("", -1, 3, 0.1, 0.4), ("q", 0, 0, 0.1, 0.2), ("k", 0, 1, 0.1, 0.3), ("v", 0, 2, 0.1, 0.4)]
    )
    parallel = _trace(
        [
            ("", -1, 4, 0.1, 0.4),
            ("attention", 0, 3, 0.1, 0.4),
            ("attention.q", 1, 0, 0.1, 0.2),
            ("attention.k", 1, 1, 0.1, 0.3),
            ("attention.v", 1, 2, 0.1, 0.4),
        ]
    )
    partners = {"attention.q": (("q",), 1.0), "attention.k": (("k",), 1.0), "attention.v": (("v",), 1.0)}
    assert chain_runs(parallel, parallel_reference, dict(partners), set()) == []
    # the same three as a pipeline (each takes its predecessor's output) form a chain...
    stages = _trace([("", -1, 3, 0.1, 0.4), ("q", 0, 0, 0.1, 0.2), ("k", 0, 1, 0.2, 0.3), ("v", 0, 2, 0.3, 0.4)])
    pipeline = _trace(
        [
            ("", -1, 4, 0.1, 0.4),
            ("stack", 0, 3, 0.1, 0.4),
            ("stack.q", 1, 0, 0.1, 0.2),
            ("stack.k", 1, 1, 0.2, 0.3),
            ("stack.v", 1, 2, 0.3, 0.4),
        ]
    )
    partners = {"stack.q": (("q",), 1.0), "stack.k": (("k",), 1.0), "stack.v": (("v",), 1.0)}
    assert [(chain.module, chain.run) for chain in chain_runs(pipeline, stages, dict(partners), set())] == [
        ("stack", ("q", "k", "v"))
    ]
    # ...unless a stage also takes a second tensor (a mask the module made)
    pipeline.modules[3].inputs.append(_summary(0.9, [1, 1, 4, 4]))
    assert chain_runs(pipeline, stages, dict(partners), set()) == []


class Attention(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        if fused:
            self.qkv_proj = nn.Linear(8, 24)
        else:
            self.q_proj, self.k_proj, self.v_proj = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.o_proj = nn.Linear(8, 8)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            q, k, v = self.qkv_proj(x).split(8, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        weights = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return self.o_proj(weights @ v)


class Model(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.self_attn = Attention(fused)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.self_attn(self.norm(x)))


def test_evidence_pairs_what_names_left(tmp_path: Path) -> None:
    """gemma_pytorch's fused `qkv_proj` against transformers' `q_proj`, `k_proj`, `v_proj`, every other name
    shared: names align most modules, so the automatic alignment never ran and the fused module stayed unpaired."""
    torch.manual_seed(0)
    reference, port = Model(fused=False).eval(), Model(fused=True).eval()
    with torch.no_grad():
        port.norm.load_state_dict(reference.norm.state_dict())
        port.out.load_state_dict(reference.out.state_dict())
        port.self_attn.o_proj.load_state_dict(reference.self_attn.o_proj.state_dict())
        attention = reference.self_attn
        port.self_attn.qkv_proj.weight.copy_(
            torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
        )
        port.self_attn.qkv_proj.bias.copy_(
            torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias])
        )
    tokens = torch.randn(1, 5, 8)
    for name, model in (("reference", reference), ("port", port)):
        with torch.no_grad(), capture(model, tmp_path / f"{name}.mtrace", full_tensors=True):
            model(tokens)
    result = diff_paths(tmp_path / "reference.mtrace", tmp_path / "port.mtrace")
    try:
        fused = next(module for module in result.modules if module.candidate.path == "self_attn.qkv_proj")
        assert fused.reference is not None
        assert fused.reference.path == "self_attn.q_proj + self_attn.k_proj + self_attn.v_proj"
        assert fused.aligned_by == "auto" and fused.status == "match"
        assert result.alignment.unaligned_candidate == []
        # the names' pairs stay as they were
        assert {module.aligned_by for module in result.modules if module.candidate.path != "self_attn.qkv_proj"} == {
            "path"
        }
        assert result.first_divergence is None
    finally:
        close_result(result)


def test_a_pair_the_pairs_inside_it_contradict_is_dropped() -> None:
    """Swin: the order alignment paired timm's `layers` (every stage) with transformers' first stage, while the
    second stage's blocks pair inside `layers.1`. With outputs that differ, nothing speaks for that pair; with
    outputs that agree, it stays."""
    pairs = [
        ("", ""),
        ("layers", "encoder.layers.0"),
        ("layers.0.blocks.0", "encoder.layers.0.blocks.0"),
        ("layers.1.downsample", "encoder.layers.0.downsample"),
        ("layers.1.blocks", "encoder.layers.1"),
    ]
    assert contradicted(pairs, lambda reference, candidate: False) == {("layers", "encoder.layers.0")}
    assert contradicted(pairs, lambda reference, candidate: True) == set()


class Head(nn.Module):
    """timm's way: the stages and a head whose pooling is a module of its own, norm and classifier inline."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 2, stride=2)
        self.stages = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 8, 1))
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(self.norm(self.global_pool(x).flatten(1)))


class Backbone(nn.Module):
    """transformers' `ConvNextModel`: the stages, then the pooling and its norm, returned beside the hidden
    states."""

    def __init__(self, max_pooling: bool) -> None:
        super().__init__()
        self.embeddings = nn.Conv2d(3, 8, 2, stride=2)
        self.encoder = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 8, 1))
        self.layernorm = nn.LayerNorm(8)
        self.max_pooling = max_pooling

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encoder(self.embeddings(pixels))
        pooled = hidden.amax([-2, -1]) if self.max_pooling else hidden.mean([-2, -1])
        return hidden, self.layernorm(pooled)


class Classifier(nn.Module):
    def __init__(self, max_pooling: bool) -> None:
        super().__init__()
        self.backbone = Backbone(max_pooling)
        self.classifier = nn.Linear(8, 4)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.backbone(pixels)[1])


def test_a_chain_compared_in_part_is_searched_for_what_it_computes_past_its_run(tmp_path: Path) -> None:
    """The backbone pairs with `stem -> stages` (a chain): its hidden states match, its pooled output has no
    counterpart in the run and is left out. A bug in its pooling is first seen at its `layernorm` (aligned with
    the head's norm, outside the run), which receives a differing tensor: the difference arises inside the
    backbone, whose inputs match, so it is the divergence, bounded by its aligned children, not the root."""
    torch.manual_seed(0)
    reference = Head().eval()
    ports = {}
    for name, max_pooling in (("port", False), ("bug", True)):
        port = Classifier(max_pooling).eval()
        with torch.no_grad():
            port.backbone.embeddings.load_state_dict(reference.stem.state_dict())
            port.backbone.encoder.load_state_dict(reference.stages.state_dict())
            port.backbone.layernorm.load_state_dict(reference.norm.state_dict())
            port.classifier.load_state_dict(reference.fc.state_dict())
        ports[name] = port
    image = torch.randn(1, 3, 8, 8)
    for name, model in (("reference", reference), *ports.items()):
        with torch.no_grad(), capture(model, tmp_path / f"{name}.mtrace", full_tensors=True):
            model(image)
    result = diff_paths(tmp_path / "reference.mtrace", tmp_path / "port.mtrace")
    try:
        assert result.first_divergence is None and result.not_comparable is None
    finally:
        close_result(result)
    result = diff_paths(tmp_path / "reference.mtrace", tmp_path / "bug.mtrace")
    try:
        backbone = next(module for module in result.modules if module.candidate.path == "backbone")
        assert backbone.reference is not None and backbone.reference.path == "stem -> stages"
        divergence = result.first_divergence
        assert divergence is not None and divergence.module is backbone and divergence.inputs_match
        assert divergence.compared_in is not None and divergence.compared_in.candidate.path == ""
        assert divergence.last_matching_child is not None
        assert divergence.last_matching_child.candidate.path == "backbone.encoder"
        assert divergence.first_differing_child is not None
        assert divergence.first_differing_child.candidate.path == "backbone.layernorm"
        pooling = next(
            number for number, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "hidden.amax(" in text
        )
        assert divergence.lines is not None and divergence.lines.start <= pooling <= divergence.lines.end
        # a verdict recomputed (after a replay) restores the backbone's own comparison first, and finds it again
        decide(result)
        assert result.first_divergence is not None and result.first_divergence.module is backbone
        forget_moved_into(backbone)
        assert (backbone.status, backbone.outputs, backbone.max_abs_diff) == ("match", "match", 0.0)
    finally:
        close_result(result)
