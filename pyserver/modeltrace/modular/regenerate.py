"""Regenerate a modular file's generated twin into a temporary folder, never over the user's generated file.

When `modular_x.py` changed since `modeling_x.py` was written (`mapping.ModularMap.is_stale`), the trace of the
generated file would run the old code. A model adder works in a transformers checkout, which holds the converter
(`utils/modular_model_converter.py`): it is found by walking up from the modular file. The converter writes its
output beside the modular file it is given, and wants that file under `src/transformers/` (it names the generated
file's source by the path from there: `AUTO_GENERATED_MESSAGE`); it imports the parent models' files through
`transformers` itself (`importlib.util.find_spec`), so the checkout's `src` goes first on its `PYTHONPATH`. So the
model folder is copied to `<temporary>/src/transformers/models/<name>/` and the converter runs there, from the
checkout (it imports its neighbours in `utils/`, and formats what it writes with `ruff check` / `ruff format
--config pyproject.toml`, both run by name from the checkout: the interpreter's own `bin` goes first on `PATH`, so a
virtual environment's ruff is found). The copy's modular file is byte for byte the user's, so its trace shows on
the user's lines. Torch-free, runs nothing in-process: the converter is a child process.

The temporary folders are ModelTrace's, never the user's: `RegeneratedFolders` removes one when the trace made from
it is replaced or no longer shown, the oldest beyond `KEEP_REGENERATED`, and all of them when the server stops;
`remove_regenerated` refuses any folder that is not one `regenerate_copy` made.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.modular.twins import generated_path

CONVERTER = Path("utils") / "modular_model_converter.py"
# NOTE: the layout the converter expects around a modular file (`src/transformers/...`, see the docstring)
MODELS_LAYOUT = Path("src") / "transformers" / "models"
TEMPORARY_PREFIX = "modeltrace-regenerated-"
# A converter run over one model takes seconds; a hung one is stopped.
CONVERTER_TIMEOUT_SECONDS = 300.0
# Regenerated folders the server keeps at most (one per modular file whose regenerated trace is shown).
KEEP_REGENERATED = 4


# NOTE: the converter's command line changed across transformers versions: older ones take only
# `--files_to_parse PATH` (the contributor guide's command, `twins.REGENERATE_COMMAND`); recent ones take the files as
# positional arguments (transformers' own `add_new_model_like` runs `modular_model_converter.py <name>`). The first
# is tried first; on an argparse refusal of it (exit 2, "usage:"), the second.
CONVERTER_ARGUMENTS = (
    lambda copy: ["--files_to_parse", str(copy)],
    lambda copy: [str(copy)],
)
ARGPARSE_EXIT = 2


def _refused_arguments(completed: subprocess.CompletedProcess) -> bool:
    """Whether the converter's argparse refused its command line (nothing was converted)."""
    return completed.returncode == ARGPARSE_EXIT and "usage:" in completed.stderr and "error:" in completed.stderr


def find_checkout(modular: str | Path) -> Path | None:
    """The transformers source checkout above a modular file: the nearest folder holding the converter."""
    path = Path(modular).resolve()
    for folder in path.parents:
        if (folder / CONVERTER).is_file():
            return folder
    return None


def no_checkout_message(modular: str | Path) -> str:
    return (
        f"{modular}: no transformers source checkout above it (a folder holding {CONVERTER.as_posix()}): "
        "regenerating needs transformers' converter; clone transformers and work on the modular file inside it"
    )


def regenerate_copy(
    modular: str | Path,
    checkout: str | Path,
    python: str = sys.executable,
    timeout: float = CONVERTER_TIMEOUT_SECONDS,
) -> Path:
    """Copy the modular file's folder to a new temporary folder, run the checkout's converter on the copy, and
    return the copy's modular file (its generated twin freshly written beside it). The user's folder is only
    read. A ModelTraceError naming the converter and its output when it fails or writes no generated file."""
    source = Path(modular).resolve()
    checkout = Path(checkout).resolve()
    converter = checkout / CONVERTER
    if not converter.is_file():
        raise ModelTraceError(f"{checkout}: no {CONVERTER.as_posix()} there")
    root = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
    try:
        return _convert_copy(source, checkout, converter, root, python, timeout)
    except BaseException:
        # NOTE: a failed run leaves nothing behind; its message carries the converter's own output
        remove_regenerated(root)
        raise


def _convert_copy(source: Path, checkout: Path, converter: Path, root: Path, python: str, timeout: float) -> Path:
    folder = root / MODELS_LAYOUT / source.parent.name
    shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    copy = folder / source.name
    twin = generated_path(copy)
    # NOTE: the stale twin goes, so that a converter that writes nothing is caught, not traced
    twin.unlink(missing_ok=True)
    environment = dict(os.environ)
    checkout_src = checkout / "src"
    if checkout_src.is_dir():
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(checkout_src), *filter(None, [environment.get("PYTHONPATH")])]
        )
    # NOTE: the converter runs `ruff` by name (`check_copies.run_ruff`); without it on PATH it dies, and with a
    # failing one it writes nothing: the interpreter's environment (where `pip install -e .[quality]` puts it)
    # goes first
    interpreter = Path(shutil.which(python) or python)
    environment["PATH"] = os.pathsep.join([str(interpreter.parent), *filter(None, [environment.get("PATH")])])
    completed = None
    for arguments in CONVERTER_ARGUMENTS:
        command = [python, str(converter), *arguments(copy)]
        try:
            completed = subprocess.run(
                command, cwd=checkout, env=environment, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise ModelTraceError(f"{converter}: still running after {timeout:.0f} s on {copy}; stopped") from None
        except OSError as error:
            raise ModelTraceError(f"{converter}: cannot run it with {python}: {error}") from None
        if not _refused_arguments(completed):
            break
    assert completed is not None
    output = (completed.stderr.strip() or completed.stdout.strip())[-2000:]
    if completed.returncode != 0:
        raise ModelTraceError(f"{converter} failed on a copy of {source.name} (exit {completed.returncode}): {output}")
    if not twin.is_file():
        raise ModelTraceError(
            f"{converter} wrote no {twin.name} for the copy of {source.name}: {output or 'no output'}"
        )
    try:
        ast.parse(twin.read_text(encoding="utf-8"), filename=str(twin))
    except SyntaxError as error:
        raise ModelTraceError(
            f"{twin}:{error.lineno}: the regenerated file does not parse ({error.msg})", str(twin), error.lineno
        ) from None
    return copy


def regenerated_root(copy: str | Path) -> Path | None:
    """The temporary folder `regenerate_copy` made for a copy it returned (`<it>/src/transformers/models/<name>/
    modular_<name>.py`); None for any other path."""
    path = Path(copy).resolve()
    if len(path.parents) < 5:
        return None
    root = path.parents[4]
    if not _is_ours(root) or path.parent.parent != root / MODELS_LAYOUT:
        return None
    return root


def _is_ours(folder: Path) -> bool:
    # NOTE: only a folder directly in the temporary directory, named as `regenerate_copy` names them
    temporary = Path(tempfile.gettempdir()).resolve()
    return (
        folder.name.startswith(TEMPORARY_PREFIX) and folder.parent.resolve() == temporary and not folder.is_symlink()
    )


def remove_regenerated(root: str | Path) -> bool:
    """Remove a folder `regenerate_copy` made; True when it was removed. Any other folder is refused (a
    ValueError): whatever the caller holds, the user's files are never removed here."""
    folder = Path(root)
    if not _is_ours(folder):
        raise ValueError(
            f"{folder}: not a folder ModelTrace regenerated into ({TEMPORARY_PREFIX}* in {tempfile.gettempdir()})"
        )
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


class RegeneratedFolders:
    """The regenerated folders a server holds, by the user's modular file they were made from: a new one for the
    same file replaces (removes) the one before, the oldest beyond `keep` go, and `clear` removes the rest.
    Thread-safe: regenerations run off the event loop."""

    def __init__(self, keep: int = KEEP_REGENERATED) -> None:
        self.keep = keep
        self._folders: OrderedDict[str, Path] = OrderedDict()
        self._lock = threading.Lock()

    def hold(self, modular: str, root: Path) -> list[Path]:
        """Keep `root` as `modular`'s regenerated folder; return the folders removed for it. A ValueError for a
        folder `regenerate_copy` did not make (it would be removed later)."""
        if not _is_ours(Path(root)):
            raise ValueError(f"{root}: not a folder ModelTrace regenerated into")
        with self._lock:
            dropped = []
            previous = self._folders.pop(modular, None)
            if previous is not None and previous != root:
                dropped.append(previous)
            self._folders[modular] = root
            while len(self._folders) > self.keep:
                dropped.append(self._folders.popitem(last=False)[1])
        return [folder for folder in dropped if remove_regenerated(folder)]

    def release(self, modular: str) -> list[Path]:
        """Remove `modular`'s regenerated folder (its trace is no longer shown)."""
        with self._lock:
            folder = self._folders.pop(modular, None)
        return [folder] if folder is not None and remove_regenerated(folder) else []

    def clear(self) -> list[Path]:
        """Remove every folder held (the server stops)."""
        with self._lock:
            folders, self._folders = list(self._folders.values()), OrderedDict()
        return [folder for folder in folders if remove_regenerated(folder)]

    def copy_of(self, modular: str) -> Path | None:
        """The regenerated copy of `modular` held, while its folder is there."""
        with self._lock:
            root = self._folders.get(modular)
        copy = root / MODELS_LAYOUT / Path(modular).parent.name / Path(modular).name if root is not None else None
        return copy if copy is not None and copy.is_file() else None

    def held(self) -> dict[str, Path]:
        with self._lock:
            return dict(self._folders)
