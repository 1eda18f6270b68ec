"""Values the first differing line reads that were made of repeated copies: where their arrangement was decided.

Line records hold statistics, and statistics do not depend on the order of the elements. A value built from copies
of another (`keys.repeat(1, 1, repeats, 1)` against `torch.repeat_interleave(keys, repeats, dim=2)`: key heads
`0, 1, 0, 1` against `0, 0, 1, 1`) holds the same numbers in either arrangement, so it matches the reference's by
its statistics and the first line whose statistics differ is the one consuming it (the scores), not the one that
arranged it. Such a line is found in the data: a value whose mean, min, max and per-element variance equal those
of an earlier value of the call while holding a whole multiple (at least twice) of its elements was made of copies
of it. For each name the first differing line reads, the value it reads is followed back through the values of
equal statistics (re-bindings, transposes, helper returns) to the first one that holds copies; that line is named
(`LineDivergence.arranged`), as a suspect the statistics cannot clear.
"""

from __future__ import annotations

import ast
import functools
import math

from modeltrace.trace.records import LineRecord, TensorSummary
from modeltrace.trace.source_files import UnreadableSource, read_source_text

# NOTE: statistics of the same numbers agree to float32 rounding of their sums
_SAME = 1e-5


def arranged_inputs(cand_body: list[LineRecord], position: int) -> tuple[tuple[str, str, int], ...]:
    """(name read, file, line) for each name the line of `cand_body[position]` reads whose value was made of
    repeated copies earlier in the call (module docstring), in the order the names are read."""
    found = cand_body[position]
    earlier = cand_body[:position]
    arranged = []
    for name in _names_read(found.file, found.line):
        latest = next(
            (record for record in reversed(earlier) if record.name == name and record.file == found.file), None
        )
        if latest is None or not _varying(latest.tensor):
            continue
        same = [record for record in earlier if _same_numbers(record.tensor, latest.tensor)]
        for index, record in enumerate(same):
            count = math.prod(record.tensor.shape)
            if any(_copies(count, math.prod(other.tensor.shape)) for other in same[:index]):
                arranged.append((name, record.file, record.line))
                break
    return tuple(arranged)


def _copies(count: int, source: int) -> bool:
    return source > 0 and count >= 2 * source and count % source == 0


def _varying(summary: TensorSummary) -> bool:
    """Values whose statistics identify them: floating, known, not all equal (zero-filled caches are not)."""
    return (
        summary.std is not None
        and summary.std > 0
        and summary.mean is not None
        and summary.min is not None
        and summary.max is not None
        and not summary.dtype.startswith("complex")
    )


def _same_numbers(first: TensorSummary, second: TensorSummary) -> bool:
    """Whether two summaries describe copies of the same numbers: equal mean, min and max, and an equal variance
    per element (a sample std over n copies of n values is not the std over the n values themselves)."""
    if not (_varying(first) and _varying(second)) or first.dtype != second.dtype:
        return False
    scale = max(abs(first.min), abs(first.max), first.std, 1e-12)  # type: ignore[arg-type]
    for name in ("mean", "min", "max"):
        if abs(getattr(first, name) - getattr(second, name)) > _SAME * scale:
            return False
    return abs(_variance(first) - _variance(second)) <= _SAME * max(_variance(first), 1e-24) * 10


def _variance(summary: TensorSummary) -> float:
    """The population variance from the recorded (sample) std."""
    count = math.prod(summary.shape)
    std = summary.std or 0.0
    return std * std * (count - 1) / count if count > 1 else 0.0


def _statements(file: str) -> dict[int, ast.stmt]:
    """First line -> the innermost simple statement starting there (compound statements' headers left out)."""
    try:
        return _parsed(read_source_text(file))
    except UnreadableSource:
        return {}


# NOTE: cached by the text, not the path: a file edited between two diffs (the language server's) is parsed again
@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> dict[int, ast.stmt]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    found: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not hasattr(node, "body"):
            found.setdefault(node.lineno, node)
    return found


def _names_read(file: str, line: int) -> list[str]:
    statement = _statements(file).get(line)
    if statement is None:
        return []
    names = [node for node in ast.walk(statement) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)]
    names.sort(key=lambda node: (node.lineno, node.col_offset))
    return list(dict.fromkeys(node.id for node in names))
