"""Alignment: which reference module call each candidate module call is compared with.

In order: the same path and call index; then, when most modules are still unaligned, a common leading prefix
(`model.` of a `…ForCausalLM` against its base model); then user rename maps (`--map 'REGEX=>REPL'`, a
`re.sub` chain). Maps are tried both ways and on both spellings of a name: on the path as recorded and on the
path with the automatic prefix stripped, rewriting reference names to find a candidate name, then candidate
names to find a reference name. So a rule can be written against the names either trace shows. A map whose
regex matches no path of either trace, or whose rewrites align nothing, is reported (`map_usage`, as notes).
Then, when most modules are still unaligned, the automatic alignment of `auto_align` (evidence other than
names), if it aligns more. A mapping file (`--mapping`, `diff/mapping.py`) replaces all of these: its pairs are
the alignment.
Candidate modules inside numbered layers that the reference lacks while it has layers on both sides of them
(`layers.0` and `layers.7` but not `layers.3`) are what `do_prune_layers=True` leaves out: they are marked
pruned, not unaligned. Everything else left over is reported.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from modeltrace.diff.auto_align import ModuleMapping, ModulePair, align_modules
from modeltrace.diff.chains import SEPARATOR as CHAIN
from modeltrace.diff.kinds import is_no_op
from modeltrace.diff.mapping import pair_calls
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import ModuleCall, Trace


@dataclass(frozen=True)
class RenameMap:
    """One `REGEX=>REPL` rule: `re.sub(REGEX, REPL, path)` (REPL may use `\\1` / `\\g<name>`)."""

    pattern: re.Pattern
    replacement: str
    text: str

    @classmethod
    def parse(cls, text: str) -> RenameMap:
        regex, separator, replacement = text.partition("=>")
        if not separator or not regex:
            raise ModelTraceError(
                f"--map {text!r}: expected 'REGEX=>REPLACEMENT' (for example 'h\\.(\\d+)=>layers.\\1')"
            )
        try:
            pattern = re.compile(regex)
        except re.error as error:
            raise ModelTraceError(f"--map {text!r}: invalid regular expression ({error})") from None
        if nested_repetition(regex):
            raise ModelTraceError(
                f"--map {text!r}: a repetition inside a repetition (like '(a+)+') can take exponential time on "
                "some paths; write it without the outer one (for example '(a+)' or '[a.]+')"
            )
        try:
            pattern.sub(replacement, "")
        except (re.error, IndexError) as error:
            raise ModelTraceError(f"--map {text!r}: invalid replacement ({error})") from None
        return cls(pattern, replacement, text)

    def apply(self, path: str) -> str:
        try:
            return self.pattern.sub(self.replacement, path)
        except (re.error, IndexError) as error:
            raise ModelTraceError(f"--map {self.text!r}: cannot rewrite {path!r} ({error})") from None


def nested_repetition(regex: str) -> bool:
    """Whether `regex` repeats something that itself repeats (`(a+)+`, `(\\w*\\.)*x`): the shape of pattern on
    which Python's backtracking engine can take exponential time (`^(([a-z_.0-9])+)+X$` on a long path hangs).

    NOTE: read from the standard library's own parse tree of the pattern; a pattern it cannot parse was refused
    by `re.compile` already.
    """
    from re import _constants as constants, _parser as parser  # type: ignore[attr-defined]

    repeats = {constants.MAX_REPEAT, constants.MIN_REPEAT}

    def walk(items: object, inside_repeat: bool) -> bool:
        for operator, value in items:  # type: ignore[attr-defined]
            if operator in repeats:
                _low, high, body = value
                repeating = high > 1
                if inside_repeat and repeating:
                    return True
                if walk(body, inside_repeat or repeating):
                    return True
            elif operator == constants.SUBPATTERN:
                if walk(value[-1], inside_repeat):
                    return True
            elif operator == constants.BRANCH:
                if any(walk(branch, inside_repeat) for branch in value[1]):
                    return True
            elif operator in (constants.ASSERT, constants.ASSERT_NOT):
                if walk(value[1], inside_repeat):
                    return True
            elif operator == constants.ATOMIC_GROUP:
                if walk(value, inside_repeat):
                    return True
        return False

    return walk(parser.parse(regex), False)


def parse_maps(texts: list[str] | tuple[str, ...] | None) -> list[RenameMap]:
    return [RenameMap.parse(text) for text in texts or ()]


@dataclass
class Alignment:
    """`reference_for[i]`: the reference record index of candidate record `i`, or -1; `how[i]` says why
    ("path", "map", "prefix", "auto", "mapping"); `pruned` holds candidate indices absent from a pruned reference.
    `mapping` is the module mapping used ("auto" or "mapping"), whose pairs carry confidence and evidence;
    `pair_of[i]` is the mapping pair candidate call `i` was aligned by; `groups` says whether a fused pair added
    group records (whose concatenated tensors `mapping.ConcatenatedTensors` serves)."""

    reference_for: list[int]
    how: list[str]
    pruned: set[int] = field(default_factory=set)
    unaligned_reference: list[int] = field(default_factory=list)
    unaligned_candidate: list[int] = field(default_factory=list)
    prefix: str | None = None
    prefix_side: str | None = None
    # per map (in the order given): (paths its regex matched, module calls it aligned)
    map_usage: list[tuple[RenameMap, int, int]] = field(default_factory=list)
    mapping: ModuleMapping | None = None
    pair_of: dict = field(default_factory=dict)
    groups: bool = False

    @property
    def aligned_count(self) -> int:
        return sum(1 for index in self.reference_for if index >= 0)


def align_traces(
    reference: Trace,
    candidate: Trace,
    maps: list[RenameMap] | None = None,
    mapping: ModuleMapping | None = None,
    automatic: bool = True,
) -> Alignment:
    if mapping is not None:
        return _finish(_from_mapping(reference, candidate, mapping, "mapping"), reference, candidate)
    alignment = _align_by_names(reference, candidate, maps or [])
    non_root = sum(1 for record in candidate.modules if record.path)
    aligned = sum(
        1
        for position, record in enumerate(candidate.modules)
        if record.path and alignment.reference_for[position] >= 0
    )
    if automatic and non_root and aligned < non_root / 2 and reference.modules:
        try:
            found = align_modules(reference, candidate)
        except ValueError:  # too many calls for the automatic alignment: keep what names gave
            found = None
        if found is not None and sum(len(pair.candidate) for pair in found.pairs if any(pair.candidate)) > aligned:
            alignment = _from_mapping(reference, candidate, found, "auto")
    if automatic and alignment.mapping is None and reference.modules:
        _fill_by_evidence(alignment, reference, candidate)
    return _finish(alignment, reference, candidate)


def _fill_by_evidence(alignment: Alignment, reference: Trace, candidate: Trace) -> None:
    """Names first, evidence for what names leave: where names aligned most modules, the automatic alignment's
    fused pairs and chains whose modules names left unaligned on both sides join them (gemma_pytorch's fused
    `qkv_proj` against transformers' `q_proj`, `k_proj`, `v_proj`, every other name shared). A chain's run keeps
    the pairs its members have (`diff/chains.py`): only its one module must be unaligned."""
    reference_for = alignment.reference_for
    # NOTE: the automatic alignment costs ~0.1 ms a call: asked only where a group can form, an unaligned module
    # with children (a chain) or unaligned modules on both sides (a fused module and its run)
    parents = {record.parent for record in candidate.modules}
    left = [
        position
        for position, found in enumerate(reference_for)
        if found < 0 and not is_no_op(candidate.modules[position])
    ]
    used = set(reference_for)
    reference_left = any(
        position not in used and not is_no_op(record) for position, record in enumerate(reference.modules)
    )
    if not any(position in parents for position in left) and not (left and reference_left):
        return
    # NOTE: the automatic alignment reads a call's children by its index: records numbered otherwise (made up by
    # hand, not written by a capture) keep what names gave
    if any(
        record.index != position for trace in (reference, candidate) for position, record in enumerate(trace.modules)
    ):
        return
    try:
        found = align_modules(reference, candidate)
    except ValueError:  # too many calls for the automatic alignment: keep what names gave
        return
    named_cand = {candidate.modules[position].path for position, found in enumerate(reference_for) if found >= 0}
    named_ref = {reference.modules[found].path for found in reference_for if found >= 0}

    def free(pair: ModulePair) -> bool:
        cand_free = not named_cand.intersection(pair.candidate)
        ref_free = not named_ref.intersection(pair.reference)
        if pair.chain:
            return cand_free if len(pair.candidate) == 1 else ref_free
        return cand_free and ref_free

    # NOTE: groups only (fused runs, chains): what names cannot express. A one-to-one pair names left apart is left
    # apart (gemma_pytorch's `embedder` against transformers' `embed_tokens`, which scales inside it: outputs
    # that differ by design, whose difference the parent's code absorbs)
    gaps = [pair for pair in found.pairs if (pair.fused or pair.chain) and free(pair)]
    calls = pair_calls(reference, candidate, ModuleMapping(gaps))
    # NOTE: a run on the candidate side added its group records to the candidate's calls
    added = len(candidate.modules) - len(reference_for)
    reference_for.extend([-1] * added)
    alignment.how.extend([""] * added)
    for cand_position, ref_position, pair in calls:
        if reference_for[cand_position] < 0:
            reference_for[cand_position] = ref_position
            alignment.how[cand_position] = "auto"
            alignment.pair_of[cand_position] = pair
    alignment.groups = alignment.groups or any(pair.fused for pair in gaps)


def _from_mapping(reference: Trace, candidate: Trace, mapping: ModuleMapping, how: str) -> Alignment:
    """The alignment a module mapping makes (group records added for fused pairs)."""
    calls = pair_calls(reference, candidate, mapping)
    alignment = Alignment([-1] * len(candidate.modules), [""] * len(candidate.modules))
    alignment.mapping = mapping
    alignment.groups = any(pair.fused for pair in mapping.pairs)
    for cand_position, ref_position, pair in calls:
        alignment.reference_for[cand_position] = ref_position
        alignment.how[cand_position] = how
        alignment.pair_of[cand_position] = pair
    return alignment


def _finish(alignment: Alignment, reference: Trace, candidate: Trace) -> Alignment:
    """Pruned layers and the lists of what is left unaligned on each side."""
    used = set(alignment.reference_for)
    pairs = {
        id(pair): pair
        for pair in [*(alignment.mapping.pairs if alignment.mapping else []), *alignment.pair_of.values()]
    }
    grouped = {
        path
        for pair in pairs.values()
        if pair.fused
        for path in (pair.reference if len(pair.reference) > 1 else pair.candidate)
    }
    if any(found < 0 for found in alignment.reference_for):
        _mark_pruned(alignment, candidate.modules)
    # NOTE: members of a fused run are compared through their group record, not unaligned
    alignment.unaligned_reference = [
        position
        for position, record in enumerate(reference.modules)
        if position not in used and record.path not in grouped and not _is_group(record.path)
    ]
    alignment.unaligned_candidate = [
        position
        for position, found in enumerate(alignment.reference_for)
        if found < 0 and position not in alignment.pruned and candidate.modules[position].path not in grouped
    ]
    return alignment


def _is_group(path: str) -> bool:
    """Whether a record is a fused run's or a chain's group record, added by the alignment."""
    return " + " in path or CHAIN in path


def _align_by_names(reference: Trace, candidate: Trace, maps: list[RenameMap]) -> Alignment:
    ref_records, cand_records = reference.modules, candidate.modules
    reference_for = [-1] * len(cand_records)
    how = [""] * len(cand_records)
    used = [False] * len(ref_records)
    by_key = {(record.path, record.call_index): position for position, record in enumerate(ref_records)}

    def pair(cand_position: int, ref_position: int, reason: str) -> None:
        reference_for[cand_position] = ref_position
        how[cand_position] = reason
        used[ref_position] = True

    for position, record in enumerate(cand_records):
        found = by_key.get((record.path, record.call_index))
        if found is not None and not used[found]:
            pair(position, found, "path")

    alignment = Alignment(reference_for, how)
    non_root = [position for position, record in enumerate(cand_records) if record.path]
    aligned_non_root = sum(1 for position in non_root if reference_for[position] >= 0)
    if non_root and aligned_non_root < len(non_root) / 2:
        _align_by_prefix(alignment, ref_records, cand_records, used)
    if maps:
        _align_by_maps(alignment, ref_records, cand_records, used, maps)

    return alignment


def _spellings(path: str, prefix: str | None, prefixed: bool) -> list[str]:
    """A path as recorded and, on the side that carries the automatic prefix, without it."""
    if not prefix or not prefixed:
        return [path]
    stem = prefix[:-1]
    if path == stem:
        return [path, ""]
    return [path, path[len(prefix) :]] if path.startswith(prefix) else [path]


def _align_by_maps(
    alignment: Alignment,
    ref_records: list[ModuleCall],
    cand_records: list[ModuleCall],
    used: list[bool],
    maps: list[RenameMap],
) -> None:
    """Rename maps on whatever is still unaligned, both ways, on both spellings of each name (see the module
    docstring); counts per map what its regex matched and what it aligned."""
    prefix = alignment.prefix
    ref_prefixed = alignment.prefix_side == "reference"
    cand_prefixed = alignment.prefix_side == "candidate"
    matched = [0] * len(maps)
    aligned = [0] * len(maps)
    seen_paths: set[tuple[str, str]] = set()
    for side, records, prefixed in (("r", ref_records, ref_prefixed), ("c", cand_records, cand_prefixed)):
        for record in records:
            if (side, record.path) in seen_paths:
                continue
            seen_paths.add((side, record.path))
            for spelling in _spellings(record.path, prefix, prefixed):
                for number, rename in enumerate(maps):
                    if rename.pattern.search(spelling):
                        matched[number] += 1

    def rewrite_all(path: str, prefixed: bool) -> list[tuple[str, list[int]]]:
        """Rewritten spellings of `path`, each with the maps of the chain that changed it (a spelling the chain
        leaves as it is is not a rewrite)."""
        out = []
        for spelling in _spellings(path, prefix, prefixed):
            current, changed_by = spelling, []
            for number, rename in enumerate(maps):
                rewritten = rename.apply(current)
                if rewritten != current:
                    changed_by.append(number)
                current = rewritten
            if changed_by:
                out.append((current, changed_by))
        return out

    def lookup_table(
        records: list[ModuleCall], prefixed: bool, free: Callable[[int], bool]
    ) -> dict[tuple[str, int], int]:
        table: dict[tuple[str, int], int] = {}
        for position, record in enumerate(records):
            if free(position):
                for spelling in _spellings(record.path, prefix, prefixed):
                    table.setdefault((spelling, record.call_index), position)
        return table

    reference_for, how = alignment.reference_for, alignment.how
    free_cand = lookup_table(cand_records, cand_prefixed, lambda position: reference_for[position] < 0)
    for ref_position, record in enumerate(ref_records):
        if used[ref_position]:
            continue
        for target_path, changed_by in rewrite_all(record.path, ref_prefixed):
            target = free_cand.get((target_path, record.call_index))
            if target is not None and reference_for[target] < 0:
                reference_for[target], how[target] = ref_position, "map"
                used[ref_position] = True
                for number in changed_by:
                    aligned[number] += 1
                break
    free_ref = lookup_table(ref_records, ref_prefixed, lambda position: not used[position])
    for position, record in enumerate(cand_records):
        if reference_for[position] >= 0:
            continue
        for target_path, changed_by in rewrite_all(record.path, cand_prefixed):
            found = free_ref.get((target_path, record.call_index))
            if found is not None and not used[found]:
                reference_for[position], how[position] = found, "map"
                used[found] = True
                for number in changed_by:
                    aligned[number] += 1
                break
    alignment.map_usage = [(rename, matched[number], aligned[number]) for number, rename in enumerate(maps)]


def map_notes(alignment: Alignment) -> list[str]:
    """Warnings for maps that matched nothing or aligned nothing."""
    notes = []
    for rename, matched, aligned in alignment.map_usage:
        if not matched:
            notes.append(
                f"warning: --map {rename.text!r} matches no module path of either trace (paths are tried "
                "as recorded and without the automatic prefix)"
            )
        elif not aligned:
            notes.append(
                f"warning: --map {rename.text!r} matches {matched} module paths but aligns no module call "
                "(no rewritten name exists on the other side, or those modules were aligned already)"
            )
    return notes


def _best_prefix(longer: list[ModuleCall], shorter: list[ModuleCall]) -> tuple[str, int] | None:
    """The prefix P (ending in '.') such that most `shorter` paths appear in `longer` as P + path."""
    short_paths = {record.path for record in shorter if record.path}
    if not short_paths:
        return None
    counts: Counter[str] = Counter()
    for record in longer:
        path = record.path
        position = path.find(".")
        while position >= 0:
            if path[position + 1 :] in short_paths:
                counts[path[: position + 1]] += 1
            position = path.find(".", position + 1)
    if not counts:
        return None
    prefix, count = counts.most_common(1)[0]
    return (prefix, count) if count >= max(1, len(short_paths) / 2) else None


def _align_by_prefix(
    alignment: Alignment, ref_records: list[ModuleCall], cand_records: list[ModuleCall], used: list[bool]
) -> None:
    options = []
    found = _best_prefix(ref_records, cand_records)
    if found:
        options.append((found[1], found[0], "reference"))
    found = _best_prefix(cand_records, ref_records)
    if found:
        options.append((found[1], found[0], "candidate"))
    if not options:
        return
    _, prefix, side = max(options)
    # Start over on the prefixed side: the roots are different modules (`LlamaForCausalLM` vs `LlamaModel`).
    for position in range(len(alignment.reference_for)):
        if alignment.how[position] == "path":
            used[alignment.reference_for[position]] = False
            alignment.reference_for[position] = -1
            alignment.how[position] = ""
    stem = prefix[:-1]

    def reference_path(candidate_path: str) -> str | None:
        if side == "reference":
            return prefix + candidate_path if candidate_path else stem
        if candidate_path == stem:
            return ""
        return candidate_path[len(prefix) :] if candidate_path.startswith(prefix) else None

    by_key = {(record.path, record.call_index): position for position, record in enumerate(ref_records)}
    for position, record in enumerate(cand_records):
        if alignment.reference_for[position] >= 0:
            continue
        target_path = reference_path(record.path)
        if target_path is None:
            continue
        target = by_key.get((target_path, record.call_index))
        if target is not None and not used[target]:
            alignment.reference_for[position] = target
            alignment.how[position] = "prefix"
            used[target] = True
    alignment.prefix, alignment.prefix_side = prefix, side


_NUMBER = re.compile(r"\.(\d+)(?=\.|$)")


def _mark_pruned(alignment: Alignment, cand_records: list[ModuleCall]) -> None:
    """Candidate modules under `stem.N` where the aligned modules have `stem.M` and `stem.K` with M < N < K."""
    numbers: dict[str, set[int]] = {}
    for position, record in enumerate(cand_records):
        if alignment.reference_for[position] < 0:
            continue
        for match in _NUMBER.finditer(record.path):
            numbers.setdefault(record.path[: match.start()], set()).add(int(match.group(1)))
    if not numbers:
        return
    for position, record in enumerate(cand_records):
        if alignment.reference_for[position] >= 0:
            continue
        for match in _NUMBER.finditer(record.path):
            present = numbers.get(record.path[: match.start()])
            number = int(match.group(1))
            if present and number not in present and min(present) < number < max(present):
                alignment.pruned.add(position)
                break
