"""Cost of module capture on a CUDA device: ModelTrace's `ModuleCapture` (statistics computed on the device and
fetched in one batch; with `--full-tensors`, tensors copied off the device within the default limits) vs the plain
forward, for a medium and a 1B-size Llama in bfloat16 and float32. Run by `bench/gpu_check.sh`.

    python bench/bench_gpu.py [--quick] [--json FILE]

`LlamaModel` from a `LlamaConfig` (random weights built on the device, seed 0, eager attention, batch 1):
- medium: hidden 512, intermediate 1536, 8 layers, 8 heads (4 KV), sequence 128;
- 1b: Llama-3.2-1B's shape: hidden 2048, intermediate 8192, 16 layers, 32 heads (8 KV), vocabulary 128256,
  sequence 512.
Each variant is timed with `torch.cuda.synchronize()` on both sides, in a shuffled order per round after a warm-up;
`× plain` is the median over rounds of variant / plain timed in the same round. The engine alone (`ModuleCapture`)
and the library's `modeltrace.capture()`, which writes the whole `.mtrace` (parameters to the shared store once
per content, in a temporary `MODELTRACE_PARAMETER_STORE`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rounds import round_order

SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocabulary, sequence
    "medium": (512, 1536, 8, 8, 4, 1024, 128),
    "1b": (2048, 8192, 16, 32, 8, 128256, 512),
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def build(size: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.Tensor]:
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
    with torch.device("cuda"):
        model = LlamaModel(config).to(dtype).eval()
    input_ids = torch.randint(0, vocabulary, (1, sequence), device="cuda", generator=None)
    return model, input_ids


def measure(size: str, dtype_name: str, rounds: int) -> dict:
    import modeltrace
    from modeltrace.worker.capture import ModuleCapture
    from modeltrace.worker.protocol import DEFAULT_MAX_TENSOR_MB, DEFAULT_MAX_TRACE_MB

    model, input_ids = build(size, DTYPES[dtype_name])
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
    for function in variants.values():
        for _ in range(2):
            function()
    rows = []
    names = list(variants)
    for order in round_order(names, rounds):  # NOTE: shuffled per round: no variant always follows the same one
        times = {}
        for name in order:
            torch.cuda.synchronize()
            started = time.perf_counter()
            variants[name]()
            torch.cuda.synchronize()
            times[name] = time.perf_counter() - started
        rows.append(times)
    return {
        "size": size,
        "dtype": dtype_name,
        "plain_ms": 1000 * statistics.median(row["plain"] for row in rows),
        "stats_x": statistics.median(row["stats"] / row["plain"] for row in rows),
        "full_x": statistics.median(row["full tensors"] / row["plain"] for row in rows),
        "capture_stats_x": statistics.median(row["capture() stats"] / row["plain"] for row in rows),
        "capture_full_x": statistics.median(row["capture() full"] / row["plain"] for row in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ModuleCapture on CUDA vs the plain forward")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    arguments = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    rounds = 4 if arguments.quick else 10
    # the parameters `capture(full_tensors=True)` stores go to a temporary store, not the user's cache
    os.environ.setdefault("MODELTRACE_PARAMETER_STORE", tempfile.mkdtemp(prefix="bench-gpu-store-"))
    results = []
    for size in SIZES:
        for dtype in DTYPES:
            results.append(measure(size, dtype, rounds))
            torch.cuda.empty_cache()  # the model of the last measure is gone with its closures
    print(f"\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}\n")
    print("| model | dtype | plain ms | engine stats | engine full tensors | capture() stats | capture() full |")
    print("|---|---|---|---|---|---|---|")
    for row in results:
        print(
            f"| {row['size']} | {row['dtype']} | {row['plain_ms']:.2f} | {row['stats_x']:.2f}× | {row['full_x']:.2f}× "
            f"| {row['capture_stats_x']:.2f}× | {row['capture_full_x']:.2f}× |"
        )
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
