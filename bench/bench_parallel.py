"""Cost of a tensor-parallel trace on CPU: the same 2-rank forward (transformers' tp_plan="auto", gloo) with and
without ModelTrace's capture.

    .venv/bin/python bench/bench_parallel.py            # medium Llama, 2 ranks, prints a markdown table
    .venv/bin/python bench/bench_parallel.py --quick    # fewer rounds
    .venv/bin/python bench/bench_parallel.py --size tiny --json bench/results/parallel.json

A `LlamaModel` (random weights, seed 0, eager attention; medium: hidden 512, intermediate 1536, 8 layers, 8 heads
/ 4 KV heads, sequence 128; tiny: hidden 64, 2 layers, sequence 7) is saved with save_pretrained, then two rank
processes are started with torchrun's environment (as `modeltrace trace --nproc 2` starts them) and each loads it
with `from_pretrained(tp_plan="auto")`. After a warm-up, every round times on both ranks, between barriers:

- `plain`: `model(input_ids)` under `torch.no_grad()`: the torchrun forward without capture;
- `trace`: the same forward inside `ModuleCapture`, then what `worker/parallel.py` does per trace after it: the
  records (and nothing else) sent to rank 0 with `gather_object`, merged into whole tensors (`merge_ranks`, with the
  logical shapes of the meta run), and the trace written (msgpack, atomic rename).

Per-trace work that does not grow with the forward is timed once and reported apart: the shape-only run on the
meta device that gives the whole tensors' shapes, and gathering the DTensor weights for the builds' fingerprints.
The target is checked on the paired ratio (median over rounds of trace / plain in the same round), rank 0's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = {  # hidden, intermediate, layers, heads, kv heads, sequence, rounds
    "tiny": (64, 128, 2, 4, 2, 7, 40),
    "medium": (512, 1536, 8, 8, 4, 128, 15),
}
TARGET = 1.3


def save_checkpoint(size: str, folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaModel

    hidden, intermediate, layers, heads, kv_heads, _, _ = SIZES[size]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=1024,
        max_position_embeddings=512,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    LlamaModel(config).save_pretrained(folder)


def rank_job(checkpoint: Path, size: str, rounds: int, out: Path) -> None:
    """One rank: load with tp_plan="auto", time plain and traced forwards in alternation."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaModel

    from modeltrace.trace.records import Trace
    from modeltrace.trace.storage import write_trace
    from modeltrace.worker.capture import ModuleCapture
    from modeltrace.worker.parallel import merge_ranks

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = LlamaModel.from_pretrained(str(checkpoint), tp_plan="auto", attn_implementation="eager").eval()
    sequence = SIZES[size][5]
    input_ids = torch.randint(0, 1024, (1, sequence), generator=torch.Generator().manual_seed(0))

    def plain() -> None:
        with torch.no_grad():
            model(input_ids)

    def traced(logical: list | None) -> None:
        with torch.no_grad(), ModuleCapture(model) as capture:
            model(input_ids)
        gathered = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(capture.records, gathered, dst=0)
        if rank == 0:
            merged = merge_ranks(gathered, logical)
            folder = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
            try:
                write_trace(
                    Trace(model={"class": "LlamaModel"}, modules=merged.records), folder / "t.mtrace", durable=False
                )
            finally:
                shutil.rmtree(folder, ignore_errors=True)

    # the one-time parts, timed once
    started = time.perf_counter()
    logical = _meta_records(model, input_ids) if rank == 0 else None
    meta_seconds = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():
        for parameter in model.parameters():
            if hasattr(parameter.data, "full_tensor"):
                parameter.data.full_tensor()
    weights_seconds = time.perf_counter() - started
    for _ in range(2):
        plain()
        traced(logical)
    rows = []
    for round_index in range(rounds):
        times = {}
        order = ("plain", "trace") if round_index % 2 == 0 else ("trace", "plain")
        for name in order:
            dist.barrier()
            started = time.perf_counter()
            plain() if name == "plain" else traced(logical)
            dist.barrier()
            times[name] = time.perf_counter() - started
        rows.append(times)
    if rank == 0:
        out.write_text(json.dumps({"rows": rows, "meta_seconds": meta_seconds, "weights_seconds": weights_seconds}))
    dist.destroy_process_group()


def _meta_records(model, input_ids) -> list:  # noqa: ANN001
    """The shape-only run of the same config on the meta device (what `worker/parallel.py` does per trace)."""
    import torch
    from transformers import LlamaModel

    from modeltrace.worker.capture import ModuleCapture
    from modeltrace.worker.shape_only import ShapeOnlyMode

    mode = ShapeOnlyMode()
    with mode, torch.device("meta"):
        meta = LlamaModel(model.config).eval()
    with torch.no_grad(), mode, ModuleCapture(meta) as capture:
        meta(input_ids.to("meta"))
    return capture.records


def measure(size: str, rounds: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    try:
        checkpoint = work / "checkpoint"
        save_checkpoint(size, checkpoint)
        out = work / "result.json"
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        processes = []
        for rank in range(2):
            environment = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--rank-job",
                        str(checkpoint),
                        "--size",
                        size,
                        "--rounds",
                        str(rounds),
                        "--out",
                        str(out),
                    ],
                    env=environment,
                )
            )
        codes = [process.wait(timeout=1800) for process in processes]
        if any(codes):
            raise SystemExit(f"a rank failed: exit codes {codes}")
        data = json.loads(out.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = data["rows"]
    plain = [row["plain"] for row in rows]
    trace = [row["trace"] for row in rows]
    return {
        "size": size,
        "rounds": rounds,
        "plain_ms": 1000 * statistics.median(plain),
        "trace_ms": 1000 * statistics.median(trace),
        "ratio_paired": statistics.median(row["trace"] / row["plain"] for row in rows),
        "meta_run_ms": 1000 * data["meta_seconds"],
        "weights_gather_ms": 1000 * data["weights_seconds"],
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="medium")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--rank-job", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.rank_job:
        rank_job(Path(arguments.rank_job), arguments.size, arguments.rounds, Path(arguments.out))
        return 0
    rounds = SIZES[arguments.size][6] // (3 if arguments.quick else 1)
    result = measure(arguments.size, rounds)
    passed = result["ratio_paired"] <= TARGET
    print(
        f"| 2-rank CPU TP ({arguments.size}) | plain ms | trace ms | × plain (paired) | meta run ms (once) | "
        "weights gather ms (once) |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| tp_plan=auto, gloo | {result['plain_ms']:.1f} | {result['trace_ms']:.1f} | "
        f"{result['ratio_paired']:.2f}× | {result['meta_run_ms']:.0f} | {result['weights_gather_ms']:.0f} |"
    )
    print(
        f"\nload average {result['load_average']:.2f}; target trace ≤ {TARGET}× plain (paired): "
        f"{'PASS' if passed else 'FAIL'}"
    )
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(result, indent=1))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "pyserver"))
    sys.exit(main())
