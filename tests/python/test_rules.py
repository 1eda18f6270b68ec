"""The rules shared by the editor and the worker (`modeltrace.rules`) give one answer on both sides.

The editor reads a modeling file with `ast` (no import), the worker imports it; on real transformers files
both must pick the same base model, or the code lens asks the worker to build a class the CLI would not.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from modeltrace.lsp.classes import base_model_name, find_module_classes
from modeltrace.rules import is_task_head, pick_base_model
from modeltrace.worker.building import choose_model_class


# maskformer and pp_formulanet: "For" inside the family name (`MaskFormerModel`), which the editor once took
# for a task head (it then built `MaskFormerDetrDecoder`); the others cover heads, `…Model` and composites.
FAMILIES = ("maskformer", "pp_formulanet", "mask2former", "llama", "gpt2", "bert", "t5", "blip", "bark")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_editor_and_the_worker_pick_the_same_base_model(family: str) -> None:
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    source = Path(module.__file__).read_text()
    worker_choice = choose_model_class(module, None, Path(module.__file__)).__name__
    assert base_model_name(find_module_classes(source)) == worker_choice
    assert not is_task_head(worker_choice) or family == "bark"


def test_task_heads_are_for_and_a_capitalised_task() -> None:
    assert is_task_head("LlamaForCausalLM") and is_task_head("BertForSequenceClassification")
    assert not is_task_head("MaskFormerModel") and not is_task_head("PPFormulaNetModel")
    assert pick_base_model(["MaskFormerDetrDecoder", "MaskFormerModel", "MaskFormerForInstanceSegmentation"]) == (
        "MaskFormerModel"
    )
    assert pick_base_model(["LlamaForCausalLM"]) == "LlamaForCausalLM"
    assert pick_base_model([]) is None
