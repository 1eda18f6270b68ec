"""The copy of ModelTrace that the VS Code extension carries (`extension/out/bundled/`), and how it finds its
pure-Python dependencies in an interpreter where ModelTrace is not installed.

The extension runs `PYTHON -m modeltrace serve` with `bundled/tool` (this package) on PYTHONPATH and
`MODELTRACE_BUNDLE` naming the bundle. Two folders of libraries come with it:

- `bundled/libs`: the language server's own stack (pygls, lsprotocol, cattrs, attrs, ...), put first on the
  server's path: the server was tested with these versions, and it runs no model code that could mind them.
- `bundled/fallback`: pure-Python builds of what the worker needs too (msgpack), put last on every process's
  path: the environment's own compiled copy wins where it has one, the bundled one fills in where it has none.

What cannot be bundled (torch, numpy, safetensors, libcst: compiled for one platform and Python) must come from
the user's environment; `environment.missing_requirements` says what is missing, and the extension offers the
one `pip install` that adds it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


BUNDLE_VARIABLE = "MODELTRACE_BUNDLE"
SERVER_LIBRARIES = "libs"
FALLBACK_LIBRARIES = "fallback"


def bundle_folder() -> Path | None:
    """The extension's bundle folder when this process was started from it, else None."""
    value = os.environ.get(BUNDLE_VARIABLE)
    return Path(value) if value else None


def add_fallback_libraries() -> None:
    """Append the bundled pure-Python fallbacks to `sys.path` (after site-packages), when running bundled."""
    folder = bundle_folder()
    if folder is None:
        return
    fallback = str(folder / FALLBACK_LIBRARIES)
    if fallback not in sys.path and os.path.isdir(fallback):
        sys.path.append(fallback)


def add_server_libraries() -> None:
    """Put the bundled language-server stack first on `sys.path` (the `serve` command only; see the docstring)."""
    folder = bundle_folder()
    if folder is None:
        return
    libraries = str(folder / SERVER_LIBRARIES)
    if libraries not in sys.path and os.path.isdir(libraries):
        sys.path.insert(0, libraries)
