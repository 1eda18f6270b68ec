"""Weights between transformers' Llama / Mistral and the Meta layout (Meta's Llama `model.py`, Mistral's
one-file reference), with transformers' own conversion rule.

`permute` and the name table are those of transformers' `convert_llama_weights_to_hf.py` and
`convert_mistral_weights_to_hf.py` (the same rule: original -> HF, the rows of wq and wk reordered from
interleaved rotary pairs to halves). The corpus starts from the
transformers reference's weights, so the port needs the inverse: `unpermute`, checked against `permute` on
every tensor it converts (a converter that does not round-trip refuses to convert).
"""

from __future__ import annotations

import torch


def permute(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """transformers' `convert_llama_weights_to_hf.permute` (Meta's interleaved rows -> HF's halves)."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def unpermute(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """The inverse of `permute` (HF's halves -> Meta's interleaved rows)."""
    return w.view(n_heads, 2, dim1 // n_heads // 2, dim2).transpose(1, 2).reshape(dim1, dim2)


# Meta name -> transformers name, per layer (`{i}`), as convert_llama_weights_to_hf.py writes them
LAYER_NAMES = {
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
}
MODEL_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_to_meta(hf: dict[str, torch.Tensor], n_layers: int, n_heads: int, n_kv_heads: int) -> dict[str, torch.Tensor]:
    """A Meta-layout state dict from a transformers `LlamaForCausalLM` / `MistralForCausalLM` state dict."""
    meta = {name: hf[hf_name] for name, hf_name in MODEL_NAMES.items()}
    for i in range(n_layers):
        for name, hf_name in LAYER_NAMES.items():
            meta[name.format(i=i)] = hf[hf_name.format(i=i)]
        for name, heads in (
            (f"layers.{i}.attention.wq.weight", n_heads),
            (f"layers.{i}.attention.wk.weight", n_kv_heads),
        ):
            weight = meta[name]
            rows, columns = weight.shape
            meta[name] = unpermute(weight, heads, rows, columns)
            if not torch.equal(permute(meta[name], heads, rows, columns), weight):
                raise ValueError(f"{name}: unpermute does not invert the conversion script's permute")
    return meta
