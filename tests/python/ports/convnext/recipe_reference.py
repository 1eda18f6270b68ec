"""`modeltrace trace vendored/convnext.py --recipe recipe_reference.py`: timm's ConvNeXt (timm 1.0.31), tiny, seeded."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import make_trained_like
from vision_common import import_timm, pixel_values

import_timm()
from convnext import ConvNeXt  # noqa: E402


def build_reference() -> nn.Module:
    torch.manual_seed(0)
    model = ConvNeXt(depths=(1, 1, 2, 1), dims=(8, 16, 24, 32), num_classes=10, ls_init_value=1e-6)
    return make_trained_like(model).eval()


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (pixel_values(),)
