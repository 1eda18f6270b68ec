"""Import shims for Google's `gemma_pytorch` (`gemma/model.py`), for what its forward does not use.

- `gemma.tokenizer` (sentencepiece): `GemmaForCausalLM.__init__` loads a tokenizer file that `forward` never
  reads; the shim's `Tokenizer` takes the path and does nothing.
- `gemma.siglip_vision.preprocessor` (PIL, numpy), imported by the vision config that `gemma/config.py`
  imports: a text model never preprocesses an image.
"""

from __future__ import annotations

import sys
import types


class Tokenizer:
    """Stands in for `gemma.tokenizer.Tokenizer` (sentencepiece), unused by `forward`."""

    def __init__(self, model_path: str | None) -> None:
        self.model_path = model_path


def install() -> None:
    """Register the two stand-ins before `gemma.model` is imported (idempotent)."""
    if "gemma.tokenizer" in sys.modules:
        return
    tokenizer = types.ModuleType("gemma.tokenizer")
    tokenizer.Tokenizer = Tokenizer  # type: ignore[attr-defined]
    sys.modules["gemma.tokenizer"] = tokenizer
    preprocessor = types.ModuleType("gemma.siglip_vision.preprocessor")
    preprocessor.DEFAULT_IMAGE_SIZE = 896  # type: ignore[attr-defined] # the one name the vision config reads
    sys.modules["gemma.siglip_vision.preprocessor"] = preprocessor
