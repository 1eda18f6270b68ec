"""`modeltrace trace vendored/open_clip/transformer.py --recipe recipe_reference.py`: open_clip's CLIP (open_clip_torch
3.3.0) in OpenAI's layout (quick GELU), tiny (2 layers per tower), seeded; an image and a prompt ending in EOT."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import PROMPT, make_trained_like
from vision_common import IMAGE_SIZE, importing_without, pixel_values

# NOTE: torchvision only: open_clip imports transformers, which must not take a stand-in PIL for the real one
with importing_without(("torchvision",)):
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg  # noqa: E402

VOCAB = 128
EOT = VOCAB - 1  # the largest id: open_clip pools at argmax(ids), transformers at the first EOS
CONTEXT = len(PROMPT) + 1
WIDTH, HEADS, LAYERS, EMBED = 32, 2, 2, 16
PATCH = 16


def build_reference() -> nn.Module:
    torch.manual_seed(0)
    model = CLIP(
        embed_dim=EMBED,
        vision_cfg=CLIPVisionCfg(
            layers=LAYERS, width=WIDTH, head_width=WIDTH // HEADS, patch_size=PATCH, image_size=IMAGE_SIZE
        ),
        text_cfg=CLIPTextCfg(context_length=CONTEXT, vocab_size=VOCAB, width=WIDTH, heads=HEADS, layers=LAYERS),
        quick_gelu=True,
    )
    return make_trained_like(model).eval()


def text_ids() -> torch.Tensor:
    return torch.tensor([[*PROMPT, EOT]], dtype=torch.long)


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return (pixel_values(), text_ids())
