"""`modeltrace trace vendored/modeling_resnet.py --recipe recipe_port.py`: transformers' ResNet, with timm's weights
moved by `convert.py` (the HF conversion script's `ModuleTransfer`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from convert import ModuleTransfer
from modeling_resnet import ResNetForImageClassification
from recipe_reference import LAYERS, build_reference
from transformers import ResNetConfig
from vision_common import pixel_values


def build_model() -> nn.Module:
    config = ResNetConfig(
        embedding_size=64, hidden_sizes=[16, 32, 64, 128], depths=list(LAYERS), layer_type="bottleneck", num_labels=10
    )
    model = ResNetForImageClassification(config).eval()
    with torch.no_grad():
        ModuleTransfer(src=build_reference(), dest=model)(pixel_values())
    return model


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    return {"pixel_values": pixel_values()}
