"""What recording how modules were built costs: the construction hook while the model is built, and the
settings and parameter fingerprints read once per trace after the forward (`worker/builds.py`), next to the
forward pass itself, on bench_capture's tiny and medium Llama; and the diff's settings/parameter comparison.

Run: .venv/bin/python bench/bench_builds.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_capture import SIZES, build  # noqa: E402

from modeltrace.diff.settings import compare_parameters, compare_settings  # noqa: E402
from modeltrace.worker.builds import ConstructionRecorder, record_builds  # noqa: E402


ROUNDS = 5


def _median_seconds(action, rounds: int = ROUNDS) -> float:  # noqa: ANN001
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"{'size':<8} {'build':>9} {'build+hook':>11} {'forward':>9} {'builds':>9} {'diff':>9}  modules")
    for size in SIZES:
        plain_build = _median_seconds(lambda: build(size))

        def hooked_build() -> None:
            with ConstructionRecorder():
                build(size)

        hooked = _median_seconds(hooked_build)
        with ConstructionRecorder() as constructions:
            model, input_ids = build(size)
        with torch.no_grad():
            forward = _median_seconds(lambda: model(input_ids))
        recorded = _median_seconds(lambda: record_builds(model, constructions))
        builds = record_builds(model, constructions)

        def compare() -> None:
            for build_record in builds:
                compare_settings(build_record, build_record)
                compare_parameters(build_record, build_record)

        compared = _median_seconds(compare)
        print(
            f"{size:<8} {plain_build * 1e3:>7.1f}ms {hooked * 1e3:>9.1f}ms {forward * 1e3:>7.1f}ms "
            f"{recorded * 1e3:>7.1f}ms {compared * 1e3:>7.1f}ms  {len(builds)}"
        )


if __name__ == "__main__":
    main()
