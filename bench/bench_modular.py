"""Modular files of the installed transformers: does `modeltrace trace modular_<name>.py` trace, and do its lines
carry the hints?

    .venv/bin/python bench/bench_modular.py                          # every modular file with a generated twin
    .venv/bin/python bench/bench_modular.py --limit 20 --seed 0      # a random sample of 20
    .venv/bin/python bench/bench_modular.py qwen3 apertus --json bench/results/modular.json

For each `transformers/models/*/modular_<name>.py` whose generated `modeling_<name>.py` exists:
1. the generated file is traced unaided (as `bench_breadth.py` does): the denominator;
2. the modular file is traced unaided, with line capture: it must trace too (the issue's target: 95%);
3. hints: in the forwards the modular file writes itself (`forward` methods of its classes), the generated lines
   that carry a hint (a module call or a captured variable), and among them those a modular line shows (its map
   onto the generated file, `modeltrace.modular`): the share of the modular forwards' hinted lines shown on the
   modular file (target: 90%). A forward written as `return super().forward(...)` stands for the whole inlined
   parent body on one line: that line shows the body's last hint (its hover links the range); the other lines of
   the body are counted apart.
The mapping's own check (no installed pair reads as stale) is a test: `tests/python/test_modular_mapping.py`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pyserver"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_breadth import reason_of, trace_one, transformers_models_folder  # noqa: E402

from modeltrace.modular.annotate import modular_entries  # noqa: E402
from modeltrace.modular.mapping import map_modular_file  # noqa: E402
from modeltrace.modular.twins import generated_path  # noqa: E402
from modeltrace.trace.lines import index_module_calls  # noqa: E402
from modeltrace.trace.storage import read_trace  # noqa: E402
from modeltrace.worker.client import WorkerClient  # noqa: E402


def modular_files(only: list[str]) -> list[Path]:
    files = [
        path for path in sorted(transformers_models_folder().glob("*/modular_*.py")) if generated_path(path).is_file()
    ]
    return [path for path in files if not only or path.parent.name in only]


def forward_ranges(modular: Path, generated_text: str) -> list[range]:
    """The generated line ranges of the `forward` methods the modular file's classes define themselves."""
    modular_tree = ast.parse(modular.read_text(encoding="utf-8"))
    generated_classes = {node.name: node for node in ast.parse(generated_text).body if isinstance(node, ast.ClassDef)}
    ranges = []
    for node in modular_tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in generated_classes:
            continue
        if not any(isinstance(item, ast.FunctionDef) and item.name == "forward" for item in node.body):
            continue
        twin = next(
            (
                item
                for item in generated_classes[node.name].body
                if isinstance(item, ast.FunctionDef) and item.name == "forward"
            ),
            None,
        )
        if twin is not None:
            ranges.append(range(twin.lineno, (twin.end_lineno or twin.lineno) + 1))
    return ranges


def hint_share(modular: Path, trace_path: str) -> tuple[int, int, int]:
    """(hinted generated lines in the modular file's own forwards, those shown on a modular line, those not shown
    that belong to a parent body inlined for a `super().forward(...)` line: that one line shows the last one)."""
    trace = read_trace(trace_path, inputs=False)
    generated = Path(trace.model["file"])
    entries = index_module_calls(trace).get(str(generated), {})
    mapping = map_modular_file(modular)
    shown = {id(entry) for entry in modular_entries(mapping, entries).values()}
    hinted = [
        line
        for span in forward_ranges(modular, generated.read_text(encoding="utf-8"))
        for line in span
        if line in entries
    ]
    inlined = {line for lines in mapping.lines.values() if len(lines) > 1 for line in lines}
    hidden = [line for line in hinted if id(entries[line]) not in shown]
    return len(hinted), len(hinted) - len(hidden), sum(1 for line in hidden if line in inlined)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("only", nargs="*", help="model folders to run (default: all)")
    parser.add_argument("--limit", type=int, help="a random sample of this many modular files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", help="write every result to this file")
    arguments = parser.parse_args()
    files = modular_files(arguments.only)
    if arguments.limit is not None and arguments.limit < len(files):
        files = sorted(random.Random(arguments.seed).sample(files, arguments.limit))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    results = []
    with WorkerClient(environment=environment) as worker, tempfile.TemporaryDirectory() as scratch:
        for number, modular in enumerate(files, start=1):
            started = time.perf_counter()
            generated = trace_one(
                worker, generated_path(modular), Path(scratch) / "generated.mtrace", arguments.timeout, {}
            )
            result = {"modular": str(modular), "generated_ok": generated["ok"]}
            if not generated["ok"]:
                result["generated_reason"] = reason_of(generated)
            else:
                traced = trace_one(
                    worker, modular, Path(scratch) / "modular.mtrace", arguments.timeout, {"lines": True}
                )
                result["modular_ok"] = traced["ok"]
                if traced["ok"]:
                    result["hinted"], result["shown"], result["inlined"] = hint_share(
                        modular, str(Path(scratch) / "modular.mtrace")
                    )
                else:
                    result["modular_reason"] = reason_of(traced)
            results.append(result)
            print(
                f"[{number}/{len(files)}] {modular.parent.name}: generated {'ok' if generated['ok'] else 'FAIL'}"
                + (f", modular {'ok' if result.get('modular_ok') else 'FAIL'}" if generated["ok"] else "")
                + (f", hints {result['shown']}/{result['hinted']}" if result.get("modular_ok") else "")
                + f" ({time.perf_counter() - started:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(results, indent=1))
    print(summary(results))
    return 0


def summary(results: list[dict]) -> str:
    baseline = [result for result in results if result["generated_ok"]]
    traced = [result for result in baseline if result.get("modular_ok")]
    hinted = sum(result["hinted"] for result in traced)
    shown = sum(result["shown"] for result in traced)
    lines = [
        f"modular files: {len(results)}; their generated file traces unaided: {len(baseline)}",
        f"traced from the modular file: {len(traced)}/{len(baseline)}"
        + (f" ({100 * len(traced) / len(baseline):.0f}%)" if baseline else ""),
        f"hinted lines of the modular files' own forwards shown on the modular file: {shown}/{hinted}"
        + (f" ({100 * shown / hinted:.1f}%)" if hinted else ""),
        f"  not shown, in a parent body inlined for one `super().forward(...)` line: "
        f"{sum(result.get('inlined', 0) for result in traced)}",
    ]
    failures = Counter(result["modular_reason"] for result in baseline if not result.get("modular_ok"))
    lines += [f"  modular failed, {count}: {reason}" for reason, count in failures.most_common()]
    skipped = Counter(result["generated_reason"] for result in results if not result["generated_ok"])
    lines += [f"  generated file does not trace unaided, {count}: {reason}" for reason, count in skipped.most_common()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
