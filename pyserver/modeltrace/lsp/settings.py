"""The server's settings (`modelTrace.*` in VS Code), their defaults and how the client's values are read.

The values arrive through `configuration` (`initialize`, `workspace/didChangeConfiguration`); unknown or malformed
values are logged and ignored, so one bad setting never stops the server.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from modeltrace.errors import ModelTraceError
from modeltrace.trace.lines import HintDetail
from modeltrace.worker.messages import (
    ATTENTION_IMPLEMENTATIONS,
    DEFAULT_ATTENTION,
    DEFAULT_DTYPE,
    DEFAULT_TIMEOUT_SECONDS,
)
from modeltrace.worker.protocol import DEFAULT_MAX_TENSOR_MB, DEFAULT_MAX_TRACE_MB, DEFAULT_TENSOR_MEMORY_MB

# the editor's budget of full tensors for a trace taken without a reference (`modelTrace.fullTensorsMB`)
DEFAULT_EDITOR_FULL_TENSORS_MB = 256.0


logger = logging.getLogger(__name__)


def default_trace_directory() -> Path:
    """Where traces go unless told otherwise: `$MODELTRACE_TRACE_DIR`, else the user's cache folder."""
    if os.environ.get("MODELTRACE_TRACE_DIR"):
        return Path(os.environ["MODELTRACE_TRACE_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modeltrace" / "traces"


class HintPlacement(str, Enum):
    """Where inlay hints go (`modelTrace.hintPlacement`): after each assigned name, or one label at the line's end."""

    AFTER_NAME = "afterName"
    END_OF_LINE = "endOfLine"


class HintSizes(str, Enum):
    """Which sizes the hints show: the traced (shrunk) run's, or the model's full sizes (`lsp/full_sizes.py`)."""

    TRACED = "traced"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Settings:
    """What the user can set; `python` is the interpreter of the trace worker (it needs torch)."""

    python: str = sys.executable
    device: str = "cpu"
    dtype: str = DEFAULT_DTYPE
    # The attention implementation traces are built with (`attn_implementation`).
    attention: str = DEFAULT_ATTENTION
    hint_detail: HintDetail = HintDetail.DTYPE
    hint_placement: HintPlacement = HintPlacement.AFTER_NAME
    hint_sizes: HintSizes = HintSizes.TRACED
    trace_on_save: bool = False
    # Start the worker (torch and transformers imported) when a model file opens in a trusted workspace, so that
    # the first trace does not wait seconds for it; False: on the first trace.
    start_worker_on_open: bool = True
    # NOTE: the same default as the editor's setting (package.json, compared by a test): every client gets line hints
    lines: bool = True
    # Other files whose lines are captured too (helpers the model calls into); relative to the workspace root.
    follow: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    # Full tensors kept by a trace (recorded while a reference is set): larger ones keep their statistics only.
    max_tensor_mb: float = DEFAULT_MAX_TENSOR_MB
    max_trace_mb: float = DEFAULT_MAX_TRACE_MB
    # NOTE: a trace taken without a reference keeps its tensors too, up to this many MB (the rest: statistics), so
    # that pinning it gives a full reference without tracing again; 0 keeps statistics only until a reference is set
    full_tensors_mb: float = DEFAULT_EDITOR_FULL_TENSORS_MB
    # Full tensors waiting in memory for the trace's writer; past it the forward waits for the disk.
    tensor_memory_mb: float = DEFAULT_TENSOR_MEMORY_MB
    trace_directory: Path = field(default_factory=default_trace_directory)
    # Diff against a reference trace: tolerances (None: the diff's defaults) and module path rename maps.
    diff_atol: float | None = None
    diff_rtol: float | None = None
    diff_maps: tuple[str, ...] = ()
    # Re-run the first differing modules on the reference's inputs when the reference has full tensors.
    diff_replay: bool = True
    # A module mapping file (`modeltrace align`) that aligns the trace with its reference instead of names.
    diff_mapping: str | None = None
    # Shape-only traces (the full-size config on the meta device: shapes and dtypes, no statistics) and a local
    # checkpoint folder (saved with save_pretrained) to load instead of a shrunk random-weight config.
    shape_only: bool = False
    checkpoint: str | None = None
    # A recipe (`build_model()`, `build_inputs(model)`) and a config.json that traces are built with, as the CLI's
    # `--recipe` / `--config`; a relative path is the workspace's. None: the unaided build.
    recipe: str | None = None
    config: str | None = None
    # The project file to read (`modeltrace.toml` or a `pyproject.toml`), instead of the nearest one above each
    # traced file; its entries win over `recipe` / `config` (DESIGN: the project file).
    project_file: str | None = None
    # With a checkpoint: accelerate's device map (`auto`, or a JSON object / file), as `--device-map`.
    device_map: str | None = None
    # "Trace generate": decode steps after the prefill; backward traces: a gradient hint after each line's value.
    generate_steps: int = 4
    gradient_hints: bool = True

    def updated(self, values: Mapping[str, Any]) -> Settings:
        """A copy with the camelCase `values` applied (`hintDetail`, `traceOnSave`, ...); bad ones are skipped."""
        changes: dict[str, Any] = {}
        for name, value in values.items():
            if name not in _SETTINGS:
                continue
            field_name, parse = _SETTINGS[name]
            try:
                changes[field_name] = parse(value)
            except (TypeError, ValueError) as error:
                logger.warning("ignoring setting modelTrace.%s = %r: %s", name, value, error)
        return dataclasses.replace(self, **changes)


def _python(value: Any) -> str:
    # NOTE: an empty setting means "the interpreter running this server", as in the Python tools template.
    return str(value) if value else sys.executable


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _seconds(value: Any) -> float:
    seconds = float(value)
    if not 0 < seconds < float("inf"):  # NOTE: NaN fails this too
        raise ValueError("expected a finite number of seconds > 0")
    return seconds


def _megabytes(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number of megabytes")
    megabytes = float(value)
    if not 0 <= megabytes < float("inf"):
        raise ValueError("expected a number of megabytes >= 0")
    return megabytes


def _directory(value: Any) -> Path:
    return Path(_text(value)).expanduser()


def _tolerance(value: Any) -> float | None:
    if value is None:
        return None
    tolerance = float(value)
    if not 0 <= tolerance < float("inf"):  # NOTE: NaN fails this too
        raise ValueError("expected a finite tolerance >= 0")
    return tolerance


def _device_map(value: Any) -> str | None:
    # NOTE: read by the worker (`worker/placement.py: parse_device_map`), which names what is wrong with it. Empty
    # is the setting's default (one device): no warning for it.
    if value is None or value == "":
        return None
    text = _text(value).strip()
    return text or None


def _checkpoint(value: Any) -> str | None:
    # NOTE: an empty setting means no checkpoint; a hub id is passed on as it is, for the worker to refuse with
    # a message that names it.
    if value is None or value == "":
        return None
    text = _text(value).strip()
    if not text:
        return None
    expanded = Path(text).expanduser()
    return str(expanded.resolve()) if expanded.exists() else text


def _optional_path(value: Any) -> str | None:
    """A path setting: empty means none (a missing file is reported when it is used, naming it)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("expected a path")
    return value


def _attention(value: Any) -> str:
    if value not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"expected one of {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return str(value)


def _paths(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) and item for item in value):
        raise ValueError("expected a list of file paths")
    return tuple(value)


def _steps(value: Any) -> int:
    if isinstance(value, bool) or int(value) != value or not 1 <= int(value) <= 1024:
        raise ValueError("expected a whole number of decode steps from 1 to 1024")
    return int(value)


def _maps(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ValueError("expected a list of 'REGEX=>REPL' strings")
    # NOTE: imported here: `modeltrace.diff` loads numpy (~14 MB), which a server that only shows hints
    # never needs; rename maps are set by those who diff.
    from modeltrace.diff.align import parse_maps

    try:
        parse_maps(list(value))
    except ModelTraceError as error:
        raise ValueError(str(error)) from None
    return tuple(value)


# camelCase setting name -> (Settings field, parser raising ValueError/TypeError on a bad value)
_SETTINGS = {
    "python": ("python", _python),
    "device": ("device", _text),
    "dtype": ("dtype", _text),
    "attention": ("attention", _attention),
    "hintDetail": ("hint_detail", HintDetail),
    "hintPlacement": ("hint_placement", HintPlacement),
    "hintSizes": ("hint_sizes", HintSizes),
    "traceOnSave": ("trace_on_save", _boolean),
    "startWorkerOnOpen": ("start_worker_on_open", _boolean),
    "lines": ("lines", _boolean),
    "follow": ("follow", _paths),
    "timeout": ("timeout", _seconds),
    "maxTensorMB": ("max_tensor_mb", _megabytes),
    "maxTraceMB": ("max_trace_mb", _megabytes),
    "fullTensorsMB": ("full_tensors_mb", _megabytes),
    "tensorMemoryMB": ("tensor_memory_mb", _megabytes),
    "traceDirectory": ("trace_directory", _directory),
    "diffAtol": ("diff_atol", _tolerance),
    "diffRtol": ("diff_rtol", _tolerance),
    "diffMaps": ("diff_maps", _maps),
    "diffReplay": ("diff_replay", _boolean),
    "diffMapping": ("diff_mapping", _optional_path),
    "shapeOnly": ("shape_only", _boolean),
    "checkpoint": ("checkpoint", _checkpoint),
    "recipe": ("recipe", _optional_path),
    "config": ("config", _optional_path),
    "projectFile": ("project_file", _optional_path),
    "deviceMap": ("device_map", _device_map),
    "generateSteps": ("generate_steps", _steps),
    "gradientHints": ("gradient_hints", _boolean),
}
