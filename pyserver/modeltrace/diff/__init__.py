"""Diff of two traces: align module calls (`align`), compare their tensors (`compare`), report (`report`).

The modules, each importing only those after it: `paths` (two paths diffed, the replay when asked), `replay`,
`compare` (the comparison, from alignment to verdict), `evidence` (with `lines` and `settings`), `divergence`
(the first-divergence search), `sides` (each side of a call, statistics in bulk), `verdict` (the rule on a pair of
full tensors), `arrays` (the measures) and `tolerances`, `result` (the records), and below them the alignment
(`align`, `auto_align`, `mapping`, `kinds`), the pairing of tensors (`pairing`), `steps`, `gradients`, `ranks`.

No torch import: the language server uses this package. Entry points:

- `load_reference(path)`: a trace folder or a transformers debugger output, with its full tensors
  (`LoadedTrace`; close it, or use it as a context manager, to release the tensors' memory map);
- `diff_traces(reference, candidate, DiffOptions(atol, rtol, maps, rel_tol, mapping))` -> `DiffResult`, or
  `diff_paths(...)` (with `replay=True`: suspect candidate modules re-run on the reference's inputs in the
  worker, started during the comparison, `replay.ReplayRun`; `replay.run_replay` after a finished diff);
- `align_modules(reference_trace, candidate_trace)` -> `ModuleMapping` (automatic alignment by evidence, not
  names), `render_mapping` / `read_mapping` (the mapping file `modeltrace align` writes and `--mapping` reads);
- `to_json(result)` (the `diff --format json` document), `render_text(result)`, `line_statuses(result)`
  (per (file, line) of the candidate: "divergence" / "mismatch" / "inherited" / "match" / "not_compared"; a line
  status only, `INHERITED`: its calls differ only through their inputs), and
  `plot_data(result)` (max abs difference per module in the order calls finished, and per layer).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from modeltrace.diff.align import Alignment, RenameMap, align_traces, parse_maps
from modeltrace.diff.arrays import compare_arrays
from modeltrace.diff.auto_align import ModuleMapping, align_modules
from modeltrace.diff.compare import diff_traces
from modeltrace.diff.mapping import read_mapping, render_mapping
from modeltrace.diff.paths import close_result, diff_paths
from modeltrace.diff.replay import WHEN_POSSIBLE, ReplayRun, replay_unavailable, run_replay
from modeltrace.diff.report import INHERITED, line_statuses, line_statuses_for_file, plot_data, render_text, to_json
from modeltrace.diff.result import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    DiffError,
    DiffOptions,
    DiffResult,
    Divergence,
    ModuleResult,
)
from modeltrace.diff_view import diff as _library_diff
from modeltrace.trace.reference import load_reference
from modeltrace.trace.tensors import LoadedTrace


__all__ = [
    "DIVERGENCE",
    "INHERITED",
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
    """`modeltrace.diff(reference, candidate, **options)` is the library's diff (`modeltrace.diff_view.diff`),
    while `modeltrace.diff` is also this package: once the package is imported, the attribute of `modeltrace` is
    the package, so the package itself answers the call."""

    def __call__(self, reference: Path | str, candidate: Path | str, **options: Any) -> Any:
        return _library_diff(reference, candidate, **options)


sys.modules[__name__].__class__ = _CallableDiffPackage
