"""The ConvNeXt pair's weight conversion: timm's ConvNeXt state dict -> transformers' `ConvNextForImageClassification`.

transformers converts ConvNeXt checkpoints with `convert_convnext_to_pytorch.py` (`rename_key` below, staged from
a snapshot of a transformers fork, feisenyu/transformers_4573 at e9d73c3118), which reads the original facebookresearch/ConvNeXt names (`downsample_layers.N.M`,
`stages.N.M.dwconv`, `pwconv1`, `head`). timm reads those same checkpoints through its `checkpoint_filter_fn`
(FB -> timm); `timm_to_fb` undoes that renaming, so that the HF script's own `rename_key` does the conversion.
"""

from __future__ import annotations

from pathlib import Path

import re

import torch
from vision_common import upstream_definitions


def timm_to_fb(name: str) -> str:
    """The facebookresearch/ConvNeXt name of a timm ConvNeXt parameter (timm's `checkpoint_filter_fn` reversed)."""
    name = re.sub(r"^stem\.", "downsample_layers.0.", name)
    name = re.sub(r"stages\.([0-9]+)\.downsample\.([0-9]+)", r"downsample_layers.\1.\2", name)
    name = re.sub(r"stages\.([0-9]+)\.blocks\.([0-9]+)", r"stages.\1.\2", name)
    name = name.replace("conv_dw", "dwconv").replace("mlp.fc", "pwconv")
    if name.startswith("head.norm."):
        return name.replace("head.norm.", "norm.")
    return name.replace("head.fc.", "head.")


# transformers' own conversion code, staged from the corpus's mirror (never committed; see ports/sources.py):
# rename_key from models/convnext/convert_convnext_to_pytorch.py, unchanged
_UPSTREAM = upstream_definitions(
    Path(__file__).resolve().parent / "upstream" / "convert_convnext_to_pytorch.py", ("rename_key",)
)
rename_key = _UPSTREAM["rename_key"]


def convert(timm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF state dict, as `convert_convnext_checkpoint` builds it (rename, then the `convnext.` prefix)."""
    state = {}
    for key, value in timm_state.items():
        key = rename_key(timm_to_fb(key))
        if not key.startswith("classifier"):
            key = "convnext." + key
        state[key] = value
    return state
