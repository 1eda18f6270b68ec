"""Diff of two traces: align module calls (`align`), compare their tensors (`compare`), report (`report`).

No torch import: the language server uses this package. Entry points:

- `load_reference(path)`: a trace folder or a transformers debugger output, with its full tensors
  (`LoadedTrace`; close it, or use it as a context manager, to release the tensors' memory map);
- `diff_traces(reference, candidate, DiffOptions(atol, rtol, maps, rel_tol))` -> `DiffResult`, or
  `diff_paths(...)` (with `replay=True`: suspect candidate modules re-run on the reference's inputs in the
  worker, `replay.run_replay`);
- `to_json(result)` (the `diff --format json` document), `render_text(result)`, `line_statuses(result)`
  (per (file, line) of the candidate: "divergence" / "mismatch" / "match" / "not_compared"), and
  `plot_data(result)` (max abs difference per module in the order calls finished, and per layer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modeltrace.diff.align import Alignment, RenameMap, align_traces, parse_maps
from modeltrace.diff.compare import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    DiffError,
    DiffOptions,
    DiffResult,
    Divergence,
    ModuleResult,
    compare_arrays,
    diff_traces,
)
from modeltrace.diff.replay import DEFAULT_REPLAY_LIMIT, replay_unavailable, run_replay
from modeltrace.diff.report import line_statuses, line_statuses_for_file, plot_data, render_text, to_json
from modeltrace.trace.reference import load_reference
from modeltrace.trace.tensors import LoadedTrace


def diff_paths(reference: Path | str, candidate: Path | str, atol: float | None = None, rtol: float | None = None,
               maps: list[str] | tuple[str, ...] = (), rel_tol: float | None = None, replay: bool = False,
               client: Any = None, replay_limit: int = DEFAULT_REPLAY_LIMIT) -> DiffResult:
    """Load both (any accepted format) and diff them, with the replay when asked (falling back, with a note,
    where it cannot run); the tensors stay open on the result's `LoadedTrace`s until `close_result(result)`."""
    options = DiffOptions(atol=atol, rtol=rtol, maps=tuple(parse_maps(maps)), rel_tol=rel_tol)
    loaded_reference = load_reference(reference)
    try:
        loaded_candidate = load_reference(candidate)
    except BaseException:
        loaded_reference.close()
        raise
    try:
        result = diff_traces(loaded_reference, loaded_candidate, options)
        if replay:
            run_replay(result, client, replay_limit)
        return result
    except BaseException:
        loaded_reference.close()
        loaded_candidate.close()
        raise


def close_result(result: DiffResult) -> None:
    result.reference.close()
    result.candidate.close()


__all__ = [
    "DIVERGENCE",
    "MATCH",
    "MISMATCH",
    "NOT_COMPARED",
    "Alignment",
    "DiffError",
    "DiffOptions",
    "DiffResult",
    "Divergence",
    "LoadedTrace",
    "ModuleResult",
    "RenameMap",
    "align_traces",
    "close_result",
    "compare_arrays",
    "diff_paths",
    "diff_traces",
    "line_statuses",
    "line_statuses_for_file",
    "load_reference",
    "parse_maps",
    "plot_data",
    "render_text",
    "replay_unavailable",
    "run_replay",
    "to_json",
]
