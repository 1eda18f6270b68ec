"""ModelTrace: run a PyTorch / transformers forward pass under capture hooks and map what it saw onto source lines.

The package is split the way a trace travels: `worker/` builds and runs the model in a subprocess,
`trace/` stores what it captured, `lsp/` serves it to editors, `cli.py` prints it in a terminal.

As a library (`api.py`): `modeltrace.capture(model, path)`, `modeltrace.load(path)`, `modeltrace.diff(ref, cand)`.
They are imported on first use, so that `import modeltrace` (the language server does it) never imports torch.
"""

from __future__ import annotations

from typing import Any

from modeltrace import bundled as _bundled
from modeltrace.version import __version__

# NOTE: run from the VS Code extension's bundle (no ModelTrace installed), the pure-Python fallbacks it carries
# (msgpack) join the path after the environment's own packages; without MODELTRACE_BUNDLE this does nothing.
_bundled.add_fallback_libraries()

_API = ("capture", "load", "diff", "CaptureSession", "TraceView", "DiffView")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from modeltrace import api

        return getattr(api, name)
    raise AttributeError(f"module 'modeltrace' has no attribute {name!r}")
