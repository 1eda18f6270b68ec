"""Diff of two traces: align module calls (`align`), compare their tensors (`compare`), report (`report`).

No torch import: the language server uses this package. Entry points:

- `load_reference(path)`: a trace folder or a transformers debugger output, with its full tensors
  (`LoadedTrace`; close it, or use it as a context manager, to release the tensors' memory map);
- `diff_traces(reference, candidate, DiffOptions(atol, rtol, maps, mapping))` -> `DiffResult`, or `diff_paths(...)`;
- `align_modules(reference_trace, candidate_trace)` -> `ModuleMapping` (automatic alignment by evidence, not
  names), `render_mapping` / `read_mapping` (the mapping file `modeltrace align` writes and `--mapping` reads);
- `to_json(result)` (the `diff --format json` document), `render_text(result)`, `line_statuses(result)`
  (per (file, line) of the candidate: "divergence" / "mismatch" / "match" / "not_compared"), and
  `plot_data(result)` (max abs difference per module in the order calls finished, and per layer).
"""

from __future__ import annotations

from pathlib import Path

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
from modeltrace.diff.report import line_statuses, line_statuses_for_file, plot_data, render_text, to_json
from modeltrace.trace.reference import load_reference
from modeltrace.trace.tensors import LoadedTrace


def diff_paths(reference: Path | str, candidate: Path | str, atol: float | None = None, rtol: float | None = None,
               maps: list[str] | tuple[str, ...] = (), mapping: Path | str | None = None,
               automatic: bool = True) -> DiffResult:
    """Load both (any accepted format) and diff them; the tensors stay open on the result's `LoadedTrace`s
    until `close_result(result)`. `mapping`: a mapping file (`modeltrace align`) that replaces alignment by
    names; `automatic`: align by evidence when names leave most modules unaligned."""
    parsed_maps = tuple(parse_maps(maps))
    loaded_reference = load_reference(reference)
    try:
        loaded_candidate = load_reference(candidate)
    except BaseException:
        loaded_reference.close()
        raise
    try:
        module_mapping = (read_mapping(mapping, loaded_reference.trace, loaded_candidate.trace)
                          if mapping is not None else None)
        options = DiffOptions(atol=atol, rtol=rtol, maps=parsed_maps, mapping=module_mapping, automatic=automatic)
        return diff_traces(loaded_reference, loaded_candidate, options)
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
    "to_json",
]
