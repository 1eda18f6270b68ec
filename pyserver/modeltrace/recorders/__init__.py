"""`_can_record_outputs` analysis: static (stdlib `ast`, importable without torch; see `static.py`) and fixes
(libcst)."""

from __future__ import annotations

from typing import Any

from modeltrace.recorders.checking import analyze_file, analyze_source
from modeltrace.recorders.types import Analysis, Problem, Recorder

__all__ = ["Analysis", "Problem", "Recorder", "analyze_file", "analyze_source", "apply_fixes", "fix_file"]


def __getattr__(name: str) -> Any:
    # NOTE: the fixes need libcst, which the extension's bundle cannot carry (compiled): imported on first use,
    # so that the checks (and the server) work in an environment without it.
    if name in ("apply_fixes", "fix_file"):
        from modeltrace.recorders import fixes

        return getattr(fixes, name)
    raise AttributeError(f"module 'modeltrace.recorders' has no attribute {name!r}")
