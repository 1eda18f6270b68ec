"""The reference of the Llama pair: transformers' LlamaForCausalLM, tiny, seeded, eager attention, with
grouped-query attention (4 query heads, 2 key/value heads)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like


def build_reference() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return make_trained_like(LlamaForCausalLM(config)).eval()
