"""bench/bench_gpu.py on the CPU, one round of the medium size: the GPU check runs on a lent machine for minutes,
and its benchmark must not first fail there. No timing is asserted: only that every variant and every phase of
`capture()` after its block is measured, and that the phases' timers are taken off again."""

from __future__ import annotations

import importlib
import math

from conftest import load_bench_script

bench_gpu = load_bench_script("bench_gpu")


def test_the_gpu_bench_measures_every_variant_and_capture_phase_on_the_cpu() -> None:
    originals = {
        phase: getattr(importlib.import_module(module), attribute)
        for phase, (module, attribute) in bench_gpu.CAPTURE_PHASES.items()
    }

    row = bench_gpu.measure("medium", "float32", rounds=1, device="cpu")

    for key in ("stats_x", "full_x", "capture_stats_x", "capture_full_x"):
        assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
    assert set(row["median_ms"]) == {"plain", "stats", "full tensors", "capture() stats", "capture() full"}
    for variant in ("capture() stats", "capture() full"):
        phases = row["capture_phases_ms"][variant]
        assert set(phases) == set(bench_gpu.CAPTURE_PHASES), variant
        assert all(0 < milliseconds < row["median_ms"][variant] for milliseconds in phases.values()), phases
    table = bench_gpu.phases_table([row]).splitlines()
    assert table[0].startswith("| model | dtype | variant | capture() ms | engine ms | change check |")
    assert len(table) == 2 + 2 and "| medium | float32 | capture() full |" in table[-1]
    # the timers wrap the library's functions only while a variant runs
    for phase, (module, attribute) in bench_gpu.CAPTURE_PHASES.items():
        assert getattr(importlib.import_module(module), attribute) is originals[phase], phase
