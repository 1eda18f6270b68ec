"""The cyclic garbage collector paused around work that makes many objects and no reference cycles.

Reference counting still frees everything such work drops; the collector would only walk everything alive, a few
times per pass, for nothing to collect. Used where that walk was measured: packing a trace's tables
(`trace/storage.py`), loading a trace into the server (`lsp/loading.py`: a third of the loading time), a diff
(`diff/compare.py`: ~10% of a statistics-only diff), and the worker's job from its model's build to its end
(`worker/job.py`). A capture pauses it from its `__enter__` to its `__exit__` itself (`worker/capture.py`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; the caller's setting comes back after it, an error too (a caller
    that had paused it keeps it paused)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
