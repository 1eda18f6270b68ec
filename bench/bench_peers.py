"""Capture cost against peers: every ModelTrace path next to transformers' debugger, TorchLens and nnsight, as
paired ratios to a plain forward of the same seeded Llama, in one run.

    make bench-peers                                    # its own environment (build/peers-venv), tiny and medium
    make bench-peers PEERS_ARGS="--sizes tiny medium large --rss --json build/bench-peers.json"
    OMP_NUM_THREADS=1 build/peers-venv/bin/python bench/bench_peers.py --sizes tiny --rounds 5

It runs in an environment of its own (`make bench-peers` makes build/peers-venv, never the project's .venv): the
pinned CPU torch, the project installed from this checkout (non-editable), transformers as requirements.lock pins
it, torchlens 2.36.1 and nnsight 0.8.1 (bench/peers-constraints.txt). A peer that is not installed is left out
and named in the output, so the ModelTrace rows also run in the project's venv (tests/python/test_bench_peers.py).

Model: `LlamaForCausalLM` from a `LlamaConfig` (random weights, seed 0, eager attention, use_cache=False,
vocabulary 1024, batch 1), eval mode, float32, under `torch.no_grad()`, one torch thread (`LLAMA_SIZES`).

Variants (`VARIANTS`), each timed from before entering the tool to after it returned or its block exited, files
written included; each call gets a fresh temporary folder, with `gc.collect()` and `os.sync()` before the timer
starts (so that a call pays for its own garbage and writes only) and the folder removed after it stops; what a
call returns is kept until its timer stops. The objects alive after the warm-up are frozen (`gc.freeze`), so that
those collections take milliseconds:

- `plain`: `model(input_ids)`.
- `plain, fresh model`: the first forward of a model just built from the CLI rows' recipe (the build untimed),
  the baseline the CLI rows are also given against (the summary's last columns): the CLI's job builds a fresh
  model and runs its first forward, which can cost more than the warm model's nth.
- `capture() stats` / `capture() full`: `modeltrace.capture(model, path[, full_tensors=True])` around the forward,
  as a script or a notebook calls it (construction records, parameters, source hashes; flushed to the disk at exit).
- `engine stats` / `engine full`: the capture engine alone, as bench/bench_capture.py times it for the worker
  (`ModuleCapture`, then the trace written, not fsynced; no construction records, parameters or source hashes).
- `CLI stats` / `CLI full`: the job the CLI's worker and the editor's worker run (`worker/job.run_trace_job`) on a
  recipe that builds this model, in this process, timed from the job's "running …forward" step (the model built
  and placed) to the trace written. Not timed: the worker process's start and imports, the model's build (which
  a user pays without ModelTrace too), and the fsync the worker does after it has answered.
- `floor: output statistics` (diagnostic): bench_capture.py's floor row, ModuleCapture's wrapping and per call
  the module's path, its output's shape and the kernel's moments in a list, written as one file: the least any
  statistics trace of every module call costs. Left out where the native kernel is not built.
- `C core prototype` (diagnostic): bench/capture_core.py, a per-call core in C recording what the engine records
  (call tree, call sites, keyed input and output statistics) as rows of plain values, written as one file: what the
  engine would cost with its per-call path out of the interpreter (tests/python/test_bench_capture_core.py checks it
  records the same). Left out where it cannot be built (no C compiler or Python headers).
- `hf debugger repr` / `hf debugger safetensors`: transformers' `model_addition_debugger_context(model,
  debug_path, do_prune_layers=False, use_repr=True / False)`.
- `torchlens all` / `torchlens none`: `torchlens.trace(model, input_ids, capture=CaptureOptions(layers_to_save=
  "all" / None))`: every torch op's output copied and kept in memory / the op graph alone. (TorchLens'
  `structure_only=True` refuses LlamaForCausalLM: transformers' mask code reads a tensor's value.)
- `nnsight layers` / `nnsight all modules`: `with NNsight(model).trace(input_ids)`, `.output.save()` on each
  decoder layer / on every module the forward calls, in the order their calls finish (nnsight needs execution
  order): references to the outputs, nothing copied, no statistics, nothing written.

Timing: plain forwards before any tool touched the model, a warm-up round of every variant, then R rounds, each
running every variant once in an order shuffled anew each round (`round_order`, seeded: the same orders every
run), so that load noise hits all alike, each timed call right after an untimed call of the same variant
(`time_once`). What ran just before a call moves its time: at tiny a plain forward took 1.21 ms after a plain
forward and 1.59 ms after the CLI's full-tensors job, at medium `capture()` 100-102 ms after most variants and
110 ms after a fresh model's build. A rotation gave each variant the same predecessor in every round, so that
each ratio carried its own predecessor's effect; settled, every variant is timed as it runs in a loop of its
own, as a user runs it (docs/benchmarks.md, "What ran before a call"). Reported: the median over
rounds of each variant's time divided by plain's time in the same round (min–max beside it), and median ms.
What each tool captured comes from one more, untimed call of each. The 1-minute load average is read before,
after every round and after the run: on a shared machine only a low load means anything.

`--rss` also measures, per size and variant, the peak resident memory (VmHWM) of one call in a fresh process
that built the model and ran the variant once (imports, TorchLens' wrapping of torch, nnsight's compile), then
reset the peak (`/proc/self/clear_refs` = 5) and ran it once more, its result kept until the peak is read.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import modeltrace
from rounds import round_order

BENCH_FOLDER = Path(__file__).resolve().parent
VOCAB = 1024
SEED = 0


@dataclass(frozen=True)
class LlamaSize:
    """One model size of the issue's table, and the rounds that keep a run of it to a few minutes."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    sequence: int
    rounds: int

    def label(self) -> str:
        return f"h{self.hidden}, {self.layers} layers, seq {self.sequence}"

    def config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            attn_implementation="eager",
            use_cache=False,
        )


LLAMA_SIZES = {
    "tiny": LlamaSize(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, sequence=7, rounds=41),
    "medium": LlamaSize(hidden=512, intermediate=1536, layers=8, heads=8, kv_heads=4, sequence=128, rounds=25),
    "large": LlamaSize(hidden=1024, intermediate=3072, layers=12, heads=16, kv_heads=8, sequence=256, rounds=9),
}


def build_llama(size: str) -> tuple[LlamaForCausalLM, torch.Tensor]:
    """The seeded model of `size` in eval mode and its input ids (the recipe of the CLI rows builds the same)."""
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LLAMA_SIZES[size].config()).eval().to(torch.float32)
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, VOCAB, (1, LLAMA_SIZES[size].sequence), generator=generator)
    return model, input_ids


# NOTE: the CLI rows' recipe: `--recipe` is how a user hands the CLI a model no modeling file builds by itself
RECIPE = '''"""The bench_peers model for the CLI rows: LlamaForCausalLM {label}."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    return LlamaForCausalLM(LlamaConfig(**{config!r})).to(torch.float32)


def build_inputs(model):
    return (torch.randint(0, {vocab}, (1, {sequence}), generator=torch.Generator().manual_seed({seed})),)
'''


@functools.cache
def _bench_capture_module() -> Any:
    """bench/bench_capture.py, whose `_modeltrace` is the engine as the worker runs it (so both benches time the
    same thing); loaded by path, as bench/ is no package."""
    spec = importlib.util.spec_from_file_location("bench_capture", BENCH_FOLDER / "bench_capture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "_modeltrace", None)):
        raise RuntimeError("bench/bench_capture.py has no _modeltrace(model, input_ids, folder, full_tensors)")
    return module


class SizeBench:
    """A size's model and input, its module paths in the order their calls finish, the CLI's recipe file and
    (built on first use) the nnsight wrapper with its envoys."""

    def __init__(self, size: str) -> None:
        self.size = size
        self.model, self.input_ids = build_llama(size)
        finish_order: list[str] = []
        handles = [
            module.register_forward_hook(lambda _module, _args, _output, path=path: finish_order.append(path))
            for path, module in self.model.named_modules()
        ]
        with torch.no_grad():
            self.model(self.input_ids)
        for handle in handles:
            handle.remove()
        self.finish_order = finish_order
        self.folder = Path(tempfile.mkdtemp(prefix=f"bench_peers_{size}_"))
        layout = LLAMA_SIZES[size]
        self.recipe = self.folder / f"recipe_llama_{size}.py"
        self.recipe.write_text(
            RECIPE.format(
                label=layout.label(),
                config=layout.config().to_dict(),
                vocab=VOCAB,
                sequence=layout.sequence,
                seed=SEED,
            )
        )
        self._recipe_module: Any = None
        self._nnsight_model: Any = None
        self.nnsight_layer_envoys: list[Any] = []
        self.nnsight_all_envoys: list[Any] = []

    def recipe_module(self) -> Any:
        """The CLI's recipe file as a module (loaded once), for the fresh model's plain forward."""
        if self._recipe_module is None:
            spec = importlib.util.spec_from_file_location(f"bench_peers_recipe_{self.size}", self.recipe)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._recipe_module = module
        return self._recipe_module

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        gc.unfreeze()  # NOTE: what `freeze_setup_objects` froze (this size's model among it) can go again

    def nnsight_model(self) -> Any:
        if self._nnsight_model is None:
            from nnsight import NNsight

            self._nnsight_model = NNsight(self.model)
            self.nnsight_all_envoys = [self._envoy(path) for path in self.finish_order]
            self.nnsight_layer_envoys = [
                self._envoy(f"model.layers.{index}") for index in range(self.model.config.num_hidden_layers)
            ]
        return self._nnsight_model

    def _envoy(self, path: str) -> Any:
        envoy = self._nnsight_model
        for part in filter(None, path.split(".")):
            envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
        return envoy


@dataclass
class Untimed:
    """A variant's result with seconds inside its call that are not its cost (the CLI rows: the model's build)."""

    seconds: float
    result: Any = None


def run_plain(bench: SizeBench, folder: Path) -> Any:
    with torch.no_grad():
        return bench.model(bench.input_ids)


def run_plain_fresh(bench: SizeBench, folder: Path) -> Untimed:
    """The CLI rows' baseline: the first forward of a model just built by the CLI's recipe (seeded and put in
    eval mode as the worker's recipe build does), the build untimed. A fresh model's first forward can cost more
    than the warm model's nth (at the large size 1.06x in one run of 5 builds, 1.01x in session 18's peers run),
    and the CLI's job runs exactly that one; a user running the model once without ModelTrace pays it too."""
    started = time.perf_counter()
    recipe = bench.recipe_module()
    torch.manual_seed(SEED)
    model = recipe.build_model().eval()
    torch.manual_seed(SEED)
    inputs = recipe.build_inputs(model)
    forward_started = time.perf_counter()
    with torch.no_grad():
        output = model(*inputs)
    # NOTE: the model returned too, freed after the timer stops: the CLI's job keeps its model past its answer
    # (a worker's child ends with `os._exit`, and freeing a medium model's weights takes ~5 ms), and so does this
    return Untimed(forward_started - started, (output, model))


def run_capture(bench: SizeBench, folder: Path, full_tensors: bool) -> Any:
    with torch.no_grad(), modeltrace.capture(bench.model, folder / "api.mtrace", full_tensors=full_tensors) as session:
        bench.model(bench.input_ids)
    return session


def run_engine(bench: SizeBench, folder: Path, full_tensors: bool) -> None:
    # NOTE: the module is loaded once (functools.cache), on the warm-up call, never inside a timed call
    _bench_capture_module()._modeltrace(bench.model, bench.input_ids, folder, full_tensors)


def run_floor(bench: SizeBench, folder: Path) -> None:
    _bench_capture_module()._floor(bench.model, bench.input_ids, folder)


def _floor_unavailable() -> str | None:
    return None if _bench_capture_module()._FLOAT32_KERNEL is not None else "no native statistics kernel"


@functools.cache
def _capture_core_module() -> Any:
    """bench/capture_core.py (the C prototype), loaded once, on the warm-up call."""
    spec = importlib.util.spec_from_file_location("capture_core", BENCH_FOLDER / "capture_core.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["capture_core"] = module
    spec.loader.exec_module(module)
    return module


def run_core_prototype(bench: SizeBench, folder: Path) -> None:
    _capture_core_module().run_core(bench.model, bench.input_ids, folder)


def run_cli_job(bench: SizeBench, folder: Path, full_tensors: bool) -> Untimed:
    from modeltrace.worker.job import run_trace_job
    from modeltrace.worker.messages import TraceRequest

    started = time.perf_counter()
    forward_started: list[float] = []

    def progress(message: str) -> None:
        # NOTE: the job says "running <class>.forward" once the model is built and placed: what comes after is
        # what the CLI adds to the user's forward
        if message.startswith("running ") and not forward_started:
            forward_started.append(time.perf_counter())

    request = TraceRequest(
        file=str(bench.recipe), recipe=str(bench.recipe), out=str(folder / "cli.mtrace"), full_tensors=full_tensors
    )
    result = run_trace_job(request, progress)
    if not forward_started:
        raise RuntimeError("the worker's job no longer reports 'running …forward': the CLI rows cannot be timed")
    return Untimed(forward_started[0] - started, result)


def run_hf_debugger(bench: SizeBench, folder: Path, use_repr: bool) -> None:
    from transformers.model_debugging_utils import model_addition_debugger_context

    debugger = model_addition_debugger_context(
        bench.model, debug_path=str(folder / "debug"), do_prune_layers=False, use_repr=use_repr
    )
    with torch.no_grad(), debugger:
        bench.model(bench.input_ids)


def run_torchlens(bench: SizeBench, folder: Path, layers_to_save: str | None) -> Any:
    import torchlens
    from torchlens.options import CaptureOptions

    with torch.no_grad():
        return torchlens.trace(bench.model, bench.input_ids, capture=CaptureOptions(layers_to_save=layers_to_save))


def run_nnsight(bench: SizeBench, folder: Path, every_module: bool) -> list[Any]:
    model = bench.nnsight_model()
    envoys = bench.nnsight_all_envoys if every_module else bench.nnsight_layer_envoys
    saved = []
    with torch.no_grad(), model.trace(bench.input_ids):
        for envoy in envoys:
            saved.append(envoy.output.save())
    return saved


@dataclass(frozen=True)
class Variant:
    """One row: how it runs, the package it needs beyond the project, and its column in the summary table."""

    name: str
    run: Callable[[SizeBench, Path], Any]
    column: str
    package: str | None = None
    # NOTE: a second baseline, where the variant's own forward is not the warm model's (the CLI rows: a fresh one)
    fresh_baseline: bool = False
    # NOTE: for a diagnostic row that needs something built here: why it cannot run on this machine, or None
    unavailable: Callable[[], str | None] | None = None


# the CLI rows' second baseline (`run_plain_fresh`)
FRESH_PLAIN = "plain, fresh model"
# the two diagnostic rows: what any statistics trace costs at least, and the engine with its per-call path in C
FLOOR = "floor: output statistics"
CORE_PROTOTYPE = "C core prototype"
VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("plain", run_plain, "plain forward"),
        Variant(FRESH_PLAIN, run_plain_fresh, "plain forward of a freshly built model"),
        Variant("capture() stats", lambda b, f: run_capture(b, f, False), "`capture()` statistics"),
        Variant("engine stats", lambda b, f: run_engine(b, f, False), "engine statistics alone"),
        Variant("CLI stats", lambda b, f: run_cli_job(b, f, False), "CLI / editor worker statistics", None, True),
        Variant("capture() full", lambda b, f: run_capture(b, f, True), "`capture()` full tensors"),
        Variant("engine full", lambda b, f: run_engine(b, f, True), "engine full alone"),
        Variant("CLI full", lambda b, f: run_cli_job(b, f, True), "CLI / editor worker full tensors", None, True),
        Variant(FLOOR, run_floor, "floor: output statistics (diagnostic)", unavailable=_floor_unavailable),
        Variant(
            CORE_PROTOTYPE,
            run_core_prototype,
            "per-call core in C, prototype (diagnostic)",
            unavailable=lambda: _capture_core_module().unavailable(),
        ),
        Variant("hf debugger repr", lambda b, f: run_hf_debugger(b, f, True), "HF debugger repr"),
        Variant("hf debugger safetensors", lambda b, f: run_hf_debugger(b, f, False), "HF debugger safetensors"),
        Variant("torchlens all", lambda b, f: run_torchlens(b, f, "all"), "TorchLens all", "torchlens"),
        Variant("torchlens none", lambda b, f: run_torchlens(b, f, None), "TorchLens none", "torchlens"),
        Variant("nnsight layers", lambda b, f: run_nnsight(b, f, False), "nnsight layers", "nnsight"),
        Variant(
            "nnsight all modules",
            lambda b, f: run_nnsight(b, f, True),
            "nnsight, every module's output kept",
            "nnsight",
        ),
    )
}
# NOTE: not paths a user runs: read the ModelTrace rows against them (docs/benchmarks.md)
DIAGNOSTIC_VARIANTS = [FLOOR, CORE_PROTOTYPE]
MODELTRACE_VARIANTS = [
    "plain",
    FRESH_PLAIN,
    "capture() stats",
    "engine stats",
    "CLI stats",
    "capture() full",
    "engine full",
    "CLI full",
]


def missing_packages(names: list[str]) -> dict[str, str]:
    """Variant name -> the package it needs that is not installed here, or for a diagnostic row why it cannot
    run here (no native kernel, no C compiler or Python headers)."""
    missing = {}
    for name in names:
        variant = VARIANTS[name]
        reason = variant.unavailable() if variant.unavailable is not None else None
        if reason is not None:
            missing[name] = reason
        elif variant.package and importlib.util.find_spec(variant.package) is None:
            missing[name] = variant.package
    return missing


@contextlib.contextmanager
def torch_state_for(name: str) -> Iterator[None]:
    """TorchLens wraps every torch function on its first call and leaves them wrapped, which slows every later
    torch call in the process (a plain medium forward ~5%, measured by the reference run). So that the other
    variants run on torch's own functions while TorchLens runs as it does after its first call, its wrappers
    are put back from its cache before a TorchLens call and removed after it, both outside the timing."""
    if not name.startswith("torchlens"):
        yield
        return
    from torchlens.backends.torch.wrappers import unwrap_torch, wrap_torch

    wrap_torch()
    try:
        yield
    finally:
        unwrap_torch()


def time_once(name: str, bench: SizeBench) -> float:
    """Seconds of one call of variant `name`, in a fresh folder, less what it reports as not its cost. Right
    after an untimed call of the same variant (in a folder of its own, removed before the timed
    call starts): the timed call finds the process as that variant leaves it, as when a user runs it in a loop,
    not as whichever other tool ran last left it (see `round_order`)."""
    folder = Path(tempfile.mkdtemp(prefix="call_", dir=bench.folder))
    try:
        with torch_state_for(name):
            settle_folder = Path(tempfile.mkdtemp(prefix="settle_", dir=bench.folder))
            try:
                gc.collect()
                os.sync()
                VARIANTS[name].run(bench, settle_folder)  # NOTE: its result dropped here, as a timed one's
            finally:
                shutil.rmtree(settle_folder, ignore_errors=True)
            gc.collect()
            os.sync()  # NOTE: flush what earlier calls wrote and deleted, so that a call pays for its own writes only
            started = time.perf_counter()
            result = VARIANTS[name].run(bench, folder)
            elapsed = time.perf_counter() - started
            if isinstance(result, Untimed):
                elapsed -= result.seconds
            del result
        return elapsed
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def freeze_setup_objects() -> None:
    """Move every object alive now (torch, transformers, the model, the peers' modules) out of the collector's
    reach: a full `gc.collect()` before each call then takes milliseconds instead of most of a second, and the
    collections a tool's own allocations trigger scan that tool's objects, the same for every variant."""
    gc.collect()
    gc.freeze()


@dataclass
class Captured:
    """What one call of a variant captured: module calls (TorchLens: ops), tensors, bytes on disk, bytes it
    keeps in memory after the call, and in words what those are."""

    calls: int
    tensors: int
    bytes_written: int
    bytes_kept: int
    what: str

    def text(self) -> str:
        sizes = []
        if self.bytes_written:
            sizes.append(f"{_size_text(self.bytes_written)} written")
        if self.bytes_kept:
            sizes.append(f"{_size_text(self.bytes_kept)} kept in memory")
        return f"{self.what}; {', '.join(sizes) or 'nothing kept'}"


def _size_text(size: int) -> str:
    return f"{size / 2**20:,.1f} MB" if size >= 2**20 else f"{size / 2**10:,.0f} KB"


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _safetensors_keys(folder: Path) -> list[str]:
    from safetensors import safe_open

    keys: list[str] = []
    for shard in sorted(folder.rglob("*.safetensors")):
        with safe_open(str(shard), "pt") as handle:
            keys += list(handle.keys())
    return keys


def _tensor_leaves(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensor_leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensor_leaves(item)
    elif hasattr(value, "to_tuple"):
        yield from _tensor_leaves(value.to_tuple())


def _modeltrace_captured(trace_folder: Path, full_tensors: bool, note: str) -> Captured:
    from modeltrace.trace.storage import read_trace

    trace = read_trace(trace_folder)
    summaries = sum(len(call.inputs) + len(call.outputs) for call in trace.modules)
    written = _folder_bytes(trace_folder)
    if not full_tensors:
        what = f"{len(trace.modules)} module calls, statistics of {summaries} input/output tensors{note}"
        return Captured(len(trace.modules), summaries, written, 0, what)
    keys = _safetensors_keys(trace_folder)
    parameters = sum(1 for key in keys if key.startswith("parameters"))
    what = (
        f"{len(trace.modules)} module calls, {len(keys) - parameters} input/output tensors + {parameters} parameters"
        f" stored{note}"
    )
    return Captured(len(trace.modules), len(keys), written, 0, what)


def describe(name: str, bench: SizeBench) -> Captured:
    """What one untimed call of variant `name` captured."""
    folder = Path(tempfile.mkdtemp(prefix="describe_", dir=bench.folder))
    try:
        with torch_state_for(name):
            result = VARIANTS[name].run(bench, folder)
        full = name.endswith("full")
        if name.startswith("plain"):
            return Captured(len(bench.finish_order), 0, 0, 0, f"{len(bench.finish_order)} module calls run")
        if name.startswith("capture()"):
            return _modeltrace_captured(result.path, full, "")
        if name.startswith("engine"):
            note = " (no construction records, parameters or source hashes; not fsynced)"
            return _modeltrace_captured(folder / "bench.mtrace", full, note)
        if name.startswith("CLI"):
            return _modeltrace_captured(Path(result.result.trace), full, " (fsynced by the worker after answering)")
        if name in (FLOOR, CORE_PROTOTYPE):
            return _diagnostic_captured(name, folder)
        if name.startswith("hf debugger"):
            return _hf_debugger_captured(folder / "debug", name.endswith("repr"))
        if name.startswith("torchlens"):
            return _torchlens_captured(result)
        return _nnsight_captured(result)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _diagnostic_captured(name: str, folder: Path) -> Captured:
    """The floor's rows (path, output shape, moments) or the C prototype's table (calls, summaries, sites)."""
    import msgpack

    if name == FLOOR:
        rows = msgpack.unpackb((folder / "floor.mtrace" / "rows.msgpack").read_bytes())
        measured = sum(1 for row in rows if len(row) > 1)
        what = f"{len(rows)} module calls, moments of {measured} outputs, no source line, no inputs, no call tree"
        return Captured(len(rows), measured, _folder_bytes(folder / "floor.mtrace"), 0, what)
    table = msgpack.unpackb((folder / "core.mtrace" / "trace.msgpack").read_bytes())
    pairs = sum(len(row[7]) + len(row[8]) for row in table["modules"])
    what = (
        f"{len(table['modules'])} module calls, statistics of {pairs} input/output tensors (call tree, call sites;"
        " rows of plain values, no record objects)"
    )
    return Captured(len(table["modules"]), pairs, _folder_bytes(folder / "core.mtrace"), 0, what)


def _hf_debugger_captured(debug_folder: Path, use_repr: bool) -> Captured:
    summary = json.loads(next(debug_folder.glob("*_SUMMARY.json")).read_text())
    calls = _count_debugger_calls(summary)
    tensor_files = len(list(debug_folder.rglob("*.safetensors")))
    what = (
        f"{calls} module calls, repr text + mean/std/min/max of each tensor"
        if use_repr
        else f"{calls} module calls, {tensor_files} tensors in one safetensors file each, + mean/std/min/max"
    )
    return Captured(calls, tensor_files, _folder_bytes(debug_folder), 0, what)


def _count_debugger_calls(node: Any) -> int:
    if isinstance(node, dict):
        own = 1 if "module_path" in node else 0
        return own + sum(_count_debugger_calls(child) for child in node.get("children", []))
    if isinstance(node, list):
        return sum(_count_debugger_calls(child) for child in node)
    return 0


def _torchlens_captured(trace: Any) -> Captured:
    layers = trace.layer_list
    saved = [layer.out for layer in layers if layer.has_saved_activation and isinstance(layer.out, torch.Tensor)]
    kept = sum(int(tensor.nbytes) for tensor in saved)
    what = f"{len(layers)} torch ops (op graph + metadata), {len(saved)} op outputs copied"
    return Captured(len(layers), len(saved), 0, kept, what)


def _nnsight_captured(saved: list[Any]) -> Captured:
    tensors = [tensor for value in saved for tensor in _tensor_leaves(value)]
    kept = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    what = f"{len(saved)} module outputs saved ({len(tensors)} tensors, references: no copy, no statistics)"
    return Captured(len(saved), len(tensors), 0, kept, what)


@dataclass
class SizeResult:
    """One size's measurements: per variant the paired ratios to plain, median ms and what it captured."""

    size: str
    label: str
    parameters: int
    rounds: int
    plain_untouched_ms: float
    times_ms: dict[str, list[float]]
    captured: dict[str, Captured]
    load_per_round: list[float]
    peak_rss_mb: dict[str, float | str] = field(default_factory=dict)

    def paired_ratios(self, name: str) -> list[float]:
        return [time / plain for time, plain in zip(self.times_ms[name], self.times_ms["plain"])]

    def ratio(self, name: str) -> float:
        return statistics.median(self.paired_ratios(name))

    def fresh_ratio(self, name: str) -> float | None:
        """`name`'s paired median ratio to the fresh model's plain forward, for a variant that runs a fresh model
        (`Variant.fresh_baseline`) where that baseline was measured; else None."""
        fresh = self.times_ms.get(FRESH_PLAIN)
        if fresh is None or not VARIANTS[name].fresh_baseline or name not in self.times_ms:
            return None
        return statistics.median(time / plain for time, plain in zip(self.times_ms[name], fresh))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["paired_ratio_median"] = {name: self.ratio(name) for name in self.times_ms}
        data["median_ms"] = {name: statistics.median(times) for name, times in self.times_ms.items()}
        data["paired_ratio_to_fresh_plain_median"] = {
            name: ratio for name in self.times_ms if (ratio := self.fresh_ratio(name)) is not None
        }
        return data


def measure(size: str, rounds: int, names: list[str]) -> SizeResult:
    """Time `names` (plain first) at `size` in interleaved rounds, each in its own shuffled order; check the
    model's output unchanged."""
    bench = SizeBench(size)
    try:
        with torch.no_grad():
            reference = bench.model(bench.input_ids).logits.clone()
        # NOTE: plain before any tool touched the model or torch (nnsight wraps the model, TorchLens torch): a
        # plain forward slowed by a tool's leftovers would show against this
        freeze_setup_objects()
        untouched = [time_once("plain", bench) for _ in range(max(3, rounds // 2))]
        for name in names:  # warm-up: imports, caches, TorchLens' first wrapping, nnsight's compile
            time_once(name, bench)
        freeze_setup_objects()
        times: dict[str, list[float]] = {name: [] for name in names}
        load_per_round = []
        orders = round_order(names, rounds)
        for round_index, order in enumerate(orders):
            for name in order:
                times[name].append(time_once(name, bench) * 1e3)
            load_per_round.append(os.getloadavg()[0])
            print(f"  {size}: round {round_index + 1}/{rounds}, load {load_per_round[-1]:.2f}", file=sys.stderr)
        with torch.no_grad():
            if not torch.equal(bench.model(bench.input_ids).logits, reference):
                raise RuntimeError(f"{size}: a variant changed the model's output (a tool left the model altered)")
        captured = {name: describe(name, bench) for name in names}
        return SizeResult(
            size=size,
            label=LLAMA_SIZES[size].label(),
            parameters=sum(parameter.numel() for parameter in bench.model.parameters()),
            rounds=rounds,
            plain_untouched_ms=statistics.median(untouched) * 1e3,
            times_ms=times,
            captured=captured,
            load_per_round=load_per_round,
        )
    finally:
        bench.close()


def _resident_kb(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def rss_child(size: str, name: str) -> float:
    """In a fresh process: the peak resident MB during one call of `name` after a first call (see the docstring)."""
    bench = SizeBench(size)
    try:
        time_once(name, bench)
        if name.startswith("CLI") or name == FRESH_PLAIN:
            # NOTE: the CLI's job builds its own model: this process's copy is not what a CLI run holds
            bench.model = None
        freeze_setup_objects()
        folder = Path(tempfile.mkdtemp(prefix="rss_", dir=bench.folder))
        with torch_state_for(name):
            Path("/proc/self/clear_refs").write_text("5")
            result = VARIANTS[name].run(bench, folder)
            peak = _resident_kb("VmHWM")
            del result
        return peak / 1024
    finally:
        bench.close()


def peak_rss(size: str, names: list[str]) -> dict[str, float | str]:
    """Peak resident MB of one call of each variant, each in its own fresh process."""
    found: dict[str, float | str] = {}
    for name in names:
        completed = subprocess.run(
            [sys.executable, __file__, "--rss-child", size, name], capture_output=True, text=True, check=False
        )
        if completed.returncode != 0:
            found[name] = "failed: " + (completed.stderr.strip().splitlines() or ["?"])[-1]
        else:
            found[name] = float(completed.stdout.split()[-1])
        print(f"  {size}: peak RSS {name}: {found[name]}", file=sys.stderr)
    return found


def environment_line() -> str:
    versions = [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    versions.append(f"modeltrace {getattr(modeltrace, '__version__', '?')} ({Path(modeltrace.__file__).parent})")
    for package in ("torchlens", "nnsight"):
        if importlib.util.find_spec(package) is not None:
            versions.append(f"{package} {__import__(package).__version__}")
    # NOTE: neither peer imports torchvision; the bench's environment never has it (the Makefile checks)
    torchvision_state = "installed" if importlib.util.find_spec("torchvision") is not None else "not installed"
    versions.append(f"torchvision {torchvision_state}")
    return (
        ", ".join(versions)
        + f"; Python {platform.python_version()}, {platform.processor() or platform.machine()}, "
        + f"{os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), CPU, float32"
    )


def summary_table(results: list[SizeResult]) -> str:
    """The issue's table: one row per size, the paired median ratio to plain of every variant measured."""
    names = [name for name in VARIANTS if name != "plain" and all(name in result.times_ms for result in results)]
    # NOTE: the variants that run a fresh model (the CLI's) again, against a fresh model's plain forward
    fresh = [name for name in names if all(result.fresh_ratio(name) is not None for result in results)]
    columns = [VARIANTS[name].column for name in names] + [
        f"{VARIANTS[name].column} vs a fresh model's plain forward" for name in fresh
    ]
    lines = [
        "| size | plain forward | " + " | ".join(columns) + " |",
        "|---|---:|" + "---:|" * len(columns),
    ]
    for result in results:
        plain = statistics.median(result.times_ms["plain"])
        cells = [f"{result.ratio(name):.2f}×" for name in names] + [
            f"{result.fresh_ratio(name):.2f}×" for name in fresh
        ]
        lines.append(f"| {result.size} ({result.label}) | {plain:.1f} ms | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(result: SizeResult) -> str:
    """Per variant of one size: what it captured, median ms, paired ratio [min–max], peak memory."""
    loads = result.load_per_round
    lines = [
        f"### {result.size}: {result.label}, {result.parameters / 1e6:.1f} M parameters, {result.rounds} rounds; "
        f"plain before any tool touched the model {result.plain_untouched_ms:.2f} ms; load average during the "
        f"rounds {min(loads):.2f}–{max(loads):.2f} (median {statistics.median(loads):.2f})",
        "",
        "| variant | captured | median ms | × plain, paired median [min–max] | × plain of a fresh model, paired "
        "median | peak RSS MB (over plain) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    plain_peak = result.peak_rss_mb.get("plain")
    for name in result.times_ms:
        ratios = result.paired_ratios(name)
        peak = result.peak_rss_mb.get(name, "")
        if isinstance(peak, float):
            peak = f"{peak:,.0f}" + (f" ({peak - plain_peak:+,.0f})" if isinstance(plain_peak, float) else "")
        lines.append(
            f"| {name} | {result.captured[name].text()} | {statistics.median(result.times_ms[name]):.2f} | "
            f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] | "
            f"{'' if (fresh := result.fresh_ratio(name)) is None else f'{fresh:.2f}'} | {peak} |"
        )
    return "\n".join(lines)


def report(results: list[SizeResult], load_before: str, load_after: str, missing: dict[str, str]) -> str:
    lines = [environment_line(), f"load average before: {load_before}; after: {load_after}"]
    if missing:
        left_out = ", ".join(f"{name} ({package})" for name, package in missing.items())
        lines.append(f"left out, not installed or not buildable here: {left_out}")
    lines += ["", summary_table(results)]
    for result in results:
        lines += ["", detail_table(result)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=list(LLAMA_SIZES))
    parser.add_argument("--rounds", type=int, help="rounds at every size (default: tiny 41, medium 25, large 9)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="VARIANT")
    parser.add_argument("--rss", action="store_true", help="peak RSS of each variant, each in a fresh process")
    parser.add_argument("--rss-child", nargs=2, metavar=("SIZE", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write every timing and what each variant captured here")
    options = parser.parse_args(argv)
    # NOTE: one torch thread, as the issue measures (make bench-peers also sets OMP_NUM_THREADS=1 before torch loads)
    torch.set_num_threads(1)
    # NOTE: TorchLens warns on every call that transformers' mask code turns a tensor into a Python bool
    warnings.filterwarnings("ignore", module="torchlens")
    warnings.filterwarnings("ignore", message=".*TorchLens.*")
    if options.rss_child:
        print(rss_child(*options.rss_child))
        return 0
    if options.rounds is not None and options.rounds < 1:
        parser.error(f"--rounds {options.rounds}: give at least 1")
    missing = missing_packages(options.variants)
    names = ["plain"] + [name for name in options.variants if name != "plain" and name not in missing]
    load_before = Path("/proc/loadavg").read_text().strip()
    results: list[SizeResult] = []
    for size in options.sizes:
        started = time.perf_counter()
        result = measure(size, options.rounds or LLAMA_SIZES[size].rounds, names)
        if options.rss:
            result.peak_rss_mb = peak_rss(size, names)
        results.append(result)
        print(f"{size}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        if options.json:  # NOTE: after each size, so that a long run keeps what it measured
            options.json.parent.mkdir(parents=True, exist_ok=True)
            options.json.write_text(json.dumps([item.to_json() for item in results], indent=1))
    load_after = Path("/proc/loadavg").read_text().strip()
    print(report(results, load_before, load_after, missing))
    if options.json:
        summary = {"environment": environment_line(), "load_before": load_before, "load_after": load_after}
        payload = {**summary, "left_out": missing, "sizes": [result.to_json() for result in results]}
        options.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
