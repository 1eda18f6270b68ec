"""Port verdicts on the corpus of tests/python/ports/: for every pair and injected bug, is the first divergence
of `modeltrace diff` the module (and a line range, line or construction line) that holds the bug?

    .venv/bin/python bench/port_verdicts.py                    # both trace variants, side by side
    .venv/bin/python bench/port_verdicts.py --variant lines    # full tensors and line records only
    .venv/bin/python bench/port_verdicts.py --pair gpt2 --json bench/results/port_verdicts.json

Each reference is traced once per variant, each port (clean, then one bug at a time, patched in a copy) once,
through the worker as `modeltrace trace --recipe` runs it, and diffed through the CLI (`modeltrace diff
--format json` with the pair's `--map` rules). Variants: `full` traces with `--full-tensors`, `lines` with
`--full-tensors --lines` (both sides). Prints the markdown table of docs/benchmarks.md and "N of M right" per variant;
the truth check is `judge` in tests/python/ports/harness.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# NOTE: only sys.path entries before the imports (no other statement), so that no import is "not at the top"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pyserver"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from modeltrace.worker.client import WorkerClient
from ports.claims import EXACT
from ports.harness import Case, Effect, Judged, PortHarness, all_cases, bug_effect, build_recipe, prepare_port
from ports.sources import unavailable

VARIANTS = {
    "full": "full tensors",
    "lines": "full tensors + lines",
    "automatic": "full tensors + lines, no --map (aligned automatically)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def effects(cases: list[Case], workdir: Path) -> dict[str, Effect]:
    """Each bug's effect at its own module (plain torch, no trace): how hard the diff's job is."""
    clean = {case.pair.name: build_recipe(prepare_port(case, workdir).recipe) for case in cases if case.bug is None}
    return {
        case.id: bug_effect(case.bug.module, clean[case.pair.name], build_recipe(prepare_port(case, workdir).recipe))
        for case in cases
        if case.bug is not None and case.pair.name in clean
    }


def markdown(cases: list[Case], results: dict[str, list[Judged]], effect: dict[str, Effect]) -> str:
    variants = list(results)
    header = (
        "| pair | bug | truth (module:line) | effect there (max abs, rel) | "
        + " | ".join(f"verdict, {VARIANTS[v]}" for v in variants)
        + " |"
    )
    rows = [header, "|---|---|---|---|" + "---|" * len(variants)]
    for position, case in enumerate(cases):
        first = results[variants[0]][position]
        cells = []
        for variant in variants:
            judged = results[variant][position]
            mark = "**right**" if judged.right else ("module only" if judged.module_right else "wrong")
            if judged.right and judged.precision:
                mark += f" ({judged.precision})"
            cells.append(f"{_cell(judged.verdict.located())}: {mark}")
        bug = case.bug.name if case.bug else "clean port"
        found = effect.get(case.id)
        size = f"{found.output_max_abs:.2g}, {found.output_relative:.2g}" if found else ""
        rows.append(f"| {case.pair.name} | {bug} | {_cell(first.truth())} | {size} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(
        "Effect: the bug's largest and relative (‖broken − clean‖ / ‖clean‖) change of its module's "
        "output, whose inputs it leaves unchanged.  "
    )
    for variant in variants:
        right = sum(judged.right for judged in results[variant])
        module_only = sum(judged.module_right and not judged.right for judged in results[variant])
        exact = sum(judged.right and judged.precision in EXACT for judged in results[variant])
        rows.append(
            f"{VARIANTS[variant]}: {right} of {len(cases)} right, {exact} of them naming the bug's exact "
            f"line ({module_only} more name the module but no line holding the bug)  "
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("all", *VARIANTS), default="all")
    parser.add_argument("--pair", action="append", default=[], help="only this pair (repeatable)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    arguments = parser.parse_args(argv)
    cases = [case for case in all_cases() if not arguments.pair or case.pair.name in arguments.pair]
    missing = {case.pair.name: unavailable(case.pair.sources) for case in cases if case.pair.sources}
    for name, reason in missing.items():
        if reason:
            print(f"# {name}: left out: {reason}", file=sys.stderr)
    cases = [case for case in cases if not missing.get(case.pair.name)]
    variants = list(VARIANTS) if arguments.variant == "all" else [arguments.variant]
    started = time.perf_counter()
    results: dict[str, list[Judged]] = {}
    with tempfile.TemporaryDirectory(prefix="port-verdicts-") as folder, WorkerClient() as worker:
        for variant in variants:
            harness = PortHarness(worker, Path(folder) / variant, lines=variant != "full", maps=variant != "automatic")
            results[variant] = []
            for case in cases:
                results[variant].append(harness.judge(case))
                print(f"# {variant} {case.id}: {results[variant][-1].verdict.located()}", file=sys.stderr, flush=True)
        effect = effects(cases, Path(folder) / "effects")
    sys.stdout.write(markdown(cases, results, effect))
    print(f"# {len(cases)} cases x {len(variants)} variants in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    if arguments.json:
        document = [
            {
                "variant": variant,
                "pair": judged.case.pair.name,
                "bug": judged.case.bug.name if judged.case.bug else None,
                "truth": judged.truth(),
                "verdict": judged.verdict.located(),
                "right": judged.right,
                "why": judged.why,
            }
            for variant, judged_list in results.items()
            for judged in judged_list
        ]
        Path(arguments.json).parent.mkdir(parents=True, exist_ok=True)
        Path(arguments.json).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
