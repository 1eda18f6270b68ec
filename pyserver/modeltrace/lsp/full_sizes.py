"""Hints at the model's full sizes: the traced model built again from its config's own values (not shrunk),
shape-only on the meta device, in the worker (never here), cached per file content.

A trace runs a shrunk config (hidden 64, 2 layers) so that it takes seconds; its hints say `[1,7,64]` where a
Qwen3 user expects 4096-wide states. With `modelTrace.hintSizes: full`, or after `modelTrace.fullSizes [uri]`
(a toggle per document), the hints show the shapes of the full-size model, each marked ` (full)`, while the hover
keeps the shrunk run's values (and says which sizes the hint shows). The full-size trace is one shape-only trace
of the same class with the same line capture; its folder is named by the file's path and the sha256 of its
content and the options that change shapes, so a file traced again unchanged reuses it, from disk, at once.
Not for a recipe (it builds its own model: there is no config to restore), a checkpoint (it ran at its own
sizes) or a shape-only trace (already full size): `DocumentSession.full_sizes_note` says which.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import shutil
from pathlib import Path

from modeltrace.errors import TraceFailed, TraceFormatError
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.loading import load_trace, run_load
from modeltrace.lsp.session import DocumentSession
from modeltrace.lsp.settings import HintSizes
from modeltrace.lsp.store import FileHints, TracedLine
from modeltrace.trace.storage import TRACE_SUFFIX
from modeltrace.worker import messages


logger = logging.getLogger(__name__)

FULL_SIZES_FOLDER = "full-sizes"


def showing_full_sizes(ls: ModelTraceServer, session: DocumentSession | None) -> bool:
    """Whether the session's hints show full sizes now: asked for, computed, and the trace not stale."""
    if session is None or session.full_sizes is None or session.trace is None or session.trace.stale:
        return False
    return session.show_full_sizes or ls.settings.hint_sizes == HintSizes.FULL


def full_size_hints(ls: ModelTraceServer, hints: FileHints) -> FileHints | None:
    """The full-size trace's hints of the file `hints` are for, when the file's hints show full sizes now."""
    session = ls.sessions.get(hints.owner)
    if not showing_full_sizes(ls, session):
        return None
    assert session is not None and session.full_sizes is not None
    return session.full_sizes.files.get(hints.path)


def full_size_line(ls: ModelTraceServer, hints: FileHints, traced: TracedLine) -> tuple[str, str] | None:
    """(the line's label at full size, what the full-size run was) for the hover, when the hints show full sizes."""
    full = full_size_hints(ls, hints)
    line = full.by_trace_line.get(traced.entry.line) if full is not None else None
    if line is None:
        return None
    session = ls.sessions.get(hints.owner)
    assert session is not None and session.full_sizes is not None
    return line.label(ls.settings.hint_detail), session.full_sizes.ran


def sizes_shown(ls: ModelTraceServer, session: DocumentSession | None) -> str:
    """`modelTrace/status`'s `sizes`: "full" or "traced"."""
    return "full" if showing_full_sizes(ls, session) else "traced"


def why_not(model: dict) -> str | None:
    """Why a trace (its header's `model`) has no full-size counterpart, or None when it can have one."""
    options = model.get("options") if isinstance(model.get("options"), dict) else {}
    if model.get("recipe"):
        return "a recipe builds its own model: there is no config to show at full size"
    if options.get("checkpoint"):
        return "the trace loaded a checkpoint: its hints show its own sizes already"
    if options.get("shape_only"):
        return "the trace is shape-only: its hints show the config's sizes already"
    return None


def full_size_folder(ls: ModelTraceServer, path: str, request: messages.TraceRequest) -> Path:
    """The cache folder of the full-size trace of `path` as it is on disk now, with `request`'s options."""
    content = hashlib.sha256(Path(path).read_bytes())
    for part in (request.model, request.config, request.dtype, request.attention, str(request.lines), *request.follow):
        content.update(b"\0" + str(part or "").encode("utf-8"))
    place = hashlib.sha256(path.encode("utf-8")).hexdigest()[:12]
    return (
        ls.settings.trace_directory
        / FULL_SIZES_FOLDER
        / f"{Path(path).stem}-{place}-{content.hexdigest()[:16]}{TRACE_SUFFIX}"
    )


def full_size_request(traced: messages.TraceRequest, model_class: str) -> messages.TraceRequest:
    """The request of the full-size trace: the traced one's class, config, capture and dtype, shape-only."""
    return messages.TraceRequest(
        file=traced.file,
        model=model_class or traced.model,
        config=traced.config,
        shape_only=True,
        lines=traced.lines,
        follow=traced.follow,
        attention=traced.attention,
        dtype=traced.dtype,
        timeout=traced.timeout,
    )


async def compute_full_sizes(
    ls: ModelTraceServer, session: DocumentSession, traced: messages.TraceRequest, uri: str
) -> str | None:
    """Fill `session.full_sizes` for the trace on view (the caller holds the trace lock); None when done, else
    why not (also kept in `session.full_sizes_note`)."""
    loaded = session.trace
    if loaded is None:
        return "there is no trace of this file yet: trace it first"
    reason = why_not(loaded.trace.model)
    if reason is None:
        request = full_size_request(traced, loaded.model_class)
        try:
            folder = full_size_folder(ls, traced.file, request)
        except OSError as error:
            reason = f"cannot read {traced.file}: {error}"
    if reason is not None:
        session.full_sizes, session.full_sizes_note = None, reason
        return reason
    try:
        if not folder.is_dir():
            # NOTE: one cached full-size trace per file: the older contents' go
            for older in folder.parent.glob(f"{folder.name.rsplit('-', 1)[0]}-*{TRACE_SUFFIX}"):
                shutil.rmtree(older, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
            request = dataclasses.replace(request, out=str(folder))
            worker = ls.worker()
            await asyncio.to_thread(worker.trace, request, lambda _text: None)
        full = await run_load(str(folder), load_trace, loaded.owner, uri, str(folder))
    except TraceFailed as failure:
        reason = f"the full-size model did not run ({str(failure).splitlines()[0]})"
    except (TraceFormatError, OSError) as error:
        reason = f"the full-size trace could not be read ({error})"
    if reason is not None:
        logger.debug("full sizes of %s: %s", traced.file, reason)
        session.full_sizes, session.full_sizes_note = None, reason
        return reason
    session.full_sizes, session.full_sizes_note = full, None
    return None
