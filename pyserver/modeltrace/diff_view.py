"""The library's diff, `modeltrace.diff(reference, candidate)`, and what it returns: a `DiffView` of the
`modeltrace diff --format json` document, shown as HTML in Jupyter.

It sits below both `api` (which offers it as `modeltrace.diff`) and the `diff` package (which answers the same
call once `modeltrace.diff` is the imported package), so that neither imports the other. The diff machinery
(numpy) is imported on the first diff only: `import modeltrace.api` for a capture or a load does without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DiffView:
    """A diff: `document` is the `modeltrace diff --format json` document; `match`, `first_divergence` and
    `modules` are read from it. In Jupyter: the verdict, the table with the first divergence highlighted, and
    the difference per module."""

    document: dict[str, Any]
    text: str = field(repr=False, default="")

    @property
    def match(self) -> bool:
        return bool(self.document["match"])

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        return self.document["first_divergence"]

    @property
    def modules(self) -> list[dict[str, Any]]:
        return self.document["modules"]

    def to_json(self) -> dict[str, Any]:
        return self.document

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        from modeltrace.trace.html import diff_html

        return diff_html(self.document)


def diff(
    reference: str | Path,
    candidate: str | Path,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    rel_tol: float | None = None,
    maps: list[str] | tuple[str, ...] = (),
    mapping: str | Path | None = None,
    automatic: bool = True,
    replay: bool = False,
) -> DiffView:
    """`modeltrace diff REFERENCE CANDIDATE` as an object (the same options, the same numbers). A reference
    or candidate may be a trace folder or a transformers debugger output."""
    # NOTE: imported here, on the first diff: numpy and the diff machinery stay out of `import modeltrace.api`
    from modeltrace.diff.paths import close_result, diff_paths
    from modeltrace.diff.report import render_text, to_json

    result = diff_paths(
        reference, candidate, atol, rtol, maps, rel_tol=rel_tol, replay=replay, mapping=mapping, automatic=automatic
    )
    try:
        return DiffView(to_json(result), render_text(result))
    finally:
        close_result(result)
