"""The reference of the BERT pair: transformers' BertModel (encoder and pooler), tiny, seeded, eager attention."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like


def build_reference() -> BertModel:
    config = BertConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        hidden_act="gelu",
        pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return make_trained_like(BertModel(config)).eval()
