"""`modeltrace trace vendored/modeling_clip.py --recipe recipe_port.py`: transformers' CLIP, with open_clip's weights
copied by `convert.py` (the HF conversion script's `copy_*` functions)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from convert import convert
from modeling_clip import CLIPModel
from recipe_reference import CONTEXT, EMBED, EOT, HEADS, LAYERS, PATCH, VOCAB, WIDTH, build_reference, text_ids
from transformers import CLIPConfig
from vision_common import IMAGE_SIZE, pixel_values


def build_model() -> nn.Module:
    shared = {
        "hidden_size": WIDTH,
        "intermediate_size": 4 * WIDTH,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    }
    config = CLIPConfig(
        projection_dim=EMBED,
        text_config={
            **shared,
            "vocab_size": VOCAB,
            "max_position_embeddings": CONTEXT,
            "eos_token_id": EOT,
            "bos_token_id": 0,
            "pad_token_id": 0,
        },
        vision_config={**shared, "image_size": IMAGE_SIZE, "patch_size": PATCH},
    )
    with torch.no_grad():
        return convert(CLIPModel(config).eval(), build_reference())


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    return {"input_ids": text_ids(), "pixel_values": pixel_values()}
