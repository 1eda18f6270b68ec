"""The annotated listing: a source file printed with, beside each traced line, what that line produced.

This is the CLI's main output (`modeltrace trace` / `modeltrace show`):

     186          hidden_states = self.mlp(hidden_states)        # [1, 7, 64] float32 ×2
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.trace.lines import HintDetail, index_module_calls, line_label
from modeltrace.trace.records import Trace
from modeltrace.trace.source_files import read_source_bytes


ANNOTATION_COLUMN_LIMIT = 100


def render_listing(trace: Trace, file: str | None = None, detail: HintDetail = HintDetail.DTYPE) -> str:
    """The listing of `file` (default: the traced modeling file) annotated from `trace`.

    NOTE: the file a trace names is data: it is read only as a source file (`source_files`), and its text is
    printed only when it is the one the trace recorded (its `source_hashes`); another file at that path (edited
    since, or `/etc/passwd` named by a hostile trace) gets the annotations alone. A file the user names with
    `file` is the user's choice: it is printed, with a note when it changed since the trace.
    """
    if file:
        path = Path(file).resolve()
    else:
        recorded = trace.model.get("file")
        if not isinstance(recorded, str) or not recorded:
            raise ModelTraceError("the trace names no model file to annotate; pass the source file with --file")
        path = Path(recorded)
    data = read_source_bytes(path)
    try:
        source_lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ModelTraceError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    hashes = trace.model.get("source_hashes")
    recorded_hash = hashes.get(str(path)) if isinstance(hashes, dict) else None
    as_recorded = isinstance(recorded_hash, str) and hashlib.sha256(data).hexdigest() == recorded_hash
    entries = index_module_calls(trace).get(str(path), {})
    header = (
        f"# {trace.model.get('class', '?')} traced from {path}: {len(trace.modules)} module calls, "
        f"{len(entries)} annotated lines"
    )
    if not file and not as_recorded:
        output = [
            header,
            f"# note: {path} is not the file this trace recorded; its text is not shown "
            "(pass it with --file to show it anyway)",
        ]
        number_width = len(str(max(entries, default=0)))
        output.extend(
            f"{number:>{number_width}}  # {line_label(entries[number], detail)}" for number in sorted(entries)
        )
        return "\n".join(output) + "\n"
    width = min(max((len(text.rstrip()) for text in source_lines), default=0), ANNOTATION_COLUMN_LIMIT)
    number_width = len(str(len(source_lines)))
    output = [header]
    if recorded_hash and not as_recorded:
        output.append("# note: the file changed since this trace was taken; annotations may be off")
    for number, text in enumerate(source_lines, start=1):
        text = text.rstrip()
        entry = entries.get(number)
        if entry is None:
            output.append(f"{number:>{number_width}}  {text}")
        else:
            output.append(f"{number:>{number_width}}  {text:<{width}}  # {line_label(entry, detail)}")
    return "\n".join(output) + "\n"
