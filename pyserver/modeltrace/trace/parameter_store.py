"""The shared parameter store: a model's weights written once per content, referred to by every trace of them.

A full-tensors trace used to hold a copy of every parameter (`parameters/PATH.NAME` in its safetensors), so that
ten traces of one model held ten copies of its weights (a 1B model: 4 GB each). Now the parameters of a model go
to one file in a content-addressed folder, `<store>/<digest>.safetensors`, named by a digest of every stored
tensor's name, dtype, shape and bytes (`worker/parameter_store.py` writes it). The trace's header says which
file holds its parameters (`model["parameters"]`: `store`, `file`, `digest`, `tensors`, `bytes`); a second trace
of the same weights refers to the same file and writes nothing.

The store folder is `$MODELTRACE_PARAMETER_STORE`, else `$XDG_CACHE_HOME/modeltrace/parameters`, else
`~/.cache/modeltrace/parameters`. A reader looks for the file in the folder the header names, then in this
machine's store (a trace copied from elsewhere). A file that is gone or damaged costs the trace its parameters
only: the activations load, show and diff as before, with a note naming the file (`parameters_note`). Nothing here
imports torch (the language server reads traces).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import Trace
from modeltrace.trace.safetensors_header import read_header


STORE_ENVIRONMENT = "MODELTRACE_PARAMETER_STORE"
STORE_SUFFIX = ".safetensors"


def default_store() -> Path:
    """This machine's parameter store folder (see the module docstring); not created here."""
    chosen = os.environ.get(STORE_ENVIRONMENT)
    if chosen:
        return Path(chosen).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser().absolute() / "modeltrace" / "parameters"


def parameters_reference(trace: Trace) -> dict[str, Any] | None:
    """The header's reference to the store file holding the trace's parameters, None when it has none (a
    statistics trace, one written before the store, one captured with `parameters=False`)."""
    reference = trace.model.get("parameters") if isinstance(trace.model, dict) else None
    if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
        return None
    return reference


def _safe_name(name: str) -> bool:
    """A store file name as we write them (`<hex digest>.safetensors`): a trace is untrusted data, so a name
    that climbs out of the store folder (`../..`) is never looked up."""
    stem = name.removesuffix(STORE_SUFFIX)
    return name.endswith(STORE_SUFFIX) and stem.isalnum() and stem.isascii()


def parameters_file(trace: Trace) -> Path | None:
    """Where the trace's stored parameters are: the file in the folder its header names, else the same name in
    this machine's store; None when the trace refers to none or neither exists."""
    reference = parameters_reference(trace)
    if reference is None or not _safe_name(reference["file"]):
        return None
    folders = [Path(reference["store"])] if isinstance(reference.get("store"), str) else []
    folders.append(default_store())
    for folder in folders:
        candidate = folder / reference["file"]
        if candidate.is_file():
            return candidate
    return None


def parameters_note(trace: Trace, folder: Path | str) -> str | None:
    """What a reader says about the trace's parameters: None when it refers to none or its file is there and
    readable (a header check, no tensor read), else why they are missing, naming the file. The activations are
    never affected."""
    reference = parameters_reference(trace)
    if reference is None:
        return None
    name = Path(folder).name
    if not _safe_name(reference["file"]):
        return f"{name}: its parameters are refused (store file name {reference['file']!r} is not a digest)"
    found = parameters_file(trace)
    if found is None:
        where = Path(str(reference.get("store") or default_store())) / reference["file"]
        return (
            f"{name}: its parameters are missing ({where} is gone); activations are shown and compared, "
            "parameters by their statistics and samples only"
        )
    problem = header_problem(found)
    if problem is not None:
        return (
            f"{name}: its parameters cannot be read ({found}: {problem}); parameters are compared by statistics only"
        )
    return None


# NOTE: our store files hold a few thousand entries at most: a header past this is damage
MAX_STORE_HEADER_BYTES = 64 * 2**20


def header_problem(path: Path) -> str | None:
    """What is wrong with a store file's safetensors header (sizes, JSON, each entry's offsets within the file),
    None when nothing is. Read without numpy (`trace/safetensors_header.py`): the language server that only shows
    a trace never imports it (`tests/python/lsp/test_without_numpy.py`); the diff reads the tensors through
    `trace/tensors.py`."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            header, data_start = read_header(handle, path, size, MAX_STORE_HEADER_BYTES)
    except OSError as error:
        return f"cannot be read ({(error.strerror or str(error)).lower()})"
    except TraceFormatError as error:
        return str(error).removeprefix(f"{path}: ")
    data_size = size - data_start
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(number) is int and 0 <= number <= data_size for number in offsets)
        ):
            return f"truncated or corrupt safetensors entry {name!r}"
    return None


def open_parameters(path: Path) -> Any:
    """The store file as a `SafetensorsFile` (validated header, memory-mapped; imports numpy); a
    `TraceFormatError` naming it."""
    from modeltrace.trace.tensors import SafetensorsFile

    return SafetensorsFile(path)
