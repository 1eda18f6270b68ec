"""The annotated listing: a source file printed with, beside each traced line, what that line produced.

This is the CLI's main output (`modeltrace trace` / `modeltrace show`):

     186          hidden_states = self.mlp(hidden_states)        # [1, 7, 64] float32 ×2

A modular file (`modular_x.py`, traced through its generated `modeling_x.py`) is printed with its generated twin's
annotations on the lines that map onto it (`modular/`), and a note under each class for the methods it inherits.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.modular.annotate import inherited_notes, modular_entries
from modeltrace.modular.mapping import ModularMap, map_modular_file
from modeltrace.modular.regenerate import TEMPORARY_PREFIX, find_checkout
from modeltrace.modular.twins import generated_path, is_modular_file, regenerate_command
from modeltrace.trace.lines import HintDetail, index_module_calls, line_label
from modeltrace.trace.records import Trace
from modeltrace.trace.source_files import read_source_bytes


ANNOTATION_COLUMN_LIMIT = 100


def render_listing(trace: Trace, file: str | None = None, detail: HintDetail = HintDetail.DTYPE) -> str:
    """The listing of `file` (default: the traced modular file, else the traced modeling file) annotated from
    `trace`.

    NOTE: the file a trace names is data: it is read only as a source file (`source_files`), and its text is
    printed only when it is the one the trace recorded (its `source_hashes`); another file at that path (edited
    since, or `/etc/passwd` named by a hostile trace) gets the annotations alone. A modular file never ran and
    has no hash of its own: it is printed when the generated twin beside it, which ran, is the one recorded. A
    file the user names with `file` is the user's choice: it is printed, with a note when it changed since the
    trace.
    """
    recorded = trace.model.get("file")
    traced = Path(recorded) if isinstance(recorded, str) and recorded else None
    modular = trace.model.get("modular")
    if file:
        path = Path(file).resolve()
    elif isinstance(modular, str) and modular:
        path = Path(modular)
    elif traced is not None:
        path = traced
    else:
        raise ModelTraceError("the trace names no model file to annotate; pass the source file with --file")
    if not path.exists() and TEMPORARY_PREFIX in str(path):
        # NOTE: `trace --regenerate` traced a copy in a temporary folder, removed once the trace was printed
        raise ModelTraceError(
            f"{path}: this trace ran a copy regenerated into a temporary folder, removed after `trace --regenerate`; "
            "trace again with --regenerate to print it"
        )
    data = read_source_bytes(path)
    try:
        source_lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ModelTraceError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    index = index_module_calls(trace)
    notes: dict[int, list[str]] = {}
    through = ""
    staleness = None
    checked, checked_data = path, data
    if traced is not None and is_modular_file(path) and generated_path(path) == traced:
        mapping = _modular_map(path)
        entries = modular_entries(mapping, index.get(str(traced), {}))
        notes = inherited_notes(mapping)
        through = f" (run as its generated twin {traced.name})"
        staleness = mapping.staleness()
        checked, checked_data = traced, read_source_bytes(traced)
    else:
        entries = index.get(str(path), {})
    hashes = trace.model.get("source_hashes")
    recorded_hash = hashes.get(str(checked)) if isinstance(hashes, dict) else None
    as_recorded = isinstance(recorded_hash, str) and hashlib.sha256(checked_data).hexdigest() == recorded_hash
    header = (
        f"# {trace.model.get('class', '?')} traced from {path}{through}: {len(trace.modules)} module calls, "
        f"{len(entries)} annotated lines"
    )
    if not file and not as_recorded:
        output = [
            header,
            f"# note: {checked} is not the file this trace recorded; its text is not shown "
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
    if staleness:
        output.append(f"# note: {staleness}")
        if find_checkout(path) is not None:
            # NOTE: inside a transformers checkout the converter is at hand: a fresh copy can be traced
            output.append(
                f"# note: or trace a regenerated copy, leaving it as it is: `modeltrace trace {path} --regenerate`"
            )
    for number, text in enumerate(source_lines, start=1):
        text = text.rstrip()
        entry = entries.get(number)
        if entry is None:
            output.append(f"{number:>{number_width}}  {text}")
        else:
            output.append(f"{number:>{number_width}}  {text:<{width}}  # {line_label(entry, detail)}")
        output.extend(f"{'':>{number_width}}  # {note}" for note in notes.get(number, ()))
    return "\n".join(output) + "\n"


def _modular_map(path: Path) -> ModularMap:
    try:
        return map_modular_file(path)
    except SyntaxError as error:
        raise ModelTraceError(
            f"{error.filename}:{error.lineno}: does not parse ({error.msg}); a modular file is annotated from the "
            f"map of its lines onto its generated twin; fix it, or regenerate the twin: `{regenerate_command(path)}`"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ModelTraceError(f"{path}: cannot read it or its generated twin ({error})") from None
