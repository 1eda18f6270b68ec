"""`modeltrace trace vendored/modeling_convnext.py --recipe recipe_port.py`: transformers' ConvNeXt, with timm's
weights converted by `convert.py` (the HF conversion script's renaming)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from convert import convert
from modeling_convnext import ConvNextForImageClassification
from recipe_reference import build_reference
from transformers import ConvNextConfig
from vision_common import pixel_values


def build_model() -> nn.Module:
    config = ConvNextConfig(
        hidden_sizes=[8, 16, 24, 32],
        depths=[1, 1, 2, 1],
        num_labels=10,
        layer_scale_init_value=1e-6,
        image_size=64,
        layer_norm_eps=1e-6,
    )
    model = ConvNextForImageClassification(config)
    model.load_state_dict(convert(build_reference().state_dict()))
    return model.eval()


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    return {"pixel_values": pixel_values()}
