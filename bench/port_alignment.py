"""Alignment coverage on the port corpus: of the candidate module calls that have a counterpart in the reference,
how many does `modeltrace diff` (no `--map`) pair with one?

    .venv/bin/python bench/port_alignment.py                       # every clean pair, a markdown table
    .venv/bin/python bench/port_alignment.py --pair clip --list    # and the calls left unpaired or paired wrong

The truth comes from the data, not from names: both sides of a clean port (which compute the same logits) are
traced with full tensors, and a candidate call *has a counterpart* when one of its output tensors holds the same
numbers (1e-4 absolute + 1e-3 relative, any shape holding them in the same order) as an output of a reference
call, or as a run of consecutive slices along the last dimension of one (a fused projection on the other side),
or when a run of its own consecutive outputs' slices is one (it is the fused one). No-op classes (Identity,
Dropout, DropPath and Flatten in eval: `diff.kinds.is_no_op`) and the roots are left out on both sides: a no-op
holds its input's numbers and anchors nothing. A call is *aligned* when the diff paired it (one to one, in a
fused group, or with a chain, whose outputs are its last member's) with a reference call that is one of its
counterparts. A call whose numbers are only a permutation
of the reference's (rotary rows interleaved in the weights) has no counterpart by this rule and is not counted.

`--list` also lists the calls without a counterpart that the evidence paired all the same (Meta's `wq` and `wk`,
whose rows are permuted for the rotary layout: right by construction, and not counted).

Issue 30's target: at least 95 % of the calls that have a counterpart aligned, with no map.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# NOTE: only sys.path entries before the imports (no other statement), so that no import is "not at the top"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pyserver"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from modeltrace.diff import DiffOptions, diff_traces, load_reference
from modeltrace.diff.kinds import is_no_op
from modeltrace.trace.records import ModuleCall
from modeltrace.trace.tensors import LoadedTrace
from modeltrace.worker.client import WorkerClient
from ports.harness import PortHarness, all_cases
from ports.sources import unavailable

ATOL = 1e-4
RTOL = 1e-3


@dataclass
class Coverage:
    """One pair's figures: the candidate calls with a counterpart, those the diff aligned with one, and the rest
    (path, what the diff did) for `--list`."""

    pair: str
    calls: int = 0
    with_counterpart: int = 0
    aligned: int = 0
    missed: list[tuple[str, str]] = field(default_factory=list)
    # calls without a counterpart that the evidence (or a chain) paired all the same: (path, with what)
    unfounded: list[tuple[str, str]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.aligned / self.with_counterpart if self.with_counterpart else 1.0


def _outputs(loaded: LoadedTrace, call: ModuleCall) -> list[np.ndarray]:
    """The call's floating-point output tensors, flattened to (rows, last dimension)."""
    arrays = []
    for summary in call.outputs:
        if summary.tensor is None or loaded.tensors is None or not summary.shape:
            continue
        array = loaded.tensors.get(summary.tensor)
        if array is None or array.dtype.kind != "f" or array.size < 2:
            continue
        arrays.append(np.asarray(array, dtype=np.float64).reshape(-1, array.shape[-1]))
    return arrays


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The same numbers in the same order, whatever the shapes holding them."""
    return a.size == b.size and np.allclose(a.reshape(-1), b.reshape(-1), atol=ATOL, rtol=RTOL)


def _slices_of(part: np.ndarray, whole: np.ndarray) -> bool:
    """`part` is one of the runs of consecutive columns of `whole` (rows equal in number): a member of a fused
    projection."""
    rows, width = part.shape
    if whole.shape[0] != rows or whole.shape[1] <= width:
        return False
    # NOTE: members may differ in width (a query of 4 heads beside a key of 1): any start whose first column agrees
    starts = np.flatnonzero(np.isclose(whole[0, : whole.shape[1] - width + 1], part[0, 0], atol=ATOL, rtol=RTOL))
    return any(_same(part, whole[:, start : start + width]) for start in starts)


def _counterparts(cand: list[np.ndarray], ref: list[np.ndarray]) -> bool:
    """Whether a candidate call's outputs and a reference call's hold the same numbers (or a fused member's)."""
    return any(_same(a, b) or _slices_of(a, b) or _slices_of(b, a) for a in cand for b in ref)


def pair_coverage(name: str, reference: LoadedTrace, candidate: LoadedTrace) -> Coverage:
    """The coverage of one clean pair's automatic alignment, as the module docstring defines it."""
    result = diff_traces(reference, candidate, DiffOptions())
    coverage = Coverage(name)
    ref_calls = [call for call in reference.trace.modules if call.path and not is_no_op(call)]
    ref_outputs = {call.index: _outputs(reference, call) for call in ref_calls}
    by_path: dict[str, list[ModuleCall]] = {}
    for call in ref_calls:
        by_path.setdefault(call.path, []).append(call)
    # NOTE: a fused pair is compared through a group record ("q_proj + k_proj + v_proj") added to its side's
    # calls: a candidate member is aligned through its group's counterpart, a reference group through its members
    groups = {
        member: module
        for module in result.modules
        if " + " in module.candidate.path
        for member in module.candidate.path.split(" + ")
    }
    for module in result.modules:
        call = module.candidate
        if not call.path or " + " in call.path or " -> " in call.path or is_no_op(call):
            continue
        coverage.calls += 1
        outputs = _outputs(candidate, call)
        truth = {index for index, ref in ref_outputs.items() if outputs and ref and _counterparts(outputs, ref)}
        if not truth:
            if module.reference is not None and (" -> " in module.reference.path or module.pair is not None):
                coverage.unfounded.append((f"{call.path}#{call.call_index}", f"paired with {module.reference.path}"))
            continue
        coverage.with_counterpart += 1
        paired: set[int] = set()
        for counterpart in (module.reference, getattr(groups.get(call.path), "reference", None)):
            if counterpart is None:
                continue
            # NOTE: a chain's record ("conv1 -> bn1 -> act1") returns its last member's outputs: that one is its
            # counterpart
            members = (
                counterpart.path.split(" + ") if " + " in counterpart.path else counterpart.path.split(" -> ")[-1:]
            )
            for path in members:
                calls = by_path.get(path, [])
                if counterpart.call_index < len(calls):
                    paired.add(calls[counterpart.call_index].index)
        if paired & truth:
            coverage.aligned += 1
            continue
        said = f"paired with {module.reference.path}" if module.reference is not None else "unpaired"
        expected = ", ".join(sorted({call.path for call in ref_calls if call.index in truth}))
        coverage.missed.append((f"{call.path}#{call.call_index}", f"{said}; its counterpart: {expected}"))
    return coverage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", action="append", default=[], help="only this pair (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the calls with a counterpart left unaligned")
    arguments = parser.parse_args(argv)
    cases = [
        case for case in all_cases() if case.bug is None and (not arguments.pair or case.pair.name in arguments.pair)
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="port-alignment-") as folder, WorkerClient() as worker:
        harness = PortHarness(worker, Path(folder), lines=False, maps=False)
        for case in cases:
            reason = unavailable(case.pair.sources) if case.pair.sources else None
            if reason:
                print(f"# {case.pair.name}: left out: {reason}", file=sys.stderr)
                continue
            candidate_path, _ = harness.candidate(case)
            with load_reference(harness.reference(case.pair)) as reference, load_reference(candidate_path) as cand:
                rows.append(pair_coverage(case.pair.name, reference, cand))
            print(f"# {case.pair.name}: {rows[-1].aligned} of {rows[-1].with_counterpart}", file=sys.stderr)
    print("| pair | candidate calls | with a counterpart | aligned with one | share |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row.pair} | {row.calls} | {row.with_counterpart} | {row.aligned} | {100 * row.share:.1f} % |")
    total = sum(row.with_counterpart for row in rows)
    aligned = sum(row.aligned for row in rows)
    print(
        f"| **all** | {sum(row.calls for row in rows)} | {total} | {aligned} | **{100 * aligned / max(total, 1):.1f} %** |"
    )
    if arguments.list:
        for row in rows:
            for path, said in row.missed:
                print(f"- {row.pair}: {path}: {said}")
            for path, said in row.unfounded:
                print(f"- {row.pair}: {path}: {said}, but has no counterpart")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
