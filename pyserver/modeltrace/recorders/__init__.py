"""`_can_record_outputs` analysis: static (`ast`, importable without torch) and fixes (libcst)."""

from __future__ import annotations

from typing import Any

from modeltrace.recorders.static import Analysis, Problem, Recorder, analyze_file, analyze_source

__all__ = ["Analysis", "Problem", "Recorder", "analyze_file", "analyze_source", "apply_fixes", "fix_file"]


def __getattr__(name: str) -> Any:
    # NOTE: the fixes need libcst, which the extension's bundle cannot carry (compiled): imported on first use,
    # so that the checks (and the server) work in an environment without it.
    if name in ("apply_fixes", "fix_file"):
        from modeltrace.recorders import fixes

        return getattr(fixes, name)
    raise AttributeError(f"module 'modeltrace.recorders' has no attribute {name!r}")
