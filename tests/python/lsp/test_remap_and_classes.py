"""Edit remapping and static class discovery: the pure functions behind "hints follow edits" and the lenses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from modeltrace.lsp.classes import base_model_name, find_module_classes, trace_arguments
from modeltrace.lsp.remap import remap_lines, split_lines


def test_split_lines_counts_only_lsp_line_breaks() -> None:
    assert split_lines("a\r\nb\rc\nd\x0ce\n") == ["a", "b", "c", "d\x0ce", ""]


def test_an_inserted_line_moves_the_lines_below() -> None:
    old = ["a = 1", "b = f(a)", "c = g(b)"]
    new = ["a = 1", "# note", "b = f(a)", "c = g(b)"]
    assert remap_lines({0: "A", 1: "B", 2: "C"}, old, new) == {0: "A", 2: "B", 3: "C"}


def test_a_changed_line_loses_its_value_even_when_it_repeats_elsewhere() -> None:
    old = ["x = a + x", "y = f(x)", "x = a + x"]
    new = ["x = a + x", "y = f(x) * 2", "x = a + x"]
    assert remap_lines({0: "first", 1: "call", 2: "second"}, old, new) == {0: "first", 2: "second"}


lines = st.lists(st.sampled_from(["x = f(x)", "y = g(x)", "", "return x", "z = x + y"]), max_size=30)


@given(old=lines, new=lines)
def test_values_only_move_to_lines_with_the_same_text_in_the_same_order(old: list[str], new: list[str]) -> None:
    moved = remap_lines({line: line for line in range(len(old))}, old, new)
    assert all(new[target] == old[source] for target, source in moved.items())
    targets = sorted(moved)
    assert [moved[target] for target in targets] == sorted(moved.values())


def test_module_classes_are_found_through_bases_defined_in_the_file_and_imported_names() -> None:
    source = """
import torch.nn as nn
from transformers import PreTrainedModel
from ..llama.modeling_llama import LlamaMLP, LlamaForCausalLM

class Helper:
    pass

class Norm(nn.Module):
    pass

class ScaledNorm(Norm):
    pass

class MyMLP(LlamaMLP):
    pass

class MyPreTrainedModel(PreTrainedModel):
    pass

class MyModel(MyPreTrainedModel):
    def forward(self, input_ids):
        return input_ids

class MyComposite(MyPreTrainedModel):  # generates only: no forward of its own, never the traced class
    pass

class MyForCausalLM(LlamaForCausalLM):
    pass

class MyConfig(PretrainedConfig):
    pass
"""
    classes = find_module_classes(source)
    assert [(cls.name, cls.is_model) for cls in classes] == [
        ("Norm", False),
        ("ScaledNorm", False),
        ("MyMLP", False),
        ("MyPreTrainedModel", True),
        ("MyModel", True),
        ("MyComposite", True),
        ("MyForCausalLM", True),
    ]
    assert base_model_name(classes) == "MyModel"
    assert base_model_name([cls for cls in classes if cls.name != "MyModel"]) == "MyForCausalLM"
    by_name = {cls.name: cls for cls in classes}
    assert trace_arguments("file:///m.py", by_name["ScaledNorm"], classes) == ["file:///m.py", "MyModel", "ScaledNorm"]
    assert trace_arguments("file:///m.py", by_name["MyForCausalLM"], classes) == ["file:///m.py", "MyForCausalLM"]
    assert source.splitlines()[by_name["Norm"].line][by_name["Norm"].column :].startswith("Norm(")


def test_a_file_of_plain_modules_traces_each_class_itself() -> None:
    classes = find_module_classes("from torch import nn\n\nclass Block(nn.Module):\n    pass\n")
    assert base_model_name(classes) is None
    assert trace_arguments("file:///b.py", classes[0], classes) == ["file:///b.py", "Block"]
