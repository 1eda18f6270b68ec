"""`modeltrace trace vendored/resnet.py --recipe recipe_reference.py`: timm's ResNet (timm 1.0.31), a tiny ResNet-26
layout (bottleneck blocks, 1, 2, 1, 1 per stage, narrow), seeded; batch norms in eval with seeded running statistics."""

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
from resnet import Bottleneck, ResNet  # noqa: E402

# NOTE: 4 stages as in both libraries, one or two blocks each, narrow widths: the corpus stays fast
LAYERS = (1, 2, 1, 1)


def build_reference() -> nn.Module:
    torch.manual_seed(0)
    model = ResNet(block=Bottleneck, layers=LAYERS, num_classes=10, channels=(4, 8, 16, 32))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):  # running statistics as a trained model has them
                module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
                module.running_var.copy_(1.0 + torch.rand(module.num_features, generator=generator))
    return make_trained_like(model).eval()


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (pixel_values(),)
