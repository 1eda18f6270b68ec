"""A per-call capture core in C, as a benchmark PROTOTYPE (`capture_core.c`): what ModelTrace's statistics
capture would cost with its per-call path out of the interpreter, measured beside the engine (bench_peers.py's
`C core prototype` row). Not product code: nothing in `pyserver/` imports it.

`run_core(model, input_ids, folder)` captures one forward with it and writes the rows as one msgpack file into a
new folder renamed into place, as the engine writes a trace: call sites resolved to (file, line, column) once per
site, summaries as tuples. `capture_rows(model, input_ids)` gives the rows and summaries for
tests/python/test_bench_capture_core.py, which checks that the prototype records what the engine records (so that
its timing is comparable), and `unavailable()` says why it cannot be built here (no C compiler or Python headers).

Built on first use with the machine's C compiler, the CPU's vector flags and Python's headers, into the same
per-user cache as the product's kernels (`modeltrace.native_build`), named by a hash of the source and flags.
"""

from __future__ import annotations

import functools
import gc
import importlib.machinery
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
import weakref
from pathlib import Path
from typing import Any

import msgpack
import torch
from torch import nn

from modeltrace.native_build import BASE_FLAGS, cached_library, compiler, cpu_flags
from modeltrace.worker import source_map
from modeltrace.worker.capture import _SCALAR_TYPES, forward_parameter_names, iter_tensor_leaves
from modeltrace.worker.stats import summarize

SOURCE = Path(__file__).with_name("capture_core.c")
KERNEL_FOLDER = Path(__file__).resolve().parents[1] / "pyserver" / "modeltrace" / "worker" / "native"


def unavailable() -> str | None:
    """Why the prototype cannot be built on this machine, or None."""
    if compiler() is None:
        return "no C compiler on PATH"
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.isfile(os.path.join(include, "Python.h")):
        return "no Python headers (Python.h)"
    return None


@functools.cache
def _extension() -> Any:
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"bench/capture_core.c cannot be built: {reason}")
    cc = compiler()
    assert cc is not None
    # NOTE: no FMA contraction in the mean and deviation (Python computes them without), the kernel as the product
    # builds it otherwise
    flags = [*BASE_FLAGS, *cpu_flags(), "-ffp-contract=off", f"-I{sysconfig.get_paths()['include']}"]
    flags.append(f"-I{KERNEL_FOLDER}")
    target, present = cached_library(SOURCE, "capture_core", [cc, *flags, (KERNEL_FOLDER / "moments.c").read_text()])
    if not present:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            subprocess.run([cc, "-shared", *flags, str(SOURCE), "-o", str(built)], check=True, capture_output=True)
            os.replace(built, target)
    loader = importlib.machinery.ExtensionFileLoader("capture_core", str(target))
    spec = importlib.util.spec_from_file_location("capture_core", target, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _arguments(recorder: Any, args: tuple, kwargs: dict | None, names: list[str]) -> list[tuple[str, int]]:
    """(key, summary index) of every tensor in a call's arguments, keyed as the engine keys them."""
    named: list[tuple[str, Any]] = list(zip(names, args))
    named.extend((f"args.{position}", args[position]) for position in range(len(names), len(args)))
    if kwargs:
        named.extend(kwargs.items())
    found = []
    for name, value in named:
        if isinstance(value, torch.Tensor):
            found.append((name, recorder.summarize(value)))
        elif value is not None and type(value) not in _SCALAR_TYPES:
            found.extend((key, recorder.summarize(tensor)) for key, tensor in iter_tensor_leaves(value, name))
    return found


def _outputs(recorder: Any, output: Any) -> list[tuple[str, int]]:
    return [(key, recorder.summarize(tensor)) for key, tensor in iter_tensor_leaves(output)]


def _summary(tensor: torch.Tensor) -> tuple:
    """Any tensor the C side does not summarise itself (another dtype, a view, a subclass)."""
    summary = summarize(tensor, "")
    return (
        summary.shape,
        summary.dtype,
        summary.mean,
        summary.std,
        summary.min,
        summary.max,
        summary.abs_max,
        summary.positive_fraction,
        0.0,
    )


# model -> (the cell its wrappers read the live Recorder from, [(module, wrapper)]): made once per model, as the
# engine's wrappers are (`capture._ModelWrappers`)
_WRAPPERS: weakref.WeakKeyDictionary[nn.Module, tuple[list[Any], list[tuple[nn.Module, Any]]]] = (
    weakref.WeakKeyDictionary()
)


class CoreCapture:
    """Wrap every module of `model` with the C wrapper while the block runs; `recorder` holds what it recorded."""

    def __init__(self, model: nn.Module) -> None:
        core = _extension()
        self.model = model
        entry = _WRAPPERS.get(model)
        if entry is None:
            live: list[Any] = [None]
            pairs = []
            for path, module in model.named_modules():
                names = forward_parameter_names(module)
                wrapper = core.Wrapper(
                    live, path, type(module)._call_impl, weakref.ref(module), names[0] if names else None, names
                )
                pairs.append((module, wrapper))
            entry = _WRAPPERS[model] = (live, pairs)
        self._live, self._pairs = entry
        self.recorder = core.Recorder(
            source_map._plumbing, _arguments, _outputs, _summary, torch.Tensor, nn.Parameter, torch.float32
        )
        self._collector_was_enabled = False

    def __enter__(self) -> CoreCapture:
        self._live[0] = self.recorder
        for module, wrapper in self._pairs:
            module.__dict__["_call_impl"] = wrapper
        # NOTE: as ModuleCapture does: the records hold no cycles, the collector waits for the exit
        self._collector_was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for module, wrapper in self._pairs:
            if module.__dict__.get("_call_impl") is wrapper:
                del module.__dict__["_call_impl"]
        self._live[0] = None
        if self._collector_was_enabled:
            gc.enable()


_POSITIONS: dict[Any, list] = {}


def table(recorder: Any) -> dict[str, Any]:
    """The rows with each call site as an index into `locations` ([file, line, column], once per site)."""
    locations: list[list[Any]] = []
    location_index: dict[tuple[int, int], int] = {}
    modules = []
    for index, path, calls, parent, finish, code, offset, inputs, outputs in recorder.rows:
        where = None
        if code is not None:
            where = location_index.get((id(code), offset))
            if where is None:
                positions = _POSITIONS.get(code)
                if positions is None:
                    positions = _POSITIONS[code] = list(code.co_positions())
                line, _, column, _ = positions[offset // 2]
                where = location_index[(id(code), offset)] = len(locations)
                locations.append([source_map.real_path(code.co_filename), line, column])
        modules.append([index, path, calls, -1 if parent is None else parent, finish, where, offset, inputs, outputs])
    return {"locations": locations, "summaries": recorder.summaries, "modules": modules}


def capture_rows(model: nn.Module, input_ids: torch.Tensor) -> dict[str, Any]:
    with torch.no_grad(), CoreCapture(model) as capture:
        model(input_ids)
    return table(capture.recorder)


def run_core(model: nn.Module, input_ids: torch.Tensor, folder: Path) -> None:
    """One forward captured by the prototype and written into `folder`/core.mtrace (mkdir, write, rename)."""
    with torch.no_grad(), CoreCapture(model) as capture:
        model(input_ids)
    payload = msgpack.packb(table(capture.recorder), use_bin_type=True)
    temporary = folder / ".core.tmp"
    os.mkdir(temporary)
    descriptor = os.open(temporary / "trace.msgpack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.write(descriptor, payload)
    finally:
        os.close(descriptor)
    os.rename(temporary, folder / "core.mtrace")
