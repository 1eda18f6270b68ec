"""Cost of generation and backward traces on CPU, against the same work done plainly.

    .venv/bin/python bench/bench_genback.py            # prints a markdown table
    .venv/bin/python bench/bench_genback.py --rounds 3 # a smoke run

Model: the medium Llama of `bench_capture.py` as a `LlamaForCausalLM` (hidden 512, intermediate 1536, 8 layers,
8 heads, 4 KV heads, random weights, fixed seed, eager attention), batch 1.

- generation, prompt 128 tokens, 16 decode steps: `plain generate` is `model.generate` (greedy, 17 new tokens,
  the model's cache) under `torch.no_grad()`; `traced generate` is `worker/generation.run_generation` (the same
  call) under `ModuleCapture`, with the cache's statistics per step and layer, and the trace written.
- forward + backward, sequence 128: `plain fwd+bwd` is the forward with labels and `loss.backward()`;
  `traced fwd+bwd` is `worker/backward.run_backward` under `ModuleCapture` (gradient statistics of every module
  call's outputs and inputs and of every parameter), and the trace written.

Variants run interleaved (a plain and a traced run in each round, alternating which goes first); the ratios are
medians of the per-round ratios (paired), so that load from other processes on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from modeltrace.trace.records import Trace
from modeltrace.trace.storage import write_trace
from modeltrace.worker.backward import run_backward
from modeltrace.worker.building import BuiltModel
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.generation import run_generation


SEED = 0
VOCAB = 1000
SEQUENCE = 128
DECODE_STEPS = 16


def build() -> tuple[LlamaForCausalLM, torch.Tensor]:
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, VOCAB, (1, SEQUENCE), generator=torch.Generator().manual_seed(SEED))
    return model, input_ids


def _write(capture: ModuleCapture, **extra: object) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench_genback_"))
    try:
        trace = Trace(model={"class": "LlamaForCausalLM"}, modules=capture.records, **extra)
        write_trace(trace, folder / "t.mtrace", durable=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def plain_generate(model: LlamaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            input_ids,
            max_new_tokens=DECODE_STEPS + 1,
            min_new_tokens=DECODE_STEPS + 1,
            do_sample=False,
            num_beams=1,
            use_cache=True,
            pad_token_id=0,
        )


def traced_generate(model: LlamaForCausalLM, input_ids: torch.Tensor) -> list[list[int]]:
    with torch.no_grad(), ModuleCapture(model) as capture:
        generation = run_generation(model, (), {"input_ids": input_ids}, DECODE_STEPS, capture, {})
    _write(capture, generation=generation)
    return generation.generated_ids


def plain_backward(model: LlamaForCausalLM, input_ids: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    return loss.item()


def traced_backward(model: LlamaForCausalLM, input_ids: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    built = BuiltModel(model=model, kwargs={"input_ids": input_ids}, model_class="LlamaForCausalLM")
    with ModuleCapture(model) as capture:
        gradients = run_backward(built, capture, {})
    _write(capture, gradients=gradients)
    return gradients.loss.mean


# NOTE: `--clock process` times this process's CPU seconds instead of wall seconds: with `--threads 1`, a
# measure that other processes' load on a shared machine does not inflate (it leaves out time spent waiting).
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
clock = time.perf_counter


def _timed(function, model, input_ids) -> float:  # noqa: ANN001
    gc.collect()
    started = clock()
    function(model, input_ids)
    return clock() - started


def measure(rounds: int) -> dict[str, dict[str, float]]:
    model, input_ids = build()
    pairs = {
        "generate (16 decode steps)": (plain_generate, traced_generate),
        "forward + backward": (plain_backward, traced_backward),
    }
    # the traced runs compute what the plain ones do
    plain_ids = plain_generate(model, input_ids)[:, SEQUENCE:].tolist()
    assert traced_generate(model, input_ids) == plain_ids, "tracing changed the generated tokens"
    assert traced_backward(model, input_ids) == plain_backward(model, input_ids), "tracing changed the loss"
    results = {}
    for label, (plain, traced) in pairs.items():
        for _ in range(1):  # warm-up
            _timed(plain, model, input_ids)
            _timed(traced, model, input_ids)
        plain_times, traced_times = [], []
        for round_index in range(rounds):
            order = [(plain, plain_times), (traced, traced_times)]
            for function, times in order if round_index % 2 == 0 else reversed(order):
                times.append(_timed(function, model, input_ids))
        results[label] = {
            "plain_ms": statistics.median(plain_times) * 1e3,
            "traced_ms": statistics.median(traced_times) * 1e3,
            "paired_ratio": statistics.median(t / p for t, p in zip(traced_times, plain_times)),
        }
    return results


def markdown(results: dict[str, dict[str, float]], rounds: int) -> str:
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = [
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}, "
        f"CPU, {torch.get_num_threads()} torch threads, {rounds} rounds, {clock.__name__}, load average at the "
        f"end {load}",
        "",
        "| medium Llama | plain, median ms | traced, median ms | × plain (paired) | target ≤ 1.3× |",
        "|---|---:|---:|---:|:---:|",
    ]
    for label, row in results.items():
        met = "yes" if row["paired_ratio"] <= 1.3 else "no"
        lines.append(
            f"| {label} | {row['plain_ms']:.0f} | {row['traced_ms']:.0f} | {row['paired_ratio']:.2f} | {met} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall seconds (default) or this process's CPU seconds (use with --threads 1)",
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    global clock
    clock = CLOCKS[options.clock]
    started = time.perf_counter()
    with contextlib.redirect_stderr(sys.stderr):
        results = measure(options.rounds)
    print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(markdown(results, options.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
