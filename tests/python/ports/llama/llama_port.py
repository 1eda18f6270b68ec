"""Llama in plain PyTorch, in the style of the original research release (`llama/model.py`), not transformers.

What differs from transformers' Llama on purpose: the original's names (`tok_embeddings`, `attention.wq`,
`feed_forward.w1/w2/w3`, `attention_norm`, `ffn_norm`, `output`); rotary embeddings as complex numbers on
interleaved pairs (transformers rotates halves, so the converter permutes the rows of wq and wk); the causal
mask built inside the attention, which takes only `x` (no mask, no position ids, no cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    vocab_size: int = 32000
    ffn_dim: int = 11008
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torch.repeat_interleave(x, dim=2, repeats=n_rep)"""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    expanded = x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim)
    return expanded.reshape(bs, slen, n_kv_heads * n_rep, head_dim)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.rope_theta = args.rope_theta
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)

        freqs_cis = precompute_freqs_cis(self.head_dim, seqlen, self.rope_theta).to(x.device)
        freqs_cis = freqs_cis.view(1, seqlen, 1, self.head_dim // 2)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        xq = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(x)
        xk = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(x)

        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu(1)
        scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs) -> None:
        super().__init__()
        self.params = params
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList([TransformerBlock(layer_id, params) for layer_id in range(params.n_layers)])
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        return self.output(h).float()


# --- loading weights from a transformers Llama state dict -----------------------------------------------------


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' q/k rows rotate halves of each head; ours rotate interleaved pairs."""
    dim1, dim2 = w.shape
    return w.view(n_heads, 2, dim1 // n_heads // 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def load_hf_weights(model: Transformer, sd: dict[str, torch.Tensor]) -> Transformer:
    args = model.params
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(sd["model.embed_tokens.weight"])
        model.norm.weight.copy_(sd["model.norm.weight"])
        model.output.weight.copy_(sd["lm_head.weight"])
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            layer.attention.wq.weight.copy_(_unpermute(sd[p + "self_attn.q_proj.weight"], args.n_heads))
            layer.attention.wk.weight.copy_(_unpermute(sd[p + "self_attn.k_proj.weight"], args.n_kv_heads))
            layer.attention.wv.weight.copy_(sd[p + "self_attn.v_proj.weight"])
            layer.attention.wo.weight.copy_(sd[p + "self_attn.o_proj.weight"])
            layer.feed_forward.w1.weight.copy_(sd[p + "mlp.gate_proj.weight"])
            layer.feed_forward.w2.weight.copy_(sd[p + "mlp.down_proj.weight"])
            layer.feed_forward.w3.weight.copy_(sd[p + "mlp.up_proj.weight"])
            layer.attention_norm.weight.copy_(sd[p + "input_layernorm.weight"])
            layer.ffn_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
    return model
