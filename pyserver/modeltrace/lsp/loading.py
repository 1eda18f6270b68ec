"""Load a trace into the server: read it without the calls' inputs, index it, and keep the collector off it.

`storage.read_trace(inputs=False)` streams the records and shares what they repeat (~40 MB for a 50,000-call
trace, against ~140 MB of dicts for a whole-document decode); hints and hovers show outputs, and anything that
needs inputs reads the trace file.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from modeltrace.collector import collector_paused
from modeltrace.errors import TraceFormatError
from modeltrace.lsp.store import DocumentTrace, build_document_trace
from modeltrace.trace.parameter_store import parameters_note
from modeltrace.trace.relocate import SourceMatch, locate_sources, relocate
from modeltrace.trace.storage import read_trace


T = TypeVar("T")

# NOTE: a 50,000-call trace (12 MB) loads in ~0.5 s, one at the 2 GB size limit in ~2 minutes; a load still
# running after this is answered as failed (its thread cannot be stopped: it finishes on its own, and what it
# read is dropped then). Files that never end a read (FIFOs, devices) are refused before any read.
LOAD_TIMEOUT_SECONDS = 300.0
# Loads whose thread still runs (hung on a slow disk, say) beyond which a new load is refused at once.
MAX_LOADS_RUNNING = 8

_running_lock = threading.Lock()
_running = 0


class LoadRefused(TraceFormatError):
    """A load that took too long, or that could not start because too many are still running."""


async def run_load(what: str, function: Callable[..., T], *arguments: Any, timeout: float = LOAD_TIMEOUT_SECONDS) -> T:
    """`function(*arguments)` in a thread of its own, for at most `timeout` seconds (then `LoadRefused`).

    NOTE: loads never share the event loop's default thread pool, where a few that hang (a file on a stalled
    network disk) would hold up every later load, diff and trace; here a hung load holds one thread of its own,
    and at most `MAX_LOADS_RUNNING` of them are held before new loads are refused. `what` names the file in
    the messages.
    """
    global _running
    with _running_lock:
        if _running >= MAX_LOADS_RUNNING:
            raise LoadRefused(f"{what}: not loaded, {_running} earlier loads are still running")
        _running += 1
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the caller stopped waiting: the result is dropped here, and its memory with it
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def load() -> None:
        global _running
        try:
            result, error = function(*arguments), None
        except BaseException as raised:  # noqa: BLE001 - handed to the waiting coroutine as it is
            # NOTE: the frames of a failed load hold what it had decoded (all of a trace damaged in its last
            # record, 29 MB for 20,000 calls); cleared here, it is freed now, not whenever the cycle collector
            # meets the frames (the exception keeps its traceback's lines for the log).
            traceback.clear_frames(raised.__traceback__)
            result, error = None, raised
        finally:
            with _running_lock:
                _running -= 1
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed (the server exited) while this load ran
            pass

    threading.Thread(target=load, name="modeltrace-load", daemon=True).start()
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise LoadRefused(f"{what}: not loaded within {timeout:g} s") from None


def load_trace(owner: str, uri: str, trace_path: str) -> DocumentTrace:
    """Read and index a trace for the document `uri` (CPU work: run it off the event loop)."""
    # NOTE: loading creates a million objects and no garbage; the collector would run hundreds of times for
    # nothing (a third of the loading time).
    with collector_paused():
        return build_document_trace(owner, uri, trace_path, read_trace(trace_path, inputs=False))


def library_folders() -> list[str]:
    """The folders of the Python installation this server runs on (its standard library and site-packages):
    public code a trace's records may name (torch's and transformers' modules), never a user's private file."""
    paths = sysconfig.get_paths()
    return sorted({paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(name)})


def load_trace_here(
    owner: str, uri: str, trace_path: str, roots: list[str], open_texts: dict[str, str]
) -> tuple[DocumentTrace, list[SourceMatch]]:
    """`load_trace` for a trace captured elsewhere ("Load Trace…"): its records are pointed at the files found
    here (`trace.relocate`: under `roots`, among the open documents, or installed packages at their recorded
    path), and it is marked stale when one of them changed since the capture."""
    with collector_paused():
        trace = read_trace(trace_path, inputs=False)
        matches = locate_sources(trace, roots, open_texts, library_folders())
        relocate(trace, matches)
        # NOTE: only the files found here are read; a recorded path found nowhere here is never opened.
        found = {match.found for match in matches if match.found is not None}
        loaded = build_document_trace(owner, uri, trace_path, trace, readable=found.__contains__)
    loaded.stale = any(match.changed for match in matches if match.found in loaded.files)
    # NOTE: a trace whose parameters' store file is gone still shows its activations; the user is told
    loaded.parameters_note = parameters_note(trace, trace_path)
    return loaded, matches


# Traces with fewer calls are not worth a full collection each time one is installed.
FREEZE_MIN_CALLS = 10_000


def settle_memory(loaded: DocumentTrace) -> None:
    """After a large trace was installed: collect once, then keep what is alive out of later collections.

    A large trace is hundreds of thousands of long-lived objects without reference cycles; every full
    collection would walk them all (~0.2 s for 50,000 calls), stalling whichever request it interrupts.
    Frozen, they are skipped; they are still freed by reference counting when their trace goes.
    """
    if loaded.call_count < FREEZE_MIN_CALLS:
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    release_free_heap()


# glibc's `mallopt` parameter for the number of heaps (malloc.h)
_M_ARENA_MAX = -8


def _glibc() -> Any | None:
    """The C library's functions when it is glibc on Linux, else None (macOS, Windows, musl: nothing to tune)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # NOTE: imported here: only Linux servers need it

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def configure_heap() -> None:
    """Keep the C heap from holding on to what loading a trace freed (call once, at the server's start).

    NOTE: glibc gives each thread that allocates under contention a heap of its own, and a trace is loaded in a
    worker thread: that heap kept ~5 MB of a 50,000-call trace's decoding buffers after loading (more or less
    from run to run), which trimming did not return. One heap for all threads costs nothing here (Python's lock
    serialises them anyway); a fixed `M_MMAP_THRESHOLD` returned as much but made every whole-file hint answer
    (~300 KB) map fresh pages, 1.5 ms slower.
    """
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, 1)


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`; elsewhere nothing happens).

    NOTE: loading decodes the trace file through large short-lived buffers and lists; glibc keeps the pages they
    freed (~7 MB for a 50,000-call trace) in the process for later allocations, which a server that then sits
    idle for hours never makes. Trimming takes a few milliseconds, once per large trace.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
