"""The annotated listing: a source file printed with, beside each traced line, what that line produced.

This is the CLI's main output (`modeltrace trace` / `modeltrace show`):

     186          hidden_states = self.mlp(hidden_states)        # [1, 7, 64] float32 ×2

A modular file (`modular_x.py`, traced through its generated `modeling_x.py`) is printed with its generated twin's
annotations on the lines that map onto it (`modular/`), and a note under each class for the methods it inherits.
"""

from __future__ import annotations

from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.modular.annotate import inherited_notes, modular_entries
from modeltrace.modular.mapping import ModularMap, map_modular_file
from modeltrace.modular.twins import generated_path, is_modular_file, regenerate_command
from modeltrace.trace.lines import HintDetail, index_module_calls, line_label
from modeltrace.trace.records import Trace


ANNOTATION_COLUMN_LIMIT = 100


def render_listing(trace: Trace, file: str | None = None, detail: HintDetail = HintDetail.DTYPE) -> str:
    """The listing of `file` (default: the traced modular file, else the traced modeling file) annotated from
    `trace`."""
    traced = Path(trace.model.get("file") or "")
    path = Path(file).resolve() if file else Path(trace.model.get("modular") or traced)
    try:
        source_lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ModelTraceError(f"{path}: cannot read the source file to annotate ({error.strerror})") from None
    index = index_module_calls(trace)
    notes: dict[int, list[str]] = {}
    through = ""
    stale = _is_stale(trace, path)
    staleness = None
    if is_modular_file(path) and generated_path(path) == traced:
        mapping = _modular_map(path)
        entries = modular_entries(mapping, index.get(str(traced), {}))
        notes = inherited_notes(mapping)
        through = f" (run as its generated twin {traced.name})"
        stale = _is_stale(trace, traced)
        staleness = mapping.staleness()
    else:
        entries = index.get(str(path), {})
    width = min(max((len(text.rstrip()) for text in source_lines), default=0), ANNOTATION_COLUMN_LIMIT)
    number_width = len(str(len(source_lines)))
    header = (
        f"# {trace.model.get('class', '?')} traced from {path}{through}: {len(trace.modules)} module calls, "
        f"{len(entries)} annotated lines"
    )
    output = [header]
    if stale:
        output.append("# note: the file changed since this trace was taken; annotations may be off")
    if staleness:
        output.append(f"# note: {staleness}")
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


def _is_stale(trace: Trace, path: Path) -> bool:
    import hashlib

    recorded = (trace.model.get("source_hashes") or {}).get(str(path))
    if not recorded:
        return False
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() != recorded
    except OSError:
        return False
