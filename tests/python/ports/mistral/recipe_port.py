"""`modeltrace trace one_file_ref.py --recipe recipe_port.py`: Mistral's one-file reference as published
(materialised from mistralai/mistral-inference, see ports/corpus.py), with the reference's weights converted
by transformers' rule (`meta_convert`: Mistral's checkpoint layout is Meta's)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import prompt_ids
from meta_convert import hf_to_meta
from mistral_reference import DIM, FFN, HEAD_DIM, HEADS, KV_HEADS, LAYERS, NORM_EPS, ROPE_THETA, VOCAB, build_reference
from mistral_shims import install, on_cpu

install()
import one_file_ref as mistral  # noqa: E402 - the shims must be registered first

MAX_SEQ_LEN = 16


def build_model() -> nn.Module:
    args = mistral.TransformerArgs(
        dim=DIM,
        n_layers=LAYERS,
        head_dim=HEAD_DIM,
        hidden_dim=FFN,
        n_heads=HEADS,
        n_kv_heads=KV_HEADS,
        norm_eps=NORM_EPS,
        vocab_size=VOCAB,
        rope_theta=ROPE_THETA,
        max_seq_len=MAX_SEQ_LEN,
        max_batch_size=1,
    )
    with on_cpu():
        port = mistral.Transformer(args)
    # NOTE: the caches are built float16 (for a float16 model on a GPU); a prefill writes them and never reads
    # them, so on this float32 CPU model they are rebuilt in float32 for the writes to type-check.
    for layer in port.layers:
        shape = (1, MAX_SEQ_LEN, KV_HEADS, HEAD_DIM)
        layer.attention.cache_k, layer.attention.cache_v = torch.zeros(shape), torch.zeros(shape)
    weights = hf_to_meta(build_reference().state_dict(), LAYERS, HEADS, KV_HEADS)
    port.load_state_dict(weights, strict=False)  # a port whose modules lack a weight keeps its own (a bug)
    return port.eval()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    ids = prompt_ids()
    return (ids, torch.arange(ids.shape[1]))
