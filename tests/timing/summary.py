"""Where `make test` spent its time: each step (build/test-steps.tsv, written by tests/timing/step.sh), slowest
first, then the slowest Python tests and test files (pytest's JUnit report, build/pytest-junit.xml).

Printed at the end of `make test` so that a step or a test that grew shows in every run's log (CI included).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path


def main(build: Path) -> int:
    steps = build / "test-steps.tsv"
    if steps.is_file():
        rows = [line.split("\t") for line in steps.read_text().splitlines() if line.count("\t") == 2]
        total = sum(int(seconds) for seconds, _, _ in rows)
        print(f"\nmake test: {total // 60} min {total % 60} s in {len(rows)} steps, slowest first")
        for seconds, name, status in sorted(rows, key=lambda row: -int(row[0])):
            print(f"  {int(seconds):5d} s  {name}{'' if status == '0' else f'  (exit {status})'}")
    junit = build / "pytest-junit.xml"
    if junit.is_file():
        cases = [
            (float(case.get("time", 0)), case.get("classname", ""), case.get("name", ""))
            for case in ElementTree.parse(junit).getroot().iter("testcase")
        ]
        by_file: dict[str, float] = defaultdict(float)
        for seconds, classname, _ in cases:
            # NOTE: a test class is the last dotted part of its classname (a capitalised name): count its module
            parts = classname.split(".")
            by_file[".".join(parts[:-1] if len(parts) > 1 and parts[-1][:1].isupper() else parts)] += seconds
        print(f"\nslowest test files (of {len(by_file)}; {sum(by_file.values()):.0f} s of tests in all)")
        for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:12]:
            print(f"  {seconds:7.1f} s  {name}")
        print("\nslowest tests (set-up included where pytest counts it)")
        for seconds, classname, name in sorted(cases, reverse=True)[:12]:
            print(f"  {seconds:7.1f} s  {classname}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build")))
