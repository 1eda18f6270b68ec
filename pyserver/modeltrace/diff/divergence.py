"""The first-divergence search: which module's own computation differs first, and which of its source lines
hold the cause.

The first divergence is the first module, in the order modules finish (innermost first), whose compared inputs
match and whose compared outputs differ; where the reference has no outputs for a module (the transformers
debugger keeps outputs of leaf modules only), a module whose inputs match and one of whose children receives
differing inputs. With a replay (`diff.replay`: suspect candidate modules re-run on the reference's inputs), a
replayed module is judged on its own: one whose replayed output matches the reference is cleared (its outputs
differ only through its inputs), one whose replayed output differs is a divergence whatever its recorded inputs
were. Inside the divergence, the last child whose outputs still match and the first child whose inputs differ
bound the lines where the difference arises (`Divergence.lines`, `source_range`).
"""

from __future__ import annotations

from modeltrace.diff.pairing import dtype_kind
from modeltrace.diff.result import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NONE,
    UNKNOWN,
    Divergence,
    ModuleResult,
    finish_key,
)
from modeltrace.trace.records import ModuleCall, SourceRange
from modeltrace.trace.source_files import UnreadableSource, read_source_text


def first_divergence(results: list[ModuleResult]) -> Divergence | None:
    """The first divergence among the module results (their replays included), bounded by its children; None
    where no module differs (boundary differences are not divergences: `find_divergence`)."""
    return find_divergence(results)[0]


def find_divergence(results: list[ModuleResult]) -> tuple[Divergence | None, list[ModuleResult]]:
    """The first divergence and the boundary differences before it (`_reabsorbed`): modules whose inputs match and
    whose outputs differ, but whose difference the next compared tensors no longer show. Each boundary
    difference is confirmed by what its nearest compared ancestor shows: that ancestor's outputs match, or a
    divergence found later lies inside it (the ancestor differs because of that one). An unconfirmed one is the
    first divergence after all: a boundary difference never hides a real one, nor is it hidden by one."""
    ordered = sorted(results, key=finish_key)
    tentative: list[ModuleResult] = []
    divergence = _search(results, ordered, tentative)
    by_index = {result.candidate.index: result for result in results}
    confirmed = []
    for boundary in tentative:
        ancestor = _compared_ancestor(boundary, by_index)
        if ancestor is None or ancestor.outputs == MATCH:
            confirmed.append(boundary)
        elif divergence is not None and _inside(divergence.module, ancestor, by_index):
            confirmed.append(boundary)
        else:
            kids = [kid for kid in results if kid.candidate.parent == boundary.candidate.index and kid.reference]
            return bounded(Divergence(boundary, inputs_match=True), kids), confirmed
    return divergence, confirmed


def _compared_ancestor(result: ModuleResult, by_index: dict[int, ModuleResult]) -> ModuleResult | None:
    """The nearest enclosing call whose outputs were compared (matched or differed)."""
    parent = by_index.get(result.candidate.parent)
    while parent is not None:
        if parent.reference is not None and parent.outputs in (MATCH, MISMATCH):
            return parent
        parent = by_index.get(parent.candidate.parent)
    return None


def _inside(result: ModuleResult, ancestor: ModuleResult, by_index: dict[int, ModuleResult]) -> bool:
    parent = by_index.get(result.candidate.parent)
    while parent is not None:
        if parent is ancestor:
            return True
        parent = by_index.get(parent.candidate.parent)
    return False


# A difference counts as absorbed when the next call's input is at most this fraction of it (relative errors).
ABSORBED_FRACTION = 1e-3


def _reabsorbed(
    result: ModuleResult, results: list[ModuleResult], by_index: dict[int, ModuleResult]
) -> ModuleResult | None:
    """Whether the difference of `result` (inputs match, outputs differ) is gone by the next compared tensors:
    the first module called after it returns (not inside it) whose inputs were compared receives a tensor of the
    shape of a differing output of `result` (an output no later call takes, such as attention weights that are
    returned and dropped, is no evidence), and its inputs match. Returns that next call, or None (one side scales the embedding inside its module, the other right
    after it in the caller: the next layer receives the same hidden states)."""
    outputs = result.candidate.outputs
    differing = {leaf.key for leaf in result.output_leaves if leaf.status == MISMATCH}
    if differing:
        shapes = {tuple(summary.shape) for summary in outputs if summary.key in differing}
    elif len(outputs) == 1:
        shapes = {tuple(outputs[0].shape)}
    else:
        return None  # several outputs, not known which differs: no evidence that the difference is gone
    if not shapes:
        return None
    for other in sorted(results, key=lambda item: item.candidate.index):
        if other.candidate.index <= result.candidate.index or _inside(other, result, by_index):
            continue
        if other.reference is None or other.inputs not in (MATCH, MISMATCH):
            continue
        taking = {summary.key for summary in other.candidate.inputs if tuple(summary.shape) in shapes}
        if not taking:
            return None  # the next compared call does not take what it returned: no evidence either way
        if other.inputs != MATCH or _inside(result, other, by_index):
            return None
        # NOTE: matching within the tolerance is not enough: a small error added to a large residual stream
        # (a scaled query shard, say) passes the next call's input check while it is still there, and grows
        # later. Absorbed means gone: what the next call receives is far closer to the reference than what this
        # module returned (a scale moved across a boundary leaves float rounding behind, ~1e-7 relative).
        received = [leaf.rel_err for leaf in other.input_leaves if leaf.key in taking]
        own = result.rel_err
        if own is None or not received or any(value is None or value > ABSORBED_FRACTION * own for value in received):
            return None
        return other
    return None


def _search(
    results: list[ModuleResult], ordered: list[ModuleResult], tentative: list[ModuleResult]
) -> Divergence | None:
    """The first module in finishing order that qualifies as the divergence; the re-absorbed ones met before it
    go to `tentative`."""
    by_index = {result.candidate.index: result for result in results}
    children: dict[int, list[ModuleResult]] = {}
    for result in results:
        children.setdefault(result.candidate.parent, []).append(result)

    def kids_of(result: ModuleResult) -> list[ModuleResult]:
        return [kid for kid in children.get(result.candidate.index, []) if kid.reference is not None]

    for result in ordered:
        if result.reference is None:
            continue
        replay = result.replay
        if replay is not None and replay.status == MATCH:
            continue  # on the reference's inputs it computes the reference's outputs: not where the bug is
        if replay is not None and replay.status == MISMATCH:
            divergence = Divergence(result, inputs_match=True, by_replay=True)
            return bounded(divergence, kids_of(result))
        if result.inputs not in (MATCH, NONE):
            continue
        if result.outputs == MISMATCH:
            absorbed_by = _reabsorbed(result, results, by_index) if replay is None else None
            if absorbed_by is not None:
                result.absorbed_by = absorbed_by
                tentative.append(result)
                continue
            return bounded(Divergence(result, inputs_match=True), kids_of(result))
        if result.outputs == UNKNOWN and any(kid.inputs == MISMATCH for kid in kids_of(result)):
            return bounded(Divergence(result, inputs_match=True, inferred=True), kids_of(result))
    # NOTE: no module has matching inputs and differing outputs: a module whose inputs already differ is no
    # finding (the difference arose before it, where nothing compared runs); `comparison_stopped` says where
    # comparison stopped being possible, and the verdict is "not_comparable"
    return None


def comparison_stopped(results: list[ModuleResult]) -> str | None:
    """Why no first divergence can be named although modules differ, or None where none differs: the earliest
    called module whose inputs already differ (no compared module produced them: every module that finished
    before it matches or was not compared), with the last compared module before it that still matches."""
    differing = [
        result
        for result in results
        if result.status in (MISMATCH, DIVERGENCE)
        and not result.boundary
        and not (result.replay is not None and result.replay.status == MATCH)
    ]
    if not differing:
        return None
    receivers = sorted(
        (result for result in results if result.reference is not None and result.inputs == MISMATCH),
        key=lambda result: result.candidate.index,
    )
    if not receivers:
        return (
            f"{len(differing)} module call(s) differ, but none has both compared inputs that match and outputs "
            "that differ: no module can be named as where the difference arises"
        )
    first = receivers[0]
    record = first.candidate
    keys = [leaf.key or "(input)" for leaf in first.input_leaves if leaf.status == MISMATCH]
    what = f"inputs ({', '.join(keys)})" if keys else "inputs"
    if not record.path:
        return (
            f"the model's {what} differ: comparison stops at the root; trace both with the same inputs (and seed) "
            "to compare them"
        )
    finish = first.candidate.finish_order
    before = [
        result
        for result in results
        if result.reference is not None
        and result.outputs == MATCH
        and result.candidate.index < record.index
        and (result.candidate.finish_order < 0 or finish < 0 or result.candidate.finish_order < finish)
    ]
    last = max(before, key=finish_key) if before else None
    called = f" (called at {record.called_at.file}:{record.called_at.line})" if record.called_at else ""
    after = f" after {last.candidate.path or '(root)'}, which still matches," if last is not None else ""
    return (
        f"comparison stops at {record.path}{called}: its {what} already differ and no compared module produced "
        f"them; the difference arises{after} in code that no aligned module covers (inline code of a caller, or "
        "a module on one side only); align or map that part (`modeltrace align`, --mapping) to compare it"
    )


def bounded(divergence: Divergence, kids: list[ModuleResult]) -> Divergence:
    """`divergence` with the last of its children whose outputs still match and the first whose inputs differ."""
    kids = sorted(kids, key=lambda kid: kid.candidate.index)
    last_match = None
    for kid in kids:
        if kid.inputs == MISMATCH or (kid.replay is not None and kid.replay.status == MISMATCH):
            divergence.first_differing_child = kid
            break
        if kid.outputs == MATCH or (kid.replay is not None and kid.replay.status == MATCH and kid.inputs == MATCH):
            last_match = kid
    divergence.last_matching_child = last_match
    return divergence


# ---------------------------------------------------------------------------------------- source lines


_forward_cache: dict[tuple[str, float], dict[int, tuple[int, int]]] = {}
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python")


def _forward_ranges(file: str) -> dict[int, tuple[int, int]]:
    """{line of a class statement (and of its decorators): (first, last) line of its `forward`} of a file."""
    import ast
    import os

    try:
        key = (file, os.path.getmtime(file))
    except OSError:
        return {}
    found = _forward_cache.get(key)
    if found is not None:
        return found
    found = {}
    try:
        tree = ast.parse(read_source_text(file), file)
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef):
            forward = next(
                (
                    item
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "forward"
                ),
                None,
            )
            if forward is not None:
                span = (forward.lineno, forward.end_lineno or forward.lineno)
                for line in [node.lineno, *(decorator.lineno for decorator in node.decorator_list)]:
                    found[line] = span
    if len(_forward_cache) > 64:
        _forward_cache.clear()
    _forward_cache[key] = found
    return found


_function_cache: dict[tuple[str, float], list[tuple[int, int]]] = {}


def function_spans(file: str) -> list[tuple[int, int]]:
    """(first, last) line of every function of a file (methods and nested functions too)."""
    import ast
    import os

    try:
        key = (file, os.path.getmtime(file))
    except OSError:
        return []
    found = _function_cache.get(key)
    if found is not None:
        return found
    try:
        tree = ast.parse(read_source_text(file), file)
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    found = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    if len(_function_cache) > 64:
        _function_cache.clear()
    _function_cache[key] = found
    return found


def enclosing_function(file: str, line: int) -> tuple[int, int] | None:
    """(first, last) line of the innermost function of `file` holding `line`, or None."""
    spans = [span for span in function_spans(file) if span[0] <= line <= span[1]]
    return min(spans, key=lambda span: span[1] - span[0]) if spans else None


def _nested_range(file: str, span: tuple[int, int], after: object, before: object) -> SourceRange | None:
    """The children's call lines when both lie outside the module's `forward`, in one other function of its
    file: a child module the port calls through its `forward` method (`self.attention.forward(x)`), or a
    helper, runs there without a module call of its own, so the recorded grandchildren around the difference
    are the narrowest evidence (issue 30, item 2: a module on one side only is searched, not skipped)."""
    if after is None or before is None or after.file != file or before.file != file:
        return None
    first, last = span
    if first <= after.line <= last or first <= before.line <= last or after.line > before.line:
        return None
    function = enclosing_function(file, after.line)
    if function is None or function != enclosing_function(file, before.line):
        return None
    return SourceRange(file, after.line, before.line)


def is_library_class(record: ModuleCall) -> bool:
    """Whether the call's class lives in an installed library (a torch `nn.Sequential`, `nn.Conv2d`): its code is
    not the port's; how it was built and called is."""
    defined = record.defined_at
    return defined is not None and any(marker in defined.file for marker in _LIBRARY_MARKERS)


def _derivable(last_match: ModuleResult, first_differing: ModuleResult | None) -> bool:
    """Whether the first differing child's differing inputs can have been computed from the last matching
    child's outputs: not when every one of them is of another kind (integer position ids against floating
    hidden states: they were computed from something else, possibly before that call)."""
    if first_differing is None:
        return True
    differing = {leaf.key for leaf in first_differing.input_leaves if leaf.status == MISMATCH}
    kinds = {dtype_kind(summary.dtype) for summary in first_differing.candidate.inputs if summary.key in differing}
    produced = {dtype_kind(summary.dtype) for summary in last_match.candidate.outputs}
    return not kinds or not produced or bool(kinds & produced)


def source_range(divergence: Divergence) -> SourceRange | None:
    """The smallest range of candidate lines known to hold the cause: inside the diverging module's `forward`,
    from the call of the last child whose outputs still match to the call of the first child whose inputs
    differ (or the forward's first / last line; the first line too when the differing inputs are of a kind
    the matching child does not produce, see `_derivable`). A module whose class lives in an installed library (a torch
    `nn.LayerNorm`) is not where the candidate's code went wrong: its call line is the range (its arguments, or
    how it was built: see `built_at`)."""
    record = divergence.module.candidate
    defined = record.defined_at
    if defined is not None and is_library_class(record):
        called = record.called_at
        return SourceRange(called.file, called.line, called.line) if called is not None else None
    span = _forward_ranges(defined.file).get(defined.line) if defined is not None else None
    after = divergence.last_matching_child.candidate.called_at if divergence.last_matching_child else None
    if after is not None and not _derivable(divergence.last_matching_child, divergence.first_differing_child):
        after = None  # the differing values come from elsewhere: they may be computed before that call
    before = divergence.first_differing_child.candidate.called_at if divergence.first_differing_child else None
    if span is not None:
        first, last = span
        file = defined.file
        nested = _nested_range(file, span, after, before)
        if nested is not None:
            return nested
        start = after.line if after is not None and after.file == file and first <= after.line <= last else first
        end = before.line if before is not None and before.file == file and first <= before.line <= last else last
        if start > end:
            start, end = first, last
        return SourceRange(file, start, end)
    if after is not None and before is not None and after.file == before.file and after.line <= before.line:
        return SourceRange(after.file, after.line, before.line)
    return None
