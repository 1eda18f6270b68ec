"""Where the source files a trace recorded are on this machine, for a trace captured elsewhere (a script in the
original's repository, another checkout, a colleague's machine).

A trace names files by the absolute path they had when it was captured, and keeps the sha256 of each
(`model["source_hashes"]`). A file is found, in this order: at its recorded path with the recorded content; by
its content (an open document or a file of the searched folders with the same hash); at its recorded path with
other content; by its name (a file of the searched folders with the same name, the longest common tail of path
first). A file found with other content than the capture's is `changed`: its hints sit on the recorded line
numbers, which the edits since may have moved. No torch: the language server runs this for "Load Trace…".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from modeltrace.trace.records import SourceLocation, Trace
from modeltrace.trace.source_files import is_inside, source_sha256


# NOTE: a search walks the workspace once per load; folders that hold no user source are skipped, and the walk
# stops after this many files so that a huge workspace never stalls the server.
SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages", ".git", ".venv", "venv", ".tox", "build"})
MAX_FILES_SEARCHED = 50_000

AT_RECORDED_PATH = "recorded path"
SAME_CONTENT = "same content"
SAME_NAME = "same name"
NOT_FOUND = "not found"


@dataclass(frozen=True)
class SourceMatch:
    """A recorded source file and where it is here: `found` None when nowhere; `how` one of the constants above;
    `changed` when the file found differs from the one captured (or has no recorded hash to tell)."""

    recorded: str
    found: str | None
    how: str
    changed: bool

    def to_json(self) -> dict[str, object]:
        return {"recorded": self.recorded, "path": self.found, "how": self.how, "changed": self.changed}


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str | None:
    """The sha256 of a source file (read as `source_files` reads them: regular files only, bounded), else None."""
    return source_sha256(path)


def _files_named(roots: Iterable[Path], names: set[str]) -> dict[str, list[str]]:
    """`{name: [paths]}` of the files under `roots` whose name is one of `names` (resolved, deduplicated)."""
    found: dict[str, list[str]] = {name: [] for name in names}
    seen = 0
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = [name for name in subfolders if name not in SKIPPED_FOLDERS and not name.startswith(".")]
            for name in files:
                seen += 1
                if name in found:
                    path = os.path.realpath(os.path.join(folder, name))
                    # NOTE: a link in the folder to a file outside it (`/etc/passwd`) is not the folder's file,
                    # nor is a FIFO or a device a source file
                    if path not in found[name] and is_inside(path, [root]) and os.path.isfile(path):
                        found[name].append(path)
            if seen > MAX_FILES_SEARCHED:
                return found
    return found


def _common_tail(first: str, second: str) -> int:
    """How many trailing path parts two paths share (`a/models/x.py`, `b/models/x.py`: 2)."""
    count = 0
    for left, right in zip(reversed(Path(first).parts), reversed(Path(second).parts)):
        if left != right:
            break
        count += 1
    return count


def locate_sources(
    trace: Trace, roots: Iterable[str | Path], open_texts: Mapping[str, str], libraries: Iterable[str | Path] = ()
) -> list[SourceMatch]:
    """Find each source file the trace's records name, searching the open documents (`{path: text}`) and the
    files under `roots`; see the module docstring for the order.

    NOTE: the paths a trace names are data: a recorded path outside `roots` (`/etc/passwd`, another user's home)
    is never read here, as if it did not exist; only the open documents and the files under `roots` are (and,
    at their recorded path only, those under `libraries`: the installed packages' public code, never searched).
    """
    recorded_hashes = trace.model.get("source_hashes")
    hashes: dict[str, str] = dict(recorded_hashes) if isinstance(recorded_hashes, dict) else {}
    recorded_files = sorted(trace.files())
    open_by_hash = {text_sha256(text): path for path, text in open_texts.items()}
    roots = list(roots)
    readable = [*roots, *libraries]
    hashes_here = {file: file_sha256(file) if is_inside(file, readable) else None for file in recorded_files}
    pending = {
        Path(file).name for file in recorded_files if hashes.get(file) is None or hashes_here[file] != hashes[file]
    }
    by_name = _files_named([Path(root) for root in roots], pending) if pending else {}
    matches = []
    for file in recorded_files:
        digest = hashes.get(file)
        here = hashes_here[file]
        if digest is not None and here == digest:
            matches.append(SourceMatch(file, file, AT_RECORDED_PATH, changed=False))
            continue
        same_name = sorted(by_name.get(Path(file).name, []), key=lambda path: -_common_tail(path, file))
        if digest is not None:
            content_match = open_by_hash.get(digest) or next(
                (path for path in same_name if file_sha256(path) == digest), None
            )
            if content_match is not None:
                matches.append(SourceMatch(file, content_match, SAME_CONTENT, changed=False))
                continue
        if here is not None:
            matches.append(SourceMatch(file, file, AT_RECORDED_PATH, changed=True))
        elif same_name:
            matches.append(SourceMatch(file, same_name[0], SAME_NAME, changed=True))
        else:
            matches.append(SourceMatch(file, None, NOT_FOUND, changed=False))
    return matches


def relocate(trace: Trace, matches: Iterable[SourceMatch]) -> None:
    """Point the trace's records at the files found here (in place: the server's display copy of a trace)."""
    moved = {
        match.recorded: match.found for match in matches if match.found is not None and match.found != match.recorded
    }
    if not moved:
        return
    # NOTE: records share their SourceLocation objects (`read_trace` interns them): each is rewritten once.
    done: set[int] = set()

    def move(location: SourceLocation | None) -> None:
        if location is not None and id(location) not in done:
            done.add(id(location))
            location.file = moved.get(location.file, location.file)

    for record in trace.modules:
        move(record.called_at)
        move(record.defined_at)
    for build in trace.builds:
        move(build.built_at)
        for location in build.assigned_at.values():
            move(location)
    for line_record in trace.lines:
        line_record.file = moved.get(line_record.file, line_record.file)
    if trace.model.get("file") in moved:
        trace.model["file"] = moved[trace.model["file"]]
