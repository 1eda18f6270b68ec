"""`_can_record_outputs` analysis: static (stdlib `ast`, no torch; see `static.py`) and fixes (libcst)."""

from __future__ import annotations

from modeltrace.recorders.checking import analyze_file, analyze_source
from modeltrace.recorders.fixes import apply_fixes, fix_file
from modeltrace.recorders.types import Analysis, Problem, Recorder

__all__ = ["Analysis", "Problem", "Recorder", "analyze_file", "analyze_source", "apply_fixes", "fix_file"]
