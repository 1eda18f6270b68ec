"""Diff of two traces: align module calls (`align`), compare their tensors (`compare`), report (`report`).

No torch import: the language server uses this package. Entry points:

- `load_reference(path)`: a trace folder or a transformers debugger output, with its full tensors
  (`LoadedTrace`; close it, or use it as a context manager, to release the tensors' memory map);
- `diff_traces(reference, candidate, DiffOptions(atol, rtol, maps, rel_tol, mapping))` -> `DiffResult`, or
  `diff_paths(...)` (with `replay=True`: suspect candidate modules re-run on the reference's inputs in the
  worker, started during the comparison, `replay.ReplayRun`; `replay.run_replay` after a finished diff);
- `align_modules(reference_trace, candidate_trace)` -> `ModuleMapping` (automatic alignment by evidence, not
  names), `render_mapping` / `read_mapping` (the mapping file `modeltrace align` writes and `--mapping` reads);
- `to_json(result)` (the `diff --format json` document), `render_text(result)`, `line_statuses(result)`
  (per (file, line) of the candidate: "divergence" / "mismatch" / "match" / "not_compared"), and
  `plot_data(result)` (max abs difference per module in the order calls finished, and per layer).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from modeltrace.diff.align import Alignment, RenameMap, align_traces, parse_maps
from modeltrace.diff.auto_align import ModuleMapping, align_modules
from modeltrace.diff.mapping import read_mapping, render_mapping
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
from modeltrace.diff.replay import DEFAULT_REPLAY_LIMIT, WHEN_POSSIBLE, ReplayRun, replay_unavailable, run_replay
from modeltrace.diff.report import line_statuses, line_statuses_for_file, plot_data, render_text, to_json
from modeltrace.trace.reference import load_reference
from modeltrace.trace.tensors import LoadedTrace


def diff_paths(
    reference: Path | str,
    candidate: Path | str,
    atol: float | None = None,
    rtol: float | None = None,
    maps: list[str] | tuple[str, ...] = (),
    rel_tol: float | None = None,
    replay: bool | str = False,
    client: Any = None,
    replay_limit: int = DEFAULT_REPLAY_LIMIT,
    mapping: Path | str | None = None,
    automatic: bool = True,
) -> DiffResult:
    """Load both (any accepted format) and diff them, with the replay when asked (falling back, with a note,
    where it cannot run; `replay=WHEN_POSSIBLE`: not for a reference without full tensors, and without a note then: the editor's
    default); the tensors stay open on the result's `LoadedTrace`s until `close_result(result)`.
    `mapping`: a mapping file (`modeltrace align`) that replaces alignment by names; `automatic`: align by
    evidence when names leave most modules unaligned."""
    parsed_maps = tuple(parse_maps(maps))
    loaded_reference = load_reference(reference)
    try:
        loaded_candidate = load_reference(candidate)
    except BaseException:
        loaded_reference.close()
        raise
    try:
        module_mapping = (
            read_mapping(mapping, loaded_reference.trace, loaded_candidate.trace) if mapping is not None else None
        )
        options = DiffOptions(
            atol=atol, rtol=rtol, maps=parsed_maps, rel_tol=rel_tol, mapping=module_mapping, automatic=automatic
        )
        if not replay or (replay == WHEN_POSSIBLE and loaded_reference.tensors is None):
            return diff_traces(loaded_reference, loaded_candidate, options)
        # the replay starts as soon as the comparison has named its suspects, and runs while the rest is compared
        replay_run = ReplayRun(loaded_reference, loaded_candidate, client, replay_limit)
        try:
            result = diff_traces(loaded_reference, loaded_candidate, options, watch=replay_run.watch)
        except BaseException:
            replay_run.abandon()
            raise
        replay_run.finish(result)
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
    "ReplayRun",
    "WHEN_POSSIBLE",
    "LoadedTrace",
    "ModuleMapping",
    "ModuleResult",
    "RenameMap",
    "align_modules",
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
    "read_mapping",
    "render_mapping",
    "render_text",
    "replay_unavailable",
    "run_replay",
    "to_json",
]


class _CallableDiffPackage(types.ModuleType):
    """`modeltrace.diff(reference, candidate, **options)` is the library's diff (`modeltrace.api.diff`), while
    `modeltrace.diff` is also this package: once the package is imported, the attribute of `modeltrace` is the
    package, so the package itself answers the call."""

    def __call__(self, reference: Path | str, candidate: Path | str, **options: Any) -> Any:
        from modeltrace.api import diff

        return diff(reference, candidate, **options)


sys.modules[__name__].__class__ = _CallableDiffPackage
