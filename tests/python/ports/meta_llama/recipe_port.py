"""`modeltrace trace model.py --recipe recipe_port.py`: Meta's Llama 2 `model.py` as published (materialised
from meta-llama/llama, see ports/corpus.py), with the reference's weights converted by `meta_llama_convert`."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import prompt_ids
from meta_convert import hf_to_meta
from meta_llama_reference import DIM, HEADS, KV_HEADS, LAYERS, MULTIPLE_OF, VOCAB, build_reference
from meta_llama_shims import install_fairscale, on_cpu

install_fairscale()
import model as meta  # noqa: E402 - the fairscale shim must be registered first


def build_model() -> nn.Module:
    args = meta.ModelArgs(
        dim=DIM,
        n_layers=LAYERS,
        n_heads=HEADS,
        n_kv_heads=KV_HEADS,
        vocab_size=VOCAB,
        multiple_of=MULTIPLE_OF,
        norm_eps=1e-5,
        max_batch_size=1,
        max_seq_len=16,
    )
    with on_cpu():
        port = meta.Transformer(args)
    weights = hf_to_meta(build_reference().state_dict(), LAYERS, HEADS, KV_HEADS)
    port.load_state_dict(weights, strict=False)  # a port whose modules lack a weight keeps its own (a bug)
    return port.eval()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor, int]:
    return (prompt_ids(), 0)
