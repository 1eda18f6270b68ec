"""Removal-and-fix round trip of `_can_record_outputs` over transformers' installed modeling files.

For every `models/*/modeling_*.py` declaring `_can_record_outputs`: the unmodified file must report no
problem; then, for each entry of each dict literal that a `@capture_outputs` model uses, a copy with that entry
removed is analysed and fixed (`apply_fixes`, the code path of `modeltrace check --fix` and of the editor's
quick fix), and the entry written back is compared with the original one.

They agree when they are the same entry (target class, index, layer name; a layer name's surrounding dots and
the order of a list of classes do not matter, as transformers strips the one and installs every hook of the
other), or when they are equivalent at run time: transformers installs a hook on every module of the base
model that is an instance of the target class (subclasses included) and whose dotted path contains the layer
name, and the hook keeps `output[index]` when the module returns a tuple, the whole output otherwise. So two
entries are equivalent when, over the module tree read from the file (every path from the base model to each
module it creates, list items as `*`), they hook the same modules and take the same element of what each
returns: the index is not compared for a module whose `forward` never returns a tuple, and `index=-1` equals
`index=n-1` for a module whose every `return` is a tuple of the same length n. The tree is only as good as the
static reading of the file; an entry that hooks nothing in it is compared textually.

Prints the agreement rate, the false alarms on unmodified files and each disagreement; `--json PATH` writes
the full report.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

from modeltrace.recorders.fixes import apply_fixes
from modeltrace.recorders.checking import analyze_source
from modeltrace.recorders.declarations import read_can_record
from modeltrace.recorders.types import Analysis, Recorder
from modeltrace.recorders.wiring import Wiring


def installed_files() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    root = Path(next(iter(spec.submodule_search_locations))) / "models"
    return sorted(p for p in root.glob("*/modeling_*.py") if "_can_record_outputs" in p.read_text(encoding="utf-8"))


def remove_entry(source: str, node: ast.Dict, key: str) -> str | None:
    """`source` without entry `key` of the dict literal `node` (whole lines when the entry has its own)."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    data = source.encode("utf-8")

    def offset(line: int, column: int) -> int:
        return offsets[line - 1] + column

    for position, (key_node, value) in enumerate(zip(node.keys, node.values)):
        if not (isinstance(key_node, ast.Constant) and key_node.value == key):
            continue
        start, end = offset(key_node.lineno, key_node.col_offset), offset(value.end_lineno, value.end_col_offset)
        before = data[offsets[key_node.lineno - 1] : start]
        after = data[end : offsets[value.end_lineno]]
        rest = after.strip()
        if not before.strip() and (rest in (b",", b"") or rest.lstrip(b",").strip().startswith(b"#")):
            return (data[: offsets[key_node.lineno - 1]] + data[offsets[value.end_lineno] :]).decode("utf-8")
        if position + 1 < len(node.keys) and node.keys[position + 1] is not None:
            following = node.keys[position + 1]
            return (data[:start] + data[offset(following.lineno, following.col_offset) :]).decode("utf-8")
        if position > 0:
            previous = node.values[position - 1]
            return (data[: offset(previous.end_lineno, previous.end_col_offset)] + data[end:]).decode("utf-8")
        return (data[:start] + data[end:]).decode("utf-8")
    return None


def literal_dicts(analysis: Analysis):
    """(owner, CanRecord) for each dict-literal `_can_record_outputs` in file order."""
    result = []
    for info in sorted(analysis.classes.values(), key=lambda c: c.line):
        if isinstance(info.can_record_node, ast.Dict):
            result.append((info.name, read_can_record(analysis, info, frozenset({info.name}))))
    return result


def _hooks(wiring: Wiring, key: str, recorder: Recorder) -> set[tuple]:
    """The (module path, element kept) pairs an entry hooks, over the module tree read from the file."""
    hooked = set()
    target = (recorder.target or "").rsplit(".", 1)[-1]
    layer = "." + recorder.layer_name.strip(".") + "." if recorder.layer_name is not None else None
    for node in wiring.nodes:
        name = ".".join(node.path)
        if recorder.target is not None:
            if not (
                node.cls == recorder.target or (node.cls in wiring.classes and wiring.subclass_of(node.cls, target))
            ):
                continue
        elif recorder.class_name is None or not name.endswith(recorder.class_name):
            continue
        if layer is not None:
            # a number in a layer name selects one item of a list: any item here, as the tree has `*`
            parts = layer.strip(".").split(".")
            path = list(node.path)
            if not any(
                all(p == s or (p.isdigit() and s == "*") for p, s in zip(parts, path[i : i + len(parts)]))
                and i + len(parts) <= len(path)
                for i in range(len(path))
            ):
                continue
        returns = wiring.returns(node.cls) if node.cls in wiring.classes else []
        index = recorder.effective_index(key)
        if returns and all(r.kind in ("output", "value") for r in returns):
            index = "whole output"
        elif (
            index < 0
            and returns
            and all(r.kind == "tuple" for r in returns)
            and len({len(r.names) for r in returns}) == 1
        ):
            index %= len(returns[0].names)
        hooked.add((node.path, index))
    return hooked


def equivalent(wiring: Wiring, key: str, original: list[Recorder], written: list[Recorder]) -> bool:
    def normal(recorder: Recorder) -> str:
        return repr(recorder.normalized(key))

    if sorted(map(normal, original)) == sorted(map(normal, written)):
        return True
    hooked_original = set().union(*(_hooks(wiring, key, r) for r in original))
    hooked_written = set().union(*(_hooks(wiring, key, r) for r in written))
    return bool(hooked_original) and hooked_original == hooked_written


def round_trip(path: Path, analysis_only: bool = False) -> dict:
    source = path.read_text(encoding="utf-8")
    analysis = analyze_source(source, str(path))
    report = {
        "file": str(path),
        "problems": [p.to_json() for p in analysis.problems],
        "notes": analysis.notes,
        "cases": [],
    }
    users: dict[str, list[str]] = {}
    for use in analysis.uses:
        if use.can_record:
            users.setdefault(use.can_record.owner, []).append(use.cls)
    for owner, can_record in literal_dicts(analysis):
        if owner not in users or can_record.unresolved:
            continue
        wiring = Wiring(analysis, users[owner])
        for key, recorders in can_record.entries.items():
            case = {"owner": owner, "key": key, "original": [r.source(key) for r in recorders]}
            broken = analyze_source(remove_entry(source, analysis.classes[owner].can_record_node, key), str(path))
            written = None
            if analysis_only:
                applied = [p for p in broken.problems if p.recorder is not None and p.owner]
                fixed = "".join(f'"{p.key}": {p.recorder.source(p.key)}' for p in applied)
            else:
                fixed, applied = apply_fixes("", analysis=broken)
            for problem in applied:
                if problem.key == key and problem.owner == owner:
                    recorder = problem.recorder
                    if f'"{key}": {recorder.source(key)}' in fixed:
                        written = [Recorder(a) for a in recorder.alternatives] if recorder.alternatives else [recorder]
            case["written"] = [r.source(key) for r in written] if written else None
            case["agree"] = bool(written) and equivalent(wiring, key, recorders, written)
            case["reported"] = any(p.code == "missing-recorder" and p.key == key for p in broken.problems)
            report["cases"].append(case)
    return report


def safe_round_trip(path: Path, analysis_only: bool = False) -> dict:
    try:
        return round_trip(path, analysis_only)
    except Exception as error:  # noqa: BLE001 - a crash is a finding
        return {
            "file": str(path),
            "crash": f"{type(error).__name__}: {error}",
            "problems": [],
            "cases": [],
            "notes": [],
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--only", help="only files whose name contains this")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument(
        "--analysis-only", action="store_true", help="take the entry the fix would write without writing it (faster)"
    )
    arguments = parser.parse_args()
    files = installed_files()
    if arguments.only:
        files = [f for f in files if arguments.only in f.name]
    if arguments.limit:
        files = files[: arguments.limit]
    start = time.perf_counter()
    if arguments.jobs > 1:
        import multiprocessing

        with multiprocessing.Pool(arguments.jobs) as pool:
            reports = pool.starmap(safe_round_trip, [(f, arguments.analysis_only) for f in files], chunksize=4)
    else:
        reports = [safe_round_trip(f, arguments.analysis_only) for f in files]
    cases = [c for r in reports for c in r["cases"]]
    agree = sum(c["agree"] for c in cases)
    false_alarms = [(r["file"], p) for r in reports for p in r["problems"] if p.get("severity") != "hint"]
    hints = [(r["file"], p) for r in reports for p in r["problems"] if p.get("severity") == "hint"]
    crashes = [r for r in reports if r.get("crash")]
    print(f"files: {len(files)}  round trips: {len(cases)}  agree: {agree} ({100 * agree / max(1, len(cases)):.1f}%)")
    print(
        f"unmodified files with problems (false alarms): {len({f for f, _ in false_alarms})}  with hints: {len({f for f, _ in hints})}"
        f"  crashes: {len(crashes)}  seconds: {time.perf_counter() - start:.1f}"
    )
    for r in reports:
        name = Path(r["file"]).name
        for p in r["problems"]:
            kind = "HINT" if p.get("severity") == "hint" else "FALSE ALARM"
            print(f"  {kind} {name}:{p['line']} {p['code']}: {p['message']}")
        if r.get("crash"):
            print(f"  CRASH {name}: {r['crash']}")
        for c in r["cases"]:
            if not c["agree"]:
                print(f"  DISAGREE {name} {c['owner']}[{c['key']}]: original {c['original']} written {c['written']}")
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
