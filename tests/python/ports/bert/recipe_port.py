"""`modeltrace trace bert_port.py --recipe recipe_port.py`: the port, with the reference's weights copied in."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_port import Bert, BertArgs, load_hf_weights
from bert_reference import build_reference
from corpus_common import prompt_ids


def build_model() -> nn.Module:
    reference = build_reference()
    hf = reference.config
    args = BertArgs(
        vocab_size=hf.vocab_size,
        dim=hf.hidden_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        ffn_dim=hf.intermediate_size,
        max_len=hf.max_position_embeddings,
        n_segments=hf.type_vocab_size,
        norm_eps=hf.layer_norm_eps,
    )
    return load_hf_weights(Bert(args), reference.state_dict()).eval()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (prompt_ids(),)
