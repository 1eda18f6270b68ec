"""Where callers import model building from: the `building` package (its pipeline is in its docstring).

NOTE: kept so that `job.py`, `replay.py`, `parallel.py` and the API import one stable name while the package's
inner modules move; new code may import `modeltrace.worker.building` directly.
"""

from __future__ import annotations

from modeltrace.worker.building import *  # noqa: F403
from modeltrace.worker.building import __all__  # noqa: F401
