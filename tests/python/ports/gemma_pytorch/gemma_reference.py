"""The reference of the gemma_pytorch pair: transformers' GemmaForCausalLM (Gemma 1), tiny, seeded, eager
attention, multi-query (4 query heads, 1 key/value head) as Gemma 2B."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import GemmaConfig, GemmaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like

DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, NORM_EPS = 64, 3, 4, 1, 16, 128, 128, 1e-6


def build_reference() -> GemmaForCausalLM:
    config = GemmaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=32,
        rms_norm_eps=NORM_EPS,
        rope_theta=10000.0,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return make_trained_like(GemmaForCausalLM(config)).eval()
