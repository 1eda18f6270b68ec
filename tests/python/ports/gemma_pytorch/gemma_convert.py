"""Weights between transformers' Gemma and `gemma_pytorch`, with transformers' own conversion rule.

transformers' `convert_gemma_weights_to_hf.py` (gemma_pytorch -> HF) splits each fused `qkv_proj` into
`q_proj`, `k_proj`, `v_proj` (rows: queries, then keys, then values), writes `embedder.weight` as
`model.embed_tokens.weight` (and the tied `lm_head.weight`), and keeps every other name. `hf_to_gemma` is its
inverse, checked against `split_qkv` (the script's split) on every fused weight it builds.
"""

from __future__ import annotations

import torch


def split_qkv(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """The conversion script's split of a fused `qkv_proj` weight into q, k, v."""
    return torch.split(qkv, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=0)


def hf_to_gemma(hf: dict[str, torch.Tensor], heads: int, kv_heads: int, head_dim: int) -> dict[str, torch.Tensor]:
    """A `gemma_pytorch` state dict from a transformers `GemmaForCausalLM` state dict."""
    converted: dict[str, torch.Tensor] = {"embedder.weight": hf["model.embed_tokens.weight"]}
    for name, value in hf.items():
        if (
            name in ("model.embed_tokens.weight", "lm_head.weight")
            or ".self_attn.k_proj." in name
            or (".self_attn.v_proj." in name)
        ):
            continue
        if ".self_attn.q_proj." in name:
            parts = [hf[name.replace("q_proj", projection)] for projection in ("q_proj", "k_proj", "v_proj")]
            fused = torch.cat(parts, dim=0)
            if not all(torch.equal(a, b) for a, b in zip(split_qkv(fused, heads, kv_heads, head_dim), parts)):
                raise ValueError(f"{name}: the fused weight does not split back as the conversion script splits it")
            converted[name.replace("q_proj", "qkv_proj")] = fused
            continue
        converted[name] = value
    return converted
