"""ModelTrace as a library (`modeltrace.capture`, `load`, `diff`): the same trace as the CLI's, in the caller's own
process, with only torch needed; Jupyter views; bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import modeltrace
from modeltrace.errors import ModelTraceError
from modeltrace.trace.storage import read_trace
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest


RECIPE = textwrap.dedent("""
    import torch
    from transformers import LlamaConfig, LlamaModel

    def build_model():
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
        return LlamaModel(config).eval()

    def build_inputs(model):
        return {"input_ids": torch.tensor([[1, 17, 42, 99, 5, 63, 120]]), "use_cache": False}
""")


def _model_and_inputs(tmp_path: Path) -> tuple[torch.nn.Module, dict, Path]:
    recipe = tmp_path / "recipe.py"
    recipe.write_text(RECIPE)
    namespace: dict = {}
    exec(compile(RECIPE, str(recipe), "exec"), namespace)  # the recipe the CLI runs, run here
    model = namespace["build_model"]()
    return model, namespace["build_inputs"](model), recipe


def test_capture_writes_the_trace_the_cli_writes(tmp_path: Path, worker: WorkerClient) -> None:
    model, inputs, recipe = _model_and_inputs(tmp_path)
    with torch.no_grad(), modeltrace.capture(model, tmp_path / "library.mtrace", full_tensors=True) as session:
        model(**inputs)
    assert session.path == (tmp_path / "library.mtrace").absolute()
    library = read_trace(session.path)
    modeling_file = Path(sys.modules[type(model).__module__].__file__)
    worker.trace(
        TraceRequest(file=str(modeling_file), recipe=str(recipe), out=str(tmp_path / "cli.mtrace"), full_tensors=True)
    )
    cli = read_trace(tmp_path / "cli.mtrace")
    assert [(record.path, record.class_name, record.call_index) for record in library.modules] == [
        (record.path, record.class_name, record.call_index) for record in cli.modules
    ]
    assert library.model["class"] == "LlamaModel" and library.model["file"] == cli.model["file"]
    assert library.builds and {build.path for build in library.builds} == {build.path for build in cli.builds}
    # the same numbers: the library's trace diffs against the CLI's as an exact match, on full tensors
    result = modeltrace.diff(tmp_path / "cli.mtrace", session.path)
    assert result.match, result.text
    assert result.document["modules"][0]["check"] == "full"
    assert max(module["max_abs_diff"] or 0.0 for module in result.modules) == 0.0


def test_repeated_and_nested_forwards_are_calls(tmp_path: Path) -> None:
    model, inputs, _ = _model_and_inputs(tmp_path)
    with torch.no_grad(), modeltrace.capture(model, tmp_path / "twice.mtrace") as session:
        model(**inputs)
        model(input_ids=inputs["input_ids"][:, :3], use_cache=False)
    roots = [record for record in session.trace.modules if record.path == ""]
    assert [root.call_index for root in roots] == [0, 1]
    assert roots[1].outputs[0].shape == [1, 3, 64]
    norms = [record for record in session.trace.modules if record.path == "norm"]
    assert [record.parent for record in norms] == [root.index for root in roots]


def test_lines_of_the_model_file_and_the_views(tmp_path: Path) -> None:
    model, inputs, _ = _model_and_inputs(tmp_path)
    with torch.no_grad(), modeltrace.capture(model, tmp_path / "lines.mtrace", lines=True) as session:
        model(**inputs)
    view = modeltrace.load(session.path)
    assert view.lines and {record.name for record in view.lines} >= {"query_states", "attn_weights"}
    page = view._repr_html_()
    assert "LlamaModel" in page and "query_states = " in page and "[1, 4, 7, 16]" in page
    assert "<script" not in page
    document = view.to_json()
    assert document["schema"] == "modeltrace.trace/1" and document["modules"]


def test_diff_views_show_the_divergence(tmp_path: Path) -> None:
    model, inputs, _ = _model_and_inputs(tmp_path)
    with torch.no_grad(), modeltrace.capture(model, tmp_path / "reference.mtrace", full_tensors=True):
        model(**inputs)
    with torch.no_grad():
        model.layers[1].post_attention_layernorm.weight.mul_(1.5)  # a porting bug
    with torch.no_grad(), modeltrace.capture(model, tmp_path / "candidate.mtrace", full_tensors=True):
        model(**inputs)
    result = modeltrace.diff(tmp_path / "reference.mtrace", tmp_path / "candidate.mtrace")
    assert not result.match
    assert result.first_divergence["path"] == "layers.1.post_attention_layernorm"
    assert json.loads(json.dumps(result.to_json()))["first_divergence"]["path"] == result.first_divergence["path"]
    assert "FIRST DIVERGENCE" in str(result)
    page = result._repr_html_()
    assert "FIRST DIVERGENCE" in page and "layers.1.post_attention_layernorm" in page
    assert "<svg" in page and "<script" not in page


def test_bad_input_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ModelTraceError, match="expected a torch.nn.Module, got str"):
        with modeltrace.capture("not a model", tmp_path / "x.mtrace"):
            pass
    file = tmp_path / "a-file"
    file.write_text("keep me")
    with pytest.raises(ModelTraceError, match="exists and is not a folder"):
        with modeltrace.capture(torch.nn.Linear(2, 2), file):
            pass
    assert file.read_text() == "keep me"
    with pytest.raises(ModelTraceError, match="max_trace_mb must be a number of megabytes >= 0, not -1"):
        with modeltrace.capture(torch.nn.Linear(2, 2), tmp_path / "y.mtrace", max_trace_mb=-1):
            pass
    # an exception inside the block: what ran is written, marked incomplete, and the exception propagates
    layer = torch.nn.Linear(2, 2)
    error = ValueError("the user's own error")
    with pytest.raises(ValueError, match="the user's own error") as caught:
        with modeltrace.capture(layer, tmp_path / "z.mtrace"):
            layer(torch.ones(1, 2))
            raise error
    assert caught.value is error
    partial = read_trace(tmp_path / "z.mtrace")
    assert partial.model["incomplete"] == "ValueError: the user's own error" and len(partial.modules) == 1


def test_a_plain_module_defined_in_a_script(tmp_path: Path) -> None:
    """A model written in a script (no modeling file, no transformers), captured there, diffed through the API
    as the CLI diffs it."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        import torch
        import modeltrace

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(8, 8)
                self.norm = torch.nn.LayerNorm(8)

            def forward(self, x):
                hidden = self.proj(x)
                return self.norm(hidden + x)

        torch.manual_seed(0)
        model = torch.nn.Sequential(Block(), Block())
        inputs = torch.randn(3, 8)
        for name in ("a", "b"):
            with torch.no_grad(), modeltrace.capture(model, {str(tmp_path)!r} + f"/{{name}}.mtrace", lines=True,
                                                     full_tensors=True):
                model(inputs)
            model[1].norm.eps = 1e-2 if name == "a" else model[1].norm.eps
        result = modeltrace.diff({str(tmp_path / "a.mtrace")!r}, {str(tmp_path / "b.mtrace")!r})
        print(json.dumps(result.to_json()))
    """)
    )
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    api_document = json.loads(completed.stdout)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "diff",
            str(tmp_path / "a.mtrace"),
            str(tmp_path / "b.mtrace"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert json.loads(cli.stdout) == api_document
    trace = read_trace(tmp_path / "a.mtrace")
    assert trace.model["file"] == str(script.resolve())
    assert {record.name for record in trace.lines} >= {"hidden"}


def test_importable_with_torch_alone(tmp_path: Path) -> None:
    """transformers hidden from the import system: the library captures a plain torch model, and importing
    `modeltrace` imports no torch at all until the API is used."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["transformers"] = None  # any import of it now fails
        import modeltrace
        assert "torch" not in sys.modules
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        with modeltrace.capture(model, {str(tmp_path / "plain.mtrace")!r}) as session:
            model(torch.ones(3, 4))
        print(len(session.trace.modules), session.trace.model["versions"]["transformers"])
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["4", "None"]
