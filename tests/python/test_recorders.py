"""`_can_record_outputs` static analysis, fixes and `modeltrace check`, on transformers' own files and small cases."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from conftest import load_bench_script
from modeltrace.cli import main
from modeltrace.recorders import analyze_source, apply_fixes

ROOT = Path(__file__).resolve().parents[2]
bench = load_bench_script("bench_recorders")

TRANSFORMERS = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations))) / "models"

# text, vision, audio, encoder-decoder and MoE families
FAMILIES = """
llama mistral qwen2 qwen3 gemma gemma2 phi3 olmo granite cohere stablelm starcoder2 gpt_neox gpt2 opt
phi glm glm4 helium olmo2 nemotron biogpt xglm ernie4_5 exaone4 smollm3 persimmon
bert roberta electra bart pegasus marian m2m_100 plbart blenderbot whisper speech_to_text qwen2_audio
clip siglip siglip2 vit deit beit dinov2 vit_mae ijepa blip_2
mixtral qwen2_moe qwen3_moe olmoe deepseek_v3 granitemoe phimoe nllb_moe ernie4_5_moe hunyuan_v1_moe
t5 mt5 umt5 seamless_m4t musicgen hubert wav2vec2 wavlm granite_speech5 convnext segformer albert convbert
jamba bamba falcon_h1 dbrx zamba zamba2 d_fine blt t5gemma2 idefics x_clip qwen2_vl mimi eomt
""".split()


def test_at_least_fifty_families():
    assert len(set(FAMILIES)) >= 50


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_round_trip(family):
    path = TRANSFORMERS / family / f"modeling_{family}.py"
    report = bench.round_trip(path)
    assert report["problems"] == [], report["problems"]
    assert report["cases"], "no _can_record_outputs entry found"
    for case in report["cases"]:
        assert case["reported"], case
        assert case["agree"], case


LLAMA_LIKE = """
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import PreTrainedModel
from transformers.utils.output_capturing import capture_outputs


class ToyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(4, 4)

    def forward(self, hidden_states):
        attn_weights = hidden_states.softmax(-1)
        return hidden_states, attn_weights


class ToyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = ToyAttention(config)
        self.mlp = nn.Linear(4, 4)


class ToyPreTrainedModel(PreTrainedModel):
    config_class = None
    _can_record_outputs = {
        "hidden_states": ToyLayer,
        "attentions": ToyAttention,
    }


class ToyModel(ToyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.layers = nn.ModuleList([ToyLayer(config) for _ in range(2)])

    @capture_outputs
    def forward(self, input_ids) -> BaseModelOutputWithPast:
        return BaseModelOutputWithPast(last_hidden_state=input_ids)
"""


def codes(source):
    return [p.code for p in analyze_source(source).problems]


def test_clean_toy_has_no_problem():
    assert codes(LLAMA_LIKE) == []


def test_missing_attentions_is_reported_and_fixed_keeping_format():
    broken = LLAMA_LIKE.replace('        "attentions": ToyAttention,\n', "")
    analysis = analyze_source(broken)
    [problem] = analysis.problems
    assert problem.code == "missing-recorder" and problem.key == "attentions"
    assert problem.to_json()["fix"]["entry"] == "ToyAttention"
    assert broken.count("\n") and problem.line == broken.splitlines().index("    _can_record_outputs = {") + 1
    fixed, applied = apply_fixes(broken)
    assert fixed == LLAMA_LIKE


def test_no_recorders_at_all():
    broken = LLAMA_LIKE.replace(
        """    _can_record_outputs = {
        "hidden_states": ToyLayer,
        "attentions": ToyAttention,
    }
""",
        "",
    )
    [problem] = analyze_source(broken).problems
    assert problem.code == "no-recorders"
    fixed, _ = apply_fixes(broken)
    assert codes(fixed) == []
    assert '"hidden_states": ToyLayer' in fixed and '"attentions": ToyAttention' in fixed


def test_layer_name_matching_no_module_is_fixed_with_output_recorder_import():
    broken = LLAMA_LIKE.replace(
        '"attentions": ToyAttention,', '"attentions": OutputRecorder(ToyAttention, index=1, layer_name="attn"),'
    )
    broken = broken.replace("import capture_outputs", "import OutputRecorder, capture_outputs")
    [problem] = analyze_source(broken).problems
    assert problem.code == "unknown-layer-name"
    fixed, _ = apply_fixes(broken)
    assert codes(fixed) == []


def test_shared_self_and_cross_attention_class():
    source = LLAMA_LIKE.replace(
        "        self.self_attn = ToyAttention(config)\n",
        "        self.self_attn = ToyAttention(config)\n        self.encoder_attn = ToyAttention(config)\n",
    ).replace("BaseModelOutputWithPast", "BaseModelOutputWithPastAndCrossAttentions")
    # cross-attention runs on encoder states: without them as an input there is nothing to record
    assert codes(source) == []
    source = source.replace("def forward(self, input_ids)", "def forward(self, input_ids, encoder_hidden_states=None)")
    analysis = analyze_source(source)
    problem_codes = sorted(p.code for p in analysis.problems)
    assert problem_codes == ["missing-recorder", "shared-attention-class"]
    fixed, _ = apply_fixes(source)
    assert codes(fixed) == []
    assert 'OutputRecorder(ToyAttention, index=1, layer_name="self_attn")' in fixed
    assert 'OutputRecorder(ToyAttention, index=1, layer_name="encoder_attn")' in fixed
    assert "import OutputRecorder, capture_outputs" in fixed


def test_unknown_class():
    broken = LLAMA_LIKE.replace('"attentions": ToyAttention,', '"attentions": ToyAttn,')
    assert codes(broken) == ["unknown-class"]


@pytest.mark.parametrize(
    "source",
    [
        "class Broken(:\n    pass\n",
        "x = 1\n",
        "",
        LLAMA_LIKE.replace("_can_record_outputs = {", "_can_record_outputs = make_recorders() or {"),
        LLAMA_LIKE.replace('"attentions": ToyAttention,', '"attentions": pick(ToyAttention),'),
        LLAMA_LIKE.replace('"attentions": ToyAttention,', "**OTHER,"),
    ],
)
def test_bad_input_no_false_alarm_no_crash(source):
    analysis = analyze_source(source)
    assert analysis.problems == []
    if "make_recorders" in source or "pick(" in source or "**OTHER" in source:
        assert any("dynamic" in n or "cannot resolve" in n for n in analysis.notes), analysis.notes
    if "Broken(" in source:
        assert "syntax error" in analysis.notes[0]


def test_inherited_and_parent_built_dict():
    source = LLAMA_LIKE.replace(
        "class ToyModel(ToyPreTrainedModel):",
        "class ToyBase(ToyPreTrainedModel):\n    pass\n\n\nclass ToyModel(ToyBase):",
    )
    assert codes(source) == []
    built = source.replace(
        "class ToyBase(ToyPreTrainedModel):\n    pass",
        'class ToyBase(ToyPreTrainedModel):\n    _can_record_outputs = {**ToyPreTrainedModel._can_record_outputs, "router_logits": ToyAttention}',
    )
    analysis = analyze_source(built)
    # the toy's output has no router_logits field: the entry is left alone, with a note
    assert analysis.problems == [] and len(analysis.notes) == 1 and "router_logits" in analysis.notes[0]
    assert set(analysis.uses[0].can_record.entries) == {"hidden_states", "attentions", "router_logits"}


def test_cli_check_text_json_fix(tmp_path, capsys):
    good = tmp_path / "modeling_good.py"
    good.write_text(LLAMA_LIKE)
    assert main(["check", str(good)]) == 0
    bad = tmp_path / "modeling_bad.py"
    bad.write_text(LLAMA_LIKE.replace('        "attentions": ToyAttention,\n', ""))
    capsys.readouterr()
    assert main(["check", str(bad), "--format", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    [problem] = document["problems"]
    assert set(problem) >= {"code", "message", "line", "fix"} and problem["code"] == "missing-recorder"
    assert main(["check", str(bad)]) == 1
    assert "missing-recorder" in capsys.readouterr().out
    assert main(["check", str(bad), "--fix"]) == 0
    assert bad.read_text() == LLAMA_LIKE
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    broken = tmp_path / "modeling_broken.py"
    broken.write_text("class X(:\n")
    capsys.readouterr()
    assert main(["check", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "syntax error" in err
    assert main(["check", str(tmp_path / "missing.py")]) == 2


def test_fix_that_fails_half_way_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """`--fix` writes a temporary file and renames it over the original: a crash before the rename (here the
    rename itself fails) leaves the user's file byte for byte as it was, and no temporary file behind."""
    import os

    from modeltrace.recorders import fixes

    bad = tmp_path / "modeling_bad.py"
    original = LLAMA_LIKE.replace('        "attentions": ToyAttention,\n', "")
    bad.write_text(original)

    def failing_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(fixes.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        fixes.fix_file(bad)
    assert bad.read_text() == original
    assert sorted(os.listdir(tmp_path)) == ["modeling_bad.py"]


def test_example_is_clean():
    path = ROOT / "examples" / "tiny_llama" / "modeling_tiny_llama.py"
    analysis = analyze_source(path.read_text(), str(path))
    assert analysis.uses and analysis.problems == []


def _example_copy(tmp_path, edit):
    import shutil

    package = tmp_path / "tiny_llama"
    shutil.copytree(
        ROOT / "examples" / "tiny_llama", package, ignore=shutil.ignore_patterns("*.mtrace", "__pycache__")
    )
    modeling = package / "modeling_tiny_llama.py"
    modeling.write_text(edit(modeling.read_text()))
    return modeling


def test_check_run_on_example_and_injected_problems(tmp_path, capsys):
    """One run for the clean example, one with a recorder class that is never instantiated (as after a
    register_patch_mapping without patch_output_recorders) and an index selecting the attention output."""
    clean = _example_copy(tmp_path / "clean", lambda s: s)
    assert main(["check", str(clean), "--run", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []

    def inject(source):
        source = source.replace(
            "class TinyLlamaPreTrainedModel(PreTrainedModel):",
            "class PatchedAttention(nn.Module):\n    pass\n\n\nclass TinyLlamaPreTrainedModel(PreTrainedModel):",
        )
        return source.replace('"attentions": TinyLlamaAttention,', '"attentions": PatchedAttention,')

    broken = _example_copy(tmp_path / "broken", inject)
    assert main(["check", str(broken), "--run", "--format", "json"]) == 1
    found = {p["code"] for p in json.loads(capsys.readouterr().out)["problems"]}
    assert {"class-not-instantiated", "empty-output"} <= found

    indexed = _example_copy(
        tmp_path / "indexed",
        lambda s: s.replace(
            '"attentions": TinyLlamaAttention,', '"attentions": OutputRecorder(TinyLlamaAttention, index=0),'
        ).replace("import capture_outputs", "import OutputRecorder, capture_outputs"),
    )
    assert main(["check", str(indexed), "--run", "--format", "json"]) == 1
    found = {p["code"] for p in json.loads(capsys.readouterr().out)["problems"]}
    assert "index-not-tensor" in found


def _toy(
    attention_forward: str, extra: str = "", layers: str = "nn.ModuleList([ToyLayer(config) for _ in range(2)])"
) -> str:
    source = LLAMA_LIKE.replace(
        "    def forward(self, hidden_states):\n        attn_weights = hidden_states.softmax(-1)\n        return hidden_states, attn_weights\n",
        textwrap.indent(textwrap.dedent(attention_forward), "    "),
    )
    source = source.replace("nn.ModuleList([ToyLayer(config) for _ in range(2)])", layers)
    return source.replace('        "attentions": ToyAttention,\n', "") + extra


def test_attention_returning_its_output_only_is_a_hint(tmp_path, capsys):
    source = _toy("""
        def forward(self, hidden_states):
            return self.q_proj(hidden_states)
    """)
    [problem] = analyze_source(source).problems
    assert problem.severity == "hint" and problem.key == "attentions" and problem.fix_json()["entry"] == "ToyAttention"
    path = tmp_path / "modeling_hint.py"
    path.write_text(source)
    assert main(["check", str(path)]) == 0  # a hint does not fail the check
    assert "hint: missing-recorder" in capsys.readouterr().out


def test_attention_returning_none_weights_needs_no_recorder():
    source = _toy("""
        def forward(self, hidden_states):
            return self.q_proj(hidden_states), None
    """)
    analysis = analyze_source(source)
    assert analysis.problems == [] and any("returns None" in n for n in analysis.notes)


def test_layers_from_a_lookup_table_and_a_builder_method():
    source = LLAMA_LIKE.replace(
        "class ToyPreTrainedModel(PreTrainedModel):",
        'class ToyOtherLayer(ToyLayer):\n    pass\n\n\nLAYER_TYPES = {"a": ToyLayer, "b": ToyOtherLayer}\n\n\nclass ToyPreTrainedModel(PreTrainedModel):',
    ).replace(
        "        self.layers = nn.ModuleList([ToyLayer(config) for _ in range(2)])\n",
        "        self.layers = self.build()\n\n    def build(self):\n        layers = []\n        for kind in self.config.kinds:\n"
        "            layer_class = LAYER_TYPES[kind]\n            layers.append(layer_class(self.config))\n        return nn.ModuleList(layers)\n",
    )
    assert codes(source) == []
    broken = source.replace('        "hidden_states": ToyLayer,\n', "")
    [problem] = analyze_source(broken).problems
    # ToyOtherLayer is a ToyLayer: the base class records both
    assert problem.code == "missing-recorder" and problem.fix_json()["entry"] in (
        "ToyLayer",
        "[ToyLayer, ToyOtherLayer]",
    )


T5_LIKE = """
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.modeling_utils import PreTrainedModel
from transformers.utils.output_capturing import OutputRecorder, capture_outputs


class ToyAttention(nn.Module):
    def forward(self, hidden_states, key_value_states=None):
        return hidden_states, None, hidden_states.softmax(-1)


class ToyLayerSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.SelfAttention = ToyAttention()

    def forward(self, hidden_states):
        attention_output, position_bias, attn_weights = self.SelfAttention(hidden_states)
        return attention_output, position_bias, attn_weights


class ToyLayerCrossAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.EncDecAttention = ToyAttention()

    def forward(self, hidden_states, key_value_states):
        attention_output, position_bias, attn_weights = self.EncDecAttention(hidden_states, key_value_states)
        return attention_output, position_bias, attn_weights


class ToyBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList()
        self.layer.append(ToyLayerSelfAttention(config))
        if config.is_decoder:
            self.layer.append(ToyLayerCrossAttention(config))
        self.layer.append(nn.Linear(4, 4))

    def forward(self, hidden_states, encoder_hidden_states=None):
        return (hidden_states,)


class ToyPreTrainedModel(PreTrainedModel):
    _can_record_outputs = {
        "hidden_states": OutputRecorder(ToyBlock, index=0),
        "attentions": OutputRecorder(ToyLayerSelfAttention, index=-1),
        "cross_attentions": OutputRecorder(ToyLayerCrossAttention, index=-1),
    }


class ToyStack(ToyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.block = nn.ModuleList([ToyBlock(config) for _ in range(2)])

    @capture_outputs
    def forward(self, input_ids, encoder_hidden_states=None) -> BaseModelOutputWithPastAndCrossAttentions:
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=input_ids)
"""


@pytest.mark.parametrize("key", ["attentions", "cross_attentions"])
def test_t5_like_wrapper_class_and_index_of_the_weights(key):
    """The inner attention class serves self- and cross-attention: the dedicated wrapper is recorded, at the
    index of the weights in what its forward returns (2: the same element as the original's -1)."""
    assert codes(T5_LIKE) == []
    wrapper = "ToyLayerSelfAttention" if key == "attentions" else "ToyLayerCrossAttention"
    broken = "\n".join(line for line in T5_LIKE.splitlines() if f'"{key}"' not in line) + "\n"
    [problem] = analyze_source(broken).problems
    assert problem.fix_json()["entry"] == f"OutputRecorder({wrapper}, index=2)"
    fixed, _ = apply_fixes(broken)
    assert codes(fixed) == []
