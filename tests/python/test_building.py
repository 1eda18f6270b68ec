"""The building pipeline's seams: the request read once into a spec, the strategy rows, the stateless synthesiser.

- `build_from_request` takes a dict or an object with the same attributes (the typed request) and builds the
  same model from either;
- the strategy is the first row of `STRATEGIES` that applies;
- the input synthesiser is stateless given an `InputSpec`: the same spec gives the same tensors, a repair
  gives a new spec and leaves what the old spec gives unchanged;
- a family's input rule is a row: a row added to `COMPANION_INPUTS` is made for a model that takes it;
- the traced inputs are those of the variant that ran (CSM runs with its token ids per codebook last, after the
  codebooks-first layout failed; both variants were once named alike and the first was traced).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from modeltrace.worker.building import BuildSpec, InputSpec, InputSynthesizer, build_from_request
from modeltrace.worker.building import input_forms
from modeltrace.worker.building.input_spec import BATCH_SIZE, SEQUENCE_LENGTH
from modeltrace.worker.building.strategies import choose_strategy
from modeltrace.worker.building.trials import Attempt, code_error, lines_in_file

from conftest import EXAMPLE_MODELING_FILE


MODELS = Path(transformers.__file__).parent / "models"


def _tiny_llama() -> transformers.LlamaModel:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    return transformers.LlamaModel(config).eval()


def test_a_request_dict_and_a_request_object_build_the_same_model() -> None:
    fields = {"file": str(EXAMPLE_MODELING_FILE), "seed": 3, "timeout": 60, "attention": None, "dtype": ""}
    from_dict = build_from_request(dict(fields))
    from_object = build_from_request(SimpleNamespace(**fields))
    assert from_dict.model_class == from_object.model_class == "TinyLlamaModel"
    assert from_dict.notes == from_object.notes
    assert from_dict.kwargs.keys() == from_object.kwargs.keys()
    for name, value in from_dict.kwargs.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, from_object.kwargs[name]), name
    spec = BuildSpec.from_request(SimpleNamespace(**fields))
    # Unset and empty fields take the defaults, defined once in the spec.
    assert (spec.seed, spec.timeout, spec.attention, spec.dtype) == (3, 60.0, "eager", "float32")
    assert spec.file == Path(EXAMPLE_MODELING_FILE) and spec.recipe is None and not spec.shape_only


def test_the_strategy_is_the_first_row_that_applies() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel

    file = BuildSpec(file=Path("modeling_llama.py"))
    assert choose_strategy(file, LlamaModel) == "shrunk"
    assert choose_strategy(dataclasses.replace(file, config=Path("config.json")), LlamaModel) == "config"
    assert choose_strategy(dataclasses.replace(file, shape_only=True, config=Path("c.json")), LlamaModel) == (
        "shape-only"
    )
    assert choose_strategy(dataclasses.replace(file, shape_only=True), LlamaDecoderLayer) == "plain"
    assert choose_strategy(dataclasses.replace(file, checkpoint="saved"), LlamaModel) == "checkpoint"
    assert choose_strategy(BuildSpec(recipe=Path("recipe.py")), None) == "recipe"


def test_the_same_spec_gives_the_same_tensors_and_a_repair_is_a_new_spec() -> None:
    model = _tiny_llama()
    synthesizer = InputSynthesizer(model, model.config, seed=0)
    variant = next(synthesizer.variants())
    assert variant.name == "text"
    first, again = synthesizer.build(variant.spec), synthesizer.build(variant.spec)
    assert torch.equal(first["input_ids"], again["input_ids"])
    assert first["input_ids"].shape == (BATCH_SIZE, SEQUENCE_LENGTH)

    # A layer that wants 11 positions: the repair is a spec with that prompt length; the old spec still gives 7.
    error = RuntimeError("The size of tensor a (7) must match the size of tensor b (11) at non-singleton dimension 1")
    repaired = synthesizer.fit_text_length(variant.spec, first, error)
    assert repaired is not None and repaired.text_length == 11 and variant.spec.text_length is None
    assert synthesizer.build(repaired)["input_ids"].shape[1] == 11
    assert torch.equal(synthesizer.build(variant.spec)["input_ids"], first["input_ids"])
    # An error that names no length repairs nothing.
    assert synthesizer.fit_text_length(variant.spec, first, RuntimeError("index out of range")) is None
    # A placeholder count an error asks for is part of the spec too.
    counted = variant.spec.with_count("image", 16)
    assert counted.counted("image") == 16 and variant.spec.counted("image") is None
    assert isinstance(counted, InputSpec)


def test_a_companion_input_row_is_made_for_a_model_that_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny_llama()
    synthesizer = InputSynthesizer(model, model.config, seed=0)
    spec = next(synthesizer.variants()).spec
    assert "position_ids" not in synthesizer.build(spec)
    row = input_forms.CompanionInput(
        lambda synth, inputs: synth.takes("position_ids") and "input_ids" in inputs,
        lambda synth, inputs, draw: {"position_ids": torch.arange(inputs["input_ids"].shape[1]).unsqueeze(0)},
        "a family whose forward wants explicit positions",
    )
    monkeypatch.setattr(input_forms, "COMPANION_INPUTS", (*input_forms.COMPANION_INPUTS, row))
    inputs = synthesizer.build(spec)
    assert inputs["position_ids"].tolist() == [list(range(SEQUENCE_LENGTH))]
    with torch.no_grad():
        model(**inputs)


def test_the_traced_inputs_are_those_of_the_variant_that_ran() -> None:
    from modeltrace.worker.building import build_from_file

    built = build_from_file(MODELS / "csm" / "modeling_csm.py", None, None, seed=0)
    assert built.notes["inputs"] == "text (codebooks last)"
    assert any("codebooks first" in failure for failure in built.notes["failed_candidates"])
    assert built.kwargs["input_ids"].shape == (BATCH_SIZE, SEQUENCE_LENGTH, 32)
    with torch.no_grad():
        built.model(**built.kwargs)


def test_a_code_error_is_the_same_error_at_the_same_lines_of_the_file_for_every_input_set(tmp_path: Path) -> None:
    # The lines of the traced file in a real traceback, innermost first: the line that raised, then its caller.
    modeling = tmp_path / "modeling_broken.py"
    modeling.write_text("def inner(x):\n    return x @ x\n\n\ndef outer(x):\n    return inner(x[..., :2])\n")
    namespace: dict = {}
    exec(compile(modeling.read_text(), str(modeling), "exec"), namespace)  # noqa: S102 - the test's own file
    with pytest.raises(RuntimeError) as caught:
        namespace["outer"](torch.ones(3, 4))
    lines = lines_in_file(caught.value, modeling)
    assert lines == (2, 6)
    assert lines_in_file(caught.value, tmp_path / "other.py") == () and lines_in_file(caught.value, None) == ()

    same = [
        Attempt("default", "-", "config rejected: too small"),  # built nothing: not an input set that ran
        Attempt("default", "input_ids", "RuntimeError: mat1 and mat2 shapes (7x32 and 64x128)", lines),
        Attempt("tiny", "inputs_embeds", "RuntimeError: mat1 and mat2 shapes (7x16 and 32x64)", lines),
    ]
    assert code_error(same) is same[1]
    # Another place, another error, or no line of the file: the inputs may be at fault; said as before.
    assert code_error([*same, Attempt("tiny", "x", same[1].error, (9, 6))]) is None
    assert code_error([*same, Attempt("tiny", "x", "IndexError: index 7 is out of range", lines)]) is None
    assert code_error([Attempt("default", "input_ids", same[1].error)]) is None
    assert code_error([same[0]]) is None
