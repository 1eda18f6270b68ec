"""Cost of `modeltrace diff` on CPU: statistics-only diff of two 5,000-module traces, and full-tensor diff of the
medium Llama against the time it takes just to read both tensor sets.

    .venv/bin/python bench/bench_diff.py            # prints a markdown table
    .venv/bin/python bench/bench_diff.py --quick    # fewer rounds
    .venv/bin/python bench/bench_diff.py --json bench/results/diff.json

- `stats 5k`: two synthetic traces of 5,000 module calls each (a transformer-like tree: 249 blocks of 20 calls
  and a few more, one to four input tensors and one or two output tensors per call, statistics only), the
  candidate's numbers perturbed by 1e-5 up to an activation in the middle block, and by 0.5 from there on (so
  half of the modules mismatch, as downstream of a real bug). Timed: `diff_traces` on the loaded traces
  (alignment, comparison, first divergence), then the same plus `to_json`, then the whole of
  `load_reference` ×2 + `diff_traces` (reading both traces from disk included).
- `medium Llama full`: `LlamaModel` hidden 512, intermediate 1536, 8 layers, 8 heads (4 KV heads), sequence
  128, random weights (seed 0), traced with full tensors; the candidate is the same model with RMSNorm epsilon
  1e-5 instead of 1e-6, so every tensor after the first norm differs a little. Timed: reading both
  `tensors.safetensors` with `safetensors.numpy.load_file` (the baseline), and `load_reference` ×2 +
  `diff_traces` (full-tensor comparison of every input and output), and `diff_traces` alone on traces opened
  beforehand (tensor data is read from the memory maps during the diff), and that once more with and without
  the compiled comparison kernel (`diff/native`; `MODELTRACE_NATIVE=0` is numpy's path), alternated round by
  round. Files are in the page cache for all.

- `medium Llama full + replay`: the same pair, its first 8 differing modules re-run on the reference's inputs
  (`run_replay` with a warm worker). Two cases: the editor's, where the candidate was just traced (from a
  recipe: the same model, seed 0) by the same worker, which kept the model and its calls' arguments
  (`keep_for_replay`), so the suspects are called again directly; and the CLI's (`modeltrace diff --replay`),
  where the worker rebuilds the candidate and runs its forward up to the last suspect. Timed: `load_reference`
  ×2 + `diff_traces` + `run_replay` against reading both tensor sets (target ≤ 3×); and, for the rebuild,
  inside the worker, the replayed modules' extra calls against their own live calls in the same forward
  (target: the replay adds at most the cost of running them once).

Best and median over rounds, after a warm-up; the best is what the code costs, the median what a busy machine
(these run next to other work) adds to it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from modeltrace.diff import DiffOptions, diff_traces, load_reference, native, to_json
from modeltrace.trace.records import ModuleCall, TensorSummary, Trace
from modeltrace.trace.storage import TENSORS_FILE, write_trace
from modeltrace.trace.tensors import LoadedTrace


def _time_ms(function, rounds: int) -> tuple[float, float]:
    """(best, median) wall time over `rounds` calls after a warm-up."""
    function()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return min(times), statistics.median(times)


# ------------------------------------------------------------------------------------- synthetic 5k traces


BLOCK = [
    "",
    "input_layernorm",
    "self_attn",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp",
    "mlp.gate_proj",
    "mlp.act_fn",
    "mlp.up_proj",
    "mlp.down_proj",
    "adapter",
    "adapter.down",
    "adapter.act",
    "adapter.up",
    "gate",
    "gate.proj",
    "gate.act",
]


def synthetic_traces(modules: int = 5000, seed: int = 0) -> tuple[Trace, Trace]:
    rng = random.Random(seed)
    ref_records: list[ModuleCall] = []
    cand_records: list[ModuleCall] = []

    def summary(key: str, perturb: float = 0.0) -> tuple[TensorSummary, TensorSummary]:
        mean, std = rng.gauss(0, 0.1), rng.uniform(0.5, 2.0)
        low, high = mean - 3 * std, mean + 3 * std
        ref = TensorSummary(
            key, [1, 128, 512], "float32", mean=mean, std=std, min=low, max=high, abs_max=max(abs(low), abs(high))
        )
        cand = TensorSummary(
            key,
            [1, 128, 512],
            "float32",
            mean=mean + perturb,
            std=std + perturb,
            min=low + perturb,
            max=high + perturb,
            abs_max=max(abs(low), abs(high)),
        )
        return ref, cand

    def add(path: str, parent: int) -> int:
        index = len(ref_records)
        for records in (ref_records, cand_records):
            records.append(ModuleCall(index, path, "Module", None, None, 0, parent))
        return index

    root = add("", -1)
    blocks = (modules - 1) // len(BLOCK)
    diverging = blocks // 2
    finished = 0
    for block in range(blocks):
        stack: list[tuple[str, int]] = []
        for name in BLOCK:
            path = f"layers.{block}" + (f".{name}" if name else "")
            depth = name.count(".") + (1 if name else 0)
            while len(stack) > depth:
                _, closed = stack.pop()
                ref_records[closed].finish_order = cand_records[closed].finish_order = finished
                finished += 1
            parent = stack[-1][1] if stack else root
            index = add(path, parent)
            stack.append((path, index))
            # From the activation of the middle block on, every tensor differs (what a real bug does downstream).
            after = block > diverging or (block == diverging and BLOCK.index(name) > BLOCK.index("mlp.act_fn"))
            perturb = 0.5 if after or (block == diverging and name == "mlp.act_fn") else 1e-5
            for position in range(rng.randint(1, 4)):
                ref, cand = summary(f"args.{position}" if position else "hidden_states", 0.5 if after else 1e-5)
                ref_records[index].inputs.append(ref)
                cand_records[index].inputs.append(cand)
            for position in range(rng.randint(1, 2)):
                ref, cand = summary(str(position) if position else "", perturb)
                ref_records[index].outputs.append(ref)
                cand_records[index].outputs.append(cand)
        while stack:
            _, closed = stack.pop()
            ref_records[closed].finish_order = cand_records[closed].finish_order = finished
            finished += 1
    while len(ref_records) < modules:  # top up to exactly `modules` calls with leaf modules after the blocks
        index = add(f"heads.{len(ref_records)}", root)
        ref, cand = summary("hidden_states", 1e-5)
        ref_records[index].inputs.append(ref)
        cand_records[index].inputs.append(cand)
        ref, cand = summary("", 1e-5)
        ref_records[index].outputs.append(ref)
        cand_records[index].outputs.append(cand)
        ref_records[index].finish_order = cand_records[index].finish_order = finished
        finished += 1
    ref_records[root].finish_order = cand_records[root].finish_order = finished
    return Trace(model={"class": "Synthetic"}, modules=ref_records), Trace(
        model={"class": "Synthetic"}, modules=cand_records
    )


def bench_statistics(rounds: int, folder: Path) -> dict[str, float]:
    reference, candidate = synthetic_traces()
    ref_loaded = LoadedTrace(reference, None, Path("reference"), "modeltrace")
    cand_loaded = LoadedTrace(candidate, None, Path("candidate"), "modeltrace")
    result = diff_traces(ref_loaded, cand_loaded)
    assert result.first_divergence is not None and result.first_divergence.module.candidate.path.endswith("act_fn")
    ref_path = write_trace(reference, folder / "ref5k.mtrace")
    cand_path = write_trace(candidate, folder / "cand5k.mtrace")

    def from_disk() -> None:
        with load_reference(ref_path) as ref, load_reference(cand_path) as cand:
            diff_traces(ref, cand)

    return {
        "modules": len(reference.modules),
        "leaves": sum(len(record.inputs) + len(record.outputs) for record in reference.modules),
        "diff_ms": _time_ms(lambda: diff_traces(ref_loaded, cand_loaded), rounds),
        "diff_json_ms": _time_ms(lambda: to_json(diff_traces(ref_loaded, cand_loaded)), rounds),
        "read_and_diff_ms": _time_ms(from_disk, rounds),
    }


# ------------------------------------------------------------------------------------------ medium Llama


RECIPE = """
import torch
from transformers import LlamaConfig, LlamaModel


def build_model():
    config = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, attn_implementation="eager",
                         use_cache=False, rms_norm_eps={eps})
    return LlamaModel(config).eval()


def build_inputs(model):
    return {{"input_ids": torch.randint(0, 1024, (1, 128), generator=torch.Generator().manual_seed(0))}}
"""


def _llama_trace(folder: Path, name: str, eps: float) -> Path:
    """A full-tensor trace of the medium Llama, built by a recipe (written next to it) as the worker builds
    it, so that a replay can rebuild it."""
    import torch
    from safetensors.torch import save_file

    from modeltrace.worker.building import build_from_recipe
    from modeltrace.worker.capture import ModuleCapture

    recipe = folder / f"recipe_{name.split('.')[0]}.py"
    recipe.write_text(RECIPE.format(eps=eps))
    built = build_from_recipe(recipe, 0)
    with torch.no_grad(), ModuleCapture(built.model, full_tensors=True) as capture:
        built.model(*built.args, **built.kwargs)
    trace = Trace(
        model={
            "class": "LlamaModel",
            "file": str(recipe),
            "recipe": str(recipe),
            "options": {"seed": 0, "dtype": "float32", "device": "cpu"},
        },
        modules=capture.records,
    )
    return write_trace(trace, folder / name, lambda target: save_file(capture.tensors, str(target / TENSORS_FILE)))


def bench_full(rounds: int, folder: Path) -> dict[str, float]:
    from safetensors.numpy import load_file

    reference = _llama_trace(folder, "ref.mtrace", 1e-6)
    candidate = _llama_trace(folder, "cand.mtrace", 1e-5)
    ref_tensors, cand_tensors = reference / TENSORS_FILE, candidate / TENSORS_FILE

    def read_both() -> None:
        load_file(str(ref_tensors))
        load_file(str(cand_tensors))

    def diff_both(target: Path) -> None:
        with load_reference(reference) as ref, load_reference(target) as cand:
            diff_traces(ref, cand, DiffOptions())

    def diff_only() -> float:
        """diff_traces on freshly opened traces (their tensors not yet paged in), the opening not timed."""
        with load_reference(reference) as ref, load_reference(candidate) as cand:
            started = time.perf_counter()
            diff_traces(ref, cand, DiffOptions())
            return (time.perf_counter() - started) * 1000

    diff_only()
    only = [diff_only() for _ in range(rounds)]
    # the compiled comparison kernel (diff/native) against numpy's path, alternated round by round
    with_kernel, with_numpy = [], []
    saved = os.environ.get("MODELTRACE_NATIVE")
    for _ in range(rounds):
        for setting, times in (("1", with_kernel), ("0", with_numpy)):
            os.environ["MODELTRACE_NATIVE"] = setting
            times.append(diff_only())
    # NOTE: the rest of the benchmark runs with the user's setting (the loop variable must not leak into it)
    if saved is None:
        os.environ.pop("MODELTRACE_NATIVE")
    else:
        os.environ["MODELTRACE_NATIVE"] = saved

    with load_reference(reference) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand)
        divergence = result.first_divergence.module.candidate.path
        modules = len(ref.trace.modules)
        tensors = len(ref.tensors.file.names())
    return {
        "modules": modules,
        "tensors_per_trace": tensors,
        "bytes_per_trace": ref_tensors.stat().st_size,
        "first_divergence": divergence,
        "read_both_ms": _time_ms(read_both, rounds),
        "diff_ms": _time_ms(lambda: diff_both(candidate), rounds),
        "diff_identical_ms": _time_ms(lambda: diff_both(reference), rounds),
        "diff_only_ms": (min(only), statistics.median(only)),
        "kernel": native.kernels() is not None,
        "kernel_vs_numpy": statistics.median(k / n for k, n in zip(with_kernel, with_numpy)),
        "diff_only_numpy_ms": (min(with_numpy), statistics.median(with_numpy)),
    }


def bench_replay(rounds: int, folder: Path, full: dict) -> dict:
    from safetensors.numpy import load_file

    from modeltrace.diff import close_result, diff_paths, run_replay
    from modeltrace.worker.client import WorkerClient
    from modeltrace.worker.messages import TraceRequest

    reference, candidate = folder / "ref.mtrace", folder / "cand.mtrace"
    recipe = folder / "recipe_cand.py"

    def timed(
        target: Path, worker: WorkerClient, paired: dict[str, list[float]] | None = None
    ) -> tuple[tuple[float, float], tuple[float, float], float, list[dict]]:
        """(read both activation tensor sets, load both + diff + replay, the median of their per-round ratio, the
        replays' timings) against candidate `target`: the two are timed back to back in each round, so that the
        ratio of one round compares like with like on a machine whose load changes between rounds. The baseline
        reads `candidate`'s tensors, the same activations as `target`'s: a trace run by the worker also stores the
        weights, which the reference here has none of to compare with. With `paired`, each round also times the
        replay after the whole diff, as the previous release ran it (`paired["after"]`), and load both + the same
        diff without a replay (`paired["plain"]`; `paired["added"]`: what the replay adds, round by round)."""
        timings: list[dict] = []
        reads, totals = [], []

        def read_both() -> None:
            load_file(str(reference / TENSORS_FILE))
            load_file(str(candidate / TENSORS_FILE))

        def diff_and_replay() -> None:
            # as the editor and the CLI run it: the replay starts once the comparison has named the suspects
            result = diff_paths(reference, target, replay=True, client=worker)
            try:
                assert result.replayed, result.notes
                timings.append(result.replay_timing)
            finally:
                close_result(result)

        def replay_after_diff() -> None:
            with load_reference(reference) as ref, load_reference(target) as cand:
                result = diff_traces(ref, cand, DiffOptions())
                run_replay(result, worker)
                assert result.replayed and not result.replay_timing["started_during_diff"], result.notes

        def diff_without_replay() -> None:
            close_result(diff_paths(reference, target))

        steps = [(read_both, reads), (diff_and_replay, totals)]
        if paired is not None:
            steps += [(diff_without_replay, paired["plain"]), (replay_after_diff, paired["after"])]
            replay_after_diff(), diff_without_replay()
        read_both(), diff_and_replay()  # warm-up
        timings.clear()
        for _ in range(rounds):
            for function, times in steps:
                started = time.perf_counter()
                function()
                times.append((time.perf_counter() - started) * 1000)
        if paired is not None:
            paired["added"] = [total - plain for total, plain in zip(totals, paired["plain"])]
        ratio = statistics.median(total / read for total, read in zip(totals, reads))
        return (min(reads), statistics.median(reads)), (min(totals), statistics.median(totals)), ratio, timings

    with WorkerClient() as worker:
        worker.start()
        # the editor's case: the diff follows the candidate's trace, whose worker child kept the model
        kept_trace = Path(
            worker.trace(
                TraceRequest(
                    file=str(recipe),
                    recipe=str(recipe),
                    full_tensors=True,
                    timeout=600,
                    out=str(folder / "cand_kept.mtrace"),
                    keep_for_replay=True,
                )
            ).trace
        )
        paired: dict[str, list[float]] = {"after": [], "plain": []}
        kept_read, kept_total, kept_ratio, kept_timings = timed(kept_trace, worker, paired)
        assert all(timing["kept"] for timing in kept_timings)
        # the CLI's case (`modeltrace diff --replay`): no trace ran in this worker, the candidate is rebuilt
        worker.trace(TraceRequest(file=str(recipe), recipe=str(recipe), timeout=600, out=str(folder / "other.mtrace")))
        read_both_ms, total_ms, ratio, timings = timed(candidate, worker)
        assert not any(timing["kept"] for timing in timings)
    best = min(timings, key=lambda timing: timing["seconds"])
    best_kept = min(kept_timings, key=lambda timing: timing["seconds"])
    replayed = sum(seconds for seconds, _ in best["modules"].values() if seconds)
    live = sum(seconds for _, seconds in best["modules"].values() if seconds)
    return {
        "read_both_ms": read_both_ms,
        "diff_replay_ms": total_ms,
        "kept_read_both_ms": kept_read,
        "kept_diff_replay_ms": kept_total,
        "kept_ratio": kept_ratio,
        "ratio": ratio,
        "kept_worker_ms": best_kept["seconds"] * 1000,
        "kept_direct": len(best_kept["direct"]),
        "kept_started_during_diff": sum(bool(timing.get("started_during_diff")) for timing in kept_timings),
        "kept_rounds": len(kept_timings),
        "kept_after_diff_ms": (min(paired["after"]), statistics.median(paired["after"])),
        "kept_diff_only_ms": (min(paired["plain"]), statistics.median(paired["plain"])),
        "kept_replay_adds_ms": statistics.median(paired["added"]),
        "kept_replayed_calls_ms": sum(replayed for replayed, _ in best_kept["modules"].values() if replayed) * 1000,
        "replayed_modules": len(best["modules"]),
        "worker_ms": best["seconds"] * 1000,
        "rebuild_ms": best["build_seconds"] * 1000,
        "replayed_calls_ms": replayed * 1000,
        "live_calls_ms": live * 1000,
        "diff_ms": full["diff_ms"],
    }


def _cell(times: tuple[float, float], baseline: tuple[float, float] | None = None) -> str:
    best, median = times
    text = f"{best:.1f} ({median:.1f})"
    if baseline is not None:
        text += f" — {best / baseline[0]:.2f}× ({median / baseline[1]:.2f}×)"
    return text


def markdown(stats: dict, full: dict, replay: dict | None = None) -> str:
    rows = (
        []
        if replay is None
        else [
            f"| medium Llama, full tensors, with replay of {replay['replayed_modules']} modules, after the candidate's "
            f"trace in the same worker (the editor) | load both + diff + replay "
            f"({replay['kept_direct']} modules called directly, worker {replay['kept_worker_ms']:.0f} ms; started "
            f"during the diff in {replay['kept_started_during_diff']} of {replay['kept_rounds']} rounds) | "
            f"{_cell(replay['kept_diff_replay_ms'])}, reading both {_cell(replay['kept_read_both_ms'])}; paired "
            f"ratio {replay['kept_ratio']:.2f}× | ≤ 3× |",
            f"| | the same with the replay after the whole diff (the previous release), alternated with it | "
            f"{_cell(replay['kept_after_diff_ms'])} | |",
            f"| | load both + the same diff without replay, alternated with it; what the replay adds (median of the "
            f"rounds' differences) against the replayed calls' own time | {_cell(replay['kept_diff_only_ms'])}; adds "
            f"{replay['kept_replay_adds_ms']:.1f} ms, calls {replay['kept_replayed_calls_ms']:.1f} ms | adds ≤ the "
            "calls (+ noise) |",
            f"| the same, the candidate rebuilt by the worker (`modeltrace diff --replay`) | "
            f"load both + diff + replay | {_cell(replay['diff_replay_ms'])}, reading both {_cell(replay['read_both_ms'])}; "
            f"paired ratio {replay['ratio']:.2f}× | |",
            f"| | in the worker: rebuild {replay['rebuild_ms']:.0f} ms, whole job {replay['worker_ms']:.0f} ms; the "
            f"replayed modules' extra calls against their live calls in the same forward | "
            f"{replay['replayed_calls_ms']:.1f} vs {replay['live_calls_ms']:.1f} — "
            f"{replay['replayed_calls_ms'] / max(replay['live_calls_ms'], 1e-9):.2f}× | ≤ 1× (+ noise) |",
        ]
    )
    return "\n".join(
        [
            "| benchmark | measure | best (median) ms | target |",
            "|---|---|---:|---|",
            f"| stats-only, {stats['modules']} module calls ({stats['leaves']} tensor leaves) each | diff_traces | "
            f"{_cell(stats['diff_ms'])} | ≤ 100 ms |",
            f"| | diff_traces + to_json | {_cell(stats['diff_json_ms'])} | |",
            f"| | load both from disk + diff | {_cell(stats['read_and_diff_ms'])} | |",
            f"| medium Llama, full tensors ({full['tensors_per_trace']} tensors, "
            f"{full['bytes_per_trace'] / 2**20:.0f} MiB per trace) | read both tensor sets (safetensors.numpy) | "
            f"{_cell(full['read_both_ms'])} | baseline |",
            f"| | load both + diff, candidate diverges at `{full['first_divergence']}` | "
            f"{_cell(full['diff_ms'], full['read_both_ms'])} | ≤ 2× |",
            f"| | load both + diff, identical traces | {_cell(full['diff_identical_ms'], full['read_both_ms'])} "
            "| ≤ 2× |",
            f"| | diff_traces alone, diverging (tensors paged in during the diff, trace.msgpack reading excluded) | "
            f"{_cell(full['diff_only_ms'], full['read_both_ms'])} | ≤ 2× |",
            f"| | the same without the compiled comparison kernel (numpy), paired | "
            f"{_cell(full['diff_only_numpy_ms'], full['read_both_ms'])}; kernel/numpy {full['kernel_vs_numpy']:.2f}× "
            f"(kernel {'on' if full['kernel'] else 'unavailable'}) | |",
            *rows,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--no-replay", action="store_true", help="skip the replay benchmark (starts a worker)")
    arguments = parser.parse_args(argv)
    rounds = 3 if arguments.quick else 15
    with tempfile.TemporaryDirectory() as folder:
        stats = bench_statistics(rounds, Path(folder))
        full = bench_full(max(3, rounds // 2), Path(folder))
        replay = None if arguments.no_replay else bench_replay(max(9, rounds // 2), Path(folder), full)
    print(markdown(stats, full, replay))
    if arguments.json:
        Path(arguments.json).parent.mkdir(parents=True, exist_ok=True)
        Path(arguments.json).write_text(json.dumps({"statistics": stats, "full": full, "replay": replay}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
