"""Tracing the tiny model pairs of tests/python/align_pairs/ and diffing them, for the alignment and pairing tests
(test_weight_pairing.py, test_rotary_tables.py): each model is built by a one-line expression of its file."""

from __future__ import annotations

import io
import json
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from modeltrace.cli import main
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest


def trace_models(worker: WorkerClient, folder: Path, model_file: Path, builds: dict[str, str]) -> dict[str, Path]:
    """name -> the full-tensors trace of `builds[name]` (an expression over `model_file`'s names, `port_model()`),
    run on the file's `TOKENS`."""
    found = {}
    for name, build in builds.items():
        recipe = folder / f"recipe_{name}.py"
        recipe.write_text(
            textwrap.dedent(f"""
            import sys
            import torch
            sys.path.insert(0, {str(model_file.parent)!r})
            from {model_file.stem} import TOKENS, port_model, reference_model

            def build_model():
                return {build}

            def build_inputs(model):
                return (torch.tensor(TOKENS),)
            """)
        )
        out = folder / f"{name}.mtrace"
        worker.trace(TraceRequest(file=str(model_file), recipe=str(recipe), out=str(out), full_tensors=True))
        found[name] = out
    return found


def diff_json(reference: Path, candidate: Path, *options: str) -> tuple[int, dict]:
    """`modeltrace diff REFERENCE CANDIDATE --format json OPTIONS` in this process: (exit code, document)."""
    stdout = io.StringIO()
    arguments = ["diff", str(reference), str(candidate), "--format", "json", *options]
    with redirect_stdout(stdout), redirect_stderr(io.StringIO()):
        exit_code = main(arguments)
    return exit_code, json.loads(stdout.getvalue())
