"""What a modular file shows of a trace: its generated twin's traced lines, moved onto the modular lines.

The trace records the generated file's lines (`modeling_x.py` ran); `modular_entries` gives each mapped modular line
the entry of its twin line (for an inlined `super().forward(...)`, the last traced line of the inlined body: what
the call produced), and `inherited_notes` the one-line notes of the methods a modular class inherits unchanged.
Shared by the CLI listing and the language server, so both say the same thing.
"""

from __future__ import annotations

from pathlib import Path

from modeltrace.modular.mapping import ModularMap
from modeltrace.trace.lines import LineEntry


def modular_entries(mapping: ModularMap, generated_entries: dict[int, LineEntry]) -> dict[int, LineEntry]:
    """Modular line (1-based) -> the traced entry of its generated twin, for the lines whose twin was traced."""
    entries: dict[int, LineEntry] = {}
    for modular_line, generated_lines in mapping.lines.items():
        # NOTE: several generated lines: an inlined parent body, whose last traced line is what the call returned
        for generated_line in reversed(generated_lines):
            entry = generated_entries.get(generated_line)
            if entry is not None:
                entries[modular_line] = entry
                break
    return entries


def inlined_note(mapping: ModularMap, modular_line: int) -> str | None:
    """ "runs the parent's body, inlined: modeling_x.py:40-63" for a `super()` call line (1-based), else None."""
    generated = mapping.generated_lines(modular_line)
    if len(generated) < 2:
        return None
    return f"runs the parent's body, inlined: {Path(mapping.generated).name}:{generated[0]}-{generated[-1]}"


def inherited_notes(mapping: ModularMap) -> dict[int, list[str]]:
    """Modular line (1-based) -> notes on what runs there without being written there: on a class line, "`forward`:
    inherited from `LlamaAttention.forward`, 24 lines: modeling_x.py:66" for each method the class inherits
    unchanged; on a `super().forward(...)` line, where the inlined parent body is."""
    generated_name = Path(mapping.generated).name
    notes: dict[int, list[str]] = {}
    for inherited in mapping.inherited:
        notes.setdefault(inherited.class_line, []).append(
            f"`{inherited.method}`: {inherited.describe(generated_name)}"
        )
    for modular_line in sorted(mapping.lines):
        note = inlined_note(mapping, modular_line)
        if note is not None:
            notes.setdefault(modular_line, []).append(note)
    return notes
