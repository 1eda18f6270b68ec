"""bench/bench_peers.py's ModelTrace rows at the tiny size for one round: the peers benchmark cannot rot unseen.

The peers themselves (TorchLens, nnsight) live in `make bench-peers`'s own environment, not in the project's venv;
here they are left out and named as such. No timing is asserted: only that every row is there and measured.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conftest import load_bench_script

bench_peers = load_bench_script("bench_peers")
rounds = load_bench_script("rounds")


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """The benchmark sets one torch thread for the process: put the suite's setting back afterwards."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_modeltrace_rows_at_tiny_size(tmp_path: Path, capsys: pytest.CaptureFixture[str], torch_threads: None):
    output = tmp_path / "peers.json"
    variants = [*bench_peers.MODELTRACE_VARIANTS, *bench_peers.DIAGNOSTIC_VARIANTS, "hf debugger safetensors"]
    assert bench_peers.main(["--sizes", "tiny", "--rounds", "1", "--json", str(output), "--variants", *variants]) == 0

    printed = capsys.readouterr().out
    summary_header = next(line for line in printed.splitlines() if line.startswith("| size |"))
    for name in variants[1:]:
        assert bench_peers.VARIANTS[name].column in summary_header
    summary_row = next(line for line in printed.splitlines() if line.startswith("| tiny (h64, 2 layers, seq 7) |"))
    ratios = [float(cell.strip().rstrip("×")) for cell in summary_row.split("|")[3:-1]]
    # every variant against the warm model's plain forward, then the CLI's two against a fresh model's
    assert len(ratios) == len(variants) - 1 + 2
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in ratios), summary_row
    for name in ("CLI stats", "CLI full"):
        assert f"{bench_peers.VARIANTS[name].column} vs a fresh model's plain forward" in summary_header

    result = json.loads(output.read_text())["sizes"][0]
    assert set(result["paired_ratio_median"]) == set(variants)
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in result["paired_ratio_median"].values())
    assert set(result["paired_ratio_to_fresh_plain_median"]) == {"CLI stats", "CLI full"}
    captured = result["captured"]
    # every ModelTrace path records the same 32 module calls of the tiny LlamaForCausalLM, and writes a trace
    assert captured["plain, fresh model"]["calls"] == 32
    for name in bench_peers.MODELTRACE_VARIANTS[2:]:
        assert captured[name]["calls"] == captured["plain"]["calls"] == 32, (name, captured[name])
        assert captured[name]["tensors"] > 0 and captured[name]["bytes_written"] > 0, (name, captured[name])
        assert f"| {name} | {captured[name]['what']}" in printed
    # full tensors store the parameters once per trace (the engine alone stores none): more bytes than statistics
    assert captured["capture() full"]["bytes_written"] > captured["capture() stats"]["bytes_written"]
    assert captured["hf debugger safetensors"]["tensors"] > 0
    # the floor measures every call's output; the C prototype records the engine's calls and tensors
    assert captured[bench_peers.FLOOR]["calls"] == 32 and captured[bench_peers.FLOOR]["tensors"] > 0
    prototype = captured[bench_peers.CORE_PROTOTYPE]
    assert prototype["calls"] == 32 and prototype["tensors"] == captured["engine stats"]["tensors"], prototype


def test_missing_peers_are_named_not_failed():
    missing = bench_peers.missing_packages(list(bench_peers.VARIANTS))
    assert set(missing.values()) <= {"torchlens", "nnsight"}
    for name, package in missing.items():
        assert importlib.util.find_spec(package) is None, name


def test_each_round_runs_every_variant_once_after_varied_predecessors():
    names = list(bench_peers.VARIANTS)
    orders = rounds.round_order(names, 41)
    assert orders == rounds.round_order(names, 41)  # the same orders in every run: two runs compare
    assert all(sorted(order) == sorted(names) for order in orders)
    # a rotation gave each variant one predecessor for all rounds (what ran before a call moves its time)
    predecessors: dict[str, set[str]] = {name: set() for name in names}
    for order in orders:
        for before, after in zip(order, order[1:]):
            predecessors[after].add(before)
    assert all(len(before) >= len(names) // 2 for before in predecessors.values()), predecessors
