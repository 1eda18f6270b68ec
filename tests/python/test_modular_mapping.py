"""The map of a modular file's lines onto its generated modeling file, on real pairs of the installed transformers.

transformers' converter writes `modeling_<name>.py` from `modular_<name>.py`; `modeltrace.modular` maps each modular
line onto the generated line that carries its code (torch-free: the language server uses it), reports the methods
a class inherits unchanged, and says when the generated file is out of date with the modular one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import transformers

from modeltrace.errors import ModelTraceError
from modeltrace.modular.mapping import map_modular, map_modular_file, sibling_definitions
from modeltrace.modular.twins import generated_path, modular_twin, regenerate_command, resolve_generated


MODELS = Path(transformers.__file__).resolve().parent / "models"
QWEN3 = MODELS / "qwen3" / "modular_qwen3.py"
APERTUS = MODELS / "apertus" / "modular_apertus.py"


def line_of(text: str, snippet: str, after: int = 0) -> int:
    """1-based number of the first line at or after line `after` that holds `snippet`."""
    for number, line in enumerate(text.splitlines(), start=1):
        if number >= after and snippet in line:
            return number
    raise AssertionError(f"{snippet!r} not found")


def function_node(text: str, class_name: str, method: str) -> ast.FunctionDef:
    tree = ast.parse(text)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
    return next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method)


def test_the_twin_of_a_modular_file_is_the_modeling_file_beside_it() -> None:
    assert generated_path(QWEN3) == MODELS / "qwen3" / "modeling_qwen3.py"
    assert resolve_generated(QWEN3) == (MODELS / "qwen3" / "modeling_qwen3.py").resolve()
    assert modular_twin(MODELS / "qwen3" / "modeling_qwen3.py") == QWEN3
    # a modeling file written by hand has no modular twin
    assert modular_twin(MODELS / "llama" / "modeling_llama.py") is None


def test_a_class_that_only_renames_its_parent_runs_the_parents_methods_as_generated() -> None:
    mapping = map_modular_file(QWEN3)
    generated = Path(mapping.generated).read_text().splitlines()
    inherited = {(item.class_name, item.method): item for item in mapping.inherited}
    norm = inherited[("Qwen3RMSNorm", "forward")]
    assert norm.parent == "Qwen2RMSNorm"
    assert generated[norm.generated_start - 1].strip().startswith("def forward(")
    # the generated method is the parent's, renamed: its body names the model's classes only
    body = "\n".join(generated[norm.generated_start - 1 : norm.generated_end])
    assert "Qwen2" not in body
    assert norm.describe("modeling_qwen3.py") == (
        f"inherited from `Qwen2RMSNorm.forward`, {norm.line_count} lines: modeling_qwen3.py:{norm.generated_start}"
    )
    modular_text = QWEN3.read_text()
    assert norm.class_line == line_of(modular_text, "class Qwen3RMSNorm(Qwen2RMSNorm):")
    # a class the modular file overrides is not reported as inheriting what it defines
    assert ("Qwen3Attention", "forward") not in inherited
    assert not mapping.is_stale, mapping.staleness()


def test_a_parent_name_in_modular_code_maps_onto_the_renamed_generated_line() -> None:
    # The converter renames the parents' prefixes: `Qwen2RMSNorm(...)` written in the modular file is generated
    # as `Qwen3RMSNorm(...)`. Spelled that way in the real modular file, the line still maps onto its twin.
    modular_text = QWEN3.read_text()
    original = "self.q_norm = Qwen3RMSNorm(self.head_dim"
    assert modular_text.count(original) == 1
    renamed = modular_text.replace(original, "self.q_norm = Qwen2RMSNorm(self.head_dim")
    generated_text = generated_path(QWEN3).read_text()
    mapping = map_modular(renamed, generated_text, QWEN3)
    line = line_of(renamed, "self.q_norm = Qwen2RMSNorm(")
    (twin,) = mapping.generated_lines(line)
    assert generated_text.splitlines()[twin - 1].strip().startswith(original)
    assert not mapping.is_stale, mapping.staleness()


def test_every_line_of_an_overridden_forward_maps_onto_the_same_code() -> None:
    mapping = map_modular_file(QWEN3)
    modular_lines = QWEN3.read_text().splitlines()
    generated_lines = Path(mapping.generated).read_text().splitlines()
    forward = function_node(QWEN3.read_text(), "Qwen3Attention", "forward")
    body = range(forward.lineno, forward.end_lineno + 1)
    code_lines = [line for line in body if modular_lines[line - 1].strip()]
    assert len(code_lines) > 30
    for line in code_lines:
        twins = mapping.generated_lines(line)
        assert len(twins) == 1, (line, modular_lines[line - 1])
        assert generated_lines[twins[0] - 1].strip() == modular_lines[line - 1].strip()
    # in order, and inside the generated Qwen3Attention.forward
    generated_forward = function_node(Path(mapping.generated).read_text(), "Qwen3Attention", "forward")
    twins = [mapping.generated_lines(line)[0] for line in code_lines]
    assert twins == sorted(twins)
    assert generated_forward.lineno <= twins[0] and twins[-1] <= generated_forward.end_lineno


def test_a_super_forward_call_maps_onto_the_inlined_parent_body() -> None:
    mapping = map_modular_file(APERTUS)
    modular_text = APERTUS.read_text()
    generated_text = Path(mapping.generated).read_text()
    causal_forward = function_node(modular_text, "ApertusForCausalLM", "forward")
    call = line_of(modular_text, "return super().forward(**super_kwargs)", after=causal_forward.lineno)
    inlined = mapping.generated_lines(call)
    assert len(inlined) > 5
    lines = generated_text.splitlines()
    inlined_text = "\n".join(lines[line - 1] for line in inlined)
    # the parent's (LlamaForCausalLM's) body, renamed: it runs the model, then the head
    assert "outputs: BaseModelOutputWithPast = self.model(" in inlined_text
    assert "logits = self.lm_head(hidden_states)" in inlined_text
    generated_forward = function_node(generated_text, "ApertusForCausalLM", "forward")
    assert all(generated_forward.lineno < line <= generated_forward.end_lineno for line in inlined)


def test_deleted_attributes_and_a_new_config_are_not_stale() -> None:
    mapping = map_modular_file(APERTUS)
    modular_text = APERTUS.read_text()
    generated_text = Path(mapping.generated).read_text()
    # `del self.input_layernorm`: the converter drops the parent's attribute and the `del` line
    deleted = line_of(modular_text, "del self.input_layernorm")
    assert mapping.generated_lines(deleted) == ()
    layer_init = function_node(generated_text, "ApertusDecoderLayer", "__init__")
    init_text = "\n".join(generated_text.splitlines()[layer_init.lineno - 1 : layer_init.end_lineno])
    assert "input_layernorm" not in init_text
    added = line_of(modular_text, "self.attention_layernorm = ApertusRMSNorm(")
    (twin,) = mapping.generated_lines(added)
    assert layer_init.lineno < twin <= layer_init.end_lineno
    # `super().__init__(config, layer_idx)` inlines the parent's __init__: the line maps onto those lines
    super_init = line_of(
        modular_text, "super().__init__(config, layer_idx)", after=line_of(modular_text, "class ApertusDecoderLayer")
    )
    assert "self.self_attn = ApertusAttention(" in "\n".join(
        generated_text.splitlines()[line - 1] for line in mapping.generated_lines(super_init)
    )
    # the modular file's own config class is generated into configuration_apertus.py, not the modeling file
    assert "class ApertusConfig(" in modular_text and "class ApertusConfig(" not in generated_text
    assert "ApertusConfig" in sibling_definitions(APERTUS)
    assert "ApertusConfig" not in mapping.missing
    assert not mapping.is_stale, mapping.staleness()


def test_an_edited_forward_line_makes_the_generated_file_stale() -> None:
    modular_text = QWEN3.read_text()
    original = "attn_output = self.o_proj(attn_output)"
    assert modular_text.count(original) == 1
    edited = modular_text.replace(original, "attn_output = self.o_proj(attn_output) * 2")
    mapping = map_modular(edited, generated_path(QWEN3).read_text(), QWEN3)
    line = line_of(edited, "attn_output = self.o_proj(attn_output) * 2")
    assert mapping.is_stale
    assert [(stale.line, stale.where) for stale in mapping.stale] == [(line, "Qwen3Attention.forward")]
    message = mapping.staleness()
    assert f"line {line} (Qwen3Attention.forward)" in message
    assert regenerate_command(QWEN3) in message
    # the other lines still map: hints stay where the code is the same
    assert mapping.generated_lines(line_of(edited, "value_states = self.v_proj(hidden_states)"))


def test_a_method_added_since_generation_is_missing() -> None:
    modular_text = QWEN3.read_text()
    anchor = "class Qwen3ForSequenceClassification(Qwen2ForSequenceClassification):\n    pass\n"
    assert anchor in modular_text
    edited = modular_text.replace(
        anchor,
        "class Qwen3ForSequenceClassification(Qwen2ForSequenceClassification):\n"
        "    def scale(self, value):\n        return value * 2\n",
    )
    mapping = map_modular(edited, generated_path(QWEN3).read_text(), QWEN3)
    assert mapping.missing == ["Qwen3ForSequenceClassification.scale"]
    assert "Qwen3ForSequenceClassification.scale is not in any generated file" in mapping.staleness()


def test_no_installed_modular_file_reads_as_stale() -> None:
    """Every modular/generated pair transformers ships was generated from its modular file: none is stale. This is
    what keeps the converter's by-design rewrites (inlined calls, removed members, moved attributes) from being
    taken for edits."""
    pairs = [path for path in sorted(MODELS.glob("*/modular_*.py")) if generated_path(path).is_file()]
    assert len(pairs) > 300
    stale = {path.name: map_modular_file(path).staleness() for path in pairs}
    assert {name: message for name, message in stale.items() if message} == {}


def test_a_modular_file_without_its_twin_names_the_command_that_generates_it(tmp_path: Path) -> None:
    folder = tmp_path / "qwen3"
    folder.mkdir()
    modular = folder / "modular_qwen3.py"
    modular.write_text(QWEN3.read_text())
    with pytest.raises(ModelTraceError) as missing:
        resolve_generated(modular)
    assert "modeling_qwen3.py does not exist" in str(missing.value)
    assert f"python utils/modular_model_converter.py --files_to_parse {modular}" in str(missing.value)
    (folder / "modeling_qwen3.py").write_text("class Broken(:\n")
    with pytest.raises(ModelTraceError) as broken:
        resolve_generated(modular)
    assert "modeling_qwen3.py:1: the generated twin of modular_qwen3.py does not parse" in str(broken.value)
    assert sorted(path.name for path in folder.iterdir()) == ["modeling_qwen3.py", "modular_qwen3.py"]
