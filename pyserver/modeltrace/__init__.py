"""ModelTrace: run a PyTorch / transformers forward pass under capture hooks and map what it saw onto source lines.

The package is split the way a trace travels: `worker/` builds and runs the model in a subprocess,
`trace/` stores what it captured, `lsp/` serves it to editors, `cli.py` prints it in a terminal.
"""

from __future__ import annotations

__version__ = "0.1.0"
