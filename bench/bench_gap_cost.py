"""What a pause between torch ops costs the ops themselves: the diagnostic behind the medium capture overhead.

    .venv/bin/python bench/bench_gap_cost.py                 # 2 torch threads, medium Llama
    .venv/bin/python bench/bench_gap_cost.py --threads 1

Every module of the medium Llama of `bench_capture.py` gets a pre- and a post-hook that busy-waits N µs
(reading the clock, touching no tensor memory), and the forward pass is timed. `residual` is the forward's
time minus the time spent waiting: the time the torch ops themselves took. With one torch thread the residual
stays at the plain forward's time; with two, on the 2-core CI virtual machines, it grows with N: the ops
after a pause run slower, by roughly half the pause. Module capture pauses the forward at every module call
(records, statistics), so each microsecond spent in it costs about one and a half here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capture import build  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--pauses", type=int, nargs="+", default=[0, 10, 20, 40, 100], help="µs per pause")
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    model, input_ids = build("medium")
    waited = [0.0]

    def run(pause_us: int) -> tuple[float, float]:
        handles = []
        if pause_us:
            def pause(*args: object) -> None:
                started = time.perf_counter()
                while time.perf_counter() - started < pause_us * 1e-6:
                    pass
                waited[0] += time.perf_counter() - started

            for module in model.modules():
                handles.append(module.register_forward_pre_hook(pause))
                handles.append(module.register_forward_hook(pause))
        waited[0] = 0.0
        try:
            started = time.perf_counter()
            with torch.no_grad():
                model(input_ids)
            return time.perf_counter() - started, waited[0]
        finally:
            for handle in handles:
                handle.remove()

    for _ in range(3):
        for pause_us in options.pauses:
            run(pause_us)
    totals: dict[int, list[float]] = {pause: [] for pause in options.pauses}
    residuals: dict[int, list[float]] = {pause: [] for pause in options.pauses}
    for round_index in range(options.rounds):
        shift = round_index % len(options.pauses)
        for pause_us in options.pauses[shift:] + options.pauses[:shift]:
            total, waiting = run(pause_us)
            totals[pause_us].append(total)
            residuals[pause_us].append(total - waiting)
    plain = statistics.median(residuals[options.pauses[0]])
    print(f"medium Llama, {options.threads} torch thread(s), {options.rounds} rounds, a pause before and after every module call")
    print("| pause per call boundary, µs | forward ms | of which pausing, ms | residual ms | residual − plain, ms |")
    print("|---:|---:|---:|---:|---:|")
    for pause_us in options.pauses:
        residual = statistics.median(residuals[pause_us])
        total = statistics.median(totals[pause_us])
        print(f"| {pause_us} | {total * 1e3:.1f} | {(total - residual) * 1e3:.1f} | {residual * 1e3:.1f} | {(residual - plain) * 1e3:+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
