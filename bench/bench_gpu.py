"""Cost of module capture on a CUDA device: ModelTrace's `ModuleCapture` (statistics computed on the device and
fetched in one batch; with `--full-tensors`, tensors copied off the device within the default limits) vs the plain
forward, for a medium and a 1B-size Llama in bfloat16 and float32. Run by `bench/gpu_check.sh`.

    python bench/bench_gpu.py [--quick] [--json FILE] [--sizes medium 1b] [--device cuda]

`LlamaModel` from a `LlamaConfig` (random weights built on the device, seed 0, eager attention, batch 1):
- medium: hidden 512, intermediate 1536, 8 layers, 8 heads (4 KV), sequence 128;
- 1b: Llama-3.2-1B's shape: hidden 2048, intermediate 8192, 16 layers, 32 heads (8 KV), vocabulary 128256,
  sequence 512.
Each variant is timed with `torch.cuda.synchronize()` on both sides, in a shuffled order per round after a warm-up;
`× plain` is the median over rounds of variant / plain timed in the same round. The engine alone (`ModuleCapture`)
and the library's `modeltrace.capture()`, which writes the whole `.mtrace` (parameters to the shared store once
per content, in a temporary `MODELTRACE_PARAMETER_STORE`). What `capture()` spends after the block, phase by
phase (its change check `reuse.model_facts`, the construction records `_builds`, `assemble_trace`,
`write_captured`), is timed in its timed calls and printed as a second table: session 22's run left open what
`capture()` adds to the engine at 1b. `--device cpu` runs the same code on the CPU (`tests/python/test_bench_gpu.py`
runs the medium size so, one round: the bench must not first fail on the machine it was written for).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from rounds import round_order

SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocabulary, sequence
    "medium": (512, 1536, 8, 8, 4, 1024, 128),
    "1b": (2048, 8192, 16, 32, 8, 128256, 512),
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# what `modeltrace.capture` does after the block, by the module attribute it calls (each is looked up at call time)
CAPTURE_PHASES = {
    "change check": ("modeltrace.worker.reuse", "model_facts"),
    "builds": ("modeltrace.api", "_builds"),
    "assemble": ("modeltrace.worker.assemble", "assemble_trace"),
    "write": ("modeltrace.worker.assemble", "write_captured"),
}


def synchronize(device: str) -> None:
    """Wait for the device's queue (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def phases_timed(device: str) -> Iterator[Callable[[dict[str, list[float]] | None], None]]:
    """While active, each of `CAPTURE_PHASES` appends its seconds (to the device's end) to the dict that the
    setter this yields was last given (`into[phase]`); given None, nothing is recorded (untimed calls)."""
    import importlib

    into: list[dict[str, list[float]] | None] = [None]
    originals: list[tuple[Any, str, Any]] = []

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if into[0] is not None:
                    synchronize(device)
                    into[0].setdefault(name, []).append(time.perf_counter() - started)

        return call

    for name, (module_name, attribute) in CAPTURE_PHASES.items():
        module = importlib.import_module(module_name)
        originals.append((module, attribute, getattr(module, attribute)))
        setattr(module, attribute, timed(name, getattr(module, attribute)))

    def record_into(target: dict[str, list[float]] | None) -> None:
        into[0] = target

    try:
        yield record_into
    finally:
        for module, attribute, original in originals:
            setattr(module, attribute, original)


def build(size: str, dtype: torch.dtype, device: str = "cuda") -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import LlamaConfig, LlamaModel

    hidden, intermediate, layers, heads, kv_heads, vocabulary, sequence = SIZES[size]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocabulary,
        max_position_embeddings=4096,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaModel(config).to(dtype).eval()
    input_ids = torch.randint(0, vocabulary, (1, sequence), device=device, generator=None)
    return model, input_ids


def measure(size: str, dtype_name: str, rounds: int, device: str = "cuda") -> dict:
    import modeltrace
    from modeltrace.worker.capture import ModuleCapture
    from modeltrace.worker.protocol import DEFAULT_MAX_TENSOR_MB, DEFAULT_MAX_TRACE_MB

    model, input_ids = build(size, DTYPES[dtype_name], device)
    trace_folder = Path(tempfile.mkdtemp(prefix="bench-gpu-")) / "capture.mtrace"

    def plain() -> None:
        with torch.no_grad():
            model(input_ids)

    def stats() -> None:
        with torch.no_grad(), ModuleCapture(model):
            model(input_ids)

    def library(full_tensors: bool) -> None:
        # the library's path: `modeltrace.capture` writes a whole .mtrace (parameters to the shared store)
        with torch.no_grad(), modeltrace.capture(model, trace_folder, full_tensors=full_tensors):
            model(input_ids)

    def full() -> None:
        with (
            torch.no_grad(),
            ModuleCapture(
                model,
                full_tensors=True,
                max_tensor_bytes=int(DEFAULT_MAX_TENSOR_MB * 2**20),
                max_trace_bytes=int(DEFAULT_MAX_TRACE_MB * 2**20),
            ),
        ):
            model(input_ids)

    variants = {
        "plain": plain,
        "stats": stats,
        "full tensors": full,
        "capture() stats": lambda: library(False),
        "capture() full": lambda: library(True),
    }
    rows = []
    names = list(variants)
    phases: dict[str, dict[str, list[float]]] = {"capture() stats": {}, "capture() full": {}}
    try:
        for function in variants.values():
            for _ in range(2):
                function()
        with phases_timed(device) as record_into:
            for order in round_order(names, rounds):  # NOTE: shuffled per round: no variant follows the same one
                times = {}
                for name in order:
                    synchronize(device)
                    record_into(phases.get(name))  # NOTE: None for the variants that are not `capture()`
                    started = time.perf_counter()
                    variants[name]()
                    synchronize(device)
                    times[name] = time.perf_counter() - started
                    record_into(None)
                rows.append(times)
    finally:
        shutil.rmtree(trace_folder.parent, ignore_errors=True)
    return {
        "size": size,
        "dtype": dtype_name,
        "plain_ms": 1000 * statistics.median(row["plain"] for row in rows),
        "stats_x": statistics.median(row["stats"] / row["plain"] for row in rows),
        "full_x": statistics.median(row["full tensors"] / row["plain"] for row in rows),
        "capture_stats_x": statistics.median(row["capture() stats"] / row["plain"] for row in rows),
        "capture_full_x": statistics.median(row["capture() full"] / row["plain"] for row in rows),
        # median ms of each variant, and of each phase `capture()` spends after its block (the block itself:
        # the variant's time less its phases)
        "median_ms": {name: 1000 * statistics.median(row[name] for row in rows) for name in names},
        "capture_phases_ms": {
            variant: {phase: 1000 * statistics.median(values) for phase, values in timed.items()}
            for variant, timed in phases.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ModuleCapture on CUDA vs the plain forward")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the bench itself")
    arguments = parser.parse_args(argv)
    device = arguments.device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    rounds = 4 if arguments.quick else 10
    # the parameters `capture(full_tensors=True)` stores go to a temporary store, not the user's cache
    os.environ.setdefault("MODELTRACE_PARAMETER_STORE", tempfile.mkdtemp(prefix="bench-gpu-store-"))
    results = []
    for size in arguments.sizes:
        for dtype in DTYPES:
            results.append(measure(size, dtype, rounds, device))
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()  # the model of the last measure is gone with its closures
    name = torch.cuda.get_device_name(0) if torch.device(device).type == "cuda" else "CPU"
    print(f"\n{name}, torch {torch.__version__}\n")
    print("| model | dtype | plain ms | engine stats | engine full tensors | capture() stats | capture() full |")
    print("|---|---|---|---|---|---|---|")
    for row in results:
        print(
            f"| {row['size']} | {row['dtype']} | {row['plain_ms']:.2f} | {row['stats_x']:.2f}× | {row['full_x']:.2f}× "
            f"| {row['capture_stats_x']:.2f}× | {row['capture_full_x']:.2f}× |"
        )
    print()
    print(phases_table(results))
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(results, indent=1))
    return 0


def phases_table(results: list[dict]) -> str:
    """Per model, dtype and `capture()` variant: its median ms, the engine's, and each phase after the block."""
    lines = [
        "| model | dtype | variant | capture() ms | engine ms | " + " | ".join(CAPTURE_PHASES) + " |",
        "|---|---|---|---:|---:|" + "---:|" * len(CAPTURE_PHASES),
    ]
    engines = {"capture() stats": "stats", "capture() full": "full tensors"}
    for row in results:
        for variant, engine in engines.items():
            timed = row["capture_phases_ms"].get(variant, {})
            cells = " | ".join(f"{timed[phase]:.2f}" if phase in timed else "–" for phase in CAPTURE_PHASES)
            lines.append(
                f"| {row['size']} | {row['dtype']} | {variant} | {row['median_ms'][variant]:.2f} "
                f"| {row['median_ms'][engine]:.2f} | {cells} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
