"""Rank-aware findings of a diff where one trace (or both) is tensor-parallel (`modeltrace trace --nproc N`).

Two kinds, both in `DiffResult.ranks` (`diff --format json`: "ranks") and in the text report:
- `rank_divergence`: a tensor every rank should hold whole differs between ranks (found when the parallel trace was
  merged, `worker/parallel.py`, and recorded in its header): a divergence of its own, so the diff is no match even
  where the merged values agree with the other trace;
- `shard`: at the first divergence, the ranks whose shard of a sharded output differs from the same part of the
  other trace, and those whose shard agrees. The other trace's part comes from its own shards (two parallel traces)
  or from slicing its full tensor (`--full-tensors`); with statistics only on a single-device side it cannot be
  split, and the finding says so.
No torch: NumPy on the stored tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modeltrace.trace.records import TensorSummary


# NOTE: a shard "agrees" when its statistics are this close, relative to the larger std (float32 TP runs differ
# from a single-device run by reduction order only: ~1e-7).
SHARD_TOLERANCE = 1e-3
_STATISTICS = ("mean", "std", "min", "max")


def rank_findings(result: Any) -> list[dict[str, Any]]:
    findings: list[dict[str, Any]] = []
    for side_name, loaded in (("reference", result.reference), ("candidate", result.candidate)):
        parallel = loaded.trace.model.get("parallel") or {}
        for item in parallel.get("rank_divergences") or []:
            findings.append(
                {
                    "kind": "rank_divergence",
                    "trace": side_name,
                    "rank": int(item["rank"]),
                    "reference_rank": int(item.get("reference_rank", 0)),
                    "path": item.get("path"),
                    "side": item.get("side"),
                    "key": item.get("key"),
                    "message": f"{side_name}: {item['message']}",
                }
            )
    divergence = result.first_divergence
    if divergence is None or divergence.module.reference is None:
        return findings
    # NOTE: the diverging module's outputs, then the inputs of its first child that receives differing inputs
    # (a replicated output, reduced over the ranks, cannot tell them apart; the shard feeding the reduction can)
    places = [(divergence.module, "outputs")]
    child = divergence.first_differing_child
    if child is not None and child.reference is not None:
        places.append((child, "inputs"))
    for module, side in places:
        references = {summary.key: summary for summary in getattr(module.reference, side)}
        for candidate in getattr(module.candidate, side):
            reference = references.get(candidate.key)
            if reference is None:
                continue
            finding = _shard_finding(module.candidate.path, reference, candidate, result, side)
            if finding is not None:
                findings.append(finding)
    # NOTE: a shard that agrees within the tolerance says nothing once another one names a rank (a softmax over
    # near-uniform scores hides a scaled query; the values that feed the reduction after it do not)
    if any(finding["kind"] == "shard" and finding["ranks"] for finding in findings):
        findings = [finding for finding in findings if finding["kind"] != "shard" or finding["ranks"]]
    return findings


def _shard_finding(
    path: str, reference: TensorSummary, candidate: TensorSummary, result: Any, side: str = "outputs"
) -> dict[str, Any] | None:
    if _is_shard(candidate):
        sharded, other, other_loaded, sharded_side = candidate, reference, result.reference, "candidate"
    elif _is_shard(reference):
        sharded, other, other_loaded, sharded_side = reference, candidate, result.candidate, "reference"
    else:
        return None
    placement = sharded.placement or {}
    dim, local_shapes, ranks = int(placement["dim"]), placement["local_shapes"], placement["ranks"]
    counterparts = _counterpart_statistics(other, other_loaded, dim, local_shapes)
    where = f"{path or '(model)'} {side[:-1]}{f' `{sharded.key}`' if sharded.key else ''}"
    if counterparts is None:
        return {
            "kind": "shard",
            "path": path,
            "key": sharded.key,
            "dim": dim,
            "ranks": [],
            "agreeing_ranks": [],
            "message": (
                f"{where} is sharded on dimension {dim} over {len(ranks)} ranks in the {sharded_side}; the "
                "other trace has statistics only, which cannot be split per rank (trace it with "
                "--full-tensors to have the diff name the rank)"
            ),
        }
    differing = [rank for rank, (mine, theirs) in enumerate(zip(ranks, counterparts)) if not _agree(mine, theirs)]
    agreeing = [rank for rank in range(len(ranks)) if rank not in differing]
    if differing:
        named = ", ".join(f"rank {rank} {_shape_text(local_shapes[rank])}" for rank in differing)
        tail = (
            (
                f"; {'rank' if len(agreeing) == 1 else 'ranks'} {', '.join(map(str, agreeing))} "
                f"{'agrees' if len(agreeing) == 1 else 'agree'}"
            )
            if agreeing
            else ""
        )
        message = (
            f"{where} is sharded on dimension {dim}: the shard of {named} differs from the same part of the "
            f"{'reference' if sharded_side == 'candidate' else 'candidate'}{tail}"
        )
    else:
        message = f"{where} is sharded on dimension {dim}: every rank's shard agrees with the same part of the other"
    return {
        "kind": "shard",
        "path": path,
        "key": sharded.key,
        "dim": dim,
        "ranks": differing,
        "agreeing_ranks": agreeing,
        "message": message,
    }


def _is_shard(summary: TensorSummary) -> bool:
    return bool(summary.placement) and summary.placement.get("kind") == "shard"


def _counterpart_statistics(
    other: TensorSummary, loaded: Any, dim: int, local_shapes: list[list[int]]
) -> list[dict[str, float]] | None:
    """Statistics of the parts of `other` that match each rank's shard: its own shards, or slices of its full
    tensor; None when it has neither."""
    placement = other.placement or {}
    if (
        placement.get("kind") == "shard"
        and placement.get("dim") == dim
        and placement.get("local_shapes") == local_shapes
    ):
        return list(placement["ranks"])
    if other.tensor is None or loaded.tensors is None or other.tensor not in loaded.tensors:
        return None
    values = loaded.tensors.get(other.tensor)
    if values is None or values.ndim <= dim or values.shape[dim] != sum(shape[dim] for shape in local_shapes):
        return None
    parts, start = [], 0
    for shape in local_shapes:
        piece = np.take(values, np.arange(start, start + shape[dim]), axis=dim).astype(np.float64).ravel()
        start += shape[dim]
        finite = piece[np.isfinite(piece)]
        if finite.size == 0:
            parts.append({name: None for name in _STATISTICS})
            continue
        parts.append(
            {
                "mean": float(finite.mean()),
                "std": float(finite.std(ddof=1)) if finite.size > 1 else 0.0,
                "min": float(finite.min()),
                "max": float(finite.max()),
            }
        )
    return parts


def _agree(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    scale = max(abs(mine.get("std") or 0.0), abs(theirs.get("std") or 0.0), 1e-12)
    for name in _STATISTICS:
        a, b = mine.get(name), theirs.get(name)
        if a is None or b is None:
            if (a is None) != (b is None):
                return False
            continue
        if abs(a - b) > SHARD_TOLERANCE * scale:
            return False
    return True


def _shape_text(shape: list[int]) -> str:
    return "[" + ", ".join(str(size) for size in shape) + "]"
