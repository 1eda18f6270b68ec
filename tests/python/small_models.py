"""Small models for diff tests: one models file written into a folder, a recipe per build (`models.<call>`),
traced through the worker with full tensors; and `modeltrace diff --format json` on two of the traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from modeltrace.cli import main
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest


def _recipe(folder: Path, name: str, build: str, shape: str) -> Path:
    path = folder / f"recipe_{name}.py"
    path.write_text(
        "import sys\nimport torch\n"
        f"sys.path.insert(0, {str(folder)!r})\nimport models\n\n"
        f"def build_model():\n    return {build}\n\n"
        f"def build_inputs(model):\n    return (torch.randn({shape}, generator=torch.Generator().manual_seed(1)),)\n"
    )
    return path


def trace_builds(
    folder: Path, worker: WorkerClient, source: str, builds: dict[str, tuple[str, str]]
) -> dict[str, Path]:
    """Trace each build (name -> (the `models.…` call that builds it, its input's shape as `1, 5, 8`))."""
    (folder / "models.py").write_text(source)
    found = {}
    for name, (build, shape) in builds.items():
        out = folder / f"{name}.mtrace"
        recipe = _recipe(folder, name, build, shape)
        worker.trace(TraceRequest(file=str(folder / "models.py"), recipe=str(recipe), out=str(out), full_tensors=True))
        found[name] = out
    return found


def diff_json(reference: Path, candidate: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["diff", str(reference), str(candidate), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def first_divergence(reference: Path, candidate: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """The diff's `first_divergence`, asserting that it exits 1."""
    code, document = diff_json(reference, candidate, capsys)
    assert code == 1, document.get("verdict")
    return document["first_divergence"]
