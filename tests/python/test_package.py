"""The package a user installs without this repository: the wheel holds the code, the kernel's source and the kernel
prebuilt into it, and traces from its own files on a machine without a C compiler."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import EXAMPLE_MODELING_FILE, REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(folder), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    (found,) = folder.glob("modeltrace-*.whl")
    return found


def test_wheel_contents(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "modeltrace/worker/native/moments.c" in names
    assert any(
        name.startswith("modeltrace/worker/native/modeltrace_moments.") and name.endswith((".so", ".pyd"))
        for name in names
    ), "the prebuilt kernel is missing"
    assert "modeltrace/api.py" in names and "modeltrace/lsp/server.py" in names
    assert not [name for name in names if name.startswith(("tests/", "examples/", "extension/"))]


def test_installed_wheel_traces_without_a_compiler(wheel: Path, tmp_path: Path) -> None:
    """The wheel unpacked on its own (ahead of this checkout on the path), PATH without any compiler: the
    statistics come from the prebuilt kernel and `modeltrace trace` traces the example."""
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    environment = {key: value for key, value in os.environ.items() if key not in ("CC", "PYTHONPATH")}
    environment.update(PYTHONPATH=str(target), PATH=str(tmp_path / "bin"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import modeltrace, modeltrace.worker.native as native; native.kernels(); "
            "print(modeltrace.__file__, native.form)",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    module_file, form = probe.stdout.split()
    assert Path(module_file).is_relative_to(target) and form == "prebuilt"
    traced = subprocess.run(
        [sys.executable, "-m", "modeltrace", "trace", str(EXAMPLE_MODELING_FILE), "--out", str(tmp_path / "t.mtrace")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert traced.returncode == 0, traced.stderr
    assert "self.self_attn(" in traced.stdout and "[1, 7, 64]" in traced.stdout
