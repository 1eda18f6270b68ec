"""Frames between the worker client and the worker: a 4-byte big-endian length, then one msgpack map.

Used on both sides of the pipes (no torch here). Every frame is a map with a `type`; which types there are, and
what each holds, is `worker/messages.py` (the frozen dataclasses both sides share, and the one place a frame is
checked). This module only moves the bytes, and holds the size limits the messages' defaults use.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import msgpack


MAX_FRAME_BYTES = 64 * 1024 * 1024
# Full tensors kept by one trace (`--max-tensor-mb`, `--max-trace-mb`, modelTrace.maxTensorMB/maxTraceMB): a
# tensor over the first, or one that would take the trace's total over the second, keeps its statistics only.
# NOTE: sized so that a 1B model at sequence 256 is stored whole, weights included (Llama-3.2-1B in float32:
# 4.7 GB of weights, a 1002 MB embedding, about 1 GB of activations).
DEFAULT_MAX_TENSOR_MB = 1024.0
DEFAULT_MAX_TRACE_MB = 8192.0
# Full tensors held in memory while the trace's writer catches up (`--tensor-memory-mb`,
# modelTrace.tensorMemoryMB): past it, the forward waits for the writer (`worker/tensor_stream.py`).
DEFAULT_TENSOR_MEMORY_MB = 1024.0
# A trace request with `keep_for_replay` (the editor's, when the document has a reference and replay is on)
# leaves its child alive after answering, holding the model and the arguments of its calls (up to
# `keep_calls_mb` of tensors), so that the diff's replay re-runs suspect modules without rebuilding the model or
# running a forward. The child ends with the next trace request, on shutdown, or after this long unused.
DEFAULT_KEEP_CALLS_MB = 1024.0
KEEP_FOR_REPLAY_SECONDS = 600.0
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The other side sent something that is not a frame (or closed the pipe mid-frame)."""


def encode_frame(message: dict[str, Any]) -> bytes:
    payload = msgpack.packb(message, use_bin_type=True)
    return _HEADER.pack(len(payload)) + payload


def write_frame(fd: int, message: dict[str, Any]) -> None:
    data = encode_frame(message)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks = []
    remaining = size
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            if remaining == size:
                return None
            raise ProtocolError(f"pipe closed after {size - remaining} of {size} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    """The next frame from `fd`, or None at a clean end of stream."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    payload = _read_exactly(fd, size)
    if payload is None:
        raise ProtocolError("pipe closed before the frame's payload")
    try:
        message = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise ProtocolError(f"undecodable frame: {error}") from None
    if not isinstance(message, dict) or "type" not in message:
        raise ProtocolError("frame is not a message (a map with a 'type')")
    return message
