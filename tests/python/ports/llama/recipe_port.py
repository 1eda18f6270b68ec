"""`modeltrace trace llama_port.py --recipe recipe_port.py`: the port, with the reference's weights copied in."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import prompt_ids
from llama_port import ModelArgs, Transformer, load_hf_weights
from llama_reference import build_reference


def build_model() -> nn.Module:
    reference = build_reference()
    hf = reference.config
    args = ModelArgs(
        dim=hf.hidden_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads,
        vocab_size=hf.vocab_size,
        ffn_dim=hf.intermediate_size,
        norm_eps=hf.rms_norm_eps,
        rope_theta=hf.rope_parameters["rope_theta"],
    )
    return load_hf_weights(Transformer(args), reference.state_dict()).eval()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (prompt_ids(),)
