"""How modules were built (settings, parameters, construction line) and line-level drill-down, in the diff.

Worker records come from real transformers models built from small configs (GPT-2's Conv1D and LayerNorm,
Llama's RMSNorm); the diff's evidence from real traces made by the worker with `--lines` of the example model
and of edited copies of it (an RMSNorm built with another eps in one layer), of the example port (its rotary
code differs: the first differing line is in another file than the reference's), and of a Llama recipe with one
weight transposed, traced with full tensors (parameters compared in full).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaModel
from transformers.pytorch_utils import Conv1D

from conftest import EXAMPLE_PACKAGE, REPO_ROOT, line_of
from modeltrace.diff import DIVERGENCE, DiffOptions, diff_traces, line_statuses, load_reference, render_text, to_json
from modeltrace.diff.settings import (
    DIFFERENT,
    TRANSPOSED,
    activation_of,
    compare_parameters,
    compare_settings,
)
from modeltrace.trace.storage import read_trace
from modeltrace.worker.builds import ConstructionRecorder, record_builds, sample_positions, split_fields
from modeltrace.worker.messages import TraceRequest


PORT_FILE = REPO_ROOT / "examples" / "tiny_llama_port" / "modeling_tiny_llama_port.py"
OLD_TRACE = REPO_ROOT / "examples" / "reference" / "tiny_llama.mtrace"
EPS_LINE = "self.post_attention_layernorm = TinyLlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)"


def _gpt2(layer_norm_epsilon: float = 1e-5) -> tuple[GPT2LMHeadModel, dict]:
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, layer_norm_epsilon=layer_norm_epsilon
    )
    torch.manual_seed(0)
    with ConstructionRecorder() as constructions:
        model = GPT2LMHeadModel(config).eval()
    return model, {build.path: build for build in record_builds(model, constructions)}


def _source_line(location) -> str:
    return Path(location.file).read_text().splitlines()[location.line - 1]


def test_gpt2_builds_record_settings_construction_lines_and_fingerprints() -> None:
    model, builds = _gpt2()
    norm = builds["transformer.h.1.ln_2"]
    assert norm.class_name == "LayerNorm" and norm.settings["eps"] == 1e-5
    assert norm.settings["elementwise_affine"] is True and norm.settings["normalized_shape"] == [32]
    assert "self.ln_2 =" in _source_line(norm.built_at)
    assert norm.built_at.file.endswith("modeling_gpt2.py")
    # items of a ModuleList: the line that built the list
    assert "nn.ModuleList" in _source_line(builds["transformer.h.0"].built_at)
    projection = builds["transformer.h.0.attn.c_attn"]
    weight = next(parameter for parameter in projection.parameters if parameter.name == "weight")
    tensor = model.transformer.h[0].attn.c_attn.weight.detach()
    assert projection.class_name == "Conv1D" and weight.summary.shape == [32, 96]
    positions = sample_positions(tensor.numel())
    assert weight.sample == pytest.approx(tensor.reshape(-1)[positions].double().tolist())
    assert weight.sample_transposed == pytest.approx(tensor.t().reshape(-1)[positions].double().tolist())
    assert activation_of(builds["transformer.h.0.mlp.act"]) == "gelu_tanh"
    # tied embeddings: the head's weight is the embedding's
    head = builds["lm_head"].parameters[0]
    assert head.shared_with == "transformer.wte.weight"


def test_llama_rmsnorm_settings_from_attributes_and_extra_repr() -> None:
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        rms_norm_eps=1e-6,
    )
    with ConstructionRecorder() as constructions:
        model = LlamaModel(config)
    builds = {build.path: build for build in record_builds(model, constructions)}
    norm = builds["layers.0.input_layernorm"]
    assert norm.settings["variance_epsilon"] == 1e-6 and norm.settings["eps"] == 1e-6
    assert "self.input_layernorm =" in _source_line(norm.built_at)
    assert builds["layers.0.self_attn"].settings["scaling"] == pytest.approx(8**-0.5)
    assert split_fields("(32,), eps=1e-06, name='a,b'") == ["(32,)", "eps=1e-06", "name='a,b'"]


def test_eps_changed_in_one_layer_is_a_setting_difference() -> None:
    _, reference = _gpt2()
    model, _ = _gpt2()
    model.transformer.h[1].ln_2.eps = 1e-6
    candidate = {build.path: build for build in record_builds(model)}
    differences = compare_settings(reference["transformer.h.1.ln_2"], candidate["transformer.h.1.ln_2"])
    assert [(item.name, item.reference, item.candidate) for item in differences] == [("eps", 1e-5, 1e-6)]
    assert compare_settings(reference["transformer.h.0.ln_2"], candidate["transformer.h.0.ln_2"]) == []


def test_rmsnorm_variance_epsilon_pairs_with_layernorm_eps_across_classes() -> None:
    class ResearchRMSNorm(nn.Module):
        def __init__(self, width: int, epsilon: float) -> None:
            super().__init__()
            self.epsilon = epsilon
            self.scale = nn.Parameter(torch.ones(width))

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        rms_norm_eps=1e-6,
    )
    reference = {build.path: build for build in record_builds(LlamaModel(config))}["layers.0.input_layernorm"]
    candidate = record_builds(ResearchRMSNorm(32, 1e-5))[0]
    differences = compare_settings(reference, candidate)
    assert [(item.name, item.reference, item.candidate) for item in differences] == [("eps", 1e-6, 1e-5)]
    assert differences[0].note in ("eps vs epsilon", "variance_epsilon vs epsilon")
    # `scale` pairs with `weight` (same kind and size) and holds the same ones
    assert compare_parameters(reference, candidate) == []


def test_conv1d_and_linear_weights_copied_transposed_or_dropped() -> None:
    torch.manual_seed(0)
    conv = Conv1D(16, 16)  # GPT-2's c_proj: square, so only the values tell a transpose
    nn.init.normal_(conv.weight, std=0.02)
    reference = record_builds(conv)[0]

    def linear_with(weight: torch.Tensor | None) -> list:
        linear = nn.Linear(16, 16)
        with torch.no_grad():
            if weight is not None:
                linear.weight.copy_(weight)
            linear.bias.copy_(conv.bias)
        return compare_parameters(reference, record_builds(linear)[0])

    assert linear_with(conv.weight.t()) == []  # the right copy: Linear stores [out, in], Conv1D [in, out]
    transposed = linear_with(conv.weight)
    assert [(item.name, item.status) for item in transposed] == [("weight", TRANSPOSED)]
    dropped = linear_with(None)  # never copied: Linear's own initialisation
    assert [(item.name, item.status) for item in dropped] == [("weight", DIFFERENT)]
    assert dropped[0].max_abs_diff > 0.01


def test_dropped_weight_copy_in_a_transformers_model() -> None:
    reference_model, reference = _gpt2()
    torch.manual_seed(1)
    candidate_model = GPT2LMHeadModel(reference_model.config).eval()
    state = copy.deepcopy(reference_model.state_dict())
    del state["transformer.h.1.mlp.c_fc.weight"]
    candidate_model.load_state_dict(state, strict=False)
    candidate = {build.path: build for build in record_builds(candidate_model)}
    dropped = {path: compare_parameters(reference[path], candidate[path]) for path in reference}
    assert {path: [(item.name, item.status) for item in found] for path, found in dropped.items() if found} == {
        "transformer.h.1.mlp.c_fc": [("weight", DIFFERENT)]
    }


# ---------------------------------------------------------------------------------------- through traces


def _trace(worker, file: Path, out: Path, lines: bool = True) -> Path:
    return Path(worker.trace(TraceRequest(file=str(file), out=str(out), lines=lines, seed=0)).trace)


@pytest.fixture(scope="module")
def original(worker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _trace(worker, EXAMPLE_PACKAGE / "modeling_tiny_llama.py", tmp_path_factory.mktemp("evidence") / "a.mtrace")


def _edited_copy(tmp_path: Path, old: str, new: str) -> Path:
    target = tmp_path / "tiny_llama_edited"
    shutil.copytree(EXAMPLE_PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    modeling = target / "modeling_tiny_llama.py"
    source = modeling.read_text()
    assert source.count(old) == 1
    modeling.write_text(source.replace(old, new))
    return modeling


def test_eps_in_one_layer_is_named_with_its_construction_line(worker, original: Path, tmp_path: Path) -> None:
    edited = _edited_copy(
        tmp_path,
        EPS_LINE,
        EPS_LINE.replace("eps=config.rms_norm_eps", "eps=config.rms_norm_eps if layer_idx != 1 else 1e-2"),
    )
    candidate = _trace(worker, edited, tmp_path / "b.mtrace")
    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand, DiffOptions())
        divergence = result.first_divergence
        assert divergence.module.candidate.path == "layers.1.post_attention_layernorm"
        assert divergence.built_at.line == line_of(edited, "self.post_attention_layernorm =")
        assert [(item.name, item.reference, item.candidate) for item in divergence.settings] == [("eps", 1e-6, 1e-2)]
        # same file on both sides: the line of the forward that first computes another value
        assert divergence.line.line == line_of(edited, "hidden_states = hidden_states * torch.rsqrt(")
        assert divergence.line.file == str(edited.resolve())
        document = to_json(result)["first_divergence"]
        assert document["built_at"]["line"] == divergence.built_at.line
        assert document["settings"][0]["name"] == "eps" and document["line"]["line"] == divergence.line.line
        module = next(item for item in to_json(result)["modules"] if item["path"] == divergence.module.candidate.path)
        assert module["settings"][0]["candidate"] == 1e-2
        text = render_text(result)
        assert "layers.1.post_attention_layernorm: eps 1e-06 (reference) vs 0.01 (candidate), built at" in text
        assert "first differing line" in text
        statuses = line_statuses(result)
        assert statuses[(str(edited.resolve()), divergence.built_at.line)] == DIVERGENCE
        assert statuses[(divergence.line.file, divergence.line.line)] == DIVERGENCE


def test_port_in_another_file_names_its_first_differing_line(worker, original: Path, tmp_path: Path) -> None:
    candidate = _trace(worker, PORT_FILE, tmp_path / "port.mtrace")
    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand, DiffOptions())
        line = result.first_divergence.line
        assert line is not None and line.file == str(PORT_FILE.resolve())
        assert line.line == line_of(PORT_FILE, "x1 = x[..., 0::2]") and line.name == "x1"
        # rotate_half is a helper: the attention's forward line that leads to it is named and marked too
        caller = line_of(PORT_FILE, "query_states, key_states = apply_rotary_pos_emb(")
        assert line.called_from == (str(PORT_FILE.resolve()), caller)
        assert to_json(result)["first_divergence"]["line"]["called_from"] == {
            "file": str(PORT_FILE.resolve()),
            "line": caller,
        }
        assert line_statuses(result)[(str(PORT_FILE.resolve()), caller)] == "divergence"
        # the port builds its modules the same way: nothing reported as built differently
        assert not any(module.settings or module.parameters for module in result.modules)


SCALING_LINE = "self.scaling = self.head_dim**-0.5"


def _port_copy(tmp_path: Path, old: str, new: str) -> Path:
    target = tmp_path / "tiny_llama_port"
    shutil.copytree(PORT_FILE.parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    modeling = target / PORT_FILE.name
    source = modeling.read_text()
    assert source.count(old) == 1
    modeling.write_text(source.replace(old, new))
    return modeling


def test_a_setting_computed_in_init_is_named_at_the_line_that_assigns_it(
    worker, original: Path, tmp_path: Path
) -> None:
    edited = _port_copy(tmp_path, SCALING_LINE, "self.scaling = self.head_dim**-0.25")
    assigned = line_of(edited, "self.scaling = self.head_dim**-0.25")
    built = line_of(edited, "self.self_attn = TinyLlamaPortAttention(")
    candidate = _trace(worker, edited, tmp_path / "scaling.mtrace")
    # the construction record: the attention's own `__init__` line for the setting it computes; none for one that
    # only keeps a constructor argument (`self.variance_epsilon = eps`: the parent's line chose it)
    builds = {build.path: build for build in read_trace(candidate).builds}
    assert builds["layers.0.self_attn"].assigned_at["scaling"].line == assigned
    assert builds["layers.0.self_attn"].built_at.line == built
    assert "variance_epsilon" not in builds["layers.0.input_layernorm"].assigned_at
    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand, DiffOptions())
        divergence = result.first_divergence
        assert divergence.module.candidate.path == "layers.0.self_attn"
        (setting,) = [item for item in divergence.settings if item.name == "scaling"]
        assert (setting.reference, setting.candidate) == (0.25, 0.5)
        assert setting.assigned_at.file == str(edited.resolve()) and setting.assigned_at.line == assigned
        assert to_json(result)["first_divergence"]["settings"][0]["assigned_at"]["line"] == assigned
        text = render_text(result)
        assert f"scaling 0.25 (reference) vs 0.5 (candidate), assigned at {edited.resolve()}:{assigned}" in text
        assert "built at" not in text.split("scaling 0.25", 1)[1].splitlines()[0]
        statuses = line_statuses(result)
        assert statuses[(str(edited.resolve()), assigned)] == DIVERGENCE
        # the parent's line built the attention as the original does: not where the bug is
        assert statuses.get((str(edited.resolve()), built)) != DIVERGENCE


def test_identical_traces_have_no_evidence(worker, original: Path, tmp_path: Path) -> None:
    again = _trace(worker, EXAMPLE_PACKAGE / "modeling_tiny_llama.py", tmp_path / "again.mtrace")
    with load_reference(original) as ref, load_reference(again) as cand:
        result = diff_traces(ref, cand, DiffOptions())
        assert result.match and result.first_divergence is None
        assert not any(module.settings or module.parameters for module in result.modules)
    trace = read_trace(again)
    assert trace.builds and all(record.module_call >= 0 for record in trace.lines)
    # records only point at calls that exist
    assert {record.module_call for record in trace.lines} <= {record.index for record in trace.modules}


def test_old_traces_still_load_and_diff(original: Path) -> None:
    old = read_trace(OLD_TRACE)
    assert old.builds == [] and all(record.module_call == -1 for record in old.lines)
    with load_reference(OLD_TRACE) as ref, load_reference(original) as cand:
        result = diff_traces(ref, cand, DiffOptions())
        document = to_json(result)
        assert document["match"] is True or document["first_divergence"]["line"] is None
        assert not any(module.settings or module.parameters for module in result.modules)


def test_builds_are_recorded_once_per_module_not_per_call(original: Path) -> None:
    trace = read_trace(original)
    paths = [build.path for build in trace.builds]
    assert len(paths) == len(set(paths))
    assert {record.path for record in trace.modules} <= set(paths)


RECIPE = """
import torch
from transformers import LlamaConfig, LlamaModel


def build_model():
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    if TRANSPOSE:
        with torch.no_grad():
            weight = model.layers[1].self_attn.o_proj.weight
            weight.copy_(weight.t().clone())
    return model


def build_inputs(model):
    return {"input_ids": torch.arange(7).unsqueeze(0), "use_cache": False}
"""


def test_a_transposed_weight_is_named_from_full_tensors(worker, tmp_path: Path) -> None:
    traces = {}
    for name, transpose in (("reference", False), ("candidate", True)):
        recipe = tmp_path / f"recipe_{name}.py"
        recipe.write_text(f"TRANSPOSE = {transpose}\n" + RECIPE)
        traces[name] = Path(
            worker.trace(
                TraceRequest(
                    file=str(recipe),
                    recipe=str(recipe),
                    full_tensors=True,
                    out=str(tmp_path / f"{name}.mtrace"),
                    seed=0,
                )
            ).trace
        )
    candidate = read_trace(traces["candidate"])
    stored = {parameter.summary.tensor for build in candidate.builds for parameter in build.parameters}
    assert "parameters/layers.1.self_attn.o_proj.weight" in stored
    with load_reference(traces["reference"]) as ref, load_reference(traces["candidate"]) as cand:
        result = diff_traces(ref, cand, DiffOptions())
        divergence = result.first_divergence
        assert divergence.module.candidate.path == "layers.1.self_attn.o_proj"
        assert [(item.name, item.status) for item in divergence.parameters] == [("weight", TRANSPOSED)]
        assert "full tensors" in divergence.parameters[0].note
        # nothing else was built differently
        assert {module.candidate.path for module in result.modules if module.parameters} == {
            "layers.1.self_attn.o_proj"
        }
