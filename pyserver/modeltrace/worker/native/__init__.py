"""The fused statistics kernel (`moments.c`): compiled on first use with the machine's C compiler (the CPU's
vector flags, torch's OpenMP threads); without a compiler, the copy prebuilt into the installed package (the
wheel's `modeltrace_moments` extension: baseline flags, one thread); with neither (or `MODELTRACE_NATIVE=0`)
`worker/stats.py` uses torch's reductions and gets the same numbers, only slower.

`kernels()` gives one function per dtype, `(address, count) -> (sum, sum of squares, positives, min, max)`, and
`f32_strided(address, sizes, strides)`, the same for a float32 view read in place (None where it cannot be).
They come from a Python extension module built from the same file where Python's headers are installed (a call
costs ~0.1 µs), else from the plain shared library through ctypes (~1 µs, and several times that inside a
forward pass, with the caches cold). The extension module also holds the capture's per-call path
(`capture_core.c`, included by moments.c), under `kernels()["capture_core"]`: the module itself.

The shared library is cached per user under `$XDG_CACHE_HOME/modeltrace/` (default `~/.cache/modeltrace/`),
named by a hash of the source, the flags and the compiler, so an edit or another CPU flag set builds a new one.
It is written to a temporary name and renamed into place, so processes that compile at the same moment never
load half a file.

Where torch runs on OpenMP with its own libgomp already loaded (the Linux wheels), the kernel is built with
OpenMP and linked against that very file, so its parallel regions use torch's thread pool and thread count
(`torch.set_num_threads`) instead of starting a second pool that would fight torch's for the cores. Anywhere
else, or if that build fails, the kernel is built single-threaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modeltrace.native_build import BASE_FLAGS as _BASE_FLAGS
from modeltrace.native_build import cached_library
from modeltrace.native_build import compiler as _compiler
from modeltrace.native_build import cpu_flags as _cpu_flags
from modeltrace.native_build import native_setting


SOURCE = Path(__file__).with_name("moments.c")
# NOTE: included by moments.c in the extension module's build: part of what names the cached library
CORE_SOURCE = Path(__file__).with_name("capture_core.c")

# the dtype kernels take (address, count); "f32_strided" takes (address, sizes, strides) and may return None
Kernel = Callable[..., tuple[float, float, float, float, float] | None]

_kernels: dict[str, Kernel] | None = None
_loaded = False
_baseline: tuple[dict[str, Kernel] | None] | None = None
load_error: str | None = None
# how the kernels were loaded ("extension" or "ctypes": built here; "prebuilt": the package's own), and whether
# they split large arrays across torch's OpenMP threads
form: str | None = None
parallel = False


def torch_openmp_runtime() -> Path | None:
    """The libgomp that torch loaded into this process, when torch's parallel backend is OpenMP and exactly one
    libgomp is mapped (Linux); None otherwise."""
    import torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        return None
    paths = set()
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and "libgomp" in os.path.basename(fields[5]):
            paths.add(fields[5].strip())
    if len(paths) != 1:
        return None
    runtime = Path(paths.pop())
    return runtime if runtime.is_file() else None


def _python_include() -> str | None:
    include = sysconfig.get_paths().get("include")
    return include if include and os.path.isfile(os.path.join(include, "Python.h")) else None


def _build(compiler: str, flags: list[str], openmp_runtime: Path | None, python_include: str | None) -> Path:
    """Compile `moments.c` into the cache (once per source, flags, compiler, OpenMP runtime and Python)."""
    if python_include is not None:
        flags = [*flags, "-DMODELTRACE_PYTHON_MODULE", f"-I{python_include}"]
    core = hashlib.sha256(CORE_SOURCE.read_bytes()).hexdigest()
    target, present = cached_library(SOURCE, "moments", [compiler, *flags, str(openmp_runtime), core])
    if present:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        if openmp_runtime is None:
            subprocess.run(
                [compiler, "-shared", *flags, str(SOURCE), "-o", str(built)],
                check=True,
                capture_output=True,
                timeout=120,
            )
        else:
            # NOTE: compile with -fopenmp but link without it: -fopenmp at link time adds the system's -lgomp,
            # a second OpenMP runtime (its own thread pool) whenever torch's copy has another soname.
            objects = Path(scratch) / "moments.o"
            subprocess.run(
                [compiler, *flags, "-fopenmp", "-c", str(SOURCE), "-o", str(objects)],
                check=True,
                capture_output=True,
                timeout=120,
            )
            subprocess.run(
                [
                    compiler,
                    "-shared",
                    str(objects),
                    str(openmp_runtime),
                    f"-Wl,-rpath,{openmp_runtime.parent}",
                    "-o",
                    str(built),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        os.replace(built, target)
    return target


def _load_extension(path: Path) -> dict[str, Kernel]:
    loader = importlib.machinery.ExtensionFileLoader("modeltrace_moments", str(path))
    spec = importlib.util.spec_from_file_location("modeltrace_moments", path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return _module_kernels(module)


def _module_kernels(module: Any) -> dict[str, Kernel]:
    kernels = {"f32": module.f32, "f64": module.f64, "i64": module.i64, "f32_strided": module.f32_strided}
    # NOTE: the batch of weights' fingerprints (`builds`) exists only in the extension module (it builds Python
    # objects); a prebuilt extension older than it, and the ctypes form, leave it to the per-weight path
    batch = getattr(module, "f32_fingerprints", None)
    if batch is not None:
        kernels["f32_fingerprints"] = batch
    # NOTE: the capture's per-call path (`capture_core.c`, `worker/capture.py`): the module itself, whose `Wrapper`
    # and `Session` use its own `f32`; absent from a prebuilt extension older than it and from the ctypes form
    if hasattr(module, "Wrapper") and hasattr(module, "Session"):
        kernels["capture_core"] = module
    return kernels


def _load_ctypes(path: Path) -> dict[str, Kernel]:
    loaded = ctypes.CDLL(str(path))
    out = (ctypes.c_double * 5)()
    out_address = ctypes.addressof(out)
    kernels: dict[str, Kernel] = {}
    for kind in ("f32", "f64", "i64"):
        function = getattr(loaded, f"modeltrace_moments_{kind}")
        function.restype = None
        function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]

        def kernel(address: int, count: int, function=function) -> tuple[float, float, float, float, float]:  # noqa: ANN001
            function(address, count, out_address)
            return out[0], out[1], out[2], out[3], out[4]

        kernels[kind] = kernel
    strided_function = loaded.modeltrace_moments_f32_strided
    strided_function.restype = ctypes.c_int
    strided_function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def strided(address: int, sizes: tuple[int, ...], strides: tuple[int, ...]) -> tuple[float, ...] | None:
        dims = len(sizes)
        if (
            strided_function(
                address, dims, (ctypes.c_int64 * dims)(*sizes), (ctypes.c_int64 * dims)(*strides), out_address
            )
            != 0
        ):
            return None
        return out[0], out[1], out[2], out[3], out[4]

    kernels["f32_strided"] = strided
    return kernels


def absent_reason() -> str | None:
    """Why this machine has no kernel by its own configuration (`MODELTRACE_NATIVE=0`, or no C compiler and no
    prebuilt kernel in the installation), as opposed to a build that was tried and failed; None when a kernel
    can be had."""
    if native_setting() == "0":
        return "disabled by MODELTRACE_NATIVE=0"
    if _compiler() is None and _prebuilt() is None:
        return "no C compiler (cc, gcc or clang) on PATH and no prebuilt kernel in this installation"
    return None


def _prebuilt() -> dict[str, Kernel] | None:
    """The kernel compiled into the installed package (the wheel's `modeltrace_moments` extension, baseline
    flags, one thread), or None where the package was built without it."""
    try:
        from modeltrace.worker.native import modeltrace_moments as module
    except ImportError:
        return None
    return _module_kernels(module)


def _load(flag_sets: list[list[str]]) -> tuple[dict[str, Kernel] | None, str | None, bool, list[str]]:
    """The first build of `flag_sets` (best first) that compiles and loads: (kernels, form, parallel, errors of
    the better builds that failed)."""
    compiler = _compiler()
    if compiler is None:
        return None, None, False, ["no C compiler (cc, gcc or clang) on PATH"]
    runtime = torch_openmp_runtime() if os.environ.get("MODELTRACE_NATIVE_OPENMP", "1") != "0" else None
    include = _python_include()
    # NOTE: the extension with OpenMP first, then without each in turn, for each flag set; the first that builds
    # wins (dict.fromkeys drops the repeats where there are no CPU flags, no OpenMP runtime or no headers).
    attempts = dict.fromkeys(
        (tuple(flags), openmp_runtime, python_include)
        for flags in flag_sets
        for openmp_runtime, python_include in ((runtime, include), (None, include), (runtime, None), (None, None))
    )
    errors = []
    for flags, openmp_runtime, python_include in attempts:
        try:
            path = _build(compiler, list(flags), openmp_runtime, python_include)
            loaded = _load_extension(path) if python_include is not None else _load_ctypes(path)
        except (OSError, ImportError, subprocess.SubprocessError, AttributeError) as error:
            stderr = getattr(error, "stderr", b"") or b""
            errors.append(f"{type(error).__name__}: {error} {stderr.decode(errors='replace')[:300]}".strip())
            continue
        return loaded, "extension" if python_include is not None else "ctypes", openmp_runtime is not None, errors
    return None, None, False, errors


def kernels() -> dict[str, Kernel] | None:
    """The kernels by dtype ("f32", "f64", "i64", "f32_strided"), built the first time; None (with `load_error`
    saying why) when unavailable. `MODELTRACE_NATIVE=baseline` builds without the CPU's vector flags, as
    `baseline_kernels` does."""
    global _kernels, _loaded, load_error, form, parallel
    if _loaded:
        return _kernels
    _loaded = True
    load_error = absent_reason()
    if load_error is not None:
        return None
    baseline_only = native_setting() == "baseline"
    # NOTE: the CPU's vector flags first; a compiler too old for them falls back to the baseline; without a
    # compiler (or when every build failed), the kernel prebuilt into the package
    flag_sets = [_BASE_FLAGS] if baseline_only else [_BASE_FLAGS + _cpu_flags(), _BASE_FLAGS]
    _kernels, form, parallel, errors = _load(flag_sets)
    if _kernels is None:
        _kernels = _prebuilt()
        if _kernels is not None:
            form, parallel = "prebuilt", False
    # NOTE: kept when a better build failed and a lesser one loaded: tests and users can see why
    load_error = "; ".join(errors) or None
    return _kernels


def baseline_kernels() -> dict[str, Kernel] | None:
    """The kernels built with the baseline flags only (no AVX2, FMA or AVX-512: what a CPU without them runs),
    beside the CPU's own build in the same process; None when no build of them loads."""
    global _baseline
    if _baseline is None:
        _baseline = (_load([_BASE_FLAGS])[0],) if absent_reason() is None else (None,)
    return _baseline[0]
