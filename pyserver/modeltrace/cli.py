"""The `modeltrace` command line: trace a modeling file, show, diff and export traces, serve the editor.

Exit codes follow DESIGN.md: 0 success or match; 1 divergence (`diff`); 2 bad input or failure, with one
line on stderr naming the file, the class and the cause (never a bare traceback; `MODELTRACE_DEBUG=1` adds
the worker's traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from modeltrace.errors import ModelTraceError, TraceFailed
from modeltrace.trace.lines import HintDetail
from modeltrace.modular.twins import generated_path, is_modular_file, resolve_generated
from modeltrace.project import project_choices
from modeltrace.trace.listing import render_listing
from modeltrace.trace.parameter_store import parameters_note
from modeltrace.trace.storage import TRACE_SUFFIX, check_destination, read_trace
from modeltrace.worker.messages import (
    ATTENTION_IMPLEMENTATIONS,
    DEFAULT_ATTENTION,
    DEFAULT_DTYPE,
    DEFAULT_TIMEOUT_SECONDS,
    DTYPE_NAMES,
    TraceRequest,
)
from modeltrace.worker.protocol import DEFAULT_MAX_TENSOR_MB, DEFAULT_MAX_TRACE_MB, DEFAULT_TENSOR_MEMORY_MB

if TYPE_CHECKING:
    from modeltrace.diff.result import DiffResult
    from modeltrace.recorders.static import Analysis


def _trace_command(arguments: argparse.Namespace) -> int:

    if arguments.nproc is not None:
        return _parallel_trace_command(arguments)
    file = Path(arguments.file).resolve()
    if not file.is_file():
        raise ModelTraceError(f"{arguments.file}: no such file")
    out = Path(arguments.out).resolve() if arguments.out else Path.cwd() / f"{file.stem}{TRACE_SUFFIX}"
    if not arguments.regenerate:
        if is_modular_file(file) and not arguments.recipe:
            # NOTE: before a worker starts: a modular file without a usable generated twin cannot run
            resolve_generated(file)
        return _trace_file(file, out, arguments)
    from modeltrace.modular.regenerate import regenerated_root, remove_regenerated

    copy = _regenerated_copy(file)
    try:
        return _trace_file(copy, out, arguments)
    finally:
        # NOTE: the temporary folder is ModelTrace's: once the trace is written and printed it goes
        root = regenerated_root(copy)
        if root is not None and remove_regenerated(root):
            print(f"# removed the temporary folder {root}", file=sys.stderr)


def _trace_file(file: Path, out: Path, arguments: argparse.Namespace) -> int:
    """Trace `file` into `out` and print it (`trace` without `--nproc`)."""
    from modeltrace.worker.client import WorkerClient

    check_destination(out)
    # NOTE: the project file fills in what no option gives (DESIGN: the project file)
    project = project_choices(file, arguments.model, _project_option(arguments))
    recipe = arguments.recipe or project.recipe
    config = arguments.config or project.config
    if project.project_file is not None and not arguments.recipe and project.recipe is not None:
        print(f"# recipe {project.recipe} (from {project.project_file})", file=sys.stderr)
    if project.project_file is not None and not arguments.config and project.config is not None:
        print(f"# config {project.config} (from {project.project_file})", file=sys.stderr)
    follow = tuple(str(_existing_file(path, "--follow")) for path in arguments.follow)
    if follow and not arguments.lines:
        raise ModelTraceError("--follow names files whose lines are captured: add --lines")
    request = TraceRequest(
        file=str(file),
        out=str(out),
        model=arguments.model or (project.model_class if recipe else None),
        recipe=str(Path(recipe).resolve()) if recipe else None,
        config=_local_path(str(config) if config else None),
        checkpoint=_local_path(arguments.checkpoint),
        shape_only=arguments.shape_only,
        full_tensors=arguments.full_tensors,
        max_tensor_mb=arguments.max_tensor_mb,
        max_trace_mb=arguments.max_trace_mb,
        tensor_memory_mb=arguments.tensor_memory_mb,
        parameters=not arguments.no_parameters,
        lines=arguments.lines,
        follow=follow,
        attention=arguments.attention,
        device=arguments.device,
        dtype=arguments.dtype,
        seed=arguments.seed,
        timeout=arguments.timeout,
        generate=arguments.generate,
        backward=arguments.backward,
        device_map=arguments.device_map or None,
    )
    if arguments.against:
        return _trace_against(request, arguments)
    with WorkerClient() as worker:
        result = worker.trace(request)
    trace = read_trace(result.trace)
    if arguments.format == "json":
        json.dump(trace.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_listing(trace, None, _detail(arguments)))
        print(f"# trace written to {result.trace} ({result.seconds:.2f} s)", file=sys.stderr)
    return 0


def _regenerated_copy(file: Path) -> Path:
    """`trace --regenerate`: the modular file's folder copied to a temporary folder and its generated twin written
    there by the transformers checkout's converter (`modular/regenerate.py`); the copy of the modular file, to
    trace. The user's generated file is never written."""
    from modeltrace.modular.regenerate import find_checkout, no_checkout_message, regenerate_copy

    if not is_modular_file(file):
        raise ModelTraceError(f"{file}: --regenerate is for a modular file (modular_<name>.py)")
    checkout = find_checkout(file)
    if checkout is None:
        raise ModelTraceError(no_checkout_message(file))
    print(f"# regenerating {file.name} with {checkout}'s converter into a temporary folder", file=sys.stderr)
    copy = regenerate_copy(file, checkout)
    print(
        f"# traced the regenerated copy {copy} (your {generated_path(file).name} is left as it is)",
        file=sys.stderr,
    )
    return copy


def _existing_file(text: str, option: str) -> Path:
    """A file named by an option, made absolute; a clear error naming the option when it is not there."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise ModelTraceError(f"{option} {text}: no such file")
    return path.resolve()


def _trace_against(request: TraceRequest, arguments: argparse.Namespace) -> int:
    """`trace --against REF`: the editor's flow from a terminal. The trace keeps its model alive in the worker
    so that the diff's replay calls the suspects again on it (no rebuild, no second forward)."""
    from modeltrace.diff import close_result, diff_paths
    from modeltrace.worker.client import WorkerClient

    if not Path(arguments.against).exists():
        raise ModelTraceError(f"--against {arguments.against}: no such trace")
    request = dataclasses.replace(request, full_tensors=not request.shape_only, keep_for_replay=not request.shape_only)
    with WorkerClient() as worker:
        traced = worker.trace(request)
        print(f"# trace written to {traced.trace} ({traced.seconds:.2f} s)", file=sys.stderr)
        # NOTE: the model file's project file gives the diff's maps and tolerances, as in the editor
        project = project_choices(Path(request.file), request.model, _project_option(arguments))
        result = diff_paths(
            arguments.against,
            traced.trace,
            project.atol,
            project.rtol,
            project.maps,
            rel_tol=project.rel_tol,
            replay=True,
            client=worker,
            mapping=project.mapping,
        )
    try:
        return _report_diff(result, arguments.format)
    finally:
        close_result(result)


def _parallel_trace_command(arguments: argparse.Namespace) -> int:
    """`trace --nproc N`: the model on N ranks with transformers' tensor parallelism, one trace of them all
    (`worker/parallel.py`)."""
    from modeltrace.worker.parallel import run_parallel_trace

    file = Path(arguments.file).resolve()
    if not file.is_file():
        raise ModelTraceError(f"{arguments.file}: no such file")
    if arguments.device_map:
        raise ModelTraceError("--nproc and --device-map are two ways to spread a model: choose one")
    if arguments.lines:
        raise ModelTraceError("--lines is not supported with --nproc yet: tensor-parallel traces record module calls")
    out = Path(arguments.out).resolve() if arguments.out else Path.cwd() / f"{file.stem}{TRACE_SUFFIX}"
    check_destination(out)
    request = TraceRequest(
        file=str(file),
        out=str(out),
        model=arguments.model,
        checkpoint=_local_path(arguments.checkpoint),
        full_tensors=arguments.full_tensors,
        max_tensor_mb=arguments.max_tensor_mb,
        max_trace_mb=arguments.max_trace_mb,
        attention=arguments.attention,
        device=arguments.device,
        dtype=arguments.dtype,
        seed=arguments.seed,
        timeout=arguments.timeout,
    )
    result = run_parallel_trace(request, arguments.nproc)
    trace = read_trace(result.trace)
    if arguments.format == "json":
        json.dump(trace.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_listing(trace, None, _detail(arguments)))
        for divergence in trace.model.get("parallel", {}).get("rank_divergences", []):
            print(f"# rank divergence: {divergence['message']}", file=sys.stderr)
        print(
            f"# trace of {arguments.nproc} ranks written to {result.trace} ({result.seconds:.2f} s)",
            file=sys.stderr,
        )
    return 0


def _count(noun: str) -> Callable[[str], int]:
    """An argparse type: a whole number of `noun` (processes, decode steps), >= 1."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {noun}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: expected at least 1 of {noun}")
        return value

    return parse


def _finite(number: str, expected: str, *, zero_allowed: bool) -> Callable[[str], float]:
    """An argparse type: a finite number >= 0 (`zero_allowed`) or > 0. NaN and inf are refused: a timeout of
    either never stops, a tolerance of inf passes any bug, and a negative tolerance fails identical traces."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {number}") from None
        if not (0 <= value if zero_allowed else 0 < value) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    return parse


# NOTE: 0 MB stores no tensor at all
_megabytes = _finite("a number of megabytes", "a number of megabytes >= 0", zero_allowed=True)
_seconds = _finite("a number of seconds", "a finite number of seconds > 0", zero_allowed=False)
_tolerance = _finite("a number", "a finite tolerance >= 0", zero_allowed=True)


def _fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number from 0 to 1")
    return value


def _local_path(value: str | None) -> str | None:
    """A path made absolute when it exists; anything else (a hub id) goes to the worker as given, to be refused."""
    if not value:
        return None
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def _show_command(arguments: argparse.Namespace) -> int:
    trace = read_trace(arguments.trace)
    # NOTE: on stderr, so that `--format json` stays one document: the activations show either way
    note = parameters_note(trace, arguments.trace)
    if note:
        print(f"modeltrace show: note: {note}", file=sys.stderr)
    if arguments.format == "json":
        json.dump(trace.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_listing(trace, arguments.file, _detail(arguments)))
    return 0


def _project_option(arguments: argparse.Namespace) -> Path | None:
    return Path(arguments.project).expanduser() if getattr(arguments, "project", None) else None


def _diff_command(arguments: argparse.Namespace) -> int:
    from modeltrace.diff import close_result, diff_paths

    # NOTE: a diff has no model file: the project file is the one above the current folder (or --project)
    project = project_choices(Path.cwd(), None, _project_option(arguments))
    result = diff_paths(
        arguments.reference,
        arguments.candidate,
        arguments.atol if arguments.atol is not None else project.atol,
        arguments.rtol if arguments.rtol is not None else project.rtol,
        arguments.map or list(project.maps),
        rel_tol=arguments.rel_tol if arguments.rel_tol is not None else project.rel_tol,
        replay=arguments.replay,
        mapping=arguments.mapping or (str(project.mapping) if project.mapping else None),
        automatic=not arguments.no_auto_align,
    )
    try:
        return _report_diff(result, arguments.format)
    finally:
        close_result(result)


def _report_diff(result: DiffResult, form: str) -> int:
    """Print a diff result (text or JSON); returns `diff`'s exit code."""
    from modeltrace.diff import render_text, to_json

    if form == "json":
        json.dump(to_json(result), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(result))
    if not result.match and not result.not_comparable:
        return 1
    if result.not_comparable:
        # NOTE: neither a match (too little aligned to trust one) nor a finding (differences whose start no
        # compared module shows): exit 2, with the reason
        print(f"modeltrace diff: not comparable: {result.not_comparable}", file=sys.stderr)
        return 2
    return 0


def _align_command(arguments: argparse.Namespace) -> int:
    from modeltrace.diff import align_modules, render_mapping
    from modeltrace.trace.reference import load_reference

    if not 0 < arguments.threshold <= 1:
        raise ModelTraceError(f"--threshold {arguments.threshold}: expected a confidence in (0, 1]")
    with load_reference(arguments.reference) as reference, load_reference(arguments.candidate) as candidate:
        try:
            mapping = align_modules(reference.trace, candidate.trace, arguments.threshold)
        except ValueError as error:
            raise ModelTraceError(str(error)) from None
        aligned = [pair for pair in mapping.pairs if any(pair.candidate)]
        if arguments.format == "json":
            document = {
                "pairs": [
                    {
                        "reference": pair.reference,
                        "candidate": pair.candidate,
                        "confidence": pair.confidence,
                        "evidence": pair.evidence,
                        "fused": pair.fused,
                    }
                    for pair in mapping.pairs
                ],
                "unaligned": [
                    {
                        "side": item.side,
                        "path": item.path,
                        "candidates": [
                            {"path": path, "confidence": score, "why": why} for path, score, why in item.candidates
                        ],
                    }
                    for item in mapping.leftovers
                ],
                "threshold": mapping.threshold,
            }
            text = json.dumps(document, indent=1) + "\n"
        else:
            text = render_mapping(
                mapping,
                f"{arguments.reference} ({reference.trace.model.get('class', '?')})",
                f"{arguments.candidate} ({candidate.trace.model.get('class', '?')})",
            )
    if not aligned:
        raise ModelTraceError(
            f"nothing aligns: no module of {arguments.candidate} pairs with one of {arguments.reference} above "
            f"confidence {arguments.threshold}; are they traces of the same model?"
        )
    if arguments.out:
        try:
            Path(arguments.out).write_text(text, encoding="utf-8")
        except OSError as error:
            reason = (error.strerror or str(error)).lower()
            raise ModelTraceError(f"cannot write the mapping to {arguments.out}: {reason}") from None
        fused = sum(1 for pair in mapping.pairs if pair.fused)
        print(
            f"# {len(mapping.pairs)} module pairs ({fused} fused), {len(mapping.leftovers)} unaligned: "
            f"written to {arguments.out}",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0


def _export_command(arguments: argparse.Namespace) -> int:
    from modeltrace.trace.hf_debugger import write_debugger_output
    from modeltrace.trace.reference import load_reference

    with load_reference(arguments.trace) as loaded:
        summary, full = write_debugger_output(loaded, Path(arguments.hf_debugger), use_repr=not arguments.safetensors)
    print(f"# wrote {summary} and {full}", file=sys.stderr)
    return 0


def _serve_command(arguments: argparse.Namespace) -> int:
    from modeltrace.bundled import add_server_libraries

    # NOTE: started from the VS Code extension's bundle: its pygls/lsprotocol come first (see `bundled`).
    add_server_libraries()
    from modeltrace.lsp.loading import configure_heap
    from modeltrace.lsp.server import serve

    configure_heap()  # NOTE: process-wide C heap settings, made once before the server starts
    serve()
    return 0


def _check_command(arguments: argparse.Namespace) -> int:
    from modeltrace.recorders import analyze_source, fix_file

    file = Path(arguments.file)
    if not file.is_file():
        raise ModelTraceError(f"{arguments.file}: no such file")
    try:
        source = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelTraceError(f"{arguments.file}: cannot read: {error}") from error
    modular = is_modular_file(file)
    if modular:
        from modeltrace.modular.recorders import analyze_modular

        # NOTE: what runs is the generated twin: it is checked, its problems shown on the modular lines
        resolve_generated(file)
        analysis = analyze_modular(source, file)
        if arguments.fix:
            return _fix_modular(file, source, analysis, arguments)
    else:
        analysis = analyze_source(source, str(file))
    if analysis.module is None:
        raise ModelTraceError(f"{arguments.file}: {analysis.notes[0] if analysis.notes else 'not analysed'}")
    fixed = []
    if arguments.fix and any(p.fix_json() for p in analysis.problems):
        fixed = fix_file(file)
        analysis = analyze_source(file.read_text(encoding="utf-8"), str(file))
    problems = [p.to_json() for p in analysis.problems]
    if arguments.run:
        problems.extend(_run_evidence(file, arguments.model, arguments.timeout, modular))
    if arguments.format == "json":
        document = {
            "problems": problems,
            "fixed": [p.to_json() for p in fixed],
            "notes": analysis.notes,
        }
        json.dump(document, sys.stdout)
        sys.stdout.write("\n")
    else:
        for problem in fixed:
            print(f"{arguments.file}:{problem.line}: fixed {problem.code}: {problem.message}")
        for problem in problems:
            fix = problem["fix"]
            hint = ""
            if fix and "entry" in fix:
                hint = f" [fix: {fix['key']!r}: {fix['entry']}]"
            elif fix:
                hint = " [fix: add _can_record_outputs]"
            level = "hint: " if problem.get("severity") == "hint" else ""
            print(f"{arguments.file}:{problem['line']}: {level}{problem['code']}: {problem['message']}{hint}")
        for note in analysis.notes:
            print(f"{arguments.file}: note: {note}")
        if not problems and not fixed:
            print(f"{arguments.file}: no recorder problems ({len(analysis.uses)} model(s) with @capture_outputs)")
    # hints (the file does not show the entry is wrong) do not fail the check
    return 1 if any(p.get("severity") != "hint" for p in problems) else 0


def _fix_modular(file: Path, source: str, analysis: Analysis, arguments: argparse.Namespace) -> int:
    """`check --fix` on a modular file: the fixes are written into the modular file (never the generated one, which
    the converter overwrites); the problems left are those of the generated file until it is regenerated."""
    from modeltrace.modular.fixes import ModularFixError, generated_problem, modular_fixes
    from modeltrace.modular.twins import regenerate_command
    from modeltrace.recorders.fixes import write_atomically

    wanted = [problem for problem in analysis.problems if generated_problem(problem) is not None]
    try:
        fixed, applied = modular_fixes(source, file, wanted)
    except ModularFixError as error:
        raise ModelTraceError(f"{arguments.file}: --fix: {error}") from error
    if applied and fixed != source:
        write_atomically(file, fixed)
    left = [problem for problem in analysis.problems if problem not in applied]
    notes = (
        [
            f"the fixes are in the modular file; regenerate the generated file from a transformers checkout: "
            f"`{regenerate_command(file.resolve())}`"
        ]
        if applied
        else []
    )
    if arguments.format == "json":
        document = {
            "problems": [p.to_json() for p in left],
            "fixed": [p.to_json() for p in applied],
            "notes": [*analysis.notes, *notes],
        }
        json.dump(document, sys.stdout)
        sys.stdout.write("\n")
        return 1 if any(problem.severity != "hint" for problem in left) else 0
    for problem in applied:
        print(f"{arguments.file}:{problem.line}: fixed {problem.code}: {problem.message}")
    for problem in left:
        print(f"{arguments.file}:{problem.line}: {problem.code}: {problem.message}")
    for note in notes:
        print(f"{arguments.file}: note: {note}")
    return 1 if any(problem.severity != "hint" for problem in left) else 0


def _run_evidence(file: Path, model: str | None, timeout: float, modular: bool = False) -> list[dict]:
    """Problems only a run shows, from `modeltrace.worker.recorders_run` in a subprocess (it imports torch). A
    modular file runs as its generated twin; its problems name the generated lines."""
    import subprocess

    if modular:
        file = resolve_generated(file)

    command = [sys.executable, "-m", "modeltrace.worker.recorders_run", str(file.resolve())]
    if model:
        command += ["--model", model]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=file.resolve().parent)
    except subprocess.TimeoutExpired as error:
        raise ModelTraceError(f"{file}: the recorder run took longer than {timeout:g} s") from error
    try:
        result = json.loads(completed.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as error:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelTraceError(f"{file}: the recorder run failed: {tail}") from error
    if "error" in result:
        raise ModelTraceError(f"{file}: the recorder run failed: {result['error']}")
    return result["problems"]


def _detail(arguments: argparse.Namespace) -> HintDetail:
    return HintDetail.STATS if arguments.stats else HintDetail.DTYPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modeltrace",
        description="Run a PyTorch / transformers model once under capture hooks and map what it saw onto source lines.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trace = commands.add_parser("trace", help="trace a modeling file and print it annotated")
    trace.add_argument(
        "file",
        help="the modeling file (modeling_*.py) to trace and annotate; a modular file (modular_*.py) runs as its "
        "generated modeling file and is annotated from it",
    )
    trace.add_argument(
        "--regenerate",
        action="store_true",
        help="for a modular file whose generated file is out of date: regenerate it into a temporary folder with "
        "the converter of the transformers checkout above it, and trace that (the generated file is not touched)",
    )
    trace.add_argument("--model", metavar="CLASS", help="the class to build (default: the file's base model)")
    trace.add_argument("--recipe", metavar="PY", help="a file defining build_model() and build_inputs(model)")
    trace.add_argument("--config", metavar="PATH", help="a config.json (or folder) to use as it is, unshrunk")
    trace.add_argument(
        "--project",
        metavar="TOML",
        help="the project file to read (default: the nearest modeltrace.toml, or pyproject.toml with "
        "[tool.modeltrace], above FILE); its recipe, config and tolerances apply where no option gives one",
    )
    trace.add_argument(
        "--shape-only",
        action="store_true",
        help="shapes and dtypes only, on the meta device (full size: no shrinking, no weights)",
    )
    trace.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a local folder saved with save_pretrained to load the model from (never downloads)",
    )
    trace.add_argument(
        "--device-map",
        metavar="auto|JSON",
        help="with --checkpoint: spread the model over the devices present with accelerate (auto, "
        "or a JSON object / file from module names to cpu, disk, 0, cuda:1...)",
    )
    trace.add_argument(
        "--nproc",
        type=_count("processes"),
        metavar="N",
        help="with --checkpoint: run the model on N ranks with transformers' tensor parallelism "
        "(tp_plan=auto; gloo on CPU, NCCL on CUDA) and write one trace of them all",
    )
    trace.add_argument("--lines", action="store_true", help="also capture tensor variables line by line")
    trace.add_argument(
        "--follow",
        action="append",
        default=[],
        metavar="PY",
        help="with --lines: also capture the lines of this file (a helper module the model calls into; repeatable)",
    )
    trace.add_argument(
        "--attention",
        choices=ATTENTION_IMPLEMENTATIONS,
        default=DEFAULT_ATTENTION,
        help="the attention implementation the model is built with (attn_implementation; default: "
        f"{DEFAULT_ATTENTION}, the readable reference code that returns attention weights)",
    )
    trace.add_argument("--full-tensors", action="store_true", help="also store every captured tensor")
    trace.add_argument(
        "--max-tensor-mb",
        type=_megabytes,
        default=DEFAULT_MAX_TENSOR_MB,
        metavar="MB",
        help=f"with --full-tensors: larger tensors keep statistics only (default: {DEFAULT_MAX_TENSOR_MB:g})",
    )
    trace.add_argument(
        "--max-trace-mb",
        type=_megabytes,
        default=DEFAULT_MAX_TRACE_MB,
        metavar="MB",
        help="with --full-tensors: store no more than this in all; later tensors keep statistics "
        f"only (default: {DEFAULT_MAX_TRACE_MB:g})",
    )
    trace.add_argument(
        "--tensor-memory-mb",
        type=_megabytes,
        default=DEFAULT_TENSOR_MEMORY_MB,
        metavar="MB",
        help="with --full-tensors: tensors are written to disk during the forward, at most this "
        "many MB of them waiting in memory; past it the forward waits for the disk "
        f"(default: {DEFAULT_TENSOR_MEMORY_MB:g})",
    )
    trace.add_argument(
        "--no-parameters",
        action="store_true",
        help="with --full-tensors: store the activations only, not the model's parameters (by default they go "
        "to the shared parameter store, $MODELTRACE_PARAMETER_STORE or ~/.cache/modeltrace/parameters, once "
        "per content)",
    )
    trace.add_argument("--device", default="cpu", help="torch device to run on (default: cpu)")
    trace.add_argument("--dtype", default=DEFAULT_DTYPE, help=", ".join(DTYPE_NAMES[:-1]) + f" or {DTYPE_NAMES[-1]}")
    trace.add_argument("--seed", type=int, default=0, help="seed for weights and inputs (default: 0)")
    trace.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="stop the trace after this",
    )
    trace.add_argument("--out", metavar="DIR", help="where to write the trace (default: ./FILE_STEM.mtrace)")
    trace.add_argument("--format", choices=("text", "json"), default="text")
    trace.add_argument("--stats", action="store_true", help="add mean and std to each annotation")
    trace.add_argument(
        "--against",
        metavar="REFERENCE",
        help="then diff the trace against this reference (implies --full-tensors) and print the "
        "diff instead, replaying suspects on the model just traced; exit codes of `diff`",
    )
    trace.add_argument(
        "--generate",
        type=_count("decode steps"),
        default=0,
        metavar="N",
        help="trace greedy generation: the prefill and N decode steps with the model's own cache "
        "(default class: the file's …ForCausalLM; a recipe may define generate(model, inputs, "
        "steps))",
    )
    trace.add_argument(
        "--backward",
        action="store_true",
        help="also run a loss and its backward pass: gradients of every module call and parameter "
        "(the model's own loss with synthesised labels, a recipe's build_loss(outputs), or "
        "0.5 * mean(output ** 2))",
    )
    trace.set_defaults(handler=_trace_command)

    show = commands.add_parser("show", help="print a trace as an annotated listing or as JSON")
    show.add_argument("trace", help="a NAME.mtrace folder")
    show.add_argument("--file", help="the source file to annotate (default: the traced modeling file)")
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.add_argument("--stats", action="store_true", help="add mean and std to each annotation")
    show.set_defaults(handler=_show_command)

    diff = commands.add_parser("diff", help="compare a candidate trace with a reference, find the first divergence")
    diff.add_argument("reference", help="a trace folder or a transformers debugger output (folder or JSON)")
    diff.add_argument("candidate", help="a trace folder or a transformers debugger output (folder or JSON)")
    diff.add_argument("--atol", type=_tolerance, default=None, help="absolute tolerance (default: 1e-3)")
    diff.add_argument(
        "--rtol",
        type=_tolerance,
        default=None,
        help="relative tolerance (default: 0; 1e-3 for float16, 1.6e-2 for bfloat16)",
    )
    diff.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="'REGEX=>REPL'",
        help="rename module paths to align them (repeatable)",
    )
    diff.add_argument(
        "--mapping",
        metavar="FILE",
        help="a module mapping file (written by `modeltrace align`, edited or not) to align by",
    )
    diff.add_argument("--no-auto-align", action="store_true", help="align by paths and --map only, never by evidence")
    diff.add_argument(
        "--project",
        metavar="TOML",
        help="the project file whose maps, mapping and tolerances apply where no option gives them (default: the "
        "nearest modeltrace.toml, or pyproject.toml with [tool.modeltrace], above the current folder)",
    )
    diff.add_argument(
        "--rel-tol",
        type=_tolerance,
        default=None,
        dest="rel_tol",
        help="relative error ‖a-b‖/‖ref‖ allowed (default: float32 1e-4, float16 2e-3, bfloat16 2e-2)",
    )
    diff.add_argument(
        "--replay",
        action="store_true",
        help="re-run the first modules whose outputs differ on the reference's inputs (needs a "
        "reference with full tensors; runs the candidate's code in a worker)",
    )
    diff.add_argument("--format", choices=("text", "json"), default="text")
    diff.set_defaults(handler=_diff_command)

    align = commands.add_parser("align", help="align two implementations' modules without names; write the mapping")
    align.add_argument("reference", help="a trace folder or a transformers debugger output (folder or JSON)")
    align.add_argument("candidate", help="a trace folder or a transformers debugger output (folder or JSON)")
    align.add_argument("--out", metavar="FILE", help="write the mapping here (default: standard output)")
    align.add_argument(
        "--threshold",
        type=_fraction,
        default=0.5,
        help="pairs below this confidence are left unaligned (default: 0.5)",
    )
    align.add_argument("--format", choices=("text", "json"), default="text")
    align.set_defaults(handler=_align_command)

    export = commands.add_parser("export", help="write a trace in another format")
    export.add_argument("trace", help="a NAME.mtrace folder")
    export.add_argument(
        "--hf-debugger",
        required=True,
        metavar="DIR",
        help="write transformers' model_addition_debugger_context files into DIR",
    )
    export.add_argument(
        "--safetensors",
        action="store_true",
        help="full tensors as one .safetensors file each (use_repr=False) instead of printed values",
    )
    export.set_defaults(handler=_export_command)

    check = commands.add_parser("check", help="check the _can_record_outputs of a modeling file (static)")
    check.add_argument("file", help="the modeling file (modeling_*.py) to check")
    check.add_argument(
        "--fix",
        action="store_true",
        help="write the fixes into the file (a modular file's into the modular file; then regenerate)",
    )
    check.add_argument(
        "--run",
        action="store_true",
        help="also build and run the model (output_hidden_states/attentions) for problems only a run shows",
    )
    check.add_argument("--model", metavar="CLASS", help="with --run: the class to build")
    check.add_argument(
        "--timeout", type=_seconds, default=300.0, metavar="SECONDS", help="with --run: stop after this"
    )
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.set_defaults(handler=_check_command)

    serve = commands.add_parser("serve", help="run the language server (LSP over stdio)")
    serve.set_defaults(handler=_serve_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        return arguments.handler(arguments)
    except TraceFailed as failure:
        if os.environ.get("MODELTRACE_DEBUG") and failure.error.traceback:
            print(failure.error.traceback, file=sys.stderr)
        print(f"modeltrace: {failure}", file=sys.stderr)
        return 2
    except ModelTraceError as error:
        print(f"modeltrace: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        # NOTE: the file system refused a path (a name over 255 characters, a permission): a message, not a bug
        reason = (error.strerror or str(error)).lower()
        print(f"modeltrace: {error.filename or 'a file'}: {reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("modeltrace: interrupted", file=sys.stderr)
        return 2
