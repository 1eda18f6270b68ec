"""`_can_record_outputs` checks on a modular file: its generated twin is checked (that is what runs), and each
problem is put on the modular line it comes from: the modular file's own declaration, or the modular class (or
the first line) where the declaration is inherited from the parent model. Static: no torch, no run."""

from __future__ import annotations

import ast
import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import transformers

from modeltrace.modular.fixes import fix_title, modular_fixes
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
    # the modular problem has no fix of its own (it would edit the generated file); the fix edits the modular file
    assert problem.fix_json() is None
    fixed, applied = modular_fixes(modular.read_text(), modular, [problem])
    assert applied == [problem]
    added = [line for line in difflib.ndiff(modular.read_text().splitlines(), fixed.splitlines()) if line[0] in "+-"]
    assert added == ['+         "attentions": SwinAttention,'], added
    assert "then regenerate: python utils/modular_model_converter.py --files_to_parse" in fix_title(problem, modular)


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
    generated_before = (folder / "modeling_qwen3.py").read_bytes()
    fixed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "check", "--fix", str(modular)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert fixed.returncode == 0, fixed.stderr
    assert f"{modular}:1: fixed missing-recorder" in fixed.stdout
    assert f"--files_to_parse {modular}" in fixed.stdout
    # the generated file is never edited; the modular file now declares the full declaration, in a new class
    # inheriting the parent model's (the converter carries class attributes into the generated file)
    assert (folder / "modeling_qwen3.py").read_bytes() == generated_before
    tree = ast.parse(modular.read_text())
    (declared,) = [
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Qwen3PreTrainedModel"
    ]
    assert [ast.unparse(base) for base in declared.bases] == ["Qwen2PreTrainedModel"]
    (assignment,) = declared.body
    assert ast.unparse(assignment) == (
        "_can_record_outputs = {'hidden_states': Qwen3DecoderLayer, 'attentions': Qwen3Attention}"
    )
    assert "from ..qwen2.modeling_qwen2 import Qwen2PreTrainedModel" in modular.read_text()
    # the class sits before the first model class that uses it
    first_model = next(node for node in tree.body if isinstance(node, ast.ClassDef) and "For" in node.name)
    assert declared.lineno < first_model.lineno


def test_an_inherited_declaration_goes_into_the_modular_class_that_inherits_it(tmp_path: Path) -> None:
    # apertus' modular file writes ApertusPreTrainedModel without `_can_record_outputs`: the fix adds the full
    # declaration to that class
    folder = copy_model_folder("apertus", tmp_path)
    modular = folder / "modular_apertus.py"
    tree = ast.parse(modular.read_text())
    (modular_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ApertusPreTrainedModel"]
    assert "_can_record_outputs" not in ast.unparse(modular_class)
    generated = folder / "modeling_apertus.py"
    generated.write_text(generated.read_text().replace('        "attentions": ApertusAttention,\n', "", 1))
    (problem,) = analyze_modular(modular.read_text(), modular).problems
    assert problem.line == modular_class.lineno
    fixed, applied = modular_fixes(modular.read_text(), modular, [problem])
    assert applied == [problem]
    (fixed_class,) = [
        n for n in ast.parse(fixed).body if isinstance(n, ast.ClassDef) and n.name == "ApertusPreTrainedModel"
    ]
    declarations = [
        n for n in fixed_class.body if isinstance(n, ast.Assign) and "_can_record_outputs" in ast.unparse(n)
    ]
    assert [ast.unparse(n) for n in declarations] == [
        "_can_record_outputs = {'hidden_states': ApertusDecoderLayer, 'attentions': ApertusAttention}"
    ]


def test_an_inherited_declaration_with_output_recorders_brings_its_import(tmp_path: Path) -> None:
    # dots1's modular file writes Dots1PreTrainedModel without `_can_record_outputs` and imports no OutputRecorder;
    # the generated declaration has a `router_logits` OutputRecorder: the fix imports it, relatively, as the
    # modular files inside transformers do (`check --fix --format json`)
    folder = copy_model_folder("dots1", tmp_path)
    modular = folder / "modular_dots1.py"
    assert "OutputRecorder" not in modular.read_text()
    generated = folder / "modeling_dots1.py"
    remove_line(generated, '        "attentions": Dots1Attention,\n')
    generated_before = generated.read_bytes()
    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "check", "--fix", "--format", "json", str(modular)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert [problem["code"] for problem in report["fixed"]] == ["missing-recorder"] and report["problems"] == []
    assert any(f"--files_to_parse {modular.resolve()}" in note for note in report["notes"])
    assert generated.read_bytes() == generated_before
    tree = ast.parse(modular.read_text())
    imports = [ast.unparse(node) for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert "from ...utils.output_capturing import OutputRecorder" in imports
    (declared,) = [
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Dots1PreTrainedModel"
    ]
    declarations = [ast.unparse(item) for item in declared.body if "_can_record_outputs" in ast.unparse(item)]
    assert declarations == [
        "_can_record_outputs = {'hidden_states': Dots1DecoderLayer, 'router_logits': "
        "OutputRecorder(Dots1TopkRouter, index=0), 'attentions': Dots1Attention}"
    ]
