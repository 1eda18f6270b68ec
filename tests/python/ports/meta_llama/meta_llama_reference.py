"""The reference of the Meta Llama pair: transformers' LlamaForCausalLM, tiny, seeded, eager attention, shaped
as Meta's `model.py` builds it (FFN width from `multiple_of`, Llama 2's rms eps 1e-5, rotary base 10000)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, MULTIPLE_OF = 64, 3, 4, 2, 128, 32
# Meta's FeedForward: int(2 * 4 * dim / 3) rounded up to a multiple of `multiple_of`
FFN = MULTIPLE_OF * ((int(2 * 4 * DIM / 3) + MULTIPLE_OF - 1) // MULTIPLE_OF)


def build_reference() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=32,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return make_trained_like(LlamaForCausalLM(config)).eval()
