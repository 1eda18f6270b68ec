"""Reading the source files a trace names: paths that come from a trace are data, never instructions.

A trace is passed around (a colleague's reference, a CI artifact, a file attached to an issue), so the files it
names may be anything: `/dev/zero` (reads until memory runs out), a FIFO (never returns), `/proc/self/environ`
(tokens), a 10 GB log. A source file is read only when it is a regular file outside the system's special
folders, no larger than `MAX_SOURCE_BYTES`, and never more than that is read. Torch-free: the server and the CLI
both read sources through here.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from modeltrace.errors import ModelTraceError


# NOTE: the largest modeling files of transformers are ~300 KB; a source file 25 times that is no source file.
MAX_SOURCE_BYTES = 8 * 1024 * 1024
# NOTE: the longest modeling files of transformers have ~5,000 lines; a line past this one is no source line.
MAX_SOURCE_LINES = 100_000
# Folders of files that look regular but are the system's (their size says 0, their content is live).
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")


class UnreadableSource(ModelTraceError):
    """A source file that is not read: its message says which and why (one line)."""


def _is_below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_source_bytes(path: str | Path, limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of the source file at `path`, or `UnreadableSource` saying why it is not read."""
    real = os.path.realpath(path)
    if any(_is_below(real, folder) for folder in SYSTEM_FOLDERS):
        raise UnreadableSource(f"{path}: a system file, never read as a source file")
    try:
        # NOTE: stat first, so that a FIFO or a device is never opened (opening either can block or act);
        # then the open file's own stat, in case the path was swapped in between.
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise UnreadableSource(f"{path}: not a regular file, never read as a source file")
        descriptor = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(descriptor, "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise UnreadableSource(f"{path}: not a regular file, never read as a source file")
            if status.st_size > limit:
                raise UnreadableSource(f"{path}: {status.st_size} bytes, more than a source file's {limit} bytes")
            data = handle.read(limit + 1)
    except OSError as error:
        raise UnreadableSource(f"{path}: cannot read the source file ({error.strerror or error})") from None
    if len(data) > limit:
        raise UnreadableSource(f"{path}: more than a source file's {limit} bytes")
    return data


def read_source_text(path: str | Path, limit: int = MAX_SOURCE_BYTES) -> str:
    """`read_source_bytes` decoded as UTF-8 (a file that is not is refused the same way)."""
    try:
        return read_source_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableSource(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def source_sha256(path: str | Path) -> str | None:
    """The sha256 of a readable source file (as the worker records it in `source_hashes`), else None."""
    try:
        return hashlib.sha256(read_source_bytes(path)).hexdigest()
    except UnreadableSource:
        return None


def is_inside(path: str | Path, folders: Iterable[str | Path]) -> bool:
    """Whether `path` (resolved, links followed) lies in one of `folders` (resolved the same way)."""
    real = os.path.realpath(path)
    return any(_is_below(real, os.path.realpath(folder)) for folder in folders)
