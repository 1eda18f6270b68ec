"""The diff's comparison kernel (`compare.c`), torch-free so that the language server can use it: compiled on
first use with the machine's C compiler and loaded through ctypes (a call costs ~1 µs; a full-tensor diff
makes one per tensor pair, not per element). Without a compiler, when the build fails, or with
`MODELTRACE_NATIVE=0`, `diff/arrays.py` measures with numpy and gets the same verdicts, only slower.

`kernels()` maps a numpy dtype (float32, float64) to `(reference, candidate, rtol) -> (max |d|, max |d|/|x|,
max |d| - rtol·|x|, max |x|, Σd², Σx², Σy², Σxy)` for two contiguous arrays of that dtype, or is None.
"""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np

from modeltrace.native_build import BASE_FLAGS, build_library, compiler, cpu_flags, native_setting

SOURCE = Path(__file__).with_name("compare.c")
# NOTE: -ffinite-math-only lets the compiler vectorise the maxima (their NaN-aware form does not vectorise); the
# kernel never tests for NaN, its caller checks the sums (see compare.c). -ffp-contract=off: no fused
# multiply-add, so |d| - r·|x| is rounded as numpy rounds it.
COMPARE_FLAGS = [*BASE_FLAGS, "-ffinite-math-only", "-ffp-contract=off"]

Measure = Callable[[np.ndarray, np.ndarray, float], tuple[float, ...]]
Kernels = dict[np.dtype, Measure]

_loaded: dict[str, Kernels | None] = {}
_chosen: dict[str, Kernels | None] = {}  # by the MODELTRACE_NATIVE setting
load_error: str | None = None


def _wrap(library: ctypes.CDLL) -> Kernels:
    out = (ctypes.c_double * 8)()
    out_address = ctypes.addressof(out)
    functions: Kernels = {}
    for dtype, symbol in (("float32", "modeltrace_compare_f32"), ("float64", "modeltrace_compare_f64")):
        function = getattr(library, symbol)
        function.restype = None
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p]

        def measure(reference: np.ndarray, candidate: np.ndarray, rtol: float, function=function) -> tuple[float, ...]:  # noqa: ANN001
            function(reference.ctypes.data, candidate.ctypes.data, reference.size, rtol, out_address)
            return tuple(out)

        functions[np.dtype(dtype)] = measure
    return functions


def load(flags: list[str]) -> Kernels | None:
    """The kernel built with `flags` (cached per process), or None with `load_error` saying why."""
    global load_error
    key = " ".join(flags)
    if key in _loaded:
        return _loaded[key]
    cc = compiler()
    found = None
    if cc is None:
        load_error = "no C compiler (cc, gcc or clang) on PATH"
    else:
        try:
            found = _wrap(ctypes.CDLL(str(build_library(SOURCE, "compare", cc, flags))))
        except (OSError, AttributeError, subprocess.SubprocessError) as error:
            stderr = getattr(error, "stderr", b"") or b""
            load_error = f"{type(error).__name__}: {error} {stderr.decode(errors='replace')[:300]}".strip()
    _loaded[key] = found
    return found


def kernels() -> Kernels | None:
    """The kernels by dtype for this machine (the CPU's vector flags, else the baseline), or None where
    `MODELTRACE_NATIVE=0` or no build loads."""
    setting = native_setting()
    if setting not in _chosen:
        if setting == "0":
            _chosen[setting] = None
        else:
            extra = [] if setting == "baseline" else cpu_flags()
            found = load([*COMPARE_FLAGS, *extra])
            _chosen[setting] = found if found is not None or not extra else load(COMPARE_FLAGS)
    return _chosen[setting]


def baseline_kernels() -> Kernels | None:
    """The kernels built with the baseline flags only (what a CPU without AVX2 runs), for tests on any CPU."""
    return load(COMPARE_FLAGS)
