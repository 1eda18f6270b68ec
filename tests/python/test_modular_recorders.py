"""`_can_record_outputs` checks on a modular file: its generated twin is checked (that is what runs), and each
problem is put on the modular line it comes from: the modular file's own declaration, or the modular class (or
the first line) where the declaration is inherited from the parent model. Static: no torch, no run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import transformers

from modeltrace.modular.recorders import analyze_modular


MODELS = Path(transformers.__file__).resolve().parent / "models"


def copy_model_folder(name: str, destination: Path) -> Path:
    folder = destination / name
    shutil.copytree(MODELS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def remove_line(file: Path, line: str) -> None:
    source = file.read_text()
    assert source.count(line) == 1, (file, line)
    file.write_text(source.replace(line, ""))


def test_installed_modular_files_check_clean_as_their_generated_twin() -> None:
    for name in ("qwen3", "swin", "apertus"):
        modular = MODELS / name / f"modular_{name}.py"
        analysis = analyze_modular(modular.read_text(), modular)
        assert analysis.problems == [], name
        assert analysis.uses, name  # the generated file's models with @capture_outputs were found
        assert f"checked as its generated twin modeling_{name}.py" in analysis.notes


def test_a_problem_in_the_modular_declaration_sits_on_its_modular_line(tmp_path: Path) -> None:
    # SwinPreTrainedModel declares `_can_record_outputs` in the modular file; an entry removed there (and, after
    # regenerating, in the generated file) is a problem on the modular declaration
    folder = copy_model_folder("swin", tmp_path)
    entry = '        "attentions": OutputRecorder(SwinStage, index=2, capture_initial_hidden_state=False),\n'
    for name in ("modular_swin.py", "modeling_swin.py"):
        remove_line(folder / name, entry)
    modular = folder / "modular_swin.py"
    (problem,) = analyze_modular(modular.read_text(), modular).problems
    assert problem.code == "missing-recorder" and problem.key == "attentions"
    assert modular.read_text().splitlines()[problem.line - 1].strip() == "_can_record_outputs = {"
    declaration = 1 + (folder / "modeling_swin.py").read_text().splitlines().index("    _can_record_outputs = {")
    assert problem.message.endswith(
        f"(in modeling_swin.py:{declaration}); fix it here, then regenerate modeling_swin.py"
    )
    # no quick fix: it would edit the generated file, which the converter overwrites
    assert problem.fix_json() is None


def test_an_inherited_declaration_is_named_where_it_is_generated(tmp_path: Path) -> None:
    # qwen3's modular file leaves Qwen3PreTrainedModel to the converter: the declaration is the parent's
    folder = copy_model_folder("qwen3", tmp_path)
    remove_line(folder / "modeling_qwen3.py", '        "attentions": Qwen3Attention,\n')
    modular = folder / "modular_qwen3.py"
    assert "class Qwen3PreTrainedModel" not in modular.read_text()
    (problem,) = analyze_modular(modular.read_text(), modular).problems
    assert problem.line == 1
    declaration = 1 + (folder / "modeling_qwen3.py").read_text().splitlines().index("    _can_record_outputs = {")
    assert f"(in modeling_qwen3.py:{declaration}, which the modular file does not write" in problem.message
    assert "declare `_can_record_outputs` in Qwen3PreTrainedModel here, then regenerate" in problem.message
    # the CLI says the same, and refuses --fix on a modular file without touching anything
    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "check", str(modular)], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 1
    assert f"{modular}:1: missing-recorder: Qwen3Model returns 'attentions'" in completed.stdout
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    refused = subprocess.run(
        [sys.executable, "-m", "modeltrace", "check", "--fix", str(modular)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "--fix edits the generated file" in refused.stderr
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
