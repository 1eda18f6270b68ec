"""The EnCodec pair's weight conversion: facebookresearch/encodec's state dict -> transformers' `EncodecModel`.

transformers converts EnCodec checkpoints with `convert_encodec_checkpoint_to_pytorch.py` (staged from a snapshot
of a transformers fork, feisenyu/transformers_4573 at e9d73c3118, never committed): its `recursively_load_weights`
walks the original names through the 24 kHz mapping tables and `set_recursively` writes each tensor by attribute
(`hf_pointer.weight_g.data = value`). Those functions run here unchanged. What they write into is `_Recorder`, a
stand-in for the model that records each write under its state-dict name: today's `EncodecModel` keeps its weight
norm as a parametrization (`conv.parametrizations.weight.original0`), which has no `weight_g` attribute for the
script to assign, while `load_state_dict` still reads the `weight_g` / `weight_v` names (PyTorch's compatibility
hook for weight-norm checkpoints). The recorded names are loaded with `strict=True`: a weight the script did not
write fails the build.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vision_common import upstream_definitions

# transformers' own conversion code, staged from the corpus's mirror (see ports/sources.py), unchanged
_UPSTREAM = upstream_definitions(
    Path(__file__).resolve().parent / "upstream" / "convert_encodec_checkpoint_to_pytorch.py",
    (
        "MAPPING_QUANTIZER",
        "MAPPING_ENCODER",
        "MAPPING_ENCODER_48K",
        "MAPPING_DECODER",
        "MAPPING_DECODER_48K",
        "MAPPING_24K",
        "MAPPING_48K",
        "IGNORE_KEYS",
        "set_recursively",
        "should_ignore",
        "recursively_load_weights",
    ),
)
recursively_load_weights = _UPSTREAM["recursively_load_weights"]
# the script's module-level logger (`transformers_4573.logging`, a package not installed here): the standard one
recursively_load_weights.__globals__["logger"] = logging.getLogger("convert_encodec_checkpoint_to_pytorch")

# the parametrized weight norm's names, and the names `set_recursively` (and old checkpoints) use for them
_WEIGHT_NORM_NAMES = {"parametrizations.weight.original0": "weight_g", "parametrizations.weight.original1": "weight_v"}


class _Slot:
    """A tensor `set_recursively` reads the shape of and assigns (`pointer.data = value`): the value is recorded."""

    def __init__(self, recorded: dict[str, torch.Tensor], key: str, shape: torch.Size) -> None:
        self._recorded, self._key, self.shape = recorded, key, shape

    @property
    def data(self) -> torch.Tensor:
        return self._recorded[self._key]

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        self._recorded[self._key] = value


class _Recorder:
    """The model as `set_recursively` walks it (`getattr` per dotted part): a submodule is a recorder, a tensor of
    the state dict (under its weight-norm name) a `_Slot`."""

    def __init__(self, module: nn.Module, prefix: str, shapes: dict[str, torch.Size], recorded: dict) -> None:
        self._module, self._prefix, self._shapes, self._recorded = module, prefix, shapes, recorded

    def __getattr__(self, name: str) -> Any:
        key = self._prefix + name
        if key in self._shapes:
            return _Slot(self._recorded, key, self._shapes[key])
        child = getattr(self._module, name)
        if not isinstance(child, nn.Module):
            raise AttributeError(f"{type(self._module).__name__} has no tensor {key!r} in its state dict")
        return _Recorder(child, key + ".", self._shapes, self._recorded)


def _checkpoint_name(key: str) -> str:
    for parametrized, plain in _WEIGHT_NORM_NAMES.items():
        key = key.replace(parametrized, plain)
    return key


def convert(original_state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of `model` (transformers' EnCodec) as the conversion script writes it from the original's."""
    shapes = {_checkpoint_name(key): value.shape for key, value in model.state_dict().items()}
    recorded: dict[str, torch.Tensor] = {}
    recursively_load_weights(original_state, _Recorder(model, "", shapes, recorded), "encodec_24khz")
    return recorded
