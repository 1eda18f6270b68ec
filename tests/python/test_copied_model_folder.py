"""A model folder copied out of transformers (`models/qwen3/`, with `from ...modeling_utils import`) traces as it is.

Its relative imports climb above the copied folder; the builder imports the folder as the transformers package it
came from, so those imports resolve against the installed transformers, and the trace names the copy's files.
Where that cannot work the error says which import and what to change. Each trace runs in its own interpreter:
importing the copy replaces `transformers.models.qwen3` in that process.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import transformers

from conftest import line_of


MODELS = Path(transformers.__file__).resolve().parent / "models"


def copy_model_folder(name: str, destination: Path, as_name: str | None = None) -> Path:
    folder = destination / (as_name or name)
    shutil.copytree(MODELS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def run_trace(modeling_file: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", "trace", str(modeling_file), "--format", "json", *options],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=modeling_file.parent.parent,
    )


def test_a_copied_qwen3_folder_traces_with_its_own_files(tmp_path: Path) -> None:
    folder = copy_model_folder("qwen3", tmp_path)
    modeling_file = folder / "modeling_qwen3.py"
    assert "from ...modeling_utils import" in modeling_file.read_text()
    completed = run_trace(modeling_file, "--lines")
    assert completed.returncode == 0, completed.stderr
    trace = json.loads(completed.stdout)
    assert trace["model"]["class"] == "Qwen3Model"
    # The copy ran, not the installed transformers' qwen3: its calls and line records point into the copy.
    attention = [module for module in trace["modules"] if module["class"] == "Qwen3Attention"]
    assert attention and all(module["defined_at"]["file"] == str(modeling_file.resolve()) for module in attention)
    query_line = line_of(modeling_file, "query_states = self.q_norm(self.q_proj(hidden_states)")
    assert any(record["line"] == query_line and record["name"] == "query_states" for record in trace["lines"])


def test_a_copied_folder_that_is_not_a_python_name_gets_told_what_to_change(tmp_path: Path) -> None:
    folder = copy_model_folder("qwen3", tmp_path, as_name="qwen3-port")
    completed = run_trace(folder / "modeling_qwen3.py")
    assert completed.returncode != 0
    message = completed.stderr
    assert "a relative import climbs 2 folders above `qwen3-port/`" in message, message
    assert "`from ...modeling_utils import X` -> `from transformers.modeling_utils import X`" in message
    # It names the first import that climbs (file:line).
    assert re.search(r"qwen3-port/\w+\.py:\d+: ", message) and "Traceback" not in message


def test_imports_climbing_higher_than_transformers_goes_get_told_what_to_change(tmp_path: Path) -> None:
    folder = copy_model_folder("qwen3", tmp_path / "deeper")
    modeling_file = folder / "modeling_qwen3.py"
    modeling_file.write_text(
        modeling_file.read_text().replace("from ...modeling_utils import", "from ....modeling_utils import", 1)
    )
    completed = run_trace(modeling_file)
    assert completed.returncode != 0
    line = line_of(modeling_file, "from ....modeling_utils import")
    assert f"{modeling_file.resolve()}:{line}: a relative import climbs 3 folders above `qwen3/`" in completed.stderr
    assert "make the imports absolute instead" in completed.stderr
