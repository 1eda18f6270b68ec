"""Cost of line-level capture on CPU: plain forward vs module capture vs module + line capture.

    .venv/bin/python bench/bench_lines.py            # prints a markdown table

Models as in `bench_capture.py` (transformers' `LlamaModel`, random weights, eager attention, batch 1, no
grad): tiny (hidden 64, 2 layers, sequence 7) and medium (hidden 512, 8 layers, sequence 128). Line capture
follows transformers' `modeling_llama.py` (every function of that file: attention, decoder layer, MLP,
RMSNorm, rotary embedding), with statistics, as `modeltrace trace --lines` does. Variants are interleaved in
an order shuffled anew each round (`rounds.py`); ratios are medians of per-round ratios to the plain forward of
the same round.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaModel

from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.lines import LineCapture
from rounds import round_order


SIZES = {"tiny": (64, 128, 2, 4, 2, 7, 150), "medium": (512, 1536, 8, 8, 4, 128, 12)}
LLAMA_FILE = transformers.models.llama.modeling_llama.__file__


def build(size: str) -> tuple[LlamaModel, torch.Tensor]:
    hidden, intermediate, layers, heads, kv_heads, sequence, _ = SIZES[size]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        attn_implementation="eager",
        use_cache=False,
    )
    return LlamaModel(config).eval(), torch.randint(0, 1024, (1, sequence))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, help="rounds for every size")
    options = parser.parse_args(argv)
    torch.set_num_threads(2)
    print("| model | plain ms | modules ms | modules + lines ms | modules × plain | lines × plain | line records |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        model, input_ids = build(size)
        records = 0

        def plain() -> None:
            with torch.no_grad():
                model(input_ids)

        def modules() -> None:
            with torch.no_grad(), ModuleCapture(model):
                model(input_ids)

        def lines() -> None:
            nonlocal records
            with torch.no_grad(), ModuleCapture(model) as capture:
                with LineCapture([LLAMA_FILE], capture.summary_cache, capture.pending) as line_capture:
                    model(input_ids)
            records = len(line_capture.records)

        variants = {"plain": plain, "modules": modules, "lines": lines}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(3):
            for function in variants.values():
                function()
        rounds = options.rounds or SIZES[size][6]
        names = list(variants)
        for order in round_order(names, rounds):
            for name in order:
                # NOTE: as in bench_capture.py, every call starts from a collected heap: the records of the call
                # before would otherwise set off the cyclic collector inside whichever variant runs next.
                gc.collect()
                started = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - started)
        ratio = {
            name: statistics.median(t / p for t, p in zip(times[name], times["plain"]))
            for name in ("modules", "lines")
        }
        median = {name: statistics.median(values) * 1e3 for name, values in times.items()}
        print(
            f"| {size} ({rounds} rounds) | {median['plain']:.2f} | {median['modules']:.2f} | {median['lines']:.2f} "
            f"| {ratio['modules']:.2f} | {ratio['lines']:.2f} | {records} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
