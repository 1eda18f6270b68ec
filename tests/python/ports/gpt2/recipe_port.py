"""`modeltrace trace gpt2_port.py --recipe recipe_port.py`: the port, with the reference's weights copied in."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import prompt_ids
from gpt2_port import GPT, GPTConfig, load_hf_weights
from gpt2_reference import build_reference


def build_model() -> nn.Module:
    reference = build_reference()
    hf = reference.config
    config = GPTConfig(
        block_size=hf.n_positions,
        vocab_size=hf.vocab_size,
        n_layer=hf.n_layer,
        n_head=hf.n_head,
        n_embd=hf.n_embd,
        norm_eps=hf.layer_norm_epsilon,
    )
    return load_hf_weights(GPT(config), reference.state_dict()).eval()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (prompt_ids(),)
