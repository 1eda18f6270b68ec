"""Port verdicts on the corpus of tests/python/ports/: for every pair and injected bug, is the first divergence
of `modeltrace diff` the module (and a line range, line or construction line) that holds the bug?

    .venv/bin/python bench/port_verdicts.py             # traces with full tensors and line records
    .venv/bin/python bench/port_verdicts.py --no-lines  # full tensors only
    .venv/bin/python bench/port_verdicts.py --pair gpt2 --json bench/results/port_verdicts.json

Each reference is traced once, each port (clean, then one bug at a time, patched in a copy) once, through the
worker as `modeltrace trace --recipe` runs it, and diffed through the CLI (`modeltrace diff --format json`,
with the pair's `--map` rules). Prints the markdown table of the README and "N of M right"; the truth check
is `judge` in tests/python/ports/harness.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pyserver"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

from modeltrace.worker.client import WorkerClient  # noqa: E402 (after the sys.path entry)
from ports.harness import Judged, PortHarness, all_cases  # noqa: E402


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(results: list[Judged]) -> str:
    rows = [
        "| pair | bug | truth (module:line) | verdict (module:lines) | right |",
        "|---|---|---|---|---|",
    ]
    for judged in results:
        case = judged.case
        bug = case.bug.name if case.bug else "clean port"
        mark = "right" if judged.right else f"wrong ({judged.why})"
        rows.append(f"| {case.pair.name} | {bug} | {_cell(judged.truth())} | {_cell(judged.verdict.located())} | "
                    f"{_cell(mark)} |")
    right = sum(judged.right for judged in results)
    rows.append("")
    rows.append(f"{right} of {len(results)} right")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-lines", action="store_true", help="trace without line records")
    parser.add_argument("--pair", action="append", default=[], help="only this pair (repeatable)")
    parser.add_argument("--no-maps", action="store_true",
                        help="diff without the pairs' --map rules: modules aligned automatically, by evidence")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    arguments = parser.parse_args(argv)
    cases = [case for case in all_cases() if not arguments.pair or case.pair.name in arguments.pair]
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="port-verdicts-") as folder, WorkerClient() as worker:
        harness = PortHarness(worker, Path(folder), lines=not arguments.no_lines, maps=not arguments.no_maps)
        for case in cases:
            results.append(harness.judge(case))
            print(f"# {case.id}: {results[-1].verdict.located()}", file=sys.stderr, flush=True)
    sys.stdout.write(markdown(results))
    print(f"# {len(results)} verdicts in {time.perf_counter() - started:.1f} s "
          f"({'full tensors' if arguments.no_lines else 'full tensors and line records'})", file=sys.stderr)
    if arguments.json:
        document = [
            {"pair": judged.case.pair.name, "bug": judged.case.bug.name if judged.case.bug else None,
             "truth": judged.truth(), "verdict": judged.verdict.located(), "right": judged.right, "why": judged.why}
            for judged in results
        ]
        Path(arguments.json).parent.mkdir(parents=True, exist_ok=True)
        Path(arguments.json).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
