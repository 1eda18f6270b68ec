"""Import shims for Mistral's one-file reference (`one_file_ref.py`), for what its forward does not use.

- `fire`, `mistral_common` (the tokenizer) and `simple_parsing` (`Serializable`, which only adds
  `from_dict` to the args dataclass) are imported at the top of the file but unused by `forward`.
- `.cuda()` / `.to("cuda")` in `__init__` (the caches and the rotary table): `on_cpu()` keeps them on the CPU
  while the model is built.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch


class Serializable:
    """Stands in for `simple_parsing.helpers.Serializable` (a mixin of the args dataclass)."""


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def install() -> None:
    """Register the modules `one_file_ref.py` imports and does not use in `forward` (idempotent)."""
    if "simple_parsing.helpers" in sys.modules:
        return
    _module("fire", Fire=lambda *args, **kwargs: None)
    _module("mistral_common")
    _module("mistral_common.tokens")
    _module("mistral_common.tokens.tokenizers")
    _module("mistral_common.tokens.tokenizers.base", Tokenizer=object)
    _module("mistral_common.tokens.tokenizers.mistral", MistralTokenizer=object)
    _module("simple_parsing")
    _module("simple_parsing.helpers", Serializable=Serializable)


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """`Tensor.cuda()` and `Tensor.to("cuda")` leave the tensor where it is inside the block."""
    cuda, to = torch.Tensor.cuda, torch.Tensor.to

    def stay(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple(arg for arg in args if not (isinstance(arg, str) and arg.startswith("cuda")))
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs.pop("device")
        return to(self, *args, **kwargs) if args or kwargs else self

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.Tensor.to = stay  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.Tensor.to = cuda, to  # type: ignore[method-assign]
