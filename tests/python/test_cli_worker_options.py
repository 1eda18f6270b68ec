"""`modeltrace trace --attention` and `--follow`: the CLI's request carries them to the worker, and the trace
says what ran (`options.attention`, line records of the followed file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MLP_FORWARD = "    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:\n        gate = self.activation("

HELPERS = '''"""Helpers the model calls into."""

import torch


def scaled(hidden_states: torch.Tensor) -> torch.Tensor:
    doubled = hidden_states * 2.0
    return doubled / 2.0
'''


def run_cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", *arguments], capture_output=True, text=True, timeout=300
    )


def _with_helpers(modeling_file: Path) -> Path:
    """The example's MLP calls `scaled` from a helper module next to it; returns the helper module."""
    helpers = modeling_file.parent / "helpers.py"
    helpers.write_text(HELPERS)
    source = modeling_file.read_text().replace(
        "from .configuration_tiny_llama import TinyLlamaConfig",
        "from .configuration_tiny_llama import TinyLlamaConfig\nfrom .helpers import scaled",
    )
    assert MLP_FORWARD in source
    modeling_file.write_text(
        source.replace(
            MLP_FORWARD,
            MLP_FORWARD.replace("        gate", "        hidden_states = scaled(hidden_states)\n        gate"),
        )
    )
    return helpers


def test_attention_and_follow_reach_the_worker(example_copy: Path, tmp_path: Path) -> None:
    helpers = _with_helpers(example_copy)
    completed = run_cli(
        "trace",
        str(example_copy),
        "--attention",
        "sdpa",
        "--lines",
        "--follow",
        str(helpers),
        "--out",
        str(tmp_path / "sdpa.mtrace"),
        "--format",
        "json",
    )
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert document["model"]["options"]["attention"] == "sdpa"
    followed = {line["name"] for line in document["lines"] if line["file"] == str(helpers.resolve())}
    assert "doubled" in followed, followed


def test_follow_needs_lines_and_an_existing_file(example_copy: Path, tmp_path: Path) -> None:
    helpers = _with_helpers(example_copy)
    out = tmp_path / "x.mtrace"
    without_lines = run_cli("trace", str(example_copy), "--follow", str(helpers), "--out", str(out))
    assert without_lines.returncode == 2
    assert without_lines.stderr.strip() == "modeltrace: --follow names files whose lines are captured: add --lines"
    missing = run_cli("trace", str(example_copy), "--lines", "--follow", "nowhere.py", "--out", str(out))
    assert missing.returncode == 2 and missing.stderr.strip() == "modeltrace: --follow nowhere.py: no such file"
    unknown = run_cli("trace", str(example_copy), "--attention", "flash", "--out", str(out))
    assert unknown.returncode == 2 and "--attention: invalid choice: 'flash'" in unknown.stderr
    assert not out.exists()
