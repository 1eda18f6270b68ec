"""Removal-and-fix round trip of `_can_record_outputs` over transformers' installed modeling files.

For every `models/*/modeling_*.py` declaring `_can_record_outputs`: the unmodified file must report no
problem; then, for each entry of each dict literal, a copy with that entry removed is analysed and fixed, and
the entry written back must equal the original one (same target class, index and layer name; the index is
not compared when the target's forward returns a single value, as the hook then ignores it).
Prints the agreement rate and each disagreement; `--json PATH` writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import libcst as cst

from modeltrace.recorders.fixes import apply_fixes
from modeltrace.recorders.static import Recorder, _read_can_record, analyze_module, analyze_source, dotted


def installed_files() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    root = Path(next(iter(spec.submodule_search_locations))) / "models"
    return sorted(p for p in root.glob("*/modeling_*.py") if "_can_record_outputs" in p.read_text(encoding="utf-8"))


class _Remover(cst.CSTTransformer):
    """Remove entry `key` from the `occurrence`-th `_can_record_outputs` dict literal."""

    def __init__(self, occurrence: int, key: str) -> None:
        self.occurrence, self.key, self.seen, self.owner = occurrence, key, -1, None
        self.stack: list[str] = []

    def visit_ClassDef(self, node):
        self.stack.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.stack.pop()
        return updated

    def leave_Assign(self, original, updated):
        if len(original.targets) == 1 and dotted(original.targets[0].target) == "_can_record_outputs" and isinstance(updated.value, cst.Dict):
            self.seen += 1
            if self.seen == self.occurrence:
                self.owner = self.stack[-1] if self.stack else None
                elements = [e for e in updated.value.elements if not (isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == self.key)]
                if elements and len(elements) < len(updated.value.elements):
                    elements[-1] = elements[-1].with_changes(comma=updated.value.elements[-1].comma)
                return updated.with_changes(value=updated.value.with_changes(elements=elements))
        return updated


def problem_source(applied, key):
    return next(p.recorder.source(key) for p in applied if p.key == key)


def literal_dicts(analysis):
    """(occurrence, owner, {key: [Recorder]}) for each dict-literal `_can_record_outputs` in file order."""
    result = []
    for info in sorted(analysis.classes.values(), key=lambda c: c.line):
        if isinstance(info.can_record_node, cst.Dict):
            result.append((info.name, _read_can_record(analysis, info, frozenset({info.name}))))
    return result


def single_output(analysis, target: str | None) -> bool:
    info = analysis.classes.get((target or "").rsplit(".", 1)[-1])
    return bool(info) and info.forward_returns_tuple is False


def equivalent(analysis, key, original, written) -> bool:
    if len(original) != len(written):
        return False
    # a list of recorders is a set of hooks: its order does not matter
    def normal(recorder):
        value = recorder.normalized(key)
        if single_output(analysis, recorder.target):
            value = (value[0], None, *value[2:])
        return repr(value)

    return sorted(map(normal, original)) == sorted(map(normal, written))


def round_trip(path: Path) -> dict:
    source = path.read_text(encoding="utf-8")
    analysis = analyze_source(source, str(path))
    report = {"file": str(path), "problems": [p.to_json() for p in analysis.problems], "notes": analysis.notes, "cases": []}
    used_owners = {u.can_record.owner for u in analysis.uses if u.can_record}
    for occurrence, (owner, can_record) in enumerate(literal_dicts(analysis)):
        if owner not in used_owners or can_record.unresolved:
            continue
        for key, recorders in can_record.entries.items():
            case = {"owner": owner, "key": key, "original": [r.source(key) for r in recorders]}
            remover = _Remover(occurrence, key)
            broken = analyze_module(analysis.module.visit(remover), None, str(path))
            fixed, applied = apply_fixes("", analysis=broken)
            # what the fix wrote, read back from the fixed text of the owner's dict
            written = None
            for problem in applied:
                if problem.key == key and problem.owner == owner:
                    recorder = problem.recorder
                    written = [Recorder(a) for a in recorder.alternatives] if recorder.alternatives else [recorder]
            if written and f'"{key}": {problem_source(applied, key)}' not in fixed:
                written = None
            case["written"] = [r.source(key) for r in written] if written else None
            case["agree"] = bool(written) and equivalent(analysis, key, recorders, written)
            case["reported"] = any(p.code == "missing-recorder" and p.key == key for p in broken.problems)
            report["cases"].append(case)
    return report


def safe_round_trip(path: Path) -> dict:
    try:
        return round_trip(path)
    except Exception as error:  # noqa: BLE001 - a crash is a finding
        return {"file": str(path), "crash": f"{type(error).__name__}: {error}", "problems": [], "cases": [], "notes": []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    arguments = parser.parse_args()
    files = installed_files()
    if arguments.limit:
        files = files[: arguments.limit]
    start = time.perf_counter()
    reports = []
    import multiprocessing

    with multiprocessing.Pool(arguments.jobs) as pool:
        reports = pool.map(safe_round_trip, files, chunksize=4)
    cases = [c for r in reports for c in r["cases"]]
    agree = sum(c["agree"] for c in cases)
    false_alarms = [(r["file"], p) for r in reports for p in r["problems"]]
    crashes = [r for r in reports if r.get("crash")]
    print(f"files: {len(files)}  round trips: {len(cases)}  agree: {agree} ({100 * agree / max(1, len(cases)):.1f}%)")
    print(f"unmodified files with problems: {len({f for f, _ in false_alarms})}  crashes: {len(crashes)}  seconds: {time.perf_counter() - start:.1f}")
    for r in reports:
        name = Path(r["file"]).name
        for p in r["problems"]:
            print(f"  FALSE ALARM {name}:{p['line']} {p['code']}: {p['message']}")
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
