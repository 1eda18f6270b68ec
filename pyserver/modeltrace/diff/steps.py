"""Step-aware diff of generation traces: which steps are compared, the first diverging step, the first differing
generated token and the first differing cache entry.

Two generation traces align step by step, then module by module inside a step: a module's calls are counted
across steps in the same order on both sides, so the diff's alignment by path and call index pairs step `s` with
step `s`. A reference that is a single forward pass is compared with the candidate's prefill (step 0) only; two
generations of different lengths are compared over the steps both have. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modeltrace.trace.records import CacheEntry, GenerationRecord, TensorSummary, Trace
from modeltrace.trace.tensors import LoadedTrace


# NOTE: cache statistics are compared relative to the tensors' scale (max |x| of both sides), like gradients.
CACHE_RELATIVE_TOLERANCE = 1e-4


@dataclass
class StepReport:
    """What a diff adds for generation traces (see the module docstring). Steps are 0 for the prefill."""

    reference_steps: int
    candidate_steps: int
    compared_steps: int
    first_diverging_step: int | None = None
    divergence_step: int | None = None
    first_differing_token: dict[str, Any] | None = None
    first_differing_cache: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "reference_steps": self.reference_steps,
            "candidate_steps": self.candidate_steps,
            "compared_steps": self.compared_steps,
            "first_diverging_step": self.first_diverging_step,
            "divergence_step": self.divergence_step,
            "first_differing_token": self.first_differing_token,
            "first_differing_cache": self.first_differing_cache,
        }


def _steps(trace: Trace) -> int:
    return trace.generation.steps if trace.generation is not None else 1


def _truncate(trace: Trace, steps: int) -> None:
    """Keep the module records (and line records) of the first `steps` steps of a generation trace."""
    generation = trace.generation
    if generation is None or steps >= generation.steps:
        return
    end = generation.step_starts[steps]
    trace.modules = trace.modules[:end]
    trace.lines = [line for line in trace.lines if line.module_call < end]


def restrict_to_common_steps(reference: LoadedTrace, candidate: LoadedTrace) -> list[str]:
    """Cut both traces to the steps both have (a single forward pass is one step, the prefill); returns notes."""
    reference_steps, candidate_steps = _steps(reference.trace), _steps(candidate.trace)
    if reference.trace.generation is None and candidate.trace.generation is None:
        return []
    common = min(reference_steps, candidate_steps)
    notes = []
    for side, loaded, steps in (("reference", reference, reference_steps), ("candidate", candidate, candidate_steps)):
        if steps > common:
            _truncate(loaded.trace, common)
            other = (
                "a single forward pass"
                if common == 1 and ((reference if side == "candidate" else candidate).trace.generation is None)
                else f"{common} steps"
            )
            notes.append(
                f"the {'reference' if side == 'candidate' else 'candidate'} is {other}: compared with the "
                f"{side}'s {'prefill (step 0)' if common == 1 else f'first {common} steps'}; "
                f"{steps - common} of its steps not compared"
            )
    return notes


def summaries_close(reference: TensorSummary, candidate: TensorSummary, relative: float) -> bool:
    """Statistics that agree within `relative` of the two tensors' scale (and the same shape and NaN/Inf counts)."""
    if list(reference.shape) != list(candidate.shape):
        return False
    if (reference.nan_count, reference.inf_count) != (candidate.nan_count, candidate.inf_count):
        return False
    scales = [abs(value) for value in (reference.abs_max, candidate.abs_max) if value is not None and value == value]
    scale = max(scales) if scales else 0.0
    limit = relative * scale + 1e-12
    for name in ("mean", "std", "min", "max"):
        left, right = getattr(reference, name), getattr(candidate, name)
        if left is None or right is None or left != left or right != right:
            continue
        if abs(left - right) > limit:
            return False
    return True


def _first_token(reference: GenerationRecord, candidate: GenerationRecord) -> dict[str, Any] | None:
    for row, (reference_ids, candidate_ids) in enumerate(zip(reference.generated_ids, candidate.generated_ids)):
        for position, (reference_id, candidate_id) in enumerate(zip(reference_ids, candidate_ids)):
            if reference_id != candidate_id:
                # NOTE: new token `position` is the one step `position` chose (the prefill chooses the first)
                return {
                    "row": row,
                    "position": position,
                    "step": position,
                    "reference": reference_id,
                    "candidate": candidate_id,
                }
    return None


def _first_cache(reference: GenerationRecord, candidate: GenerationRecord, steps: int) -> dict[str, Any] | None:
    by_place: dict[tuple[int, str, int], CacheEntry] = {
        (entry.step, entry.kind, entry.layer): entry for entry in reference.cache
    }
    for entry in sorted(candidate.cache, key=lambda item: (item.step, item.layer, item.kind)):
        if entry.step >= steps:
            continue
        other = by_place.get((entry.step, entry.kind, entry.layer))
        if other is None:
            continue
        for name in ("key", "value"):
            if not summaries_close(getattr(other, name), getattr(entry, name), CACHE_RELATIVE_TOLERANCE):
                return {
                    "step": entry.step,
                    "layer": entry.layer,
                    "kind": entry.kind,
                    "tensor": name,
                    "reference_shape": getattr(other, name).shape,
                    "candidate_shape": getattr(entry, name).shape,
                }
    return None


def step_report(result: Any) -> StepReport | None:
    """The step part of a diff result (None unless one side is a generation trace)."""
    reference, candidate = result.reference.trace, result.candidate.trace
    if reference.generation is None and candidate.generation is None:
        return None
    report = StepReport(_steps(reference), _steps(candidate), min(_steps(reference), _steps(candidate)))
    step_of = candidate.step_of
    differing = [
        step_of(module.candidate.index) for module in result.modules if module.status in ("mismatch", "divergence")
    ]
    differing = [step for step in differing if step is not None]
    report.first_diverging_step = min(differing) if differing else None
    if result.first_divergence is not None:
        report.divergence_step = step_of(result.first_divergence.module.candidate.index)
    if reference.generation is not None and candidate.generation is not None:
        report.first_differing_token = _first_token(reference.generation, candidate.generation)
        report.first_differing_cache = _first_cache(reference.generation, candidate.generation, report.compared_steps)
    return report
