"""`modeltrace trace vendored/modeling_swin.py --recipe recipe_port.py`: transformers' Swin, with timm's weights
converted by `convert.py` (the HF conversion script, then transformers 5's checkpoint renamings)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from convert import convert
from modeling_swin import SwinForImageClassification
from recipe_reference import SETTINGS, build_reference
from transformers import SwinConfig
from vision_common import IMAGE_SIZE, pixel_values


def build_model() -> nn.Module:
    config = SwinConfig(
        image_size=IMAGE_SIZE,
        patch_size=SETTINGS["patch_size"],
        window_size=SETTINGS["window_size"],
        embed_dim=SETTINGS["embed_dim"],
        depths=list(SETTINGS["depths"]),
        num_heads=list(SETTINGS["num_heads"]),
        num_labels=10,
    )
    model = SwinForImageClassification(config)
    model.load_state_dict(convert(config, build_reference().state_dict()))
    return model.eval()


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    return {"pixel_values": pixel_values()}
