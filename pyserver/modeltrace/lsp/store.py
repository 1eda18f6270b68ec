"""A trace as the editor shows it, and its lines as they are now in the editor.

A trace is indexed by every file it touches (a modeling file and the files its modules come from), so a
dependency shows hints too (`session.Sessions` keeps that index). Each file keeps its traced lines keyed by the
trace's line numbers (fixed) and by their current 0-based line in the document (moved by `remap` on every edit).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pathlib import Path

from lsprotocol import types

from modeltrace.lsp.remap import remap_lines, split_lines
from modeltrace.modular.annotate import modular_entries
from modeltrace.modular.mapping import map_modular_file
from modeltrace.modular.twins import modular_twin
from modeltrace.trace.lines import HintDetail, LineEntry, index_module_calls, line_label
from modeltrace.trace.ran import what_ran
from modeltrace.trace.records import Trace
from modeltrace.trace.relocate import AT_RECORDED_PATH, SourceMatch
from modeltrace.trace.storage import tensors_paths
from modeltrace.trace.source_files import MAX_SOURCE_LINES, UnreadableSource, read_source_text


@dataclass(slots=True)
class TracedLine:
    """One traced source line and its labels, computed once per hint detail."""

    entry: LineEntry
    labels: dict[HintDetail, str] = field(default_factory=dict)

    def label(self, detail: HintDetail) -> str:
        text = self.labels.get(detail)
        if text is None:
            text = self.labels[detail] = line_label(self.entry, detail)
        return text


@dataclass(slots=True)
class FileHints:
    """The traced lines of one file; `lines` is the text that the keys of `by_line` refer to."""

    path: str
    owner: str
    by_trace_line: dict[int, TracedLine]
    lines: list[str]
    key: int = 0
    by_line: dict[int, TracedLine] = field(default_factory=dict)
    sorted_lines: list[int] = field(default_factory=list)
    # A modular file's hints (`modular_hints`): the generated file they come from, and its traced lines' modular
    # lines (generated trace line -> modular trace lines), so that marks on the generated lines reach them too.
    twin: str | None = None
    from_twin: dict[int, list[int]] = field(default_factory=dict)
    # NOTE: building lsprotocol objects dominates a whole-file hint request; they only change with the text.
    # Keyed by (detail, placement, stale, line, gradient hints, full size): a line may have several hints (one per
    # assigned name).
    hint_cache: dict[tuple[HintDetail, str, bool, int, bool, bool], list[types.InlayHint]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        if not self.by_line:
            self.by_line = {line - 1: traced for line, traced in self.by_trace_line.items()}
        self.sorted_lines = sorted(self.by_line)

    def follow(self, new_lines: list[str]) -> bool:
        """Move the hints to a new version of the text; True when the text differed."""
        if new_lines == self.lines:
            return False
        self.by_line = remap_lines(self.by_line, self.lines, new_lines)
        self.sorted_lines = sorted(self.by_line)
        self.lines = new_lines
        self.hint_cache.clear()
        return True

    def between(self, first: int, last: int) -> Iterator[tuple[int, TracedLine]]:
        """Traced lines with `first <= line <= last` (0-based), in order."""
        start = bisect.bisect_left(self.sorted_lines, first)
        stop = bisect.bisect_right(self.sorted_lines, last)
        for line in self.sorted_lines[start:stop]:
            yield line, self.by_line[line]


@dataclass(slots=True)
class DocumentTrace:
    """A trace shown in the editor: `owner` is the path of the document it was traced for, `uri` its URI.

    `trace` is the display copy from `loading` (module calls without their inputs); `trace_path` is the
    complete trace on disk.
    """

    owner: str
    uri: str
    trace_path: str
    trace: Trace
    files: dict[str, FileHints]
    stale: bool = False
    # why the trace's stored parameters cannot be had (their store file is gone or damaged), for "Load Trace…"
    parameters_note: str | None = None

    @property
    def model_class(self) -> str:
        return str(self.trace.model.get("class") or "")

    @property
    def call_count(self) -> int:
        return len(self.trace.modules)

    @property
    def ran(self) -> str:
        """What ran, in one line (`trace/ran.py`): the hover's header and the status tooltip say it."""
        return what_ran(self.trace.model)

    def modular_lines(self, file: str, trace_line: int) -> list[tuple[str, int]]:
        """(modular file, its trace line) for each modular line that maps onto `file`'s `trace_line`."""
        return [
            (hints.path, modular_line)
            for hints in self.files.values()
            if hints.twin == file
            for modular_line in hints.from_twin.get(trace_line, ())
        ]


def show_on(loaded: DocumentTrace, copy: str, modular: str) -> None:
    """A trace of a regenerated copy of a modular file (`modular/regenerate.py`) shown on the user's modular file:
    the copy's hints (the copy is the user's file byte for byte, mapped onto the regenerated generated file) move
    to the user's path, so the open document gets them, and marks on the regenerated lines reach it."""
    hints = loaded.files.pop(copy, None)
    if hints is not None:
        hints.path = modular
        loaded.files[modular] = hints


def read_lines(path: str) -> list[str] | None:
    """A source file's lines as LSP numbers them, or None when it is not read (deleted, not text, not a regular
    file, too large: `source_files`)."""
    try:
        return split_lines(read_source_text(path))
    except UnreadableSource:
        return None


def modular_hints(owner: str, generated: str, entries: dict[int, LineEntry]) -> FileHints | None:
    """The hints of the modular file a traced generated file was written from (`modular_x.py` beside
    `modeling_x.py`): its twin lines' entries on the modular lines that map onto them (`modular/`); None without
    a modular file, or when one of the two does not parse (nothing maps)."""
    modular = modular_twin(generated)
    if modular is None:
        return None
    try:
        mapping = map_modular_file(modular)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    lines = read_lines(str(modular))
    if lines is None:
        return None
    by_trace_line = {line: TracedLine(entry) for line, entry in modular_entries(mapping, entries).items()}
    return FileHints(
        path=str(modular),
        owner=owner,
        by_trace_line=by_trace_line,
        lines=lines,
        twin=generated,
        from_twin=mapping.modular_lines(),
    )


def build_document_trace(
    owner: str, uri: str, trace_path: str, trace: Trace, readable: Callable[[str], bool] | None = None
) -> DocumentTrace:
    """Index a trace by file and line (CPU work: run it off the event loop). Only the files that `readable`
    accepts (all by default) are read: a loaded trace's others are indexed without their text. A traced generated
    file's modular file (`modular_x.py` beside `modeling_x.py`) gets the hints of the lines it maps onto."""
    files: dict[str, FileHints] = {}
    index = index_module_calls(trace)
    for path, entries in index.items():
        by_trace_line = {line: TracedLine(entry) for line, entry in entries.items()}
        # NOTE: the worker traced the file as it was on disk; the hints start from that text and follow
        # edits from there (an open document with unsaved changes is remapped right after loading).
        lines = read_lines(path) if readable is None or readable(path) else None
        if lines is None:
            # NOTE: a text of empty lines stands in for a file not read; a record past any source file's length
            # (line 3e8 of a hostile trace) is dropped rather than padded to (gigabytes of list).
            by_trace_line = {line: traced for line, traced in by_trace_line.items() if line <= MAX_SOURCE_LINES}
            lines = [""] * (max(by_trace_line, default=0) + 1)
        files[path] = FileHints(path=path, owner=owner, by_trace_line=by_trace_line, lines=lines)
    for path, entries in index.items():
        # NOTE: only beside a generated file that may be read (a loaded trace names paths: they are data)
        if readable is not None and not readable(path):
            continue
        hints = modular_hints(owner, path, entries)
        if hints is not None and hints.path not in files:
            files[hints.path] = hints
    return DocumentTrace(owner=owner, uri=uri, trace_path=trace_path, trace=trace, files=files)


def tensors_held(loaded: DocumentTrace) -> tuple[str, str | None]:
    """What a trace holds for a diff: "full" (every tensor), "partial" (some not stored: over a size limit) or
    "statistics" (no tensors); and, when not full, why."""
    options = loaded.trace.model.get("options") or {}
    if options.get("shape_only"):
        return "statistics", "the trace is shape-only (modelTrace.shapeOnly or a checkpoint on the meta device)"
    if not tensors_paths(Path(loaded.trace_path)):
        return "statistics", "the trace kept no full tensors"
    skipped = loaded.trace.model.get("tensors_not_stored")
    if skipped:
        return "partial", f"{skipped} tensor(s) were over modelTrace.fullTensorsMB / maxTensorMB / maxTraceMB"
    return "full", None


def load_message(trace_path: str, loaded: DocumentTrace, shown: list[SourceMatch]) -> str | None:
    """What the user is told after a load when its files were not simply where the trace recorded them."""
    moved = [match for match in shown if match.how != AT_RECORDED_PATH]
    changed = [match for match in shown if match.changed]
    if not moved and not changed and not loaded.parameters_note:
        return None
    parts = [f"ModelTrace: loaded {Path(trace_path).name} ({loaded.model_class})"]
    if loaded.parameters_note:
        parts.append(loaded.parameters_note)
    if moved:
        parts.append("found " + ", ".join(f"{Path(match.recorded).name} here by {match.how}" for match in moved))
    if changed:
        parts.append(
            f"{', '.join(Path(str(match.found)).name for match in changed)} changed since the capture: "
            "hints may be off by the lines edited since (marked stale)"
        )
    return "; ".join(parts)
