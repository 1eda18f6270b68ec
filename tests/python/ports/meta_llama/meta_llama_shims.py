"""Import shims for Meta's Llama 2 reference `model.py`, for what its forward on one CPU process does not use.

- `fairscale` (model parallelism): with one process the parallel layers are plain `nn.Linear` / `nn.Embedding`
  and the world size is 1; the shims take (and ignore) the parallel-only arguments.
- `.cuda()` on the key/value caches built in `Attention.__init__`: `on_cpu()` makes it the identity while the
  model is built (the caches stay on the CPU, where the rest of the model is).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class ColumnParallelLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, **parallel_only: Any) -> None:
        super().__init__(in_features, out_features, bias=bias)


class RowParallelLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, **parallel_only: Any) -> None:
        super().__init__(in_features, out_features, bias=bias)


class ParallelEmbedding(nn.Embedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, **parallel_only: Any) -> None:
        super().__init__(num_embeddings, embedding_dim)


def install_fairscale() -> None:
    """Register the `fairscale` modules `model.py` imports (idempotent)."""
    if "fairscale.nn.model_parallel.layers" in sys.modules:
        return
    names = ("fairscale", "fairscale.nn", "fairscale.nn.model_parallel")
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    initialize = types.ModuleType("fairscale.nn.model_parallel.initialize")
    initialize.get_model_parallel_world_size = lambda: 1  # type: ignore[attr-defined]
    layers = types.ModuleType("fairscale.nn.model_parallel.layers")
    layers.ColumnParallelLinear = ColumnParallelLinear  # type: ignore[attr-defined]
    layers.RowParallelLinear = RowParallelLinear  # type: ignore[attr-defined]
    layers.ParallelEmbedding = ParallelEmbedding  # type: ignore[attr-defined]
    sys.modules[initialize.__name__] = initialize
    sys.modules[layers.__name__] = layers
    sys.modules["fairscale"].nn = sys.modules["fairscale.nn"]  # type: ignore[attr-defined]
    sys.modules["fairscale.nn"].model_parallel = sys.modules["fairscale.nn.model_parallel"]  # type: ignore[attr-defined]
    sys.modules["fairscale.nn.model_parallel"].initialize = initialize  # type: ignore[attr-defined]
    sys.modules["fairscale.nn.model_parallel"].layers = layers  # type: ignore[attr-defined]


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """`Tensor.cuda()` is the identity inside the block (the caches the constructors move to the GPU)."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]
