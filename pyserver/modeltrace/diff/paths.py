"""The diff of two traces given by their paths, in any accepted format (a trace folder, a transformers debugger
output): both loaded, compared, and replayed when asked; the one entry point of the CLI, the editor and the library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modeltrace.diff.align import parse_maps
from modeltrace.diff.compare import diff_traces
from modeltrace.diff.mapping import read_mapping
from modeltrace.diff.replay import DEFAULT_REPLAY_LIMIT, WHEN_POSSIBLE, ReplayRun
from modeltrace.diff.result import DiffOptions, DiffResult
from modeltrace.trace.reference import load_reference


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
    """Release the tensors (memory maps) that `diff_paths` left open on the result's two traces."""
    result.reference.close()
    result.candidate.close()
