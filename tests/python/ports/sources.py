"""Where the independently written implementations of the corpus come from, and how a test gets them.

The implementations (Meta's Llama `model.py`, Mistral's one-file reference, Google's `gemma_pytorch`, ...) are
published by other people under their own licenses. They are NOT copied into this repository: the workplace's
rule keeps fetched code out of commits. A pair names its source (repository, commit, files, license file) and
the test materialises the files, byte for byte, from a local git mirror of that repository into the pair's
staged folder (`staged_pair_folder`), next to the pair's own committed files (recipes, shims, converter).
The sha256 of each file is pinned, so a test always runs the text this corpus was written against.

The mirrors are looked up under `$MODELTRACE_PORT_SOURCES` (default `/work/.mirror`) as
`<owner>+<name>/repo` (a bare git directory holding the pinned commit). Where a mirror is missing the pair is
skipped with the reason, never faked.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

MIRRORS_VARIABLE = "MODELTRACE_PORT_SOURCES"
DEFAULT_MIRRORS = Path("/work/.mirror")
# the corpus's modules that pair folders import from their parent folder
SHARED_MODULES = ("corpus_common.py", "meta_convert.py", "vision_common.py")


@dataclass(frozen=True)
class SourceFile:
    """One published file: its path in the repository, where it goes in the staged folder, its sha256."""

    path: str
    into: str
    sha256: str


@dataclass(frozen=True)
class Source:
    """A published implementation at a pinned commit: `repo` is `owner/name` on GitHub."""

    repo: str
    commit: str
    license: str
    files: tuple[SourceFile, ...]

    def mirror(self) -> Path:
        root = Path(os.environ.get(MIRRORS_VARIABLE) or DEFAULT_MIRRORS)
        return root / self.repo.replace("/", "+") / "repo"


class SourceUnavailable(RuntimeError):
    """The pinned text of a source cannot be read here (no mirror, no such commit, another text)."""


def _git_show(git_dir: Path, commit: str, path: str) -> bytes:
    completed = subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], capture_output=True, check=False
    )
    if completed.returncode != 0:
        message = completed.stderr.decode(errors="replace").strip()
        raise SourceUnavailable(f"{git_dir}: cannot read {path} at {commit[:12]}: {message}")
    return completed.stdout


def materialise(source: Source, folder: Path) -> None:
    """Write the source's files and its license into `folder` (their sha256 checked against the pins)."""
    git_dir = source.mirror()
    if not git_dir.is_dir():
        raise SourceUnavailable(
            f"no mirror of {source.repo} at {git_dir} (set ${MIRRORS_VARIABLE} to the folder holding "
            f"{source.repo.replace('/', '+')}/repo)"
        )
    for file in (*source.files, SourceFile(source.license, f"LICENSE.{source.repo.replace('/', '+')}", "")):
        text = _git_show(git_dir, source.commit, file.path)
        digest = hashlib.sha256(text).hexdigest()
        if file.sha256 and digest != file.sha256:
            raise SourceUnavailable(
                f"{source.repo}@{source.commit[:12]}:{file.path} has sha256 {digest}, pinned {file.sha256}"
            )
        target = folder / file.into
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)


def unavailable(sources: tuple[Source, ...]) -> str | None:
    """Why the sources cannot be materialised here (no mirror, or no pinned commit in it), or None."""
    for source in sources:
        git_dir = source.mirror()
        if not git_dir.is_dir():
            return f"no mirror of {source.repo} at {git_dir} (set ${MIRRORS_VARIABLE})"
        found = subprocess.run(
            ["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{source.commit}^{{commit}}"],
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            return f"the mirror of {source.repo} at {git_dir} lacks commit {source.commit[:12]}"
    return None


def staged_pair_folder(name: str, committed: Path, sources: tuple[Source, ...]) -> Path:
    """The committed pair folder plus its sources' files, staged once per process under the temp folder."""
    root = Path(tempfile.gettempdir()) / f"modeltrace-ports-{os.getuid()}-{os.getpid()}"
    folder = root / name
    if not root.is_dir():
        root.mkdir(parents=True)
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        # the recipes import the corpus's shared modules from the pair folder's parent
        for shared in SHARED_MODULES:
            shutil.copy2(committed.parent / shared, root / shared)
    if not folder.is_dir():
        partial = root / f".{name}.partial"
        if partial.exists():
            shutil.rmtree(partial)
        shutil.copytree(committed, partial, ignore=shutil.ignore_patterns("__pycache__"))
        for source in sources:
            materialise(source, partial)
        partial.rename(folder)
    return folder


__all__ = ["SHARED_MODULES", "Source", "SourceFile", "SourceUnavailable", "materialise", "staged_pair_folder"]
