"""What the interpreter that runs ModelTrace lacks, and the one `pip install` that adds it.

The VS Code extension carries ModelTrace and its pure-Python dependencies (`bundled`), but compiled packages
must come from the user's environment. The extension's interpreter check prints `missing_requirements()` and
offers `install_command(...)` in a terminal. Looked up with `importlib.util.find_spec`, never imported: importing
torch alone takes seconds, and the check runs before every server start.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Requirement:
    """A package ModelTrace imports from the user's environment: `module` is its import name, `package` what
    pip installs, `needed_for` what does not work without it; `server` when the language server cannot even
    start without it (the rest only disables a feature)."""

    module: str
    package: str
    needed_for: str
    server: bool = False


# NOTE: the ranges are pyproject.toml's dependencies; transformers is not here: a plain PyTorch model traces
# without it, and a transformers model's trace says it is missing when it is.
REQUIREMENTS = (
    Requirement("numpy", "numpy", "statistics and the diff (the server reads traces with it)", server=True),
    Requirement("torch", "torch>=2.6", "tracing (the worker runs the model with it)"),
    Requirement("safetensors", "safetensors>=0.4", "full tensors: reference traces, the diff's values and replay"),
    Requirement("libcst", "libcst>=1.4", "the `_can_record_outputs` quick fixes"),
)


def missing_requirements() -> list[Requirement]:
    """The requirements this interpreter cannot import, in the order of `REQUIREMENTS`."""
    missing = []
    for requirement in REQUIREMENTS:
        try:
            found = importlib.util.find_spec(requirement.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(requirement)
    return missing


def install_command(python: str, requirements: list[Requirement]) -> list[str]:
    """`PYTHON -m pip install PACKAGE...`: the command that adds `requirements` to that interpreter's environment."""
    return [python, "-m", "pip", "install", *(requirement.package for requirement in requirements)]


def probe() -> dict[str, Any]:
    """What the extension's interpreter check reads: the missing requirements, and the command that installs them
    into this interpreter's environment (None when nothing is missing)."""
    missing = missing_requirements()
    return {
        "missing": [asdict(requirement) for requirement in missing],
        "install": install_command(sys.executable, missing) if missing else None,
    }
