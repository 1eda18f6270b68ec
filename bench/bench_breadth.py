"""Breadth of the unaided trace: every modeling file of the installed transformers, traced with no options.

    .venv/bin/python bench/bench_breadth.py                      # all families, markdown summary on stdout
    .venv/bin/python bench/bench_breadth.py llama bert t5        # only these model folders
    .venv/bin/python bench/bench_breadth.py --jobs 2 --timeout 120 --json bench/results/breadth.json
    .venv/bin/python bench/bench_breadth.py --rerun-failed bench/results/breadth.json

For each `transformers/models/*/modeling_*.py`, the trace runs exactly as `modeltrace trace FILE` runs it: through
the worker (`modeltrace.worker.client.WorkerClient`), which forks one child per trace from a process that has
torch and transformers imported, and kills it at the timeout. A file whose classes hold no transformers base
model (no PreTrainedModel other than the abstract `…PreTrainedModel`) is not counted.

A family is a model folder (`models/llama`); it succeeds when every one of its modeling files that defines a
base model traces. Failures are grouped by reason: the error type and its message with class names, numbers
and quoted values replaced, so that one cause shared by many models is one row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pyserver"))

from modeltrace.errors import TraceFailed  # noqa: E402
from modeltrace.worker.client import WorkerClient  # noqa: E402
from modeltrace.worker.messages import TraceRequest  # noqa: E402


def transformers_models_folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "models"


def modeling_files(folder: Path, only: list[str]) -> list[Path]:
    files = sorted(folder.glob("*/modeling_*.py"))
    if only:
        files = [file for file in files if file.parent.name in only or file.stem in only]
    return files


# Reasons: ordered (pattern, label) pairs tried on "Type: message"; the first match names the group. Anything
# else is grouped by its normalised message.
_REASONS = [
    (r"torchvision", "needs torchvision (not installable beside this torch)"),
    (r"torchaudio", "needs torchaudio (not installable beside this torch)"),
    (r"requires the .* librar|pip install|is not installed|No module named", "needs an optional library"),
    (r"no transformers model|no base model|defines no nn.Module", "no base model"),
    (r"timeout|ran past", "timed out"),
]


def reason_of(error: dict) -> str:
    kind = error.get("type") or "Error"
    message = str(error.get("message") or "").strip().splitlines()
    text = f"{kind}: {message[0] if message else ''}"
    for pattern, label in _REASONS:
        if re.search(pattern, text, re.IGNORECASE):
            return label
    text = re.sub(r"^(\w+: )/\S+?\.py: ", r"\1", text)
    text = re.sub(r"/\S+", "PATH", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(
        r"\b[A-Z][A-Za-z0-9]*(?:Model|Config|For[A-Za-z]+|Layer|Attention|Embeddings?|Encoder|Decoder)\w*",
        "CLASS",
        text,
    )
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    text = re.sub(r"torch\.Size\(\[[^\]]*\]\)", "SIZE", text)
    text = re.sub(r"\(PATH:N\)|\(PATH:\?\)", "", text)
    return text[:220]


# Coarse groups for docs/benchmarks.md: (pattern on "Type: message", group). The first match wins.
_GROUPS = [
    (
        r"torchvision|torchaudio|requires the .* librar|pip install|is not installed|No module named",
        "needs a library not installed here",
    ),
    (r"cannot synthesise", "needs inputs ModelTrace cannot synthesise"),
    (r"timeout|ran past|SIGKILL|out of memory", "out of time or memory at the shrunk size"),
    (
        r"cannot build \w+\(\) with its defaults|could not be built from a shrunk|rejects every shrunk",
        "config cannot be built or shrunk",
    ),
]


def group_of(result: dict) -> str:
    text = f"{result.get('type') or 'Error'}: {result.get('message') or ''}"
    for pattern, label in _GROUPS:
        if re.search(pattern, text, re.IGNORECASE):
            return label
    return "forward fails on the synthesised inputs"


def cause_of(result: dict) -> str:
    """One short line: the error without the file path and the advice that follows it."""
    message = str(result.get("message") or "").strip().splitlines()
    text = message[0] if message else ""
    text = re.sub(r"^/\S+?\.py: ", "", text)
    text = text.split("; pass --")[0].split("; no shrunk")[0].split("; raise --timeout")[0]
    text = re.sub(r"Class validation error for validator '\w+': ", "", text)
    text = re.sub(r"^\w+ could not be built from a shrunk \w+: \w+: ", "", text)
    text = re.sub(r"^building \w+ failed: |^config rejected: |StrictDataclassClassValidationError: ", "", text)
    text = re.sub(r"^(\w+)\.forward needs (.*), which ModelTrace cannot synthesise.*", r"\1.forward needs \2", text)
    text = re.sub(r"^cannot build (\w+\(\)) with its defaults \((.*)\)$", r"\1: \2", text)
    text = re.sub(r"; \w+: .*", "", text)  # the next shrink level's (same) error
    if re.search(r"requires the (\w+) librar", text):
        text = "needs " + re.search(r"requires the (\w+) librar", text).group(1)
    elif "imports " in text and "not installed" in text:
        text = "needs " + text.split("imports ")[1].split(",")[0]
    if "SIGKILL" in text:
        text = "killed: out of memory"
    elif "ran past its" in text:
        text = "timed out" + (f" ({text.split('its ')[1].split(' timeout')[0]})" if "its " in text else "")
    kind = result.get("type") or ""
    if kind not in ("ModelTraceError", "TimeoutError", "WorkerCrashed") and not text.startswith("needs "):
        text = f"{kind}: {text}"
    return text[:100].replace("|", "\\|")


def trace_one(worker: WorkerClient, file: Path, out: Path, timeout: float, extra: dict) -> dict:
    request = TraceRequest(file=str(file), out=str(out), timeout=timeout, **extra)
    started = time.perf_counter()
    try:
        result = worker.trace(request)
    except TraceFailed as failure:
        error = failure.error
        return {
            "file": str(file),
            "ok": False,
            "type": error.kind,
            "cause": error.cause,
            "message": error.message[:2000],
            "where": f"{error.file}:{error.line}" if error.file else None,
            "model_class": error.model_class,
            "seconds": time.perf_counter() - started,
        }
    build: dict = {}
    try:
        from modeltrace.trace.storage import read_trace

        build = read_trace(result.trace).model.get("build") or {}
    except Exception:  # noqa: BLE001 - the notes are a bonus
        pass
    return {
        "file": str(file),
        "ok": True,
        "shrink": build.get("shrink"),
        "inputs": build.get("inputs"),
        "model_class": result.model_class,
        "modules": result.modules,
        "seconds": time.perf_counter() - started,
    }


def run(files: list[Path], jobs: int, timeout: float, extra: dict, log) -> list[dict]:
    queue = list(files)
    results: list[dict] = []
    lock = threading.Lock()
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }

    def work() -> None:
        with WorkerClient(environment=environment) as worker, tempfile.TemporaryDirectory() as scratch:
            while True:
                with lock:
                    if not queue:
                        return
                    file = queue.pop(0)
                out = Path(scratch) / f"{file.stem}.mtrace"
                result = trace_one(worker, file, out, timeout, extra)
                with lock:
                    results.append(result)
                    status = "ok  " if result["ok"] else "FAIL"
                    detail = (
                        f" [{result.get('shrink')}; {result.get('inputs')}]"
                        if result["ok"]
                        else f" {result['type']}: {result['message'][:150]!r}"
                    )
                    log(
                        f"[{len(results)}/{len(files)}] {status} {file.parent.name}/{file.name} "
                        f"({result['seconds']:.1f} s){detail}"
                    )

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(results, key=lambda result: result["file"])


def summarize(results: list[dict]) -> str:
    counted = [result for result in results if reason_of(result) != "no base model" or result["ok"]]
    skipped = [result for result in results if result not in counted]
    families: dict[str, list[dict]] = defaultdict(list)
    for result in counted:
        families[Path(result["file"]).parent.name].append(result)
    family_ok = sorted(name for name, items in families.items() if all(item["ok"] for item in items))
    files_ok = [result for result in counted if result["ok"]]
    groups: dict[str, list[str]] = defaultdict(list)
    for result in counted:
        if not result["ok"]:
            groups[reason_of(result)].append(Path(result["file"]).stem.removeprefix("modeling_"))
    modalities: dict[str, int] = defaultdict(int)
    levels: dict[str, int] = defaultdict(int)
    for result in files_ok:
        inputs = (result.get("inputs") or "?").split(" (")[0]
        modalities[inputs] += 1
        levels[result.get("shrink") or "?"] += 1
    lines = [
        f"Model families traced unaided: **{len(family_ok)} / {len(families)} "
        f"({100 * len(family_ok) / max(1, len(families)):.1f} %)**; modeling files: {len(files_ok)} / {len(counted)}"
        f" ({len(skipped)} files without a base model not counted).",
        "",
        "Inputs synthesised for the traced files: "
        + ", ".join(f"{name} {count}" for name, count in sorted(modalities.items(), key=lambda item: -item[1]))
        + ". Config used: "
        + ", ".join(f"{name} {count}" for name, count in sorted(levels.items(), key=lambda i: -i[1]))
        + " (shrink levels, see worker/building/shrink.py).",
        "",
        "| Failure reason | Files | Models |",
        "|---|---:|---|",
    ]
    for reason, names in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = reason.replace("|", "\\|")
        lines.append(f"| {shown} | {len(names)} | {', '.join(sorted(names))} |")
    # The same failures by family, in coarse groups, each with its one-line cause (the table of docs/benchmarks.md).
    coarse: dict[str, dict[str, str]] = defaultdict(dict)
    for name, items in families.items():
        failed = [item for item in items if not item["ok"]]
        if failed:
            coarse[group_of(failed[0])][name] = cause_of(failed[0])
    lines += ["", "| Reason | Families | Family: cause |", "|---|---:|---|"]
    for group, members in sorted(coarse.items(), key=lambda item: (-len(item[1]), item[0])):
        listed = "; ".join(f"{name}: {cause}" for name, cause in sorted(members.items()))
        lines.append(f"| {group} | {len(members)} | {listed} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("only", nargs="*", help="model folder names (or modeling file stems) to run")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per trace (the CLI's default)")
    parser.add_argument("--json", metavar="FILE", help="write every result here")
    parser.add_argument(
        "--rerun-failed",
        metavar="FILE",
        help="rerun only the failures in this results file and merge the new results into it",
    )
    parser.add_argument("--shape-only", action="store_true", help="trace each default config on the meta device")
    arguments = parser.parse_args()

    folder = transformers_models_folder()
    files = modeling_files(folder, arguments.only)
    previous: list[dict] = []
    if arguments.rerun_failed:
        previous = json.loads(Path(arguments.rerun_failed).read_text())
        failed = {result["file"] for result in previous if not result["ok"]}
        files = [file for file in files if str(file) in failed]
    extra = {"shape_only": True} if arguments.shape_only else {}
    started = time.perf_counter()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results = run(files, arguments.jobs, arguments.timeout, extra, log)
    if previous:
        fresh = {result["file"]: result for result in results}
        results = [fresh.get(result["file"], result) for result in previous]
    print(f"# {len(files)} files in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if arguments.json:
        Path(arguments.json).parent.mkdir(parents=True, exist_ok=True)
        Path(arguments.json).write_text(json.dumps(results, indent=1))
    sys.stdout.write(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
