"""The `modeltrace` command line: trace a modeling file, show a trace, serve the editor.

Exit codes follow DESIGN.md: 0 success; 2 bad input or failure, with one line on stderr naming the file, the
class and the cause (never a bare traceback; `MODELTRACE_DEBUG=1` adds the worker's traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from modeltrace.errors import ModelTraceError, TraceFailed
from modeltrace.trace.lines import HintDetail
from modeltrace.trace.listing import render_listing
from modeltrace.trace.storage import TRACE_SUFFIX, read_trace


def _trace_command(arguments: argparse.Namespace) -> int:
    from modeltrace.worker.client import WorkerClient

    file = Path(arguments.file).resolve()
    if not file.is_file():
        raise ModelTraceError(f"{arguments.file}: no such file")
    if arguments.shape_only:
        raise ModelTraceError("--shape-only: shape-only tracing (meta device) is not available in this version")
    out = Path(arguments.out).resolve() if arguments.out else Path.cwd() / f"{file.stem}{TRACE_SUFFIX}"
    request = {
        "file": str(file),
        "model": arguments.model,
        "recipe": str(Path(arguments.recipe).resolve()) if arguments.recipe else None,
        "config": str(Path(arguments.config).resolve()) if arguments.config else None,
        "full_tensors": arguments.full_tensors,
        "lines": arguments.lines,
        "device": arguments.device,
        "dtype": arguments.dtype,
        "seed": arguments.seed,
        "timeout": arguments.timeout,
        "out": str(out),
    }
    with WorkerClient() as worker:
        result = worker.trace(request)
    trace = read_trace(result["trace"])
    if arguments.format == "json":
        json.dump(trace.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_listing(trace, None, _detail(arguments)))
        print(f"# trace written to {result['trace']} ({result['seconds']:.2f} s)", file=sys.stderr)
    return 0


def _show_command(arguments: argparse.Namespace) -> int:
    trace = read_trace(arguments.trace)
    if arguments.format == "json":
        json.dump(trace.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_listing(trace, arguments.file, _detail(arguments)))
    return 0


def _serve_command(arguments: argparse.Namespace) -> int:
    from modeltrace.lsp.server import serve

    serve()
    return 0


def _detail(arguments: argparse.Namespace) -> HintDetail:
    return HintDetail.STATS if arguments.stats else HintDetail.DTYPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modeltrace",
        description="Run a PyTorch / transformers model once under capture hooks and map what it saw onto source lines.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trace = commands.add_parser("trace", help="trace a modeling file and print it annotated")
    trace.add_argument("file", help="the modeling file (modeling_*.py) to trace and annotate")
    trace.add_argument("--model", metavar="CLASS", help="the class to build (default: the file's base model)")
    trace.add_argument("--recipe", metavar="PY", help="a file defining build_model() and build_inputs(model)")
    trace.add_argument("--config", metavar="PATH", help="a config.json (or folder) to use as it is, unshrunk")
    trace.add_argument("--shape-only", action="store_true", help="shapes and dtypes only, on the meta device")
    trace.add_argument("--lines", action="store_true", help="also capture tensor variables line by line")
    trace.add_argument("--full-tensors", action="store_true", help="also store every captured tensor")
    trace.add_argument("--device", default="cpu", help="torch device to run on (default: cpu)")
    trace.add_argument("--dtype", default="float32", help="float32, float16, bfloat16 or float64")
    trace.add_argument("--seed", type=int, default=0, help="seed for weights and inputs (default: 0)")
    trace.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="stop the trace after this")
    trace.add_argument("--out", metavar="DIR", help="where to write the trace (default: ./FILE_STEM.mtrace)")
    trace.add_argument("--format", choices=("text", "json"), default="text")
    trace.add_argument("--stats", action="store_true", help="add mean and std to each annotation")
    trace.set_defaults(handler=_trace_command)

    show = commands.add_parser("show", help="print a trace as an annotated listing or as JSON")
    show.add_argument("trace", help="a NAME.mtrace folder")
    show.add_argument("--file", help="the source file to annotate (default: the traced modeling file)")
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.add_argument("--stats", action="store_true", help="add mean and std to each annotation")
    show.set_defaults(handler=_show_command)

    serve = commands.add_parser("serve", help="run the language server (LSP over stdio)")
    serve.set_defaults(handler=_serve_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        return arguments.handler(arguments)
    except TraceFailed as failure:
        if os.environ.get("MODELTRACE_DEBUG") and failure.error.get("traceback"):
            print(failure.error["traceback"], file=sys.stderr)
        print(f"modeltrace: {failure}", file=sys.stderr)
        return 2
    except ModelTraceError as error:
        print(f"modeltrace: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("modeltrace: interrupted", file=sys.stderr)
        return 2
