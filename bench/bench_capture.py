"""Cost of module capture on CPU: ModelTrace's `ModuleCapture` vs a plain forward vs transformers' debugger.

    .venv/bin/python bench/bench_capture.py            # tiny and medium, prints a markdown table
    .venv/bin/python bench/bench_capture.py --quick    # fewer rounds, for a smoke run
    .venv/bin/python bench/bench_capture.py --large    # also the 1B-like size (minutes; ~8 GB of memory)
    .venv/bin/python bench/bench_capture.py --json bench/results/capture.json

Models: `LlamaModel` built from a `LlamaConfig` (random weights, fixed seed, eager attention, `use_cache=False`,
batch 1), run under `torch.no_grad()`:

- tiny: hidden 64, intermediate 128, 2 layers, 4 heads (2 KV heads), sequence 7
- medium: hidden 512, intermediate 1536, 8 layers, 8 heads (4 KV heads), sequence 128
- large (opt-in, `--large`): Llama-3.2-1B-like, hidden 2048, intermediate 8192, 16 layers, 32 heads (8 KV heads),
  sequence 256 (vocabulary 1024, so about 1B parameters in the layers: 3.9 GB in float32)

Every variant is timed from before entering its context to after leaving it, so it includes what the user waits
for (files written; fsync where the writer does it before returning). Variants run interleaved, in an order
shuffled anew each round (`rounds.py`), for N rounds after a warm-up, each call in a fresh temporary folder
created, deleted and `os.sync`ed outside the timing:

- `plain`: `model(input_ids)`.
- `call wrapping` (diagnostic): ModuleCapture's own `_call_impl` on every module, doing nothing but calling
  torch's: what attaching to the model costs before any record.
- `records only` (diagnostic): ModuleCapture's wrapping, source lines and records, with the tensor summaries
  switched off, and the trace of those records written: the floor of per-module-call Python work before any
  statistic.
- `floor: output statistics` (diagnostic, with the native kernel only): ModuleCapture's wrapping, and per call
  the module's path, its output's shape and the fused kernel's moments of it in a list, written as one msgpack
  file into a new folder renamed into place; no source line, no inputs, no call tree, no summary objects. The
  least any statistics trace of every module call costs, to read the rows below against.
- `modeltrace stats`: `ModuleCapture(model)` around the forward, then the trace (`Trace`, records and a small
  header) written with `modeltrace.trace.storage.write_trace` (msgpack, atomic rename; the fsync comes after the
  worker has answered, so it is not timed), as `worker/job.py` does (job.py's source hashing of the model files is left out).
- `modeltrace full tensors`: the same with full tensors, as `worker/job.py` takes them: a `TensorStream`
  (`worker/tensor_stream.py`, default 1 GB memory budget) writes them into the trace's temporary folder from a
  background thread while the forward runs, and `write_captured` waits for it, completes the safetensors files
  and renames the folder into place.
- `api capture()`, `api capture() full tensors`: `modeltrace.capture(model, path)` around the forward, as a
  script or notebook calls it: the same engine in the caller's process, with what the library adds (the modules'
  construction records, source hashes, the trace written as the CLI writes it) on leaving the block.
- `debugger repr`: `transformers.model_debugging_utils.model_addition_debugger_context(model, debug_path=tmp,
  do_prune_layers=False, use_repr=True)` around the forward (wrapping every module's forward on entry,
  repr of every tensor and its mean/std/min/max, the `*_FULL_TENSORS.json` and `*_SUMMARY.json` files written
  at the end of the top-level forward, forwards restored on exit).
- `debugger safetensors`: the same with `use_repr=False` (one safetensors file per tensor instead of reprs).

Columns: `× plain` is a ratio of medians; `× plain (paired)` is the median over rounds of (variant / plain) timed
in the same round, which a noisy machine disturbs less (the targets are checked on paired ratios). `of which
writing` is the part of a ModelTrace variant spent after the capture context exited (building the `Trace`,
msgpack, safetensors, rename), and the last column the paired ratio without it. `--large` (or `--rss`) also measures the peak resident memory during one call of `plain`, `modeltrace full
tensors` and `debugger safetensors`, each in a fresh process that builds the model and runs it once first, with
the peak reset after that (`/proc/self/clear_refs`): the difference between rows is what each variant adds on
top of the model and its forward. The machine's load
average is printed with the table: on a shared 2-core machine two torch threads stall whenever another process
holds a core, so only runs at a low load mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import torch
import transformers

import modeltrace
from rounds import round_order
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.model_debugging_utils import model_addition_debugger_context

from modeltrace.trace.records import TensorSummary, Trace
from modeltrace.trace.storage import TENSORS_FILE, write_trace
from modeltrace.worker import native
from modeltrace.worker.assemble import discarded_on_error, start_stream, write_captured
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.protocol import DEFAULT_TENSOR_MEMORY_MB


SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads, sequence, rounds)
    "tiny": (64, 128, 2, 4, 2, 7, 200),
    "medium": (512, 1536, 8, 8, 4, 128, 30),
    "large": (2048, 8192, 16, 32, 8, 256, 4),
}
# NOTE: opt-in: building it and running its seven variants for a few rounds takes minutes on two cores
OPT_IN_SIZES = ("large",)
VOCAB = 1024
SEED = 0


def build(size: str) -> tuple[LlamaModel, torch.Tensor]:
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
    model = LlamaModel(config).eval()
    input_ids = torch.randint(0, VOCAB, (1, sequence), generator=torch.Generator().manual_seed(SEED))
    return model, input_ids


class _CallWrapping(ModuleCapture):
    """ModuleCapture's wrapping of every module, calling straight through: what attaching alone costs."""

    def _make_call(self, module, path, live):  # noqa: ANN001, ANN202
        call_impl = type(module)._call_impl

        def passing_call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return call_impl(module, *args, **kwargs)

        return passing_call


_PLACEHOLDER = TensorSummary("", [], "float32")


class _RecordsOnly(ModuleCapture):
    """ModuleCapture with tensor summaries switched off: what the records alone cost (a call of one tensor
    gets one shared placeholder summary instead of none: the wrapper's own path for that case stays)."""

    def _summary(self, tensor, key, index, side):  # noqa: ANN001
        return _PLACEHOLDER

    def _summarize_all(self, named_values, index, side):  # noqa: ANN001
        return []


class _OutputStatisticsFloor(ModuleCapture):
    """The least a statistics trace can cost (diagnostic): ModuleCapture's wrapping of every module, and per call
    the module's path, the shape of its output (a bare tensor, or a tuple's first) and the native kernel's five
    moments of it (contiguous float32 only), in a list; no source line, no inputs, no call tree, no summary
    objects, nothing cached. `_floor` writes the list as one msgpack file into a new folder renamed into place.
    Not a trace anything reads: what wrapping, a statistic per call and an atomic write cost with nothing else."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.rows: list[tuple] = []

    def _make_call(self, module, path, live):  # noqa: ANN001, ANN202
        call_impl = type(module)._call_impl
        rows = self.rows
        kernel = _FLOAT32_KERNEL

        def floor_call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            output = call_impl(module, *args, **kwargs)
            tensor = output[0] if type(output) is tuple and output else output
            if type(tensor) is torch.Tensor and tensor.dtype is torch.float32 and tensor.is_contiguous():
                rows.append((path, list(tensor.shape), kernel(tensor.data_ptr(), tensor.numel())))
            else:
                rows.append((path,))
            return output

        return floor_call


_NATIVE_KERNELS = native.kernels()
_FLOAT32_KERNEL = _NATIVE_KERNELS["f32"] if _NATIVE_KERNELS else None


def _floor(model: LlamaModel, input_ids: torch.Tensor, folder: Path) -> None:
    with torch.no_grad(), _OutputStatisticsFloor(model) as capture:
        model(input_ids)
    temporary = folder / ".floor.tmp"
    os.mkdir(temporary)
    descriptor = os.open(temporary / "rows.msgpack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.write(descriptor, msgpack.packb(capture.rows))
    finally:
        os.close(descriptor)
    os.rename(temporary, folder / "floor.mtrace")


def _modeltrace(
    model: LlamaModel,
    input_ids: torch.Tensor,
    folder: Path,
    full_tensors: bool,
    capture_class: type[ModuleCapture] = ModuleCapture,
) -> float:
    """Capture and write; returns the seconds spent writing (Trace, msgpack, safetensors, rename) after the
    capture context exited (full tensors: waiting for the stream's writer to finish included)."""
    out = folder / "bench.mtrace"
    stream = start_stream(out, int(DEFAULT_TENSOR_MEMORY_MB * 2**20)) if full_tensors else None
    with (
        discarded_on_error(stream),
        torch.no_grad(),
        capture_class(model, full_tensors=full_tensors, stream=stream) as capture,
    ):
        model(input_ids)
    writing = time.perf_counter()
    trace = Trace(
        model={"class": type(model).__name__, "options": {"full_tensors": full_tensors}}, modules=capture.records
    )
    if stream is not None:
        # NOTE: durable=False as worker/job.py writes it: the worker flushes to disk after it has answered
        write_captured(trace, capture, out, durable=False)
        return time.perf_counter() - writing
    write_extra = None
    if capture.tensors:
        from safetensors.torch import save_file

        def write_extra(target: Path) -> None:
            save_file(capture.tensors, str(target / TENSORS_FILE))

    # NOTE: durable=False as worker/job.py writes it: the worker flushes to disk after it has answered
    write_trace(trace, folder / "bench.mtrace", write_extra, durable=False)
    return time.perf_counter() - writing


def _api(model: LlamaModel, input_ids: torch.Tensor, folder: Path, full_tensors: bool) -> None:
    with torch.no_grad(), modeltrace.capture(model, folder / "api.mtrace", full_tensors=full_tensors):
        model(input_ids)


def _debugger(model: LlamaModel, input_ids: torch.Tensor, folder: Path, use_repr: bool) -> None:
    with (
        torch.no_grad(),
        model_addition_debugger_context(
            model, debug_path=str(folder / "debug"), do_prune_layers=False, use_repr=use_repr
        ),
    ):
        model(input_ids)


def variants() -> dict[str, Callable[[LlamaModel, torch.Tensor, Path], None]]:
    def plain(model, input_ids, folder):  # noqa: ANN001
        with torch.no_grad():
            model(input_ids)

    def call_wrapping(model, input_ids, folder):  # noqa: ANN001
        with torch.no_grad(), _CallWrapping(model):
            model(input_ids)

    return {
        "plain": plain,
        "call wrapping": call_wrapping,
        **({"floor: output statistics": _floor} if _FLOAT32_KERNEL is not None else {}),
        "records only": lambda m, x, f: _modeltrace(m, x, f, False, _RecordsOnly),
        "modeltrace stats": lambda m, x, f: _modeltrace(m, x, f, False),
        "modeltrace full tensors": lambda m, x, f: _modeltrace(m, x, f, True),
        "api capture()": lambda m, x, f: _api(m, x, f, False),
        "api capture() full tensors": lambda m, x, f: _api(m, x, f, True),
        "debugger repr": lambda m, x, f: _debugger(m, x, f, True),
        "debugger safetensors": lambda m, x, f: _debugger(m, x, f, False),
    }


def _time_once(function, model, input_ids) -> tuple[float, float]:  # noqa: ANN001
    """Seconds for one call of a variant, and of those the seconds it reported writing files."""
    folder = Path(tempfile.mkdtemp(prefix="bench_capture_"))
    try:
        gc.collect()
        # NOTE: flush what earlier rounds wrote and deleted (the debugger's hundreds of files), so that an fsync
        # in this call pays for this call's writes only.
        os.sync()
        started = time.perf_counter()
        writing = function(model, input_ids, folder)
        return time.perf_counter() - started, writing or 0.0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(size: str, rounds: int, warmup: int) -> dict:
    model, input_ids = build(size)
    named = variants()
    names = list(named)
    with torch.no_grad():
        reference = model(input_ids).last_hidden_state.clone()
    for _ in range(warmup):
        for name in names:
            _time_once(named[name], model, input_ids)
    # NOTE: the variants must not change the model's result (and the debugger must have restored the forwards).
    with torch.no_grad():
        assert torch.equal(model(input_ids).last_hidden_state, reference), "a variant changed the model's output"
    times: dict[str, list[float]] = {name: [] for name in names}
    writing: dict[str, list[float]] = {name: [] for name in names}
    for order in round_order(names, rounds):
        for name in order:
            total, written = _time_once(named[name], model, input_ids)
            times[name].append(total)
            writing[name].append(written)
    plain = times["plain"]
    rows = {}
    for name in names:
        median = statistics.median(times[name])
        rows[name] = {
            "median_ms": median * 1e3,
            "min_ms": min(times[name]) * 1e3,
            "writing_median_ms": statistics.median(writing[name]) * 1e3,
            "ratio_to_plain": median / statistics.median(plain),
            "paired_ratio_to_plain": statistics.median(t / p for t, p in zip(times[name], plain)),
            "paired_ratio_to_plain_without_writing": statistics.median(
                (t - w) / p for t, w, p in zip(times[name], writing[name], plain)
            ),
            "times_ms": [t * 1e3 for t in times[name]],
        }
    with contextlib.suppress(Exception):
        with torch.no_grad(), ModuleCapture(model) as capture:
            model(input_ids)
        rows["plain"]["module_calls"] = len(capture.records)
    return {"size": size, "config": SIZES[size][:6], "rounds": rounds, "variants": rows}


RSS_VARIANTS = ("plain", "modeltrace full tensors", "debugger safetensors")


def _resident_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _rss_child(size: str, variant: str, threads: int) -> int:
    """In a fresh process: build the model, run one call of `variant`, return the peak resident KB during that
    call (Linux: the peak is reset after the build, `/proc/self/clear_refs`, so that a build that peaks higher
    than the forward does not hide the call; elsewhere the process's peak, build included)."""
    torch.set_num_threads(threads)
    model, input_ids = build(size)
    with torch.no_grad():
        model(input_ids)  # warm: torch's allocator and thread pools as a later call finds them
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    _time_once(variants()[variant], model, input_ids)
    peak = _resident_kb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_rss(size: str, threads: int) -> dict[str, float]:
    """Peak resident MB during one call of each of `RSS_VARIANTS`, each in its own fresh process that built the
    model and ran it once first (so the model's weights are in every row)."""
    found = {}
    for variant in RSS_VARIANTS:
        completed = subprocess.run(
            [sys.executable, __file__, "--rss-child", size, variant, "--threads", str(threads)],
            capture_output=True,
            text=True,
            check=True,
        )
        found[variant] = int(completed.stdout.split()[-1]) / 1024
    return found


def _paired(rows: dict, numerator: str, denominator: str) -> float:
    """Median over rounds of numerator / denominator, both timed in the same round."""
    pairs = zip(rows[numerator]["times_ms"], rows[denominator]["times_ms"])
    return statistics.median(top / bottom for top, bottom in pairs)


def targets(results: dict[str, dict]) -> list[tuple[str, float, str, bool]]:
    """The issue's targets, on paired (same-round) ratios."""
    checks = []
    medium = results.get("medium", {}).get("variants")
    tiny = results.get("tiny", {}).get("variants")
    if medium:
        ratio = _paired(medium, "modeltrace stats", "plain")
        checks.append(("medium: stats ≤ 1.15× plain", ratio, f"{ratio:.2f}×", ratio <= 1.15))
        speedup = _paired(medium, "debugger repr", "modeltrace stats")
        checks.append(("medium: stats ≥ 3× faster than debugger repr", speedup, f"{speedup:.1f}×", speedup >= 3))
    if tiny:
        ratio = _paired(tiny, "modeltrace stats", "plain")
        checks.append(("tiny: stats ≤ 1.6× plain", ratio, f"{ratio:.2f}×", ratio <= 1.6))
    for size, rows in (("medium", medium), ("tiny", tiny)):
        if rows and "api capture()" in rows:
            ratio = _paired(rows, "api capture()", "modeltrace stats")
            checks.append(
                (
                    f"{size}: api capture() ≤ 1.15× the CLI's capture (modeltrace stats)",
                    ratio,
                    f"{ratio:.2f}×",
                    ratio <= 1.15,
                )
            )
        if rows:
            speedup = _paired(rows, "debugger safetensors", "modeltrace full tensors")
            checks.append(
                (
                    f"{size}: full tensors ≥ 3× faster than debugger safetensors",
                    speedup,
                    f"{speedup:.1f}×",
                    speedup >= 3,
                )
            )
    if medium:
        ratio = _paired(medium, "modeltrace full tensors", "plain")
        checks.append(("medium: full tensors ≤ 1.5× plain", ratio, f"{ratio:.2f}×", ratio <= 1.5))
    large = results.get("large", {}).get("variants")
    if large:
        ratio = _paired(large, "modeltrace full tensors", "plain")
        checks.append(("large: full tensors ≤ 1.3× plain", ratio, f"{ratio:.2f}×", ratio <= 1.3))
        ratio = _paired(large, "modeltrace stats", "plain")
        checks.append(("large: stats ≤ 1.05× plain", ratio, f"{ratio:.2f}×", ratio <= 1.05))
        speedup = _paired(large, "debugger safetensors", "modeltrace full tensors")
        checks.append(
            ("large: full tensors faster than debugger safetensors", speedup, f"{speedup:.2f}×", speedup > 1)
        )
    return checks


def markdown(results: dict[str, dict]) -> str:
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = [
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}, "
        f"CPU, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores, load average at the end {load}",
        "",
        "| model | variant | median ms | × plain | × plain (paired) | of which writing, ms | × plain (paired) without writing |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for size, result in results.items():
        for name, row in result["variants"].items():
            writes = row["writing_median_ms"] > 0
            lines.append(
                f"| {size} | {name} | {row['median_ms']:.2f} | {row['ratio_to_plain']:.2f} | "
                f"{row['paired_ratio_to_plain']:.2f} | {row['writing_median_ms']:.2f} | "
                + (f"{row['paired_ratio_to_plain_without_writing']:.2f} |" if writes else "|")
            )
    lines.append("")
    lines.append(
        ", ".join(
            f"{size}: {result['rounds']} rounds, {result['variants']['plain'].get('module_calls', '?')} module calls"
            for size, result in results.items()
        )
    )
    rss = {size: result["peak_rss_mb"] for size, result in results.items() if result.get("peak_rss_mb")}
    if rss:
        lines += [
            "",
            "| model | peak RSS during one call, MB (model included) | × plain | over plain, MB |",
            "|---|---|---:|---:|",
        ]
        for size, found in rss.items():
            for variant, megabytes in found.items():
                lines.append(
                    f"| {size} | {variant}: {megabytes:,.0f} | {megabytes / found['plain']:.2f} | "
                    f"{megabytes - found['plain']:+,.0f} |"
                )
    lines += ["", "| target | measured | met |", "|---|---:|:---:|"]
    for label, _, shown, met in targets(results):
        lines.append(f"| {label} | {shown} | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", nargs="+", default=[size for size in SIZES if size not in OPT_IN_SIZES], choices=list(SIZES)
    )
    parser.add_argument("--large", action="store_true", help="also the 1B-like size (minutes, ~8 GB of memory)")
    parser.add_argument(
        "--rss", action="store_true", help="peak RSS of plain / full tensors / debugger per size (always with --large)"
    )
    parser.add_argument("--rss-child", nargs=2, metavar=("SIZE", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a tenth of the rounds")
    parser.add_argument("--rounds", type=int, help="rounds for every size (overrides the defaults)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--json", type=Path, help="also write the results (with every timing) here")
    options = parser.parse_args(argv)
    if options.rss_child:
        print(_rss_child(*options.rss_child, options.threads))
        return 0
    torch.set_num_threads(options.threads)
    sizes = options.sizes + (["large"] if options.large and "large" not in options.sizes else [])
    results = {}
    for size in sizes:
        rounds = options.rounds or SIZES[size][6]
        if options.quick:
            rounds = max(3, rounds // 10)
        started = time.perf_counter()
        warmup = {"tiny": 10, "medium": 2}.get(size, 1)
        results[size] = measure(size, rounds, warmup=warmup)
        if options.rss or size in OPT_IN_SIZES:
            results[size]["peak_rss_mb"] = peak_rss(size, options.threads)
        print(f"{size}: {rounds} rounds in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(markdown(results))
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
