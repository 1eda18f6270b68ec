"""Judge `modeltrace diff` verdicts on the port corpus: trace a reference once, trace a (patched) port, diff them
through the CLI, and check the first divergence against the bug's truth.

The truth check (agreed between the helpers of issue 15): for a bug injected on candidate line L inside module
path P, the diff exits 1, `first_divergence.path == P`, and L lies in `lines` (start..end), or is `line.line`,
or is `built_at.line`; a clean port is a match (exit 0). Both traces keep full tensors; with `lines=True` both
also capture line records (the reference's lines are those of the transformers modeling file).

Used by tests/python/test_port_verdicts.py (with the session's warm worker) and bench/port_verdicts.py.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from modeltrace.errors import TraceFailed
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

from ports.corpus import CORPUS_ROOT, PAIRS, Bug, Pair, bugs_of
from ports.sources import SHARED_MODULES

# NOTE: options every verdict's `modeltrace diff` gets besides the pair's maps (the diff helpers add theirs here).
DIFF_OPTIONS: tuple[str, ...] = ()
TRACE_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Case:
    """A pair's clean port (`bug` None) or the port with one bug."""

    pair: Pair
    bug: Bug | None = None

    @property
    def id(self) -> str:
        return f"{self.pair.name}-{self.bug.name if self.bug else 'clean'}"


def all_cases() -> list[Case]:
    """Every pair's clean port, then each of its bugs, in table order."""
    cases = []
    for pair in PAIRS:
        cases.append(Case(pair))
        cases.extend(Case(pair, bug) for bug in bugs_of(pair.name))
    return cases


@dataclass(frozen=True)
class PreparedPort:
    """A copy of a pair folder with the bug applied: the port file, its recipe, and the truth line (or None)."""

    folder: Path
    port_file: Path
    recipe: Path
    truth_line: int | None


@dataclass(frozen=True)
class Verdict:
    """What `modeltrace diff --format json` said, reduced to what the truth check reads."""

    exit_code: int
    path: str | None = None
    lines: tuple[str, int, int] | None = None
    line: tuple[str, int] | None = None
    # the drill-down's stretch: `line.since` to the line named (values no line compares lie in between)
    line_since: int | None = None
    built_at: tuple[str, int] | None = None
    # the call lines of the children around the divergence (`after` / `before`): shown, not judged
    bounds: tuple[int | None, int | None] | None = None
    # the `__init__` lines that assigned the differing settings (`settings[].assigned_at`)
    assigned: tuple[tuple[str, int], ...] = ()
    # where the divergence's unpaired inputs were produced (`unpaired_inputs[].produced_at` / `assigned_at`):
    # (file, start, end) ranges
    produced: tuple[tuple[str, int, int], ...] = ()
    # the `__init__` statements assigning the settings the first differing line reads (`line.reads`)
    reads: tuple[tuple[str, int, int], ...] = ()
    # the lines that made of repeated copies a value the first differing line reads (`line.arranged`): (file, line)
    arranged: tuple[tuple[str, int], ...] = ()
    # the module's own forward line that called the helper function holding the first differing line
    # (`line.called_from`): an edited argument of that call is there
    called_from: tuple[str, int] | None = None
    error: str | None = None
    document: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def located(self) -> str:
        """`path:start-end` (plus `line N`, `built N` when given), `match`, or the error."""
        if self.error:
            return f"error: {self.error}"
        if self.exit_code == 0:
            return "match"
        if self.path is None:
            return "no first divergence"
        where = [f"{self.lines[1]}-{self.lines[2]}"] if self.lines else []
        if self.line:
            where.append(f"line {self.line[1]}")
        if self.called_from:
            where.append(f"called from {self.called_from[1]}")
        if self.built_at:
            where.append(f"built {self.built_at[1]}")
        where.extend(f"assigned {line}" for _, line in self.assigned)
        where.extend(f"input from {start}" + (f"-{end}" if end != start else "") for _, start, end in self.produced)
        where.extend(f"reads {start}" + (f"-{end}" if end != start else "") for _, start, end in self.reads)
        where.extend(f"arranged {line}" for _, line in self.arranged)
        path = self.path or "(root)"
        if where:
            return f"{path}:{' '.join(where)}"
        if self.bounds:  # today's children bounds: shown for information, not a range the truth check reads
            return f"{path} (no lines; children called at {self.bounds[0] or '?'}..{self.bounds[1] or '?'})"
        return f"{path} (no lines)"


@dataclass(frozen=True)
class Judged:
    """A verdict with its case and truth: `right` per the truth check, `why` says what is off when not."""

    case: Case
    port: PreparedPort
    verdict: Verdict
    right: bool
    why: str
    precision: str = ""

    @property
    def module_right(self) -> bool:
        """The first divergence names the bug's module (whatever the lines): progress short of `right`."""
        return self.case.bug is not None and self.verdict.exit_code == 1 and self.verdict.path == self.case.bug.module

    def truth(self) -> str:
        if self.case.bug is None:
            return "match"
        return f"{self.case.bug.module or '(root)'}:{self.port.truth_line}"


# --- preparing ports ----------------------------------------------------------------------------------------


def apply_bug(source: str, bug: Bug, file: Path) -> tuple[str, int]:
    """The patched text and the truth line; the patch's `old` text must occur exactly once."""
    count = source.count(bug.old) if bug.old else 1  # no old text: the truth line only (`truth_at`)
    if count != 1:
        raise ValueError(f"{file}: bug {bug.name!r}: its old text occurs {count} times (expected once): {bug.old!r}")
    start = source.index(bug.old)
    patched = source[:start] + bug.new + source[start + len(bug.old) :]
    truth_line = patched.count("\n", 0, start) + 1
    if bug.truth_at is not None:
        found = [number for number, text in enumerate(patched.splitlines(), 1) if bug.truth_at in text]
        if len(found) != 1:
            raise ValueError(f"{file}: bug {bug.name!r}: truth_at {bug.truth_at!r} is on {len(found)} lines")
        truth_line = found[0]
    return patched, truth_line


def prepare_port(case: Case, workdir: Path) -> PreparedPort:
    """Copy the pair folder (and the corpus's shared module) under `workdir/CASE_ID/` and apply the bug."""
    target = workdir / case.id
    if target.exists():
        shutil.rmtree(target)
    folder = target / case.pair.folder
    shutil.copytree(case.pair.path, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for shared in SHARED_MODULES:
        shutil.copy2(CORPUS_ROOT / shared, target / shared)
    port_file = folder / case.pair.port_file
    truth_line = None
    if case.bug is not None and case.bug.patched_file:
        patched_file = target / case.bug.patched_file
        patched, _ = apply_bug(patched_file.read_text(), replace(case.bug, truth_at=None), patched_file)
        patched_file.write_text(patched)
        _, truth_line = apply_bug(port_file.read_text(), replace(case.bug, old="", new=""), port_file)
    elif case.bug is not None:
        patched, truth_line = apply_bug(port_file.read_text(), case.bug, port_file)
        port_file.write_text(patched)
    return PreparedPort(folder, port_file, folder / "recipe_port.py", truth_line)


def reference_modeling_file(pair: Pair) -> Path:
    if pair.reference_file:
        return (pair.path / pair.reference_file).resolve()
    spec = importlib.util.find_spec(pair.reference_module)
    if spec is None or spec.origin is None:
        raise ValueError(f"pair {pair.name!r}: {pair.reference_module} is not importable here")
    return Path(spec.origin).resolve()


@dataclass
class Built:
    """A recipe's model and inputs, built in this process (plain torch, no trace)."""

    model: Any
    inputs: Any

    def run(self) -> Any:
        import torch

        with torch.no_grad():
            if isinstance(self.inputs, dict):
                return self.model(**self.inputs)
            return self.model(*self.inputs)


def build_recipe(recipe: Path) -> Built:
    """`build_model()` and `build_inputs(model)` of a recipe, seeded as the worker seeds them; the modules the
    recipe imports from its corpus folder (the pair's port and reference, the shared module) are forgotten
    afterwards, so that a patched copy of a port imports fresh next time."""
    import torch

    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location(f"port_corpus_recipe_{recipe.parent.name}", recipe)
        assert spec is not None and spec.loader is not None, recipe
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        model = module.build_model().eval()
        torch.manual_seed(0)
        return Built(model, module.build_inputs(model))
    finally:
        sys.path[:] = saved_path
        root = recipe.resolve().parents[1]
        for name in set(sys.modules) - saved_modules:
            file = getattr(sys.modules[name], "__file__", None)
            if file and Path(file).resolve().is_relative_to(root):
                del sys.modules[name]


@dataclass(frozen=True)
class Effect:
    """What a bug does at the module that owns it, clean port against broken port (plain torch), over the
    tensors of the module's first call: the largest difference of its inputs (0 when the bug is there and
    nowhere upstream) and of its outputs, and the outputs' relative difference ||broken - clean|| / ||clean||."""

    input_max_abs: float
    output_max_abs: float
    output_relative: float
    # the inputs' largest difference leaving complex tensors out (a rotary table as complex numbers)
    input_max_abs_real: float = 0.0


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value.detach().clone()]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in _tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    return []


def _first_call(built: Built, path: str) -> tuple[list[Any], list[Any]]:
    seen: dict[str, list[Any]] = {}

    def hook(module: Any, inputs: Any, output: Any) -> None:
        if "output" not in seen:  # the first call (nothing in the corpus is called twice)
            seen["input"], seen["output"] = _tensors(inputs), _tensors(output)

    handle = dict(built.model.named_modules())[path].register_forward_hook(hook)
    try:
        built.run()
    finally:
        handle.remove()
    return seen["input"], seen["output"]


def _largest(clean: list[Any], broken: list[Any]) -> float:
    if [tensor.shape for tensor in clean] != [tensor.shape for tensor in broken]:
        return float("inf")
    return max((float((a - b).abs().max()) for a, b in zip(clean, broken)), default=0.0)


def bug_effect(module_path: str, clean: Built, broken: Built) -> Effect:
    """`Effect` of a bug at `module_path`, from the clean port and the broken one (built with `build_recipe`)."""
    clean_inputs, clean_outputs = _first_call(clean, module_path)
    broken_inputs, broken_outputs = _first_call(broken, module_path)
    output_max_abs = _largest(clean_outputs, broken_outputs)
    relative = float("inf")
    if output_max_abs != float("inf"):
        difference = sum(float((b.float() - a.float()).norm()) ** 2 for a, b in zip(clean_outputs, broken_outputs))
        size = sum(float(a.float().norm()) ** 2 for a in clean_outputs)
        relative = (difference / size) ** 0.5 if size else float("inf")
    real = [(a, b) for a, b in zip(clean_inputs, broken_inputs) if not (a.is_complex() or b.is_complex())]
    real_max_abs = _largest([a for a, _ in real], [b for _, b in real])
    return Effect(_largest(clean_inputs, broken_inputs), output_max_abs, relative, real_max_abs)


# --- tracing and diffing ------------------------------------------------------------------------------------


def run_diff(reference: Path, candidate: Path, options: tuple[str, ...]) -> Verdict:
    """`modeltrace diff REF CAND --format json OPTIONS` through the CLI's `main`, in this process."""
    from modeltrace.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    arguments = ["diff", str(reference), str(candidate), "--format", "json", *options]
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            exit_code = main(arguments)
    except Exception as error:  # noqa: BLE001 - a crash of the diff is a wrong verdict, reported as such
        return Verdict(exit_code=-1, error=f"the diff raised {type(error).__name__}: {error}")
    if exit_code not in (0, 1):
        return Verdict(exit_code=exit_code, error=stderr.getvalue().strip() or f"exit {exit_code}")
    document = json.loads(stdout.getvalue())
    first = document.get("first_divergence") or {}
    lines = first.get("lines")
    line = first.get("line")
    built_at = first.get("built_at")
    return Verdict(
        exit_code=exit_code,
        path=first.get("path") if first else None,
        lines=(lines["file"], int(lines["start"]), int(lines["end"])) if lines else None,
        line=(line["file"], int(line["line"])) if line and line.get("line") is not None else None,
        line_since=int(line["since"]) if line and line.get("since") is not None else None,
        built_at=(built_at["file"], int(built_at["line"])) if built_at else None,
        bounds=_bounds(first),
        assigned=tuple(
            (setting["assigned_at"]["file"], int(setting["assigned_at"]["line"]))
            for setting in first.get("settings") or ()
            if setting.get("assigned_at")
        ),
        produced=tuple(
            (where["file"], int(where["line"]), int(where.get("end_line") or where["line"]))
            for unpaired in first.get("unpaired_inputs") or ()
            for where in (unpaired.get("produced_at"), unpaired.get("assigned_at"))
            if where
        ),
        reads=tuple(
            (read["assigned_at"]["file"], int(read["assigned_at"]["line"]), int(read["assigned_at"]["end_line"]))
            for read in (line or {}).get("reads") or ()
        ),
        arranged=tuple((item["file"], int(item["line"])) for item in (line or {}).get("arranged") or ()),
        called_from=_called_from(line),
        document=document,
    )


def _called_from(line: dict[str, Any] | None) -> tuple[str, int] | None:
    called = (line or {}).get("called_from")
    return (called["file"], int(called["line"])) if called and called.get("line") is not None else None


def _bounds(first: dict[str, Any]) -> tuple[int | None, int | None] | None:
    def call_line(child: dict[str, Any] | None) -> int | None:
        location = (child or {}).get("called_at") or {}
        return location.get("line")

    after, before = call_line(first.get("after")), call_line(first.get("before"))
    return (after, before) if after is not None or before is not None else None


def _same_file(reported: str, port_file: Path) -> bool:
    return Path(reported).resolve() == port_file.resolve()


def judge(case: Case, port: PreparedPort, verdict: Verdict) -> tuple[bool, str]:
    """The truth check of the interfaces file; returns (right, why not)."""
    if verdict.error:
        return False, verdict.error
    if case.bug is None:
        return (verdict.exit_code == 0, "" if verdict.exit_code == 0 else f"diff says {verdict.located()}")
    if verdict.exit_code != 1:
        return False, "diff says match"
    if verdict.path != case.bug.module:
        return False, f"blames {verdict.path!r}, not {case.bug.module!r}"
    line = port.truth_line
    if verdict.lines and _same_file(verdict.lines[0], port.port_file) and verdict.lines[1] <= line <= verdict.lines[2]:
        return True, ""
    if verdict.line and _same_file(verdict.line[0], port.port_file) and verdict.line[1] == line:
        return True, ""
    if verdict.called_from and _same_file(verdict.called_from[0], port.port_file) and verdict.called_from[1] == line:
        return True, ""
    if verdict.built_at and _same_file(verdict.built_at[0], port.port_file) and verdict.built_at[1] == line:
        return True, ""
    if any(_same_file(file, port.port_file) and at == line for file, at in verdict.assigned):
        return True, ""
    if any(_same_file(file, port.port_file) and start <= line <= end for file, start, end in verdict.reads):
        return True, ""
    if any(_same_file(file, port.port_file) and at == line for file, at in verdict.arranged):
        return True, ""
    if verdict.line and verdict.line_since and _same_file(verdict.line[0], port.port_file):
        if verdict.line_since <= line <= verdict.line[1]:
            return True, ""
    if any(_same_file(file, port.port_file) and start <= line <= end for file, start, end in verdict.produced):
        return True, ""
    return False, f"right module, but no range, line or construction line names line {line}"


def precision(case: Case, port: PreparedPort, verdict: Verdict) -> str:
    """How exactly a verdict names the bug's line, beyond the truth check: "line" (`line.line` is it),
    "construction line" (`built_at` is it), "assignment line" (a differing setting's `assigned_at` is it), "arrangement line"
    (the line that made a value the first differing line reads of repeated copies, `line.arranged`), "call line"
    (the forward's line that called the helper function holding the first differing line, `line.called_from`),
    "range of N lines" (only `lines`, or where
    an unpaired input was produced, holds it), "" otherwise; a
    `line` that names another line is said too ("range of 22 lines; line 76 is not the bug's")."""
    if case.bug is None or port.truth_line is None or verdict.path != case.bug.module:
        return ""
    line = port.truth_line
    if verdict.line and _same_file(verdict.line[0], port.port_file) and verdict.line[1] == line:
        return "line"
    if verdict.called_from and _same_file(verdict.called_from[0], port.port_file) and verdict.called_from[1] == line:
        return "call line"
    if verdict.built_at and _same_file(verdict.built_at[0], port.port_file) and verdict.built_at[1] == line:
        return "construction line"
    if any(_same_file(file, port.port_file) and at == line for file, at in verdict.assigned):
        return "assignment line"
    if any(_same_file(file, port.port_file) and start == line == end for file, start, end in verdict.reads):
        return "assignment line"
    if any(_same_file(file, port.port_file) and at == line for file, at in verdict.arranged):
        return "arrangement line"
    # NOTE: the narrowest named range that holds the bug's line (issue 30's measure): the module's range, the
    # drill-down's stretch (`line.since` to `line`) or where an unpaired input was produced; the module's range
    # wins a tie (its label is the plainest)
    ranges: list[tuple[int, int, str]] = []
    if verdict.lines and _same_file(verdict.lines[0], port.port_file) and verdict.lines[1] <= line <= verdict.lines[2]:
        width = verdict.lines[2] - verdict.lines[1] + 1
        ranges.append((width, 0, f"range of {width} line{'s' if width > 1 else ''}"))
    if verdict.line and verdict.line_since and _same_file(verdict.line[0], port.port_file):
        if verdict.line_since <= line <= verdict.line[1]:
            width = verdict.line[1] - verdict.line_since + 1
            ranges.append((width, 1, f"range of {width} lines (the drill-down's stretch)"))
    for file, start, end in verdict.produced:
        if _same_file(file, port.port_file) and start <= line <= end:
            width = end - start + 1
            label = "line" if width == 1 else f"range of {width} lines (where an unpaired input was produced)"
            ranges.append((width, 2, label))
    if not ranges:
        return ""
    _, kind, found = min(ranges)
    if kind == 0 and verdict.line:
        found += f"; line {verdict.line[1]} is not the bug's"
    return found


class PortHarness:
    """Traces and verdicts for the corpus, in `workdir`; reference traces are made once per (pair, lines)."""

    def __init__(
        self,
        worker: WorkerClient,
        workdir: Path,
        lines: bool = True,
        diff_options: tuple[str, ...] = DIFF_OPTIONS,
        maps: bool = True,
    ) -> None:
        """`maps`: diff with each pair's hand-written `--map` rules; without, the diff aligns the port by
        evidence alone (automatic alignment)."""
        self.worker = worker
        self.workdir = workdir
        self.lines = lines
        self.diff_options = diff_options
        self.maps = maps
        self._references: dict[tuple[str, bool], Path] = {}
        self._candidates: dict[tuple[str, bool], tuple[Path, PreparedPort]] = {}

    def _trace(self, file: Path, recipe: Path, out: Path, follow: tuple[Path, ...] = ()) -> Path:
        request = TraceRequest(
            file=str(file),
            recipe=str(recipe),
            out=str(out),
            full_tensors=True,
            lines=self.lines,
            follow=tuple(str(path) for path in follow) if self.lines else (),
            seed=0,
            timeout=TRACE_TIMEOUT_SECONDS,
        )
        try:
            return Path(self.worker.trace(request).trace)
        except TraceFailed as failure:
            raise RuntimeError(f"tracing {recipe} failed: {failure}") from failure

    def reference(self, pair: Pair) -> Path:
        key = (pair.name, self.lines)
        if key not in self._references:
            folder = self.workdir / f"reference-{pair.name}"
            folder.mkdir(parents=True, exist_ok=True)
            suffix = "-lines" if self.lines else ""
            self._references[key] = self._trace(
                reference_modeling_file(pair),
                pair.path / "recipe_reference.py",
                folder / f"reference{suffix}.mtrace",
                tuple((pair.path / name).resolve() for name in pair.reference_follow),
            )
        return self._references[key]

    def candidate(self, case: Case) -> tuple[Path, PreparedPort]:
        """The case's port, traced once per harness (verdicts with and without maps share it)."""
        key = (case.id, self.lines)
        if key not in self._candidates:
            port = prepare_port(case, self.workdir)
            suffix = "-lines" if self.lines else ""
            out = port.folder.parent / f"candidate{suffix}.mtrace"
            self._candidates[key] = (self._trace(port.port_file, port.recipe, out), port)
        return self._candidates[key]

    def judge(self, case: Case, maps: bool | None = None) -> Judged:
        """The verdict on one case; `maps` (default: the harness's) says whether the pair's `--map` rules are
        given or the diff aligns the port by evidence alone."""
        reference = self.reference(case.pair)
        candidate, port = self.candidate(case)
        maps = case.pair.maps if (self.maps if maps is None else maps) else ()
        options = tuple(option for rule in maps for option in ("--map", rule)) + self.diff_options
        verdict = run_diff(reference, candidate, options)
        right, why = judge(case, port, verdict)
        return Judged(case, port, verdict, right, why, precision(case, port, verdict))


__all__ = [
    "DIFF_OPTIONS",
    "Built",
    "Case",
    "Effect",
    "Judged",
    "PortHarness",
    "PreparedPort",
    "Verdict",
    "all_cases",
    "apply_bug",
    "bug_effect",
    "build_recipe",
    "judge",
    "precision",
    "prepare_port",
    "reference_modeling_file",
    "run_diff",
]
