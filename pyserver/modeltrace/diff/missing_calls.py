"""A child the candidate built and never called, in the place where the reference calls its counterpart.

Inside the diverging pair, a reference child call that nothing aligns with may be the counterpart of a candidate
module that was built (with the same weights: the port copied them) and never called: the port calls another
module in its place (Gemma's MLP: `gate = self.up_proj(x)` where the reference calls `gate_proj`). The children's
calls are compared in order: the candidate's call at the position where the reference calls that counterpart is
the line named (`first_divergence.line`, when the drill-down's line is later or missing), with why.
"""

from __future__ import annotations

from modeltrace.diff.lines import LineDivergence
from modeltrace.diff.result import DiffResult, Divergence
from modeltrace.diff.settings import compare_parameters
from modeltrace.trace.records import ModuleBuild, ModuleCall


def missing_call(result: DiffResult, divergence: Divergence) -> LineDivergence | None:
    """The candidate's child call that stands where the reference calls the counterpart of a module the candidate
    never calls, or None."""
    reference, candidate = divergence.module.reference, divergence.module.candidate
    if reference is None:
        return None
    ref_children = _children(result.reference.trace.modules, reference.index)
    cand_children = _children(result.candidate.trace.modules, candidate.index)
    aligned_ref = {module.reference.index for module in result.modules if module.reference is not None}
    called = {call.path for call in result.candidate.trace.modules}
    prefix = f"{candidate.path}." if candidate.path else ""
    uncalled = [
        build
        for build in result.candidate.trace.builds
        if build.path.startswith(prefix) and build.path not in called and build.parameters
    ]
    ref_builds = {build.path: build for build in result.reference.trace.builds}
    stores = (result.reference.tensors, result.candidate.tensors)
    for position, ref_call in enumerate(ref_children):
        ref_build = ref_builds.get(ref_call.path)
        if ref_call.index in aligned_ref or ref_build is None or position >= len(cand_children):
            continue
        twin = next((build for build in uncalled if _same_weights(ref_build, build, stores)), None)
        standing = cand_children[position]
        if twin is None or standing.called_at is None or standing.path == twin.path:
            continue
        where = standing.called_at
        return LineDivergence(
            where.file,
            where.line,
            standing.path.rsplit(".", 1)[-1],
            None,
            f"calls {standing.path} where the reference calls {ref_call.path}, whose counterpart {twin.path} (the "
            "same weights) the candidate built and never calls",
            module_call=candidate.index,
        )
    return None


def _children(records: list[ModuleCall], call: int) -> list[ModuleCall]:
    """The calls made directly inside `call`, in the order they started."""
    return [record for record in records if record.parent == call]


def _same_weights(reference: ModuleBuild, candidate: ModuleBuild, stores: tuple) -> bool:
    if reference.class_name != candidate.class_name or len(reference.parameters) != len(candidate.parameters):
        return False
    return not compare_parameters(reference, candidate, *stores)
