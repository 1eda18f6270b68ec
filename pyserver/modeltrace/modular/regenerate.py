"""Regenerate a modular file's generated twin into a temporary folder, never over the user's generated file.

When `modular_x.py` changed since `modeling_x.py` was written (`mapping.ModularMap.is_stale`), the trace of the
generated file would run the old code. A model adder works in a transformers checkout, which holds the converter
(`utils/modular_model_converter.py`): it is found by walking up from the modular file. The converter writes its
output beside the modular file it is given, and wants that file under `src/transformers/` (it names the generated
file's source by the path from there: `AUTO_GENERATED_MESSAGE`); it imports the parent models' files through
`transformers` itself (`importlib.util.find_spec`), so the checkout's `src` goes first on its `PYTHONPATH`. So the
model folder is copied to `<temporary>/src/transformers/models/<name>/` and the converter runs there, from the
checkout (it imports its neighbours in `utils/`). The copy's modular file is byte for byte the user's, so its
trace shows on the same lines. Torch-free, runs nothing in-process: the converter is a child process.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.modular.twins import generated_path

CONVERTER = Path("utils") / "modular_model_converter.py"
# NOTE: the layout the converter expects around a modular file (`src/transformers/...`, see the docstring)
MODELS_LAYOUT = Path("src") / "transformers" / "models"
TEMPORARY_PREFIX = "modeltrace-regenerated-"
# A converter run over one model takes seconds; a hung one is stopped.
CONVERTER_TIMEOUT_SECONDS = 300.0


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
    command = [python, str(converter), "--files_to_parse", str(copy)]
    try:
        completed = subprocess.run(
            command, cwd=checkout, env=environment, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ModelTraceError(f"{converter}: still running after {timeout:.0f} s on {copy}; stopped") from None
    except OSError as error:
        raise ModelTraceError(f"{converter}: cannot run it with {python}: {error}") from None
    output = (completed.stderr.strip() or completed.stdout.strip())[-2000:]
    if completed.returncode != 0:
        raise ModelTraceError(
            f"{converter} failed on a copy of {source.name} (exit {completed.returncode}; copy in {folder}): {output}"
        )
    if not twin.is_file():
        raise ModelTraceError(f"{converter} wrote no {twin.name} for the copy of {source.name} in {folder}: {output}")
    try:
        ast.parse(twin.read_text(encoding="utf-8"), filename=str(twin))
    except SyntaxError as error:
        raise ModelTraceError(
            f"{twin}:{error.lineno}: the regenerated file does not parse ({error.msg})", str(twin), error.lineno
        ) from None
    return copy
