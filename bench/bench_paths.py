"""What a capture costs on each path that takes one, side by side with the engine alone and a plain forward.

    .venv/bin/python bench/bench_paths.py                       # tiny and medium, a markdown table
    .venv/bin/python bench/bench_paths.py --sizes tiny medium large
    .venv/bin/python bench/bench_paths.py --quick --json bench/results/paths.json
    .venv/bin/python bench/bench_paths.py --first-trace 5 --sizes tiny medium

Model: `LlamaForCausalLM` from a `LlamaConfig` (random weights, seed 0, eager attention, `use_cache=False`,
float32, batch 1, vocabulary 1024), run under `torch.no_grad()` on the CPU with one torch thread (the sizes of
the peers benchmark, `bench/bench_peers.py`):

- tiny: hidden 64, intermediate 128, 2 layers, 4 heads (2 KV), sequence 7
- medium: hidden 512, intermediate 1536, 8 layers, 8 heads (4 KV), sequence 128
- large: hidden 1024, intermediate 3072, 12 layers, 16 heads (8 KV), sequence 256

Variants, each timed from before it starts to after its trace is in place (files written and renamed: what the
caller waits for), interleaved in an order shuffled anew each round (`rounds.py`) for N rounds after a warm-up
round, each in a fresh folder deleted outside the timing:

- `plain`: `model(input_ids)`.
- `engine stats` / `engine full`: the engine alone, as the README's capture figures measure it: `ModuleCapture`
  around the forward (full: its `TensorStream` writing the tensors during the forward), then a `Trace` of the
  records with a small header written by `write_captured` (no construction records, no parameters, no hashes).
- `capture() stats` / `capture() full`: `modeltrace.capture(model, path)` around the forward, as a script or
  notebook calls it, with everything it writes (construction records, source hashes, config, the parameters'
  reference in the shared store: written there by the warm-up round, once per content).
- `worker stats` / `worker full`: the worker's own job code (`worker/job.py` `_run_built`: the path of the CLI's
  `trace` and of the editor) in this process, from the built model to the trace in place: a fresh worker process
  has no digest of the weights and no source hashes yet, so both are dropped before each of its rounds; with full
  tensors it has the build key a rebuild of the same model gives (nothing it reads changed), so the store's
  entry for that build is found after the warm-up round (`worker/build_identity.py`). Left out: building the
  model, the process hop, and the flush to disk after the worker answered.

`--first-trace N`: the worker's trace as the CLI and the editor really take it, in a child forked from the warm
zygote, which has cached nothing about the model's classes: N fresh processes per size, each importing what the
zygote preloads, building the model and running it plain three times, then timing the worker's statistics job in
a forked child (the first trace: a cold child), reading that trace's source files ahead as the zygote does after
each trace (`Zygote._warm`), timing the job in a second forked child (every later trace), and a plain forward;
the table gives the medians over the processes and of each trace / plain ratio.

Each ratio is the median over rounds of (variant / plain) timed in the same round (paired), which a noisy,
shared machine disturbs less than a ratio of medians. The load average is printed with the table: on a shared
2-core machine only runs at a low load mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import modeltrace
from modeltrace.trace.records import Trace
from modeltrace.worker import assemble
from modeltrace.worker.assemble import discarded_on_error, start_stream, write_captured
from modeltrace.worker.building.built import BuiltModel
from modeltrace.worker.builds import ConstructionRecorder
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.job import _run_built
from modeltrace.worker.messages import TraceRequest
from modeltrace.worker.protocol import DEFAULT_TENSOR_MEMORY_MB
from rounds import round_order


try:
    from modeltrace.worker import parameter_store
except ImportError:  # a ModelTrace from before the parameter store (a before/after run)
    parameter_store = None


SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads, sequence, rounds)
    "tiny": (64, 128, 2, 4, 2, 7, 41),
    "medium": (512, 1536, 8, 8, 4, 128, 15),
    "large": (1024, 3072, 12, 16, 8, 256, 7),
}
VOCAB = 1024
SEED = 0


def build(size: str) -> tuple[LlamaForCausalLM, torch.Tensor]:
    hidden, intermediate, layers, heads, kv_heads, sequence, _ = SIZES[size]
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        attn_implementation="eager",
        use_cache=False,
    )
    model = LlamaForCausalLM(config).eval().to(torch.float32)
    input_ids = torch.randint(0, VOCAB, (1, sequence), generator=torch.Generator().manual_seed(SEED))
    return model, input_ids


def _plain(model: torch.nn.Module, input_ids: torch.Tensor, folder: Path) -> None:
    with torch.no_grad():
        model(input_ids)


def _engine(full: bool) -> Callable[[torch.nn.Module, torch.Tensor, Path], None]:
    def run(model: torch.nn.Module, input_ids: torch.Tensor, folder: Path) -> None:
        out = folder / "engine.mtrace"
        stream = start_stream(out, int(DEFAULT_TENSOR_MEMORY_MB * 2**20)) if full else None
        with (
            discarded_on_error(stream),
            torch.no_grad(),
            ModuleCapture(model, full_tensors=full, stream=stream) as capture,
        ):
            model(input_ids)
        trace = Trace(
            model={"class": type(model).__name__, "options": {"full_tensors": full}}, modules=capture.records
        )
        write_captured(trace, capture, out, durable=False)

    return run


def _library(full: bool) -> Callable[[torch.nn.Module, torch.Tensor, Path], None]:
    def run(model: torch.nn.Module, input_ids: torch.Tensor, folder: Path) -> None:
        with torch.no_grad(), modeltrace.capture(model, folder / "library.mtrace", full_tensors=full):
            model(input_ids)

    return run


def _worker(full: bool) -> Callable[[torch.nn.Module, torch.Tensor, Path], None]:
    modeling_file = sys.modules[LlamaForCausalLM.__module__].__file__

    def run(model: torch.nn.Module, input_ids: torch.Tensor, folder: Path) -> None:
        request = TraceRequest(file=modeling_file, out=str(folder / "worker.mtrace"), full_tensors=full)
        built = BuiltModel(model=model, args=(input_ids,), model_class=type(model).__name__)
        # NOTE: the key only where this checkout's job takes one (an older one, timed for a before/after, does not)
        build_key = _build_key(request) if full else None
        keyed = () if build_key is None else (None, build_key)
        _run_built(request, lambda text: None, built, ConstructionRecorder(), time.perf_counter(), *keyed)

    return run


@functools.cache
def _build_key_of(file: str, full_tensors: bool) -> str | None:
    """The build key a rebuild of the bench's model gives every round (the same model, nothing it reads
    changed), as the job computes it after a build (`build_identity.BuildInputs`); None before the build keys."""
    try:
        from modeltrace.worker.build_identity import BuildInputs
    except ImportError:
        return None
    with BuildInputs() as inputs:
        pass
    return inputs.key(TraceRequest(file=file, full_tensors=full_tensors))


def _build_key(request: TraceRequest) -> str | None:
    return _build_key_of(request.file, request.full_tensors)


def _fresh_worker(model: torch.nn.Module) -> None:
    """What a fresh worker process does not have: the weights' digest, the source files' hashes. (Absent from
    ModelTraces before the parameter store: this bench also measures those, for a before/after.)"""
    if parameter_store is not None:
        parameter_store._DIGESTS.pop(model, None)
    getattr(assemble, "_HASHES", {}).clear()


VARIANTS: dict[str, Callable[[torch.nn.Module, torch.Tensor, Path], None]] = {
    "plain": _plain,
    "engine stats": _engine(False),
    "capture() stats": _library(False),
    "worker stats": _worker(False),
    "engine full": _engine(True),
    "capture() full": _library(True),
    "worker full": _worker(True),
}


def _timed(variant: str, model: torch.nn.Module, input_ids: torch.Tensor) -> float:
    folder = Path(tempfile.mkdtemp(prefix="modeltrace-bench-paths-"))
    try:
        hashes = dict(getattr(assemble, "_HASHES", {}))
        if variant.startswith("worker"):
            _fresh_worker(model)
        started = time.perf_counter()
        VARIANTS[variant](model, input_ids, folder)
        return time.perf_counter() - started
    finally:
        # NOTE: this process's source hashes back as they were: a worker round leaves the library's alone
        getattr(assemble, "_HASHES", {}).update(hashes)
        shutil.rmtree(folder, ignore_errors=True)


def _bytes_written(variant: str, model: torch.nn.Module, input_ids: torch.Tensor) -> int:
    folder = Path(tempfile.mkdtemp(prefix="modeltrace-bench-paths-"))
    try:
        VARIANTS[variant](model, input_ids, folder)
        return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(size: str, rounds: int) -> dict:
    model, input_ids = build(size)
    # NOTE: the worker's rounds run a copy (the same weights): dropping its digest, as a fresh worker process
    # has none, leaves the library's digest of `model` alone
    worker_model = copy.deepcopy(model)
    models = {name: worker_model if name.startswith("worker") else model for name in VARIANTS}
    names = list(VARIANTS)
    for name in names:  # warm-up: imports, kernels, and the parameter store's file of these weights
        _timed(name, models[name], input_ids)
    times: dict[str, list[float]] = {name: [] for name in names}
    for order in round_order(names, rounds):
        for name in order:
            times[name].append(_timed(name, models[name], input_ids))
    plain = times["plain"]
    rows = {}
    for name in names:
        paired = [value / base for value, base in zip(times[name], plain)]
        rows[name] = {
            "median_ms": statistics.median(times[name]) * 1e3,
            "paired_ratio": statistics.median(paired),
            "bytes_written": _bytes_written(name, models[name], input_ids) if name != "plain" else 0,
        }
    store = Path(os.environ["MODELTRACE_PARAMETER_STORE"])
    store_bytes = sum(path.stat().st_size for path in store.glob("*.safetensors"))
    return {
        "size": size,
        "rounds": rounds,
        "parameter_store_bytes": store_bytes,
        "config": dict(zip(("hidden", "intermediate", "layers", "heads", "kv_heads", "sequence"), SIZES[size][:6])),
        "variants": rows,
    }


def _forked(function: Callable[[], object]) -> object:
    """`function()` run in a child forked from this process, as the worker's zygote runs each trace; its JSON
    result read back through a pipe."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        try:
            payload = json.dumps(function()).encode()
        except BaseException as error:  # noqa: BLE001 - reported to the parent, which raises it
            payload = json.dumps({"error": repr(error)}).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(write_end, view) :]
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(child, 0)
    result = json.loads(b"".join(chunks))
    if isinstance(result, dict) and "error" in result:
        raise RuntimeError(f"the forked trace failed: {result['error']}")
    return result


def _first_trace_child(size: str) -> int:
    """One process of `--first-trace`: the zygote's imports, the model built and run plain three times; then the
    worker's statistics job in a forked child (a cold child's first trace), the zygote's read-ahead of that
    trace's source files in this process (`Zygote._warm`), the job in a second forked child (the next trace's),
    and a plain forward; printed as JSON (milliseconds)."""
    import importlib

    from modeltrace.worker.zygote import PRELOADED_MODULES, Zygote

    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    os.environ["MODELTRACE_PARAMETER_STORE"] = tempfile.mkdtemp(prefix="modeltrace-bench-store-")
    model, input_ids = build(size)
    for _ in range(3):
        _plain(model, input_ids, Path("."))
    modeling_file = sys.modules[LlamaForCausalLM.__module__].__file__

    def trace() -> tuple[float, list[str]]:
        folder = Path(tempfile.mkdtemp(prefix="modeltrace-bench-paths-"))
        request = TraceRequest(file=modeling_file, out=str(folder / "worker.mtrace"), full_tensors=False)
        built = BuiltModel(model=model, args=(input_ids,), model_class=type(model).__name__)
        started = time.perf_counter()
        result = _run_built(request, lambda text: None, built, ConstructionRecorder(), started)
        elapsed = time.perf_counter() - started
        shutil.rmtree(folder, ignore_errors=True)
        return elapsed, list(getattr(result, "source_files", ()))

    cold, files = _forked(trace)
    requests, client = os.pipe()  # NOTE: no request waiting: the read-ahead reads every file
    try:
        Zygote(requests, client)._warm(files)
    finally:
        os.close(requests)
        os.close(client)
    after_read_ahead, _ = _forked(trace)
    plain = _timed("plain", model, input_ids)
    print(json.dumps({"first": cold * 1e3, "read_ahead": after_read_ahead * 1e3, "plain": plain * 1e3}))
    shutil.rmtree(os.environ["MODELTRACE_PARAMETER_STORE"], ignore_errors=True)
    return 0


def first_trace_table(sizes: list[str], processes: int) -> str:
    import subprocess

    lines = [
        "| size | first trace, cold child, ms | after the zygote's read-ahead, ms | plain ms | cold / plain | "
        "read-ahead / plain | processes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        runs = []
        for _ in range(processes):
            output = subprocess.run(
                [sys.executable, __file__, "--child", size], check=True, capture_output=True, text=True
            ).stdout
            runs.append(json.loads(output.strip().splitlines()[-1]))
        median = {key: statistics.median(run[key] for run in runs) for key in ("first", "read_ahead", "plain")}
        cold = statistics.median(run["first"] / run["plain"] for run in runs)
        warm = statistics.median(run["read_ahead"] / run["plain"] for run in runs)
        lines.append(
            f"| {size} | {median['first']:.1f} | {median['read_ahead']:.1f} | {median['plain']:.1f} | {cold:.2f}× "
            f"| {warm:.2f}× | {processes} |"
        )
    lines.append(f"Load average after: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, one torch thread.")
    return "\n".join(lines)


def render(results: list[dict], load: tuple[float, float, float]) -> str:
    names = [name for name in VARIANTS if name != "plain"]
    lines = [
        "| size | plain forward | " + " | ".join(f"`{name}`" for name in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for result in results:
        rows = result["variants"]
        cells = [f"{rows[name]['paired_ratio']:.2f}×" for name in names]
        lines.append(f"| {result['size']} | {rows['plain']['median_ms']:.1f} ms | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| size | " + " | ".join(f"`{name}` MB written" for name in names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for result in results:
        rows = result["variants"]
        lines.append(
            f"| {result['size']} | " + " | ".join(f"{rows[name]['bytes_written'] / 1e6:.1f}" for name in names) + " |"
        )
    lines.append("")
    lines.append(
        "The parameter store (written once per content, by the warm-up; shared by every trace of the weights): "
        + ", ".join(f"{result['size']} {result['parameter_store_bytes'] / 1e6:.1f} MB" for result in results)
        + "."
    )
    lines.append(
        f"Load average before/after: {load[0]:.2f} / {os.getloadavg()[0]:.2f}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, Python {platform.python_version()}, "
        f"{torch.get_num_threads()} torch thread(s)."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=list(SIZES))
    parser.add_argument("--quick", action="store_true", help="a third of the rounds (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--first-trace", type=int, metavar="N", help="time a fresh child's first trace, N processes")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one process of --first-trace: "SIZE"
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    if arguments.child:
        return _first_trace_child(arguments.child)
    if arguments.first_trace:
        print(first_trace_table(arguments.sizes, arguments.first_trace))
        return 0
    load = os.getloadavg()
    # NOTE: the store of this run only: the warm-up writes each model's parameters into it once
    store = tempfile.mkdtemp(prefix="modeltrace-bench-store-")
    os.environ["MODELTRACE_PARAMETER_STORE"] = store
    try:
        results = []
        for size in arguments.sizes:
            rounds = SIZES[size][6]
            results.append(measure(size, max(3, rounds // 3) if arguments.quick else rounds))
            print(f"{size}: done", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(store)
    print(render(results, load))
    if arguments.json:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(json.dumps({"load_average": load, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
