"""`modeltrace trace vendored/swin_transformer.py --recipe recipe_reference.py`: timm's Swin Transformer (timm 1.0.31),
tiny (2 stages of 2 blocks, the second block of each shifted), seeded."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import make_trained_like
from vision_common import IMAGE_SIZE, import_timm, pixel_values

import_timm()
from swin_transformer import SwinTransformer  # noqa: E402

SETTINGS = {"patch_size": 4, "window_size": 4, "embed_dim": 16, "depths": (2, 2), "num_heads": (2, 4)}


def build_reference() -> nn.Module:
    torch.manual_seed(0)
    model = SwinTransformer(img_size=IMAGE_SIZE, num_classes=10, **SETTINGS)
    return make_trained_like(model).eval()


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (pixel_values(),)
