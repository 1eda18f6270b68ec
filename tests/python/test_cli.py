"""The `modeltrace` command line as a user runs it: trace the example, read the listing and the JSON, and
get one clear line (exit 2, nothing left behind) for every kind of bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import EXAMPLE_MODELING_FILE, line_of


def run_cli(*arguments: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", *arguments], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def traced_example(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("cli") / "example.mtrace"
    return run_cli("trace", str(EXAMPLE_MODELING_FILE), "--out", str(out)), out


def test_trace_prints_the_annotated_source(traced_example: tuple[subprocess.CompletedProcess, Path]) -> None:
    completed, out = traced_example
    assert completed.returncode == 0, completed.stderr
    listing = completed.stdout.splitlines()
    expectations = {
        "hidden_states = self.mlp(hidden_states)": "# [1, 7, 64] float32 ×2",
        "hidden_states = self.input_layernorm(hidden_states)": "# [1, 7, 64] float32 ×2",
        "key_states = self.k_proj(hidden_states)": "# [1, 7, 32] float32 ×2",
        "hidden_states, _ = self.self_attn(": "# [1, 7, 64] float32, [1, 4, 7, 7] float32 ×2",
        "inputs_embeds = self.embed_tokens(input_ids)": "# [1, 7, 64] float32",
        "hidden_states = decoder_layer(": "# [1, 7, 64] float32 ×2",
        "return self.down_proj(gate * self.up_proj(hidden_states))": "# [1, 7, 64] float32 ×2",
    }
    for snippet, annotation in expectations.items():
        number = line_of(EXAMPLE_MODELING_FILE, snippet)
        line = listing[number]  # listing line 0 is the header
        assert line.lstrip().startswith(f"{number}  "), line
        assert snippet in line and line.endswith(annotation), line
    untouched = line_of(EXAMPLE_MODELING_FILE, "hidden_states = residual + hidden_states")
    assert "#" not in listing[untouched]
    assert (out / "trace.msgpack").is_file()
    assert "trace written to" in completed.stderr


def test_show_json_follows_the_contract(traced_example: tuple[subprocess.CompletedProcess, Path]) -> None:
    _, out = traced_example
    completed = run_cli("show", str(out), "--format", "json")
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert document["schema"] == "modeltrace.trace/1"
    assert document["model"]["class"] == "TinyLlamaModel"
    assert document["lines"] == []
    modules = document["modules"]
    assert modules[0]["path"] == "" and modules[0]["called_at"] is None
    for module in modules:
        assert {"path", "class", "defined_at", "called_at", "call_index", "inputs", "outputs"} <= set(module)
        for tensor in module["inputs"] + module["outputs"]:
            assert {"key", "shape", "dtype", "mean", "std", "min", "max"} <= set(tensor)
    mlp = [module for module in modules if module["path"].endswith(".mlp")]
    assert [module["path"] for module in mlp] == ["layers.0.mlp", "layers.1.mlp"]
    assert mlp[0]["called_at"] == {
        "file": str(EXAMPLE_MODELING_FILE.resolve()),
        "line": line_of(EXAMPLE_MODELING_FILE, "hidden_states = self.mlp(hidden_states)"),
        "column": 24,
    }
    assert mlp[0]["defined_at"]["line"] == line_of(EXAMPLE_MODELING_FILE, "class TinyLlamaMLP(nn.Module):")
    assert mlp[0]["outputs"][0]["shape"] == [1, 7, 64]


def test_show_text_with_stats(traced_example: tuple[subprocess.CompletedProcess, Path]) -> None:
    _, out = traced_example
    completed = run_cli("show", str(out), "--stats")
    assert completed.returncode == 0
    line = completed.stdout.splitlines()[line_of(EXAMPLE_MODELING_FILE, "hidden_states = self.mlp(hidden_states)")]
    assert "[1, 7, 64] float32 μ=" in line and "σ=" in line


def test_trace_json_output_and_recipe_with_local_checkpoint(tmp_path: Path) -> None:
    """A recipe loading a checkpoint saved in the test (no hub): plain `from_pretrained` of a local folder."""
    checkpoint = tmp_path / "checkpoint"
    package = EXAMPLE_MODELING_FILE.parent
    subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys; sys.path.insert(0, {str(package.parent)!r})
            from tiny_llama import TinyLlamaConfig, TinyLlamaForCausalLM
            TinyLlamaForCausalLM(TinyLlamaConfig(num_hidden_layers=3)).save_pretrained({str(checkpoint)!r})
        """),
        ],
        check=True,
    )
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(package.parent)!r})
        from tiny_llama import TinyLlamaForCausalLM

        def build_model():
            return TinyLlamaForCausalLM.from_pretrained({str(checkpoint)!r}, attn_implementation="eager")

        def build_inputs(model):
            return {{"input_ids": torch.tensor([[1, 5, 9, 3]])}}
    """)
    )
    completed = run_cli(
        "trace",
        str(EXAMPLE_MODELING_FILE),
        "--recipe",
        str(recipe),
        "--out",
        str(tmp_path / "r.mtrace"),
        "--format",
        "json",
    )
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert document["model"]["class"] == "TinyLlamaForCausalLM"
    paths = [module["path"] for module in document["modules"]]
    assert "model.layers.2.mlp" in paths and "lm_head" in paths
    logits = next(module for module in document["modules"] if module["path"] == "lm_head")
    assert logits["outputs"][0]["shape"] == [1, 4, 128]


def _assert_one_line_failure(completed: subprocess.CompletedProcess, *words: str) -> None:
    assert completed.returncode == 2, completed.stdout + completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert "Traceback" not in completed.stderr
    for word in words:
        assert word in lines[0], lines[0]


def _no_trace_left(folder: Path) -> None:
    assert not [path for path in folder.iterdir() if ".mtrace" in path.name]


def test_bad_inputs_give_one_line_and_leave_nothing(tmp_path: Path, example_copy: Path) -> None:
    out = ["--out", str(tmp_path / "bad.mtrace")]

    broken = tmp_path / "modeling_broken.py"
    broken.write_text("import torch\n\nclass Broken(torch.nn.Module:\n    pass\n")
    _assert_one_line_failure(run_cli("trace", str(broken), *out), str(broken), ":3", "syntax error")

    empty = tmp_path / "modeling_empty.py"
    empty.write_text("def helper():\n    return 1\n")
    _assert_one_line_failure(run_cli("trace", str(empty), *out), str(empty), "no nn.Module")

    _assert_one_line_failure(run_cli("trace", str(tmp_path / "missing.py"), *out), "missing.py", "no such file")

    _assert_one_line_failure(
        run_cli("trace", str(EXAMPLE_MODELING_FILE), "--config", str(tmp_path / "nowhere"), *out),
        "nowhere",
        "no such config",
    )
    _assert_one_line_failure(
        run_cli("trace", str(EXAMPLE_MODELING_FILE), "--model", "NoSuchModel", *out), "NoSuchModel", "TinyLlamaMLP"
    )

    example_copy.write_text(
        example_copy.read_text().replace(
            "        hidden_states = self.norm(hidden_states)\n",
            "        hidden_states = self.norm(hidden_states)\n        raise RuntimeError('norm exploded')\n",
        )
    )
    _assert_one_line_failure(
        run_cli("trace", str(example_copy), *out),
        "TinyLlamaModel",
        "RuntimeError: norm exploded",
        f"{example_copy.resolve()}:{line_of(example_copy, 'norm exploded')}",
    )

    recipe = tmp_path / "recipe_incomplete.py"
    recipe.write_text("def build_model():\n    import torch\n    return torch.nn.Linear(2, 2)\n")
    _assert_one_line_failure(run_cli("trace", str(recipe), "--recipe", str(recipe), *out), str(recipe), "build_inputs")
    _no_trace_left(tmp_path)

    _assert_one_line_failure(run_cli("show", str(tmp_path / "nothing.mtrace")), "nothing.mtrace", "no such trace")
