"""`modeltrace trace gemma/model.py --recipe recipe_port.py`: Google's `gemma_pytorch` as published
(materialised from google/gemma_pytorch, see ports/corpus.py), with the reference's weights converted by the
inverse of transformers' `convert_gemma_weights_to_hf.py` (`gemma_convert`), run as its `generate` runs the
prefill: key/value caches as long as the prompt, the causal mask of `generate`, the last position's logits."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import prompt_ids
from gemma_convert import hf_to_gemma
from gemma_reference import DIM, FFN, HEAD_DIM, HEADS, KV_HEADS, LAYERS, NORM_EPS, VOCAB, build_reference
from gemma_shims import install

install()
from gemma import config as gemma_config  # noqa: E402 - the shims must be registered first
from gemma import model as gemma_model  # noqa: E402


def build_model() -> nn.Module:
    config = gemma_config.GemmaConfig(
        architecture=gemma_config.Architecture.GEMMA_1,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        hidden_size=DIM,
        intermediate_size=FFN,
        head_dim=HEAD_DIM,
        rms_norm_eps=NORM_EPS,
        dtype="float32",
        tokenizer=None,
    )
    port = gemma_model.GemmaForCausalLM(config)
    weights = hf_to_gemma(build_reference().state_dict(), HEADS, KV_HEADS, HEAD_DIM)
    port.load_state_dict(weights, strict=False)  # a port whose modules lack a weight keeps its own (a bug)
    return port.eval()


def build_inputs(model: nn.Module) -> dict[str, object]:
    """The prefill of `GemmaForCausalLM.generate` for the prompt, greedy (`temperatures=None`)."""
    ids = prompt_ids()
    length = ids.shape[1]
    size = (1, length, KV_HEADS, HEAD_DIM)
    positions = torch.arange(0, length, dtype=torch.int64)
    mask = torch.triu(torch.full((1, 1, length, length), -2.3819763e38).to(torch.float), diagonal=1)
    return {
        "input_token_ids": ids,
        "input_positions": positions,
        "kv_write_indices": None,
        "kv_caches": [(torch.zeros(size), torch.zeros(size)) for _ in range(LAYERS)],
        "mask": mask.index_select(2, positions),
        "output_positions": torch.LongTensor([length - 1]),
        "temperatures": None,
        "top_ps": torch.FloatTensor([1.0]),
        "top_ks": torch.LongTensor([1]),
    }
