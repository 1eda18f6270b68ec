"""Compiling ModelTrace's small C kernels on first use, torch-free: the worker's statistics kernel
(`worker/native`) and the diff's comparison kernel (`diff/native`) share the compiler lookup, the CPU's vector
flags and the per-user cache of built libraries defined here.

A library is cached under `$XDG_CACHE_HOME/modeltrace/` (default `~/.cache/modeltrace/`), named by a hash of the
source, the flags and the compiler, so an edit or another CPU flag set builds a new one. It is written to a
temporary name and renamed into place, so processes that compile at the same moment never load half a file.
`MODELTRACE_NATIVE=0` turns every kernel off (the numpy or torch paths give the same numbers, only slower);
`MODELTRACE_NATIVE=baseline` builds them without the CPU's vector flags.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# NOTE: associative math lets the compiler split the block sums into vector lanes; no -ffinite-math-only here:
# NaN and Inf must still reach the sums, which is how the callers see them.
BASE_FLAGS = ["-O3", "-fPIC", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]


def cpu_flags() -> list[str]:
    """AVX2/FMA when the CPU has them (Linux x86-64): twice the vector width of the SSE2 baseline; AVX-512 where
    it is there too (the statistics kernel in a medium Llama's forward: -27%; torch's own kernels use it
    already, so no frequency change is added)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(flags_line.split())
    if not {"avx2", "fma"} <= flags:
        return []
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mprefer-vector-width=512"]
    return ["-mavx2", "-mfma"]


def compiler() -> str | None:
    """The C compiler to build kernels with ($CC, else cc, gcc or clang on PATH), or None."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "modeltrace"


def native_setting() -> str:
    """`MODELTRACE_NATIVE`: "0" (kernels off), "baseline" (no CPU vector flags) or "1" (the default)."""
    return os.environ.get("MODELTRACE_NATIVE", "1")


def cached_library(source: Path, stem: str, key: list[str]) -> tuple[Path, bool]:
    """(the cached library path for `source` built as `key` describes, whether it is already there)."""
    digest = hashlib.sha256(source.read_bytes() + " ".join([*key, sys.platform, sys.version]).encode()).hexdigest()
    target = cache_dir() / f"{stem}-{digest[:16]}.so"
    return target, target.exists()


def build_library(source: Path, stem: str, cc: str, flags: list[str]) -> Path:
    """Compile `source` into a shared library in the cache (once per source, flags and compiler) and return its
    path; raises `subprocess.CalledProcessError` (its stderr says why) or `OSError`."""
    target, present = cached_library(source, stem, [cc, *flags])
    if present:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run(
            [cc, "-shared", *flags, str(source), "-o", str(built)], check=True, capture_output=True, timeout=120
        )
        os.replace(built, target)
    return target
