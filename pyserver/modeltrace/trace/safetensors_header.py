"""The header of a safetensors file, read and bounded without numpy.

Shared by the tensor reader (`trace/tensors.py`, which then maps the data) and the parameter store's check
(`trace/parameter_store.py`, which the language server runs on a trace it only shows, without numpy): the first
8 bytes give the header's size, bounded by the file and a limit, then the header is JSON holding one object. A
file is untrusted data: every fault is a `TraceFormatError` naming the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import IO, Any

from modeltrace.errors import TraceFormatError


def read_header(handle: IO[bytes], path: Path, size: int, limit: int) -> tuple[dict[str, Any], int]:
    """The header object of the safetensors file `path` (`size` bytes, open as `handle` at its start) and the
    offset where its data starts. The header may be at most `limit` bytes."""
    if size < 8:
        raise TraceFormatError(f"{path}: truncated safetensors file ({size} bytes)")
    (header_size,) = struct.unpack("<Q", handle.read(8))
    if header_size > min(limit, size - 8):
        raise TraceFormatError(
            f"{path}: corrupt or truncated safetensors file (header of {header_size} bytes in a file of {size})"
        )
    try:
        header = json.loads(handle.read(header_size))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceFormatError(f"{path}: corrupt safetensors header ({error})") from None
    except RecursionError:
        raise TraceFormatError(f"{path}: corrupt safetensors header (nested too deeply)") from None
    if not isinstance(header, dict):
        raise TraceFormatError(f"{path}: corrupt safetensors header (not a JSON object)")
    return header, 8 + header_size
