"""Inlay hints: the shape of each value a traced line assigns, right after the name it is assigned to.

Placed as Pylance places variable types (`query_states: [1,4,7,16] = ...`), so a variable's shape is read at
the left of its line whatever the line's length, and each label fits VS Code's default
`editor.inlayHints.maximumLength` (`trace.lines.HINT_MAX_LENGTH`): compact shapes, the dtype only where it is not
the model's, the call count in the hover only, whole parts dropped (never characters) when it is still too long.
`_` and other discarded names get no hint. A line with module calls but no assignment (`return`, a bare call)
gets one bounded hint at its end. `modelTrace.hintPlacement: endOfLine` keeps the earlier form: one full label
per line at its end (`→ [1, 7, 64] float32 ×2`). A trace older than the document's text marks its hints
`(stale)`; lines edited since the trace have none (`remap`).

Requests name a range of 0-based LSP lines; a hint is inside it when its position is (the last line only counts
up to the range's end character).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lsprotocol import types

from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.full_sizes import full_size_hints, full_size_line
from modeltrace.lsp.markdown import line_markdown
from modeltrace.lsp.settings import HintPlacement
from modeltrace.lsp.steps import gradient_label, hover_markdown, step_label
from modeltrace.lsp.store import FileHints, TracedLine
from modeltrace.lsp.wire import CachedInlayHint
from modeltrace.trace.lines import (
    HINT_MAX_LENGTH,
    HintDetail,
    compact_calls,
    compact_values,
    compact_variables,
    fit_parts,
    is_discarded,
)


HINT_PREFIX = "→ "
NAME_PREFIX = ": "
STALE_SUFFIX = " (stale)"
# A hint of the full-size model (`lsp/full_sizes.py`), not of the shrunk run that was traced.
FULL_SUFFIX = " (full)"
RETURN_NAME = "return"
# NOTE: past this many named hints a line reads as noise (`a, b, c, ... = x.shape` with dozens of names); the
# rest are counted in one last hint and listed in the hover.
MAX_NAMED_HINTS = 6


@dataclass(frozen=True, slots=True)
class PlacedLabel:
    """One hint of a line: its label at a character (code points) of the line's text."""

    column: int
    label: str
    padding_left: bool = False


def assignment_split(text: str) -> int | None:
    """Where the assignment's targets end on a line of code (the index of its `=`, or of the operator of `+=`),
    or None when the line assigns nothing: `=` inside brackets (keyword arguments), comparisons, `:=`, strings and
    comments are skipped."""
    depth = 0
    quote = ""
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 2
                continue
            if text.startswith(quote, index):
                index += len(quote)
                quote = ""
                continue
        elif char in "\"'":
            quote = text[index : index + 3] if text[index : index + 3] in ('"""', "'''") else char
            index += len(quote)
            continue
        elif char == "#":
            return None
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "=" and depth == 0:
            before, after = text[index - 1 : index], text[index + 1 : index + 2]
            if after == "=":
                index += 2  # `==`
                continue
            if before and (before in "=!:" or (before in "<>" and text[index - 2 : index - 1] != before)):
                index += 1  # `!=`, `:=`, `<=`, `>=`
                continue
            start = index
            while start > 0 and text[start - 1] in "+-*/%&|^@<>":
                start -= 1  # `+=`, `//=`, `<<=`: the targets end before the operator
            return start
        index += 1
    return None


def name_end(text: str, name: str, stop: int | None) -> int | None:
    """The character just after the first whole-word `name` in `text[:stop]` (the whole line when None)."""
    found = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text if stop is None else text[:stop])
    return found.end() if found is not None else None


def _return_end(text: str) -> int | None:
    stripped = text.lstrip()
    if re.match(r"return(?!\w)", stripped):
        return len(text) - len(stripped) + len(RETURN_NAME)
    return None


def _target_names(text: str, stop: int) -> list[str]:
    """Plain names among a line's assignment targets, in order (`hidden_states, _ = ...` -> both)."""
    return re.findall(r"(?<![\w.])([A-Za-z_]\w*)(?![\w.(\[])", text[:stop].split(":", 1)[0])


def placed_labels(
    traced: TracedLine, text: str, detail: HintDetail, model_dtype: str | None, stale: bool, full: bool = False
) -> list[PlacedLabel]:
    """The hints of one traced line in the `afterName` placement (see the module docstring); `full`: the line's
    values are the full-size model's, marked as such."""
    suffix = STALE_SUFFIX if stale else FULL_SUFFIX if full else ""
    entry = traced.entry
    placed: list[PlacedLabel] = []
    unplaced: list[str] = []
    split = assignment_split(text)
    variables = compact_variables(entry.variables)
    if variables:
        hidden = 0
        for name, runs in variables.items():
            if is_discarded(name):
                continue
            is_return = name == RETURN_NAME
            prefix = HINT_PREFIX if is_return else NAME_PREFIX
            budget = HINT_MAX_LENGTH - len(prefix) - len(suffix)
            column = _return_end(text) if is_return else name_end(text, name, split)
            if column is None:
                unplaced.append(f"{name}: {compact_values(runs, detail, model_dtype, budget)}")
            elif len(placed) >= MAX_NAMED_HINTS:
                hidden += 1
            else:
                placed.append(
                    PlacedLabel(
                        column,
                        prefix + compact_values(runs, detail, model_dtype, budget) + suffix,
                        padding_left=is_return,
                    )
                )
        if hidden:
            placed.append(PlacedLabel(placed[-1].column, f" +{hidden} more (hover)", padding_left=True))
    elif entry.calls:
        targets = _target_names(text, split) if split is not None else []
        budget = HINT_MAX_LENGTH - len(NAME_PREFIX) - len(suffix)
        leaf_counts = {len(record.outputs) for record in entry.calls}
        if len(targets) == 1:
            column = name_end(text, targets[0], split)
            if column is not None and not is_discarded(targets[0]):
                label = compact_calls(entry, detail, model_dtype, budget)
                placed.append(PlacedLabel(column, NAME_PREFIX + label + suffix))
        elif len(targets) > 1 and leaf_counts == {len(targets)}:
            # `hidden_states, weights = self.attn(...)`: one output per target, as the unpacking assigns them.
            for position, name in enumerate(targets):
                if is_discarded(name) or len(placed) >= MAX_NAMED_HINTS:
                    continue
                runs = [[record.outputs[position]] for record in entry.calls]
                column = name_end(text, name, split)
                if column is not None:
                    placed.append(
                        PlacedLabel(column, NAME_PREFIX + compact_values(runs, detail, model_dtype, budget) + suffix)
                    )
        else:
            budget = HINT_MAX_LENGTH - len(HINT_PREFIX) - len(suffix)
            unplaced.append(compact_calls(entry, detail, model_dtype, budget))
    if unplaced:
        budget = HINT_MAX_LENGTH - len(HINT_PREFIX) - len(suffix)
        label = fit_parts(unplaced, "  ", budget) or f"{len(unplaced)} values (hover)"
        placed.append(PlacedLabel(len(text), HINT_PREFIX + label + suffix, padding_left=True))
    return placed


def _units(ls: ModelTraceServer, text: str) -> int:
    # NOTE: counting UTF-16 units walks every character; ASCII lines (nearly all code) have as many as chars.
    return len(text) if text.isascii() else ls.workspace.position_codec.client_num_units(text)


def _line_hints(
    ls: ModelTraceServer,
    hints: FileHints,
    line: int,
    traced: TracedLine,
    detail: HintDetail,
    stale: bool,
    model_dtype: str | None,
    full: TracedLine | None = None,
) -> list[types.InlayHint]:
    text = hints.lines[line] if line < len(hints.lines) else ""
    data = f"{hints.key}:{traced.entry.line}"
    shown = full or traced
    if ls.settings.hint_placement == HintPlacement.END_OF_LINE:
        suffix = STALE_SUFFIX if stale else FULL_SUFFIX if full is not None else ""
        labels = [PlacedLabel(len(text), HINT_PREFIX + shown.label(detail) + suffix, True)]
    else:
        labels = placed_labels(shown, text, detail, model_dtype, stale, full is not None)
    labels.extend(_step_and_gradient_labels(ls, hints, traced, text, model_dtype))
    # NOTE: cached hints (`FileHints.hint_cache`), serialised once (`wire`)
    return [
        CachedInlayHint(
            position=types.Position(line=line, character=_units(ls, text[: placed.column])),
            label=placed.label,
            kind=types.InlayHintKind.Type,
            padding_left=placed.padding_left,
            data=data,
        )
        for placed in labels
    ]


def _step_and_gradient_labels(
    ls: ModelTraceServer, hints: FileHints, traced: TracedLine, text: str, model_dtype: str | None
) -> list[PlacedLabel]:
    """The step label of a generation trace's line and, on `modelTrace.gradientHints`, the gradient row of a
    backward trace's line (`lsp/steps.py`), at the line's end."""
    loaded = ls.sessions.trace_of(hints.owner)
    if loaded is None or (loaded.trace.generation is None and loaded.trace.gradients is None):
        return []
    labels = [step_label(loaded.trace, traced.entry, model_dtype)]
    if ls.settings.gradient_hints:
        labels.append(gradient_label(loaded.trace, traced.entry))
    return [PlacedLabel(len(text), HINT_PREFIX + label, padding_left=True) for label in labels if label]


def inlay_hints(ls: ModelTraceServer, params: types.InlayHintParams) -> list[types.InlayHint]:
    path = ls.document_path(params.text_document.uri)
    hints = ls.sessions.hints(path) if path else None
    if hints is None:
        return []
    loaded = ls.sessions.trace_of(hints.owner)
    stale = bool(loaded and loaded.stale)
    model_dtype = _model_dtype(loaded.trace.model) if loaded is not None else None
    detail = ls.settings.hint_detail
    placement = ls.settings.hint_placement
    # NOTE: the full-size model's hints where asked for (never on a stale trace: its lines moved since)
    full_sizes = full_size_hints(ls, hints)
    last, last_character = params.range.end.line, params.range.end.character
    found = []
    for line, traced in hints.between(params.range.start.line, last):
        full = full_sizes.by_trace_line.get(traced.entry.line) if full_sizes is not None else None
        key = (detail, placement, stale, line, ls.settings.gradient_hints, full is not None)
        line_hints = hints.hint_cache.get(key)
        if line_hints is None:
            line_hints = hints.hint_cache[key] = _line_hints(ls, hints, line, traced, detail, stale, model_dtype, full)
        for hint in line_hints:
            if line == last and hint.position.character > last_character:
                continue
            found.append(hint)
    return found


def _model_dtype(model: dict) -> str | None:
    options = model.get("options")
    dtype = options.get("dtype") if isinstance(options, dict) else None
    return str(dtype) if dtype else None


def resolve_inlay_hint(ls: ModelTraceServer, hint: types.InlayHint) -> types.InlayHint:
    """Add the hover table as the tooltip (computed only for the hint the user points at)."""
    key, _, line = str(hint.data).partition(":")
    # NOTE: the data is the client's echo of ours ("key:line"); anything else, an absurdly long number
    # included (int() refuses 4,300 digits), gets the hint back as it came.
    if not (key.isdigit() and line.isdigit() and len(key) < 20 and len(line) < 20):
        return hint
    hints = ls.sessions.hints_by_key(int(key))
    traced = hints.by_trace_line.get(int(line)) if hints else None
    if hints is None or traced is None:
        return hint
    loaded = ls.sessions.trace_of(hints.owner)
    markdown = line_markdown(
        traced.entry,
        bool(loaded and loaded.stale),
        loaded.ran if loaded is not None else None,
        full_size_line(ls, hints, traced),
    )
    extra = hover_markdown(loaded.trace, traced.entry, ls.settings.gradient_hints) if loaded is not None else None
    hint.tooltip = types.MarkupContent(
        kind=types.MarkupKind.Markdown, value=markdown + ("\n\n" + extra if extra else "")
    )
    return hint
