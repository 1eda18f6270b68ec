"""What to build, read once from a trace request: the first step of the building pipeline.

A worker request (the frozen `TraceRequest` of `worker/messages.py`, or a dict with the same names) names ~15
things; building reads only the handful here, once, at the pipeline's entry (`BuildSpec.from_request`), and
every later step takes the spec instead of reaching back into the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# NOTE: the defaults of the request contract, defined once there; half the timeout is the builder's trial budget
from modeltrace.worker.messages import DEFAULT_ATTENTION, DEFAULT_DTYPE, DEFAULT_TIMEOUT_SECONDS


def _read(request: Any, name: str) -> Any:
    """A request field by name, from a dict or from an object with that attribute (None when absent)."""
    if isinstance(request, Mapping):
        return request.get(name)
    return getattr(request, name, None)


@dataclass(frozen=True)
class BuildSpec:
    """The parts of a trace request that say what model to build and how (see `strategies.choose_strategy`)."""

    file: Path | None = None
    recipe: Path | None = None
    model: str | None = None  # a class of the file (`--model`); None: the file's base model
    config: Path | None = None  # a config.json or a folder holding one, used as it is
    checkpoint: str | None = None  # a local folder saved with save_pretrained
    seed: int = 0
    dtype: str = DEFAULT_DTYPE
    attention: str = DEFAULT_ATTENTION
    shape_only: bool = False
    device_map: Any = None  # `--device-map`: a name ("auto") or a {module: device} map
    tp_plan: Any = None  # tensor parallelism (`worker/parallel.py`)
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    # Where accelerate offloads weights to disk in a `--device-map` run (made by `build_from_request`).
    offload_folder: str | None = None

    @classmethod
    def from_request(cls, request: Any) -> BuildSpec:
        """The spec of a worker request: a dict (`job.run_trace_job`) or an object with the same attributes."""
        if isinstance(request, BuildSpec):
            return request
        file, recipe, config = _read(request, "file"), _read(request, "recipe"), _read(request, "config")
        return cls(
            file=Path(file) if file else None,
            recipe=Path(recipe) if recipe else None,
            model=_read(request, "model") or None,
            config=Path(config) if config else None,
            checkpoint=_read(request, "checkpoint") or None,
            seed=int(_read(request, "seed") or 0),
            dtype=_read(request, "dtype") or DEFAULT_DTYPE,
            attention=_read(request, "attention") or DEFAULT_ATTENTION,
            shape_only=bool(_read(request, "shape_only")),
            device_map=_read(request, "device_map") or None,
            tp_plan=_read(request, "tp_plan") or None,
            timeout=float(_read(request, "timeout") or DEFAULT_TIMEOUT_SECONDS),
            offload_folder=_read(request, "offload_folder") or None,
        )
