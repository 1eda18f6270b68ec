"""The reference of the GPT-2 pair: transformers' GPT2LMHeadModel, tiny, seeded, eager attention."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like


def build_reference() -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=128,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=4,
        layer_norm_epsilon=1e-5,
        activation_function="gelu_new",
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return make_trained_like(GPT2LMHeadModel(config)).eval()
