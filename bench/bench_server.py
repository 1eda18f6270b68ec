"""Benchmark of the language server: inlay-hint latency, memory with a large trace, warm re-trace time.

Not a test: run `python bench/bench_server.py` and paste the markdown table it prints. It starts the real
server over stdio (`python -m modeltrace serve`) and drives it with a bare JSON-RPC client (so that the
timings are the server's, not a client library's):

- a synthetic 3,000-line file with 50,000 traced module calls, shown with `modelTrace.loadTrace`, then
  200 `textDocument/inlayHint` requests over random 60-line ranges and 200 over the whole file;
- the server's resident memory (RSS) with that trace loaded;
- the example model re-traced on save (`traceOnSave`): the time from `didSave` to the server's
  `workspace/inlayHint/refresh` (new hints ready), median of 5;
- the first trace of the example in a fresh server, from the command to its answer, three ways, each in a server
  of its own, alternated `--first-traces` times: asked once the worker that opening the file started is ready (a
  user who reads the file first), asked the moment the file opens (the worker still importing torch), and with
  `startWorkerOnOpen` off (the worker started by the trace, as before that setting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import write_trace


REPOSITORY = Path(__file__).resolve().parents[1]
EXAMPLE_PACKAGE = REPOSITORY / "examples" / "tiny_llama"
FILE_LINES = 3_000
CALLS = 50_000
REQUESTS = 200
VISIBLE_LINES = 60
RETRACES = 5


def synthetic_source(lines: int) -> str:
    """A plausible modeling file: one long forward with a module call on every other line."""
    body = ["import torch", "from torch import nn", "", "", "class BigModel(nn.Module):", "    def forward(self, x):"]
    while len(body) < lines - 1:
        number = len(body)
        body.append(f"        x = self.block_{number}(x)  # a call of block {number}")
        body.append("        x = x * 0.5")
    body.append("        return x")
    return "\n".join(body[:lines]) + "\n"


def synthetic_trace(file: str, lines: int, calls: int, seed: int = 0) -> Trace:
    """`calls` module calls spread over the file's lines (many calls per line, as in a deep model's loop)."""
    generator = random.Random(seed)
    modules = []
    for index in range(calls):
        line = 7 + (index * 2) % (lines - 8)
        summary = TensorSummary(
            key="",
            shape=[1, 7, 64],
            dtype="float32",
            mean=generator.gauss(0, 0.1),
            std=abs(generator.gauss(1, 0.1)),
            min=-3.0,
            max=3.0,
            abs_max=3.0,
            positive_fraction=0.5,
        )
        modules.append(
            ModuleCall(
                index=index,
                path=f"blocks.{index % 500}.layer_{line}",
                class_name="BigBlock",
                defined_at=SourceLocation(file=file, line=5),
                called_at=SourceLocation(file=file, line=line, column=12),
                call_index=index // 500,
                parent=-1,
                finish_order=index,
                call_site=24,
                inputs=[TensorSummary(**{**summary.to_json(), "key": "x"})],
                outputs=[summary],
            )
        )
    return Trace(model={"class": "BigModel", "file": file}, modules=modules)


class Connection:
    """A minimal JSON-RPC client over the server's stdio: timings include no client-side object building.

    It answers the server's requests with `null` and sets `refreshed` when the server asks the client to
    redraw inlay hints (which it does once new hints are ready).
    """

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.refreshed = asyncio.Event()
        self.worker_ready = asyncio.Event()
        self.reader = asyncio.get_running_loop().create_task(self._read_forever())

    @classmethod
    async def start(cls, *command: str) -> Connection:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        return cls(process)

    def _write(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def _read_forever(self) -> None:
        assert self.process.stdout is not None
        while True:
            length = 0
            while (header := await self.process.stdout.readline()) not in (b"\r\n", b""):
                if header.lower().startswith(b"content-length:"):
                    length = int(header.split(b":")[1])
            if not header:
                return
            message = json.loads(await self.process.stdout.readexactly(length))
            if "method" not in message:
                future = self.pending.pop(message["id"])
                if "error" in message:
                    future.set_exception(RuntimeError(message["error"]))
                else:
                    future.set_result(message.get("result"))
            elif "id" in message:
                if message["method"] == "workspace/inlayHint/refresh":
                    self.refreshed.set()
                self._write({"id": message["id"], "result": None})
            elif message["method"] == "window/logMessage" and "trace worker ready" in message["params"]["message"]:
                self.worker_ready.set()
            elif message["method"] == "window/showMessage":
                print("server:", message["params"]["message"], file=sys.stderr)

    async def request(self, method: str, params: Any) -> Any:
        self.next_id += 1
        future = self.pending[self.next_id] = asyncio.get_running_loop().create_future()
        self._write({"id": self.next_id, "method": method, "params": params})
        return await future

    def notify(self, method: str, params: Any) -> None:
        self._write({"method": method, "params": params})

    async def close(self) -> None:
        await self.request("shutdown", None)
        self.notify("exit", None)
        await self.process.wait()
        self.reader.cancel()


async def start_server(trace_directory: Path, start_worker_on_open: bool = True) -> Connection:
    connection = await Connection.start(sys.executable, "-m", "modeltrace", "serve")
    await connection.request(
        "initialize",
        {
            "processId": os.getpid(),
            "rootUri": None,
            "capabilities": {
                "window": {"workDoneProgress": True},
                "workspace": {"inlayHint": {"refreshSupport": True}, "codeLens": {"refreshSupport": True}},
            },
            "initializationOptions": {
                "settings": {"traceOnSave": True, "startWorkerOnOpen": start_worker_on_open},
                "workspaceTrusted": True,
                "traceDirectory": str(trace_directory),
            },
        },
    )
    connection.notify("initialized", {})
    return connection


def open_document(connection: Connection, path: Path) -> str:
    uri = path.resolve().as_uri()
    connection.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": path.read_text()}},
    )
    return uri


async def execute(connection: Connection, command: str, *arguments: Any) -> Any:
    return await connection.request("workspace/executeCommand", {"command": command, "arguments": list(arguments)})


async def time_hints(
    connection: Connection, uri: str, ranges: list[tuple[int, int]]
) -> tuple[list[float], float, int]:
    """Milliseconds per request, the server's mean CPU milliseconds per request, hints in the last answer.

    NOTE: on a busy machine wall-clock latency mostly measures the scheduler; the server's CPU time does not.
    """
    server = psutil.Process(connection.process.pid)
    cpu_before = sum(server.cpu_times()[:2])
    timings = []
    count = 0
    for first, last in ranges:
        started = time.perf_counter()
        hints = await connection.request(
            "textDocument/inlayHint",
            {
                "textDocument": {"uri": uri},
                "range": {"start": {"line": first, "character": 0}, "end": {"line": last, "character": 0}},
            },
        )
        timings.append((time.perf_counter() - started) * 1000)
        count = len(hints or [])
    cpu_ms = (sum(server.cpu_times()[:2]) - cpu_before) * 1000 / len(ranges)
    return timings, cpu_ms, count


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def measure_trace_file(connection: Connection, folder: Path, rows: list[tuple[str, str, str]]) -> None:
    source_file = (folder / "big_model.py").resolve()
    source_file.write_text(synthetic_source(FILE_LINES))
    trace_folder = folder / "big_model.mtrace"
    started = time.perf_counter()
    write_trace(synthetic_trace(str(source_file), FILE_LINES, CALLS), trace_folder)
    print(f"# wrote the synthetic trace in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    process = psutil.Process(connection.process.pid)
    rss_before = process.memory_info().rss
    uri = open_document(connection, source_file)
    started = time.perf_counter()
    loaded = await execute(connection, "modelTrace.loadTrace", uri, str(trace_folder))
    load_seconds = time.perf_counter() - started
    assert loaded["ok"], loaded

    generator = random.Random(1)
    visible = [
        (first, first + VISIBLE_LINES)
        for first in (generator.randrange(0, FILE_LINES - VISIBLE_LINES) for _ in range(REQUESTS))
    ]
    await time_hints(connection, uri, visible[:20])  # warm-up: label caches, first serialisations
    visible_ms, visible_cpu, visible_count = await time_hints(connection, uri, visible)
    whole_ms, whole_cpu, whole_count = await time_hints(connection, uri, [(0, FILE_LINES)] * REQUESTS)
    rss_after = process.memory_info().rss

    rows.append(("trace loaded (`modelTrace.loadTrace`, 50,000 calls)", f"{load_seconds * 1000:.0f} ms", "–"))
    rows.append(
        (
            f"inlayHint, random {VISIBLE_LINES}-line ranges (~{visible_count} hints) p50 / p95 (server CPU/request)",
            f"{percentile(visible_ms, 0.5):.2f} / {percentile(visible_ms, 0.95):.2f} ms ({visible_cpu:.2f} ms)",
            "p95 ≤ 10 ms",
        )
    )
    rows.append(
        (
            f"inlayHint, whole {FILE_LINES:,}-line file ({whole_count:,} hints) p50 / p95 (server CPU/request)",
            f"{percentile(whole_ms, 0.5):.2f} / {percentile(whole_ms, 0.95):.2f} ms ({whole_cpu:.2f} ms)",
            "p95 ≤ 10 ms",
        )
    )
    rows.append(
        (
            "server RSS with the trace loaded (before loading)",
            f"{rss_after / 2**20:.0f} MB ({rss_before / 2**20:.0f} MB)",
            "≤ 100 MB",
        )
    )


def copy_example(folder: Path) -> Path:
    package = folder / "tiny_llama"
    if not package.exists():
        shutil.copytree(EXAMPLE_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    return package / "modeling_tiny_llama.py"


async def measure_retrace(connection: Connection, folder: Path, rows: list[tuple[str, str, str]]) -> None:
    uri = open_document(connection, copy_example(folder))
    result = await execute(connection, "modelTrace.trace", uri)
    assert result["ok"], result

    warm = []
    for _ in range(RETRACES):
        connection.refreshed.clear()
        started = time.perf_counter()
        connection.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
        await asyncio.wait_for(connection.refreshed.wait(), 120)
        warm.append(time.perf_counter() - started)
    rows.append(
        (
            f"re-trace on save until new hints (median of {RETRACES}; min–max)",
            f"{statistics.median(warm):.2f} s ({min(warm):.2f}–{max(warm):.2f})",
            "≤ 1.5 s",
        )
    )


# how the first trace of a fresh server is asked for: (row label, startWorkerOnOpen, wait for the worker first)
FIRST_TRACES = (
    ("first trace, asked once the worker that opening the file started is ready", True, True),
    ("first trace, asked the moment the file opens", True, False),
    ("first trace, `startWorkerOnOpen` off (the trace starts the worker)", False, False),
)


async def first_trace(folder: Path, start_worker_on_open: bool, wait_for_worker: bool) -> float:
    """Seconds from the trace command to its answer, in a fresh server that has just opened the example."""
    connection = await start_server(folder / "traces", start_worker_on_open)
    try:
        uri = open_document(connection, copy_example(folder))
        if wait_for_worker:
            await asyncio.wait_for(connection.worker_ready.wait(), 300)
        started = time.perf_counter()
        result = await execute(connection, "modelTrace.trace", uri)
        elapsed = time.perf_counter() - started
        assert result["ok"], result
        return elapsed
    finally:
        await connection.close()


async def measure_first_traces(folder: Path, rounds: int, rows: list[tuple[str, str, str]]) -> None:
    times: dict[str, list[float]] = {label: [] for label, _, _ in FIRST_TRACES}
    for _ in range(rounds):
        for label, start_worker_on_open, wait_for_worker in FIRST_TRACES:  # NOTE: alternated, so load hits all alike
            times[label].append(await first_trace(folder, start_worker_on_open, wait_for_worker))
    for label, values in times.items():
        rows.append(
            (
                f"{label} (median of {rounds}; min–max)",
                f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})",
                "–",
            )
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-traces", type=int, default=3, help="rounds of the first-trace measurement")
    arguments = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="modeltrace-bench-") as temporary:
        folder = Path(temporary)
        # NOTE: the worker started by the trace, not on open: its imports would run beside the hint timings
        connection = await start_server(folder / "traces", start_worker_on_open=False)
        try:
            await measure_trace_file(connection, folder, rows)
            await measure_retrace(connection, folder, rows)
        finally:
            await connection.close()
        await measure_first_traces(folder, arguments.first_traces, rows)
    load = os.getloadavg()[0]
    machine = f"{psutil.cpu_count()} CPUs, load average {load:.1f}, Python {sys.version.split()[0]}"
    print(f"| measure ({machine}) | result | target |")
    print("|:--|--:|:--|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")


if __name__ == "__main__":
    asyncio.run(main())
