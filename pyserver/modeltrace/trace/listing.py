"""The annotated listing: a source file printed with, beside each traced line, what that line produced.

This is the CLI's main output (`modeltrace trace` / `modeltrace show`):

     186          hidden_states = self.mlp(hidden_states)        # [1, 7, 64] float32 ×2
"""

from __future__ import annotations

from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.trace.lines import HintDetail, index_module_calls, line_label
from modeltrace.trace.records import Trace


ANNOTATION_COLUMN_LIMIT = 100


def render_listing(trace: Trace, file: str | None = None, detail: HintDetail = HintDetail.DTYPE) -> str:
    """The listing of `file` (default: the traced modeling file) annotated from `trace`."""
    path = Path(file).resolve() if file else Path(trace.model.get("file") or "")
    try:
        source_lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ModelTraceError(f"{path}: cannot read the source file to annotate ({error.strerror})") from None
    entries = index_module_calls(trace).get(str(path), {})
    width = min(max((len(text.rstrip()) for text in source_lines), default=0), ANNOTATION_COLUMN_LIMIT)
    number_width = len(str(len(source_lines)))
    header = (
        f"# {trace.model.get('class', '?')} traced from {path}: {len(trace.modules)} module calls, "
        f"{len(entries)} annotated lines"
    )
    output = [header]
    if _is_stale(trace, path):
        output.append("# note: the file changed since this trace was taken; annotations may be off")
    for number, text in enumerate(source_lines, start=1):
        text = text.rstrip()
        entry = entries.get(number)
        if entry is None:
            output.append(f"{number:>{number_width}}  {text}")
        else:
            output.append(f"{number:>{number_width}}  {text:<{width}}  # {line_label(entry, detail)}")
    return "\n".join(output) + "\n"


def _is_stale(trace: Trace, path: Path) -> bool:
    import hashlib

    recorded = (trace.model.get("source_hashes") or {}).get(str(path))
    if not recorded:
        return False
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() != recorded
    except OSError:
        return False
