"""What the shape-only strategy (and a plain module built shape-only) shares: dtypes by name, inputs on meta."""

from __future__ import annotations

from typing import Any

import torch

from modeltrace.errors import ModelTraceError
from modeltrace.worker.messages import DTYPE_NAMES

# NOTE: the names are the messages' (`DTYPE_NAMES`, torch-free, what the CLI and the editor accept)
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `--dtype` name; `ModelTraceError` naming the choices for any other name."""
    dtype = TORCH_DTYPES.get(name)
    if dtype is None:
        raise ModelTraceError(f"--dtype {name!r}: choose one of {', '.join(TORCH_DTYPES)}")
    return dtype


def meta_inputs(mode: Any, value: Any, dtype: torch.dtype) -> Any:
    """Synthesised inputs on the meta device (with their values as shadows), floating ones in `dtype`."""
    from torch.utils import _pytree as pytree

    from modeltrace.worker.shape_only import to_meta_inputs

    def cast(item: Any) -> Any:
        return item.to(dtype) if isinstance(item, torch.Tensor) and item.is_floating_point() else item

    return to_meta_inputs(mode, pytree.tree_map(cast, value))
