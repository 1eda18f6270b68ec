"""`_can_record_outputs` analysis: static (libcst, importable without torch) and fixes."""

from modeltrace.recorders.fixes import apply_fixes, fix_file
from modeltrace.recorders.static import Analysis, Problem, Recorder, analyze_file, analyze_source

__all__ = ["Analysis", "Problem", "Recorder", "analyze_file", "analyze_source", "apply_fixes", "fix_file"]
