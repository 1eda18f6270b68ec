"""transformers' real modular converter through `trace --regenerate` and `regenerate_copy`, on a real modular file
with a model adder's edits: an overridden forward line and a `_can_record_outputs` declaration of its own.

Runs only where a transformers source checkout is given (`MODELTRACE_TRANSFORMERS_SOURCE`, `checkout_layout`):
this project vendors none of transformers' code, and the installed package ships no `utils/`. Skipped elsewhere,
saying why; `test_modular_regenerate.py` and `test_modular_trace.py` cover the same path with a stand-in converter.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkout_layout import FORWARD_EDIT, SKIP_REASON, edited_modular, transformers_source
from conftest import line_of
from modeltrace.modular.regenerate import regenerate_copy, regenerated_root, remove_regenerated

pytestmark = pytest.mark.skipif(transformers_source() is None, reason=SKIP_REASON)


def class_attribute(source: str, class_name: str, attribute: str) -> str | None:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(
                    isinstance(target, ast.Name) and target.id == attribute for target in statement.targets
                ):
                    return ast.unparse(statement.value)
    return None


def test_the_real_converter_carries_the_modular_edits_into_a_temporary_copy(tmp_path: Path) -> None:
    checkout, modular = edited_modular(tmp_path)
    before = {path.name: path.read_bytes() for path in modular.parent.iterdir()}
    copy = regenerate_copy(modular, checkout, python=sys.executable)
    root = regenerated_root(copy)
    assert root is not None
    try:
        generated = (copy.parent / "modeling_qwen3.py").read_text()
        assert "This file was automatically generated from src/transformers/models/qwen3/modular_qwen3.py" in generated
        assert FORWARD_EDIT[1] in generated
        recorders = class_attribute(generated, "Qwen3PreTrainedModel", "_can_record_outputs")
        assert recorders is not None and "OutputRecorder(Qwen3Attention, index=1)" in recorders, recorders
        assert copy.read_bytes() == modular.read_bytes()
        # the user's folder is left as it is: its generated file stays the installed one
        assert {path.name: path.read_bytes() for path in modular.parent.iterdir()} == before
    finally:
        remove_regenerated(root)
    assert not root.exists()


def test_trace_regenerate_with_the_real_converter_hints_the_edited_modular_line(tmp_path: Path) -> None:
    _, modular = edited_modular(tmp_path)
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "trace",
            str(modular),
            "--regenerate",
            "--out",
            str(tmp_path / "q.mtrace"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    assert completed.returncode == 0, completed.stderr
    edited = line_of(modular, FORWARD_EDIT[1])
    row = next(row for row in completed.stdout.splitlines() if row.lstrip().split(" ", 1)[0] == str(edited))
    assert "* 2" in row and "# " in row.split("* 2", 1)[1], row
    assert "out of date" not in completed.stdout
    assert "# removed the temporary folder" in completed.stderr
    assert not [path for path in temporary.iterdir() if path.name.startswith("modeltrace-regenerated-")]
