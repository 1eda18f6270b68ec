"""Pairs that contradict the nesting of the pairs inside them: a module paired with one whose subtree holds the
counterparts of modules outside it.

The order alignment pairs calls one by one; a container on one side may take a container on the other that holds
more or less than it does (timm's `layers`, every Swin stage, against transformers' first stage, while the second
stage's blocks pair inside `layers.1`). Such a pair says the two compute the same thing while their children say
otherwise; where their outputs differ too, nothing speaks for it, and it is dropped (the module stays unaligned, or
pairs by another rule) rather than compared against a wrong counterpart.
"""

from __future__ import annotations

from collections.abc import Callable


def contradicted(pairs: list[tuple[str, str]], outputs_agree: Callable[[str, str], bool]) -> set[tuple[str, str]]:
    """The (reference, candidate) one-to-one pairs, roots aside, that some other pair contradicts (one member
    inside one of the pair's modules and its partner outside the other) and whose outputs do not agree."""
    partner_of_cand = {cand: ref for ref, cand in pairs}
    partner_of_ref = {ref: cand for ref, cand in pairs}
    found: set[tuple[str, str]] = set()
    for ref, cand in pairs:
        # NOTE: a module's descendants' paths extend its path; walk each pair's ancestors on both sides
        for ancestor in _ancestors(cand):
            partner = partner_of_cand.get(ancestor)
            if partner is not None and partner and not _within(ref, partner):
                found.add((partner, ancestor))
        for ancestor in _ancestors(ref):
            partner = partner_of_ref.get(ancestor)
            if partner is not None and partner and not _within(cand, partner):
                found.add((ancestor, partner))
    return {pair for pair in found if pair[0] and pair[1] and not outputs_agree(*pair)}


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def _within(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor + ".")
