"""Shape-only tracing of a full-size model: the Llama-3-70B configuration, traced as a user runs it.

    .venv/bin/python bench/bench_shape_only.py            # 3 runs, prints a markdown table
    .venv/bin/python bench/bench_shape_only.py --runs 1

Each run is `modeltrace trace modeling_llama.py --config llama3-70b/config.json --shape-only --dtype bfloat16`
in a fresh process (so worker start, torch and transformers imports, model build on the meta device, the
forward pass under capture and the trace written are all included), under `/usr/bin/time -v` for the peak
resident memory of the largest process in the tree (the CLI, the worker, or its trace child). No weights are
read or written: the config is the one of meta-llama/Meta-Llama-3-70B, written here (hidden 8192, 80 layers,
64 heads, 8 key/value heads, intermediate 28672, vocabulary 128256). Target: <= 15 s and <= 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


# NOTE: the published Llama-3-70B config.json (80 layers, hidden 8192); the tests use the same file.
LLAMA_3_70B_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "llama_3_70b.json"


def run_once(folder: Path) -> dict:
    import transformers

    modeling = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"
    out = folder / f"run{time.monotonic_ns()}.mtrace"
    command = [
        "/usr/bin/time",
        "-v",
        sys.executable,
        "-m",
        "modeltrace",
        "trace",
        str(modeling),
        "--config",
        str(folder / "config.json"),
        "--shape-only",
        "--dtype",
        "bfloat16",
        "--out",
        str(out),
        "--format",
        "json",
    ]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"trace failed ({completed.returncode}): {completed.stderr[-2000:]}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", completed.stderr)
    trace = json.loads(completed.stdout)
    gate = [module for module in trace["modules"] if module["path"] == "layers.79.mlp.gate_proj"]
    assert gate and gate[0]["outputs"][0]["shape"] == [1, 7, 28672], gate
    return {
        "seconds": seconds,
        "peak_rss_mb": int(peak.group(1)) / 1024 if peak else float("nan"),
        "modules": len(trace["modules"]),
        "build_s": trace["model"]["seconds"]["build"],
        "forward_s": trace["model"]["seconds"]["forward"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        shutil.copyfile(LLAMA_3_70B_CONFIG, folder / "config.json")
        results = [run_once(folder) for _ in range(arguments.runs)]
    print("| Llama-3-70B, --shape-only (bf16) | median | max |")
    print("|---|---:|---:|")
    for key, label in (
        ("seconds", "wall time, CLI start to exit (s)"),
        ("build_s", "build on meta (s)"),
        ("forward_s", "forward under capture (s)"),
        ("peak_rss_mb", "peak RSS, largest process (MB)"),
    ):
        values = [result[key] for result in results]
        print(f"| {label} | {statistics.median(values):.1f} | {max(values):.1f} |")
    print(f"| module calls recorded | {results[0]['modules']} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
