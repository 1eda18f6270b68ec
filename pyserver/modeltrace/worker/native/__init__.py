"""The fused statistics kernel (`moments.c`): compiled on first use with the machine's C compiler, loaded with
ctypes, and optional: without a compiler (or with `MODELTRACE_NATIVE=0`) `worker/stats.py` uses torch's
reductions and gets the same numbers, only slower.

The shared library is cached per user under `$XDG_CACHE_HOME/modeltrace/` (default `~/.cache/modeltrace/`),
named by a hash of the source, the flags and the compiler, so an edit or another CPU flag set builds a new one.
It is written to a temporary name and renamed into place, so processes that compile at the same moment never
load half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


SOURCE = Path(__file__).with_name("moments.c")
# NOTE: associative math lets the compiler split the block sums into vector lanes (the blocks keep the float32
# error small); no -ffinite-math-only: NaN and Inf must still reach the sums, which is how the caller sees them.
_BASE_FLAGS = ["-O3", "-shared", "-fPIC", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]

_library: ctypes.CDLL | None = None
_loaded = False
load_error: str | None = None


def _cpu_flags() -> list[str]:
    """AVX2/FMA when the CPU has them (Linux x86-64): twice the vector width of the SSE2 baseline."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(flags_line.split())
    return ["-mavx2", "-mfma"] if {"avx2", "fma"} <= flags else []


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "modeltrace"


def _build(compiler: str, flags: list[str]) -> Path:
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join([compiler, *flags, sys.platform]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"moments-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built)], check=True, capture_output=True, timeout=120)
        os.replace(built, target)
    return target


def library() -> ctypes.CDLL | None:
    """The loaded kernel, building it the first time; None (with `load_error` saying why) when unavailable."""
    global _library, _loaded, load_error
    if _loaded:
        return _library
    _loaded = True
    if os.environ.get("MODELTRACE_NATIVE", "1") == "0":
        load_error = "disabled by MODELTRACE_NATIVE=0"
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        load_error = "no C compiler (cc, gcc or clang) on PATH"
        return None
    try:
        path = _build(compiler, _BASE_FLAGS + _cpu_flags())
        loaded = ctypes.CDLL(str(path))
        for name in ("modeltrace_moments_f32", "modeltrace_moments_f64", "modeltrace_moments_i64"):
            function = getattr(loaded, name)
            function.restype = None
            function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    except (OSError, subprocess.SubprocessError, AttributeError) as error:
        stderr = getattr(error, "stderr", b"") or b""
        load_error = f"{type(error).__name__}: {error} {stderr.decode(errors='replace')[:500]}".strip()
        return None
    _library = loaded
    return _library
