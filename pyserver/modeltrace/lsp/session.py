"""One session per traced document: everything the server keeps about it, in one object, and their registry.

A `DocumentSession` owns what was asked for a document and what it shows: its trace, its reference and the
latest diff against it, the diagnostics it published (the failure of its last trace, the first divergence, the
notes on files changed since a loaded trace was captured) and its last request (trace-on-save repeats it).
`Sessions` holds them by owner (the path of the traced document) and indexes each trace by the files it touches,
so that a dependency shows the hints of the trace it was traced in. Dropping a session drops all of it at once.
Plain state only: what the client is told lives in `publish`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.uris import from_fs_path

from modeltrace.lsp.store import DocumentTrace, FileHints
from modeltrace.worker.messages import RecipeDraft


if TYPE_CHECKING:
    # NOTE: for annotations only: importing `modeltrace.diff` loads numpy (~14 MB), which a server that only
    # shows hints never needs (`reference` imports the diff when a reference is set).
    from modeltrace.diff.report import LineMark


# A diagnostic and the URI of the document it was published on (a trace's failure may be in another file).
Located = tuple[str, types.Diagnostic]


@dataclass(frozen=True, slots=True)
class LastRequest:
    """What was last asked for a document (its URI, the class to build, the kind of trace: "forward",
    "generate" or "backward"), so that trace-on-save repeats it."""

    uri: str
    model: str | None
    mode: str = "forward"


@dataclass(frozen=True, slots=True)
class CallDiff:
    """The comparison of one module call, as a hover shows it (`status` as its gutter says it: `inherited` for a
    difference that only comes through its inputs)."""

    status: str
    check: str | None
    max_abs_diff: float | None
    max_rel_diff: float | None
    # the reference call it was compared with when its path differs, and how it was aligned when not by name
    reference_path: str | None = None
    aligned_by: str | None = None


@dataclass(slots=True)
class DocumentDiff:
    """What the latest diff of a document's trace left to show: gutter marks by (file, 1-based trace line), calls
    by (module path, call index), the first divergence (`divergence_json`) and the plot (`plot_data`)."""

    reference: str
    statuses: dict[tuple[str, int], LineMark]
    calls: dict[tuple[str, int], CallDiff]
    divergence: dict[str, Any] | None
    plot: dict[str, Any]
    matched: bool
    notes: list[str] = field(default_factory=list)
    # The marks as last sent, by file and 0-based line of the file's current text (`stale` moves them on edits).
    shown: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    @property
    def files(self) -> set[str]:
        """The files whose gutters this diff marks."""
        return {file for file, _ in self.statuses}


@dataclass(eq=False, slots=True)
class DocumentSession:
    """Everything about one traced document (`owner`: its resolved path; `uri`: how the client named it)."""

    owner: str
    uri: str
    trace: DocumentTrace | None = None
    # The reference trace (or debugger output) each trace of this document is compared with.
    reference: str | None = None
    diff: DocumentDiff | None = None
    # Published diagnostics: the first divergence of `diff`, the failure of the last trace, the notes on files
    # that changed since a loaded trace was captured.
    divergence: Located | None = None
    failure: Located | None = None
    source_notes: list[Located] = field(default_factory=list)
    last_request: LastRequest | None = None
    # The recipe the last trace was built with (saving it traces again), and what the worker tried when only a
    # recipe can build the class (the last trace failed; "Create recipe…" writes one from it).
    recipe: str | None = None
    recipe_draft: RecipeDraft | None = None
    # A trace asked for this document is waiting for the worker (trace-on-save does not queue a second one).
    waiting: bool = False
    # The same model at its config's own sizes, shape-only on the meta device (`lsp/full_sizes.py`), for the
    # trace on view: its hints show these sizes while `show_full_sizes` (or `modelTrace.hintSizes: full`) holds;
    # `full_sizes_note` says why there are none (a recipe, a checkpoint, a failed run).
    full_sizes: DocumentTrace | None = None
    full_sizes_note: str | None = None
    show_full_sizes: bool = False

    def diagnostics(self) -> list[Located]:
        """Every diagnostic this session published, wherever it is."""
        shown = [located for located in (self.failure, self.divergence) if located is not None]
        return shown + list(self.source_notes)


class Sessions:
    """The sessions by owner path, and for each file the hints of the latest trace that touched it."""

    def __init__(self) -> None:
        self._by_owner: dict[str, DocumentSession] = {}
        self._files: dict[str, FileHints] = {}
        # NOTE: hints name their file by a small key (`FileHints.key`), not its path: serialising a path with
        # each of 1,500 hints costs more than building them.
        self._by_key: dict[int, FileHints] = {}
        self._keys: Iterator[int] = itertools.count(1)

    def __iter__(self) -> Iterator[DocumentSession]:
        return iter(list(self._by_owner.values()))

    def get(self, owner: str) -> DocumentSession | None:
        return self._by_owner.get(owner)

    def open(self, owner: str, uri: str | None = None) -> DocumentSession:
        """The session of `owner`, created (named by `uri`, else by the path's `file:` URI) when it has none."""
        session = self._by_owner.get(owner)
        if session is None:
            session = self._by_owner[owner] = DocumentSession(owner=owner, uri=uri or from_fs_path(owner) or owner)
        return session

    def owner_of(self, path: str) -> str:
        """The traced document a file's commands are about: the owner of the trace it shows, else itself."""
        hints = self._files.get(path)
        return hints.owner if hints is not None else path

    def showing(self, path: str) -> DocumentSession | None:
        """The session whose trace a file shows (its own, or the one it was traced as a dependency of)."""
        return self._by_owner.get(self.owner_of(path))

    def trace_showing(self, path: str) -> DocumentTrace | None:
        session = self.showing(path)
        return session.trace if session is not None else None

    def hints(self, path: str) -> FileHints | None:
        """The hints a file shows (of the latest trace that touched it), if any."""
        return self._files.get(path)

    def hints_by_key(self, key: int) -> FileHints | None:
        return self._by_key.get(key)

    def trace_of(self, owner: str) -> DocumentTrace | None:
        session = self._by_owner.get(owner)
        return session.trace if session is not None else None

    def references(self) -> Mapping[str, str]:
        """Each document's reference, by owner path."""
        return {owner: session.reference for owner, session in self._by_owner.items() if session.reference}

    def install(self, session: DocumentSession, loaded: DocumentTrace) -> None:
        """Make `loaded` the session's trace: its files show its hints from now on."""
        self._unindex(session)
        session.trace = loaded
        # NOTE: the client hears about the session by the URI its latest trace was asked for.
        session.uri = loaded.uri
        for path, hints in loaded.files.items():
            previous = self._files.get(path)
            if previous is not None:
                self._by_key.pop(previous.key, None)
            hints.key = next(self._keys)
            self._by_key[hints.key] = hints
            self._files[path] = hints

    def close(self, owner: str) -> DocumentSession | None:
        """Forget everything about `owner` at once; the removed session (for the client to be told what goes)."""
        session = self._by_owner.pop(owner, None)
        if session is not None:
            self._unindex(session)
        return session

    def _unindex(self, session: DocumentSession) -> None:
        if session.trace is None:
            return
        for path, hints in session.trace.files.items():
            if self._files.get(path) is hints:
                del self._files[path]
                del self._by_key[hints.key]
