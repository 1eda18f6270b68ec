"""Follow edits: carry traced line numbers from one version of a document's text to the next.

Lines the edit left unchanged keep their hints at their new position; changed lines lose them. The diff is
on whole lines: the common head and tail are matched directly, `difflib` only sees the edited middle.
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import TypeVar


T = TypeVar("T")

# NOTE: LSP counts only \n, \r\n and \r as line breaks; `str.splitlines` also splits on \f, \v, \x1c and
# \u2028, which would shift every line number below such a character.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """The lines of `text` as LSP numbers them (without their line breaks; a final newline opens a last line)."""
    return _LINE_BREAK.split(text)


def matching_blocks(old: Sequence[str], new: Sequence[str]) -> list[tuple[int, int, int]]:
    """`(old_start, new_start, length)` runs of lines that are equal in `old` and `new`, in order."""
    shortest = min(len(old), len(new))
    head = 0
    while head < shortest and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < shortest - head and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    blocks = [(0, 0, head)] if head else []
    old_middle = old[head : len(old) - tail]
    new_middle = new[head : len(new) - tail]
    if old_middle and new_middle:
        # NOTE: autojunk would treat blank lines and `)` lines of long files as noise and leave them unmatched.
        matcher = difflib.SequenceMatcher(None, old_middle, new_middle, autojunk=False)
        blocks.extend((head + a, head + b, size) for a, b, size in matcher.get_matching_blocks() if size)
    if tail:
        blocks.append((len(old) - tail, len(new) - tail, tail))
    return blocks


def remap_lines(by_line: Mapping[int, T], old: Sequence[str], new: Sequence[str]) -> dict[int, T]:
    """Move `{old line: value}` to `{new line: value}`; values on lines that changed are dropped."""
    if old == new:
        return dict(by_line)
    blocks = matching_blocks(old, new)
    starts = [block[0] for block in blocks]
    moved: dict[int, T] = {}
    for line, value in by_line.items():
        position = bisect.bisect_right(starts, line) - 1
        if position < 0:
            continue
        old_start, new_start, length = blocks[position]
        if line < old_start + length:
            moved[new_start + line - old_start] = value
    return moved
