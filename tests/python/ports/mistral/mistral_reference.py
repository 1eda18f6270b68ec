"""The reference of the Mistral pair: transformers' MistralForCausalLM, tiny, seeded, eager attention, no
sliding window (the one-file reference's window is its `max_seq_len`, longer than the prompt)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import MistralConfig, MistralForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like

DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 64, 3, 4, 2, 16, 160, 128
ROPE_THETA, NORM_EPS = 1000000.0, 1e-5


def build_reference() -> MistralForCausalLM:
    config = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=32,
        rms_norm_eps=NORM_EPS,
        rope_theta=ROPE_THETA,
        sliding_window=None,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return make_trained_like(MistralForCausalLM(config)).eval()
