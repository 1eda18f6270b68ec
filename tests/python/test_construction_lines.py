"""Construction lines of modules built into a list and wrapped later, and settings passed down through `__init__`s.

A port in the style of SEANet (EnCodec's encoder and decoder in transformers) builds its layers into a Python list
(`model += [nn.ELU()]`) and registers them at the end (`self.layers = nn.ModuleList(model)`): each module's
construction line is the line that called its class, not the one that wrapped the list. A residual block takes its
dilations as a list passed positionally (`PortResBlock(dim, [base**j, 1])`) and hands each element to a convolution
through a loop variable (`for kernel_size, dilation in zip(kernel_sizes, dilations)`), a weight-normed one (torch
makes its class `ParametrizedConv1d`): a wrong dilation is named at the line of the encoder that passes the list.
The reference builds the same network in its own way (an `nn.Sequential`, plain convolutions).
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from modeltrace.worker.builds import ConstructionRecorder, record_builds
from modeltrace.worker.client import WorkerClient
from small_models import diff_json, first_divergence, trace_builds

MODELS = textwrap.dedent("""
    import torch
    from torch import nn
    from transformers.activations import ACT2FN


    class CausalConv(nn.Module):
        def __init__(self, cin, cout, kernel_size, dilation=1):
            super().__init__()
            self.conv = nn.Conv1d(cin, cout, kernel_size, dilation=dilation)
            self.padding = (kernel_size - 1) * dilation

        def forward(self, x):
            return self.conv(torch.nn.functional.pad(x, (self.padding, 0)))


    class ResBlock(nn.Module):
        def __init__(self, dim, dilation):
            super().__init__()
            self.block = nn.Sequential(
                nn.ELU(), CausalConv(dim, dim // 2, 3, dilation=dilation), nn.ELU(), CausalConv(dim // 2, dim, 1)
            )

        def forward(self, x):
            return x + self.block(x)


    class Network(nn.Module):
        def __init__(self, dim, base):
            super().__init__()
            layers = [CausalConv(1, dim, 3)]
            for j in range(2):
                layers.append(ResBlock(dim, base**j))
            layers.append(nn.ELU())
            layers.append(CausalConv(dim, 1, 1))
            self.layers = nn.Sequential(*layers)

        def forward(self, x):
            return self.layers(x)


    class PortConv(nn.Module):
        def __init__(self, cin, cout, kernel_size, dilation=1):
            super().__init__()
            self.conv = nn.Conv1d(cin, cout, kernel_size, dilation=dilation)
            self.conv = nn.utils.parametrizations.weight_norm(self.conv)
            self.padding = (kernel_size - 1) * self.conv.dilation[0]

        def forward(self, x):
            x = torch.nn.functional.pad(x, (self.padding, 0))
            return self.conv(x)


    class PortResBlock(nn.Module):
        def __init__(self, dim, dilations):
            super().__init__()
            kernel_sizes = (3, 1)
            block = []
            for i, (kernel_size, dilation) in enumerate(zip(kernel_sizes, dilations)):
                cin = dim if i == 0 else dim // 2
                cout = dim // 2 if i == 0 else dim
                block += [nn.ELU()]
                block += [PortConv(cin, cout, kernel_size, dilation=dilation)]
            self.block = nn.ModuleList(block)

        def forward(self, x):
            residual = x
            for layer in self.block:
                x = layer(x)
            return residual + x


    class PortNetwork(nn.Module):
        def __init__(self, dim, base, bug):
            super().__init__()
            model = [PortConv(1, dim, 3)]
            for j in range(2):
                model += [PortResBlock(dim, [base if bug == "dilation" else base**j, 1])]
            model += [nn.Tanh() if bug == "activation" else nn.ELU()]
            model += [PortConv(dim, 1, 1)]
            self.layers = nn.ModuleList(model)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x


    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = ACT2FN["gelu"]
            self.stack = nn.Sequential(
                nn.Linear(4, 4),
                nn.Linear(4, 4),
            )
            self.clones = nn.ModuleList([copy_of(self.stack[0]) for _ in range(2)])


    def copy_of(module):
        import copy

        return copy.deepcopy(module)


    def _load(port_conv, conv):
        with torch.no_grad():
            weight = port_conv.conv.parametrizations.weight
            weight.original1.copy_(conv.weight)
            weight.original0.copy_(torch.linalg.vector_norm(conv.weight, dim=(1, 2), keepdim=True))
            port_conv.conv.bias.copy_(conv.bias)


    def reference():
        torch.manual_seed(0)
        return Network(4, 2).eval()


    def port(bug=None):
        original = reference()
        model = PortNetwork(4, 2, bug)
        pairs = [(model.layers[0], original.layers[0]), (model.layers[4], original.layers[4])]
        for position in (1, 2):
            pairs += [(model.layers[position].block[1], original.layers[position].block[1])]
            pairs += [(model.layers[position].block[3], original.layers[position].block[3])]
        for port_conv, reference_conv in pairs:
            _load(port_conv, reference_conv.conv)
        return model.eval()
""")


def _line(source: list[str], location: dict | object) -> str:
    line = location["line"] if isinstance(location, dict) else location.line
    return source[line - 1].strip()


@pytest.fixture(scope="module")
def models_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("construction-lines")
    (folder / "models.py").write_text(MODELS)
    return folder / "models.py"


def _import(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("construction_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_module_built_into_a_list_is_built_where_its_class_was_called(models_file: Path) -> None:
    models = _import(models_file)
    before = nn.Module.__init__
    with ConstructionRecorder() as constructions:
        model = models.PortNetwork(4, 2, "activation")
        mixed = models.Mixed()
    assert nn.Module.__init__ is before  # the wrapper is gone with the recorder
    source = models_file.read_text().splitlines()
    builds = {build.path: build for build in record_builds(model, constructions)}
    assert _line(source, builds["layers.3"].built_at) == 'model += [nn.Tanh() if bug == "activation" else nn.ELU()]'
    assert _line(source, builds["layers.1"].built_at).startswith("model += [PortResBlock(dim, [")
    assert _line(source, builds["layers.1.block.1"].built_at) == (
        "block += [PortConv(cin, cout, kernel_size, dilation=dilation)]"
    )
    # assigned again (`self.conv = weight_norm(self.conv)`), constructed once: the line that called Conv1d
    assert _line(source, builds["layers.1.block.1.conv"].built_at) == (
        "self.conv = nn.Conv1d(cin, cout, kernel_size, dilation=dilation)"
    )
    assert _line(source, builds["layers"].built_at) == "self.layers = nn.ModuleList(model)"
    mixed_builds = {build.path: build for build in record_builds(mixed, constructions)}
    # built by transformers' factory: the line of the registering file that called it
    assert _line(source, mixed_builds["act"].built_at) == 'self.act = ACT2FN["gelu"]'
    # the items of a multi-line nn.Sequential, each on its own line (both read `nn.Linear(4, 4),`)
    assert [mixed_builds[f"stack.{index}"].built_at.line for index in (0, 1)] == [
        mixed_builds["stack"].built_at.line + 1,
        mixed_builds["stack"].built_at.line + 2,
    ]
    # deep copies never call their class: the line that registered them
    assert _line(source, mixed_builds["clones.0"].built_at).startswith("self.clones = nn.ModuleList(")


def test_nested_recorders_share_one_wrapper_and_put_back_the_original() -> None:
    before = nn.Module.__init__
    with ConstructionRecorder() as outer:
        with ConstructionRecorder() as inner:
            layer = nn.Linear(2, 2)
        after_inner = nn.Linear(2, 2)
    assert nn.Module.__init__ is before
    assert inner.construction_stack(layer) and outer.construction_stack(layer)
    assert outer.construction_stack(after_inner) and not inner.construction_stack(after_inner)
    # NOTE: a deep copy is built without calling its class: nothing recorded for it
    assert not outer.construction_stack(copy.deepcopy(layer))
    assert torch.equal(layer(torch.ones(1, 2)), layer(torch.ones(1, 2)))


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    builds = {
        "reference": ("models.reference()", "1, 1, 32"),
        "clean": ("models.port()", "1, 1, 32"),
        "dilation": ('models.port("dilation")', "1, 1, 32"),
        "activation": ('models.port("activation")', "1, 1, 32"),
    }
    return trace_builds(tmp_path_factory.mktemp("construction-traces"), worker, MODELS, builds)


def _source(traced: dict[str, Path]) -> list[str]:
    return (traced["reference"].parent / "models.py").read_text().splitlines()


def test_the_clean_port_matches(traced: dict[str, Path], capsys) -> None:
    code, document = diff_json(traced["reference"], traced["clean"], capsys)
    assert code == 0, document.get("first_divergence")


def test_an_activation_built_into_a_list_is_named_at_its_construction(traced: dict[str, Path], capsys) -> None:
    first = first_divergence(traced["reference"], traced["activation"], capsys)
    assert first["path"] == "layers.3"
    assert _line(_source(traced), first["built_at"]) == 'model += [nn.Tanh() if bug == "activation" else nn.ELU()]'


def test_a_dilation_passed_down_two_inits_is_named_where_the_encoder_passes_it(
    traced: dict[str, Path], capsys
) -> None:
    """The first block's convolution dilates by 2 where the reference's does by 1: the value reaches the
    `nn.Conv1d` as `dilation=dilation` (PortConv's parameter), `dilation=dilation` (PortResBlock's loop variable
    over its parameter `dilations`) and the list PortNetwork passes in `dilations`' place."""
    first = first_divergence(traced["reference"], traced["dilation"], capsys)
    assert first["path"].startswith("layers.1"), first["path"]
    [setting] = [setting for setting in first["settings"] if setting["name"] == "dilation"]
    assert (setting["reference"], setting["candidate"]) == ([1], [2])
    assert setting["path"] == "layers.1.block.1.conv"
    assert _line(_source(traced), setting["assigned_at"]) == (
        'model += [PortResBlock(dim, [base if bug == "dilation" else base**j, 1])]'
    )


def test_a_value_is_followed_up_only_while_an_init_passes_a_parameter_on_unchanged() -> None:
    """The loop variable over `zip(kernel_sizes, dilations)` is an element of `dilations`, and the comprehension's
    of `dilations` too; `s += 1` and `stride * factor` compute a value there (that line decides it)."""
    import ast

    from modeltrace.diff.inner_builds import _parameter_behind, _positional_index

    source = textwrap.dedent("""
        def __init__(self, config, dim, dilations, stride, factor):
            kernel_sizes = (3, 1)
            for i, (kernel_size, dilation) in enumerate(zip(kernel_sizes, dilations)):
                first = make(dilation=dilation)
            s = stride
            s += 1
            second = make(stride=s)
            third = make(stride=stride * factor)
            fourth = [make(dilation=item) for item in dilations]
            fifth = make(stride=stride)
    """)
    function = ast.parse(source).body[0]
    values = {
        node.lineno: node.keywords[0].value
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "make"
    }
    behind = {line: _parameter_behind(function, value, line) for line, value in sorted(values.items())}
    assert list(behind.values()) == ["dilations", None, None, "dilations", "stride"]
    assert _positional_index(function, "dilations") == 2 and _positional_index(function, "self") is None
