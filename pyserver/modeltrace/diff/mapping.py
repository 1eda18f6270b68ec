"""Module mappings a user can read and fix: the file `modeltrace align` writes and `diff --mapping` reads, and
how a mapping pairs the calls of two traces.

The file is text, one pair per line, so that an error can name its line and a pair can be fixed in any editor:

    # modeltrace mapping 1: REFERENCE => CANDIDATE  # confidence: evidence
    embed_tokens => tok_embeddings  # 1.00: kind embedding, output [7, 64], values equal
    layers.0.self_attn.q_proj + layers.0.self_attn.k_proj + layers.0.self_attn.v_proj => layers.0.attention.wqkv  # 0.95: fused …
    # unaligned reference rotary_emb: best norm 0.04 (kinds differ …; below the threshold 0.5)

`A + B + C => F` pairs a fused module with the run it replaces: the run's outputs are compared concatenated on
the last dimension (either side may be the fused one). `A -> B -> C => M` pairs a module with the run it computes
in sequence (a chain, `diff/chains.py`): compared on A's inputs and C's outputs; its members may be paired on
other lines too. The root is `(root)`. Comments and blank lines are
ignored; a line may end in `# confidence: evidence`, which is kept as the pair's evidence.

Calls pair by call index within a module pair. A fused pair becomes one record on the side of the run (its
path `A + B + C`), whose first output summarises the concatenation and whose full tensor, when every member
has one, is the concatenation itself (`ConcatenatedTensors` serves it to the comparison).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from modeltrace.diff.auto_align import DEFAULT_THRESHOLD, Leftover, ModuleMapping, ModulePair, pooled_moments
from modeltrace.diff.chains import SEPARATOR as CHAIN
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import ModuleCall, TensorSummary, Trace
from modeltrace.trace.source_files import UnreadableSource, read_source_text
from modeltrace.trace.tensors import TensorStore


HEADER = "# modeltrace mapping 1: REFERENCE => CANDIDATE  # confidence: evidence"
ROOT = "(root)"
_CONCAT_PREFIX = "concat\x1f"
_SEPARATOR = "\x1f"
_CONFIDENCE = re.compile(r"^\s*([0-9.]+)\s*(?::\s*(.*))?$")


def render_mapping(mapping: ModuleMapping, reference_label: str, candidate_label: str) -> str:
    """The mapping file's text."""
    lines = [
        HEADER,
        f"# reference: {reference_label}",
        f"# candidate: {candidate_label}",
        f"# pairs below confidence {mapping.threshold} were left unaligned (listed at the end)",
        "",
    ]
    for pair in mapping.pairs:
        joiner = CHAIN if pair.chain else " + "
        left = joiner.join(_path_text(path) for path in pair.reference)
        right = joiner.join(_path_text(path) for path in pair.candidate)
        lines.append(f"{left} => {right}  # {pair.confidence:.2f}: {pair.evidence}")
    if mapping.leftovers:
        lines.append("")
    for leftover in mapping.leftovers:
        options = "; ".join(f"{_path_text(path)} {score:.2f} ({why})" for path, score, why in leftover.candidates)
        lines.append(f"# unaligned {leftover.side} {_path_text(leftover.path)}: best {options or 'none'}")
    return "\n".join(lines) + "\n"


def _path_text(path: str) -> str:
    return path or ROOT


def _path_value(text: str) -> str:
    return "" if text == ROOT else text


def read_mapping(path: Path | str, reference: Trace, candidate: Trace) -> ModuleMapping:
    """Parse a mapping file, checking every path against the traces; errors name the file and line."""
    path = Path(path)
    try:
        # NOTE: read as a source file is (a regular file, bounded): a FIFO or /dev/zero given as --mapping is refused
        text = read_source_text(path)
    except UnreadableSource as error:
        raise ModelTraceError(f"cannot read the mapping file: {error}") from None
    ref_paths = {record.path for record in reference.modules}
    cand_paths = {record.path for record in candidate.modules}
    pairs: list[ModulePair] = []
    seen_ref: dict[str, int] = {}
    seen_cand: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        body, _, comment = raw.partition("#")
        if not body.strip():
            continue
        left, arrow, right = body.partition("=>")
        where = f"{path}:{number}"
        if not arrow or "=>" in right:
            raise ModelTraceError(
                f"{where}: expected 'REFERENCE => CANDIDATE' (paths joined by ' + ' for a fused "
                f"run), got {raw.strip()!r}"
            )
        chain = "->" in left or "->" in right
        if chain and "+" in left + right:
            raise ModelTraceError(f"{where}: a pair is a fused run ('+') or a chain ('->'), not both: {raw.strip()!r}")
        items = (left.split("->"), right.split("->")) if chain else (left.split("+"), right.split("+"))
        reference_paths = [_path_value(item.strip()) for item in items[0]]
        candidate_paths = [_path_value(item.strip()) for item in items[1]]
        if any(not item.strip() for item in items[0] + items[1]):
            raise ModelTraceError(f"{where}: an empty module path in {raw.strip()!r}")
        if len(reference_paths) > 1 and len(candidate_paths) > 1:
            kind = "a chain" if chain else "a fused pair"
            raise ModelTraceError(f"{where}: {kind} has one module on one side, not runs on both")
        for side, paths, known, seen in (
            ("reference", reference_paths, ref_paths, seen_ref),
            ("candidate", candidate_paths, cand_paths, seen_cand),
        ):
            for item in paths:
                if item not in known:
                    close = _closest(item, known)
                    raise ModelTraceError(
                        f"{where}: the {side} trace has no module {_path_text(item)!r}"
                        + (f" (did you mean {close!r}?)" if close else "")
                    )
                # NOTE: a chain's run keeps its members' own pairs (`conv1 => convolution` beside the chain)
                if chain and len(paths) > 1:
                    continue
                if item in seen:
                    raise ModelTraceError(
                        f"{where}: {side} module {_path_text(item)!r} is already paired on line {seen[item]}"
                    )
                seen[item] = number
        confidence, evidence = 1.0, "given in the mapping file"
        match = _CONFIDENCE.match(comment) if comment.strip() else None
        if match:
            try:
                confidence = float(match.group(1))
            except ValueError:
                confidence = 1.0
            evidence = match.group(2) or evidence
        pairs.append(ModulePair(reference_paths, candidate_paths, confidence, evidence, line=number, chain=chain))
    if not pairs:
        raise ModelTraceError(f"{path}: no 'REFERENCE => CANDIDATE' line in the mapping file")
    leftovers = [Leftover("reference", item) for item in sorted(ref_paths - seen_ref.keys())]
    leftovers += [Leftover("candidate", item) for item in sorted(cand_paths - seen_cand.keys())]
    return ModuleMapping(pairs, leftovers, DEFAULT_THRESHOLD, source=str(path))


def _closest(path: str, known: set[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(path, sorted(known), n=1, cutoff=0.6)
    return found[0] if found else None


def pair_calls(reference: Trace, candidate: Trace, mapping: ModuleMapping) -> list[tuple[int, int, ModulePair]]:
    """(candidate position, reference position, pair) for every call pair the mapping makes, adding a group
    record to the run's trace for each fused pair."""
    ref_calls = _calls_by_path(reference)
    cand_calls = _calls_by_path(candidate)
    found = []
    for pair in mapping.pairs:
        if len(pair.reference) > 1:
            ref_side = _group_calls(reference, pair.reference, ref_calls, pair.chain)
            cand_side = cand_calls.get(pair.candidate[0], [])
        elif len(pair.candidate) > 1:
            ref_side = ref_calls.get(pair.reference[0], [])
            cand_side = _group_calls(candidate, pair.candidate, cand_calls, pair.chain)
        else:
            ref_side, cand_side = ref_calls.get(pair.reference[0], []), cand_calls.get(pair.candidate[0], [])
        for cand_position, ref_position in zip(cand_side, ref_side):
            found.append((cand_position, ref_position, pair))
    return found


def _calls_by_path(trace: Trace) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for position, record in enumerate(trace.modules):
        found.setdefault(record.path, []).append(position)
    return found


def _group_calls(trace: Trace, paths: list[str], calls: dict[str, list[int]], chain: bool = False) -> list[int]:
    """One group record per call index of the run (appended to `trace.modules`), as far as every member has
    that call."""
    count = min(len(calls.get(path, [])) for path in paths)
    positions = []
    for call_index in range(count):
        members = [trace.modules[calls[path][call_index]] for path in paths]
        record = _group_record(len(trace.modules), members, call_index, chain)
        trace.modules.append(record)
        positions.append(record.index)
    return positions


def _group_record(index: int, members: list[ModuleCall], call_index: int, chain: bool = False) -> ModuleCall:
    """A fused run's record, whose first output is the members' outputs concatenated; or, with `chain`, a chain's
    (`diff/chains.py`): the run's first inputs and its last member's outputs, the tensors the module on the other
    side takes and returns."""
    first, last = members[0], max(members, key=lambda item: item.finish_order)
    joiner = CHAIN if chain else " + "
    if chain:
        outputs = list(last.outputs)
    else:
        outputs = [_concatenated(members)] if all(item.outputs for item in members) else []
    return ModuleCall(
        index=index,
        path=joiner.join(item.path for item in members),
        class_name="(" + joiner.join(item.class_name for item in members) + ")",
        defined_at=first.defined_at,
        called_at=first.called_at,
        call_index=call_index,
        parent=first.parent,
        finish_order=last.finish_order,
        inputs=list(first.inputs),
        outputs=outputs,
    )


def _concatenated(members: list[ModuleCall]) -> TensorSummary:
    """The summary of the members' first outputs concatenated on the last dimension, from their own summaries
    (exact for min, max and the counts; mean and std from the pooled moments)."""
    summaries = [item.outputs[0] for item in members]
    first = summaries[0]
    shape = list(first.shape[:-1]) + [sum(summary.shape[-1] for summary in summaries)]
    combined = TensorSummary(first.key, shape, first.dtype, first.device)
    counts = [math.prod(summary.shape) for summary in summaries]
    if all(summary.mean is not None and summary.std is not None for summary in summaries):
        combined.mean, combined.std = pooled_moments(
            [(count, summary.mean, summary.std) for count, summary in zip(counts, summaries)]
        )
    if all(summary.min is not None for summary in summaries):
        combined.min = min(summary.min for summary in summaries)
        combined.max = max(summary.max for summary in summaries)
        combined.abs_max = max(summary.abs_max for summary in summaries)
    combined.nan_count = sum(summary.nan_count for summary in summaries)
    combined.inf_count = sum(summary.inf_count for summary in summaries)
    if all(summary.positive_fraction is not None for summary in summaries):
        combined.positive_fraction = sum(
            count * summary.positive_fraction for count, summary in zip(counts, summaries)
        ) / sum(counts)
    if all(summary.tensor is not None for summary in summaries):
        combined.tensor = _CONCAT_PREFIX + _SEPARATOR.join(summary.tensor for summary in summaries)
    return combined


class ConcatenatedTensors(TensorStore):
    """A trace's tensors plus the concatenations that group records name."""

    def __init__(self, inner: TensorStore) -> None:
        self.inner = inner

    def _members(self, name: str) -> list[str] | None:
        return name[len(_CONCAT_PREFIX) :].split(_SEPARATOR) if name.startswith(_CONCAT_PREFIX) else None

    def get(self, name: str) -> np.ndarray | None:
        members = self._members(name)
        if members is None:
            return self.inner.get(name)
        arrays = [self.inner.get(member) for member in members]
        if any(array is None for array in arrays):
            return None
        return np.concatenate(arrays, axis=-1)

    def __contains__(self, name: object) -> bool:
        members = self._members(name) if isinstance(name, str) else None
        if members is None:
            return name in self.inner
        return all(member in self.inner for member in members)

    def precision(self, name: str) -> tuple[float, float]:
        members = self._members(name)
        if members is None:
            return self.inner.precision(name)
        precisions = [self.inner.precision(member) for member in members]
        return max(item[0] for item in precisions), max(item[1] for item in precisions)

    def close(self) -> None:
        self.inner.close()
