"""Bundle the Python side into the extension: `extension/out/bundled/`, which the `.vsix` carries.

    python extension/bundle_python.py        (run by `npm run package` before vsce)

- `tool/modeltrace/`: the package's source as it is in `pyserver/` (no compiled kernel: it is built on first
  use where there is a C compiler, else torch computes the statistics);
- `libs/`: the language server's pure-Python stack (pygls, lsprotocol and what they need, pure wheels for any
  Python >= 3.10), installed with `pip install --target` as microsoft/vscode-black-formatter bundles its own;
- `fallback/`: msgpack built without its C extension (`MSGPACK_PUREPYTHON=1`), used only where the user's
  environment has no msgpack of its own.

Versions come from `requirements.lock`. The folders' roles are `modeltrace.bundled`'s docstring.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


REPOSITORY = Path(__file__).resolve().parent.parent
BUNDLE = REPOSITORY / "extension" / "out" / "bundled"
LOCK_FILE = REPOSITORY / "requirements.lock"
# NOTE: pygls, lsprotocol and all they need, pure wheels only. exceptiongroup is named although only Python 3.10
# needs it (cattrs): pip evaluates dependency markers for the Python that runs it, not for --python-version.
SERVER_PACKAGES = ("pygls", "lsprotocol", "attrs", "cattrs", "typing-extensions", "exceptiongroup")
FALLBACK_PACKAGES = ("msgpack",)
OLDEST_PYTHON = "3.10"
LEFT_OUT = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.dylib")


def locked_versions() -> dict[str, str]:
    """`{name: version}` of the `name==version` lines of requirements.lock."""
    versions = {}
    for line in LOCK_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            versions[name.strip().lower()] = version.strip()
    return versions


def pinned(names: tuple[str, ...], versions: dict[str, str]) -> list[str]:
    missing = [name for name in names if name not in versions]
    if missing:
        raise SystemExit(f"{LOCK_FILE}: no pinned version for {', '.join(missing)}")
    return [f"{name}=={versions[name]}" for name in names]


def pip(*arguments: str, environment: dict[str, str] | None = None) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-compile",
        "--disable-pip-version-check",
        *arguments,
    ]
    completed = subprocess.run(command, env=environment)
    if completed.returncode != 0:
        raise SystemExit(f"bundling failed: {' '.join(command)} exited with {completed.returncode}")


def check_bundle() -> None:
    """The bundled stack imports with nothing but the standard library beside it, and msgpack is the pure one."""
    script = (
        "import sys; sys.path[:0] = sys.argv[1:]; import pygls.lsp.server, lsprotocol.types, msgpack; "
        "assert not hasattr(msgpack, '_cmsgpack') and msgpack.Packer.__module__ == 'msgpack.fallback', msgpack.Packer"
    )
    # NOTE: -I -S: no site-packages, no PYTHONPATH, no user site: only the bundle and the standard library.
    completed = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, str(BUNDLE / "libs"), str(BUNDLE / "fallback")],
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise SystemExit(f"the bundle in {BUNDLE} is incomplete:\n{completed.stderr}")


def main() -> None:
    versions = locked_versions()
    shutil.rmtree(BUNDLE, ignore_errors=True)
    BUNDLE.mkdir(parents=True)
    shutil.copytree(REPOSITORY / "pyserver" / "modeltrace", BUNDLE / "tool" / "modeltrace", ignore=LEFT_OUT)
    pip(
        "--target",
        str(BUNDLE / "libs"),
        "--only-binary=:all:",
        "--implementation",
        "py",
        "--abi",
        "none",
        "--platform",
        "any",
        "--python-version",
        OLDEST_PYTHON,
        "-c",
        str(LOCK_FILE),
        *pinned(SERVER_PACKAGES, versions),
    )
    pip(
        "--target",
        str(BUNDLE / "fallback"),
        "--no-deps",
        "--no-binary",
        ",".join(FALLBACK_PACKAGES),
        *pinned(FALLBACK_PACKAGES, versions),
        environment={**os.environ, "MSGPACK_PUREPYTHON": "1"},
    )
    for folder in ("libs", "fallback"):
        shutil.rmtree(BUNDLE / folder / "bin", ignore_errors=True)
    check_bundle()
    for cache in BUNDLE.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    size = sum(path.stat().st_size for path in BUNDLE.rglob("*") if path.is_file())
    print(f"bundled the Python server into {BUNDLE.relative_to(REPOSITORY)} ({size / 2**20:.1f} MB)")


if __name__ == "__main__":
    main()
