"""Shared fixtures: paths of the example model, and one warm worker for the tests that trace through it."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from modeltrace.worker.client import WorkerClient


# NOTE: the shared parameter store (`trace/parameter_store.py`) of this test process, never the user's cache; set
# before any worker or server process starts, so that they inherit it. Each pytest process (pytest-xdist runs two)
# makes its own, even where it inherited one that another pytest process made: a process removes its store when it
# exits, which must not be while the other still runs tests. A store named before pytest started is kept.
_STORE_MADE_BY = "MODELTRACE_TEST_STORE_MADE_BY"
_store_maker = os.environ.get(_STORE_MADE_BY)
if "MODELTRACE_PARAMETER_STORE" not in os.environ or (_store_maker is not None and _store_maker != str(os.getpid())):
    os.environ["MODELTRACE_PARAMETER_STORE"] = tempfile.mkdtemp(prefix="modeltrace-test-parameters-")
    os.environ[_STORE_MADE_BY] = str(os.getpid())
    atexit.register(shutil.rmtree, os.environ["MODELTRACE_PARAMETER_STORE"], ignore_errors=True)

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PACKAGE = REPO_ROOT / "examples" / "tiny_llama"
EXAMPLE_MODELING_FILE = EXAMPLE_PACKAGE / "modeling_tiny_llama.py"


BENCH_FOLDER = REPO_ROOT / "bench"


def load_bench_script(name: str) -> ModuleType:
    """`bench/<name>.py` as a module (loaded once), as it runs as a script: with its folder on `sys.path`, where
    the scripts share `rounds.py`. bench/ is no package."""
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH_FOLDER) not in sys.path:
        sys.path.insert(0, str(BENCH_FOLDER))
    spec = importlib.util.spec_from_file_location(name, BENCH_FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # NOTE: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def line_of(file: Path, snippet: str, occurrence: int = 0) -> int:
    """1-based number of the line holding `snippet` (its `occurrence`-th appearance)."""
    matches = [number for number, text in enumerate(file.read_text().splitlines(), 1) if snippet in text]
    assert len(matches) > occurrence, f"{snippet!r} not found {occurrence + 1} time(s) in {file}"
    return matches[occurrence]


@pytest.fixture(scope="session")
def worker() -> Iterator[WorkerClient]:
    client = WorkerClient(python=sys.executable)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def example_copy(tmp_path: Path) -> Path:
    """A private copy of the example package (tests edit it); returns its modeling file."""
    import shutil

    target = tmp_path / "tiny_llama"
    shutil.copytree(EXAMPLE_PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target / "modeling_tiny_llama.py"
