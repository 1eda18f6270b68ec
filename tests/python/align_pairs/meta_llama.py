"""A Llama written the way research code is (names in the style of Meta's reference implementation, none of them
shared with transformers': `blocks`, `final_norm`), to align with transformers' `LlamaModel` by evidence, not names.

Options make the variants the alignment tests need: `fused` (one `wqkv` and one `w13` projection instead of
`wq/wk/wv` and `w1/w3`), `wrapped` (the blocks two levels deeper, inside a called `Trunk` wrapper, beside a
`ModuleDict` that is never called), `attention_block` (the blocks' class is `XAttentionBlock`, a name holding two
words of the class-name vocabulary, as some codebases name their layers). `copy_from_transformers` copies a `LlamaModel`'s weights in.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, fused: bool) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.fused = fused
        kv_dim = n_kv_heads * self.head_dim
        if fused:
            self.wqkv = nn.Linear(dim, dim + 2 * kv_dim, bias=False)
        else:
            self.wq = nn.Linear(dim, dim, bias=False)
            self.wk = nn.Linear(dim, kv_dim, bias=False)
            self.wv = nn.Linear(dim, kv_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, dim = x.shape
        kv_dim = self.n_kv_heads * self.head_dim
        if self.fused:
            xq, xk, xv = self.wqkv(x).split([dim, kv_dim, kv_dim], dim=-1)
        else:
            xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        xq, xk = rotate(xq, cos, sin), rotate(xk, cos, sin)
        repeats = self.n_heads // self.n_kv_heads
        xk, xv = xk.repeat_interleave(repeats, dim=1), xv.repeat_interleave(repeats, dim=1)
        scores = xq @ xk.transpose(2, 3) / math.sqrt(self.head_dim)
        causal = torch.full((seqlen, seqlen), float("-inf")).triu(1)
        probs = F.softmax((scores + causal).float(), dim=-1).type_as(xq)
        out = (probs @ xv).transpose(1, 2).reshape(bsz, seqlen, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, fused: bool) -> None:
        super().__init__()
        self.fused, self.hidden_dim = fused, hidden_dim
        if fused:
            self.w13 = nn.Linear(dim, 2 * hidden_dim, bias=False)
        else:
            self.w1 = nn.Linear(dim, hidden_dim, bias=False)
            self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.w13(x).chunk(2, dim=-1)
            return self.w2(F.silu(gate) * up)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden_dim: int, eps: float, fused: bool) -> None:
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads, fused)
        self.feed_forward = FeedForward(dim, hidden_dim, fused)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class XAttentionBlock(TransformerBlock):
    """The same layer under a class name that also says "Attention" (the last word, Block, decides its kind)."""


class Trunk(nn.Module):
    """The blocks one level down (a wrapper some codebases have), called as one module."""

    def __init__(self, blocks: list[TransformerBlock]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, cos, sin)
        return x


class Transformer(nn.Module):
    def __init__(
        self,
        vocab_size: int = 128,
        dim: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        n_kv_heads: int = 2,
        hidden_dim: int = 128,
        eps: float = 1e-6,
        theta: float = 10000.0,
        fused: bool = False,
        wrapped: bool = False,
        block_class: type[TransformerBlock] = TransformerBlock,
    ) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        blocks = [block_class(dim, n_heads, n_kv_heads, hidden_dim, eps, fused) for _ in range(n_layers)]
        self.wrapped = wrapped
        if wrapped:
            self.body = nn.ModuleDict({"trunk": Trunk(blocks), "unused_heads": nn.ModuleDict()})
        else:
            self.blocks = nn.ModuleList(blocks)
        self.final_norm = RMSNorm(dim, eps)
        head_dim = dim // n_heads
        self.register_buffer(
            "inv_freq", 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        angles = torch.outer(torch.arange(tokens.shape[1]).float(), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos()[None, None], angles.sin()[None, None]
        if self.wrapped:
            h = self.body["trunk"](h, cos, sin)
        else:
            for layer in self.blocks:
                h = layer(h, cos, sin)
        return self.final_norm(h)


def copy_from_transformers(port: Transformer, reference: nn.Module) -> None:
    """Copy a transformers `LlamaModel`'s weights into `port` (concatenated where the port fuses)."""
    with torch.no_grad():
        port.tok_embeddings.weight.copy_(reference.embed_tokens.weight)
        port.final_norm.weight.copy_(reference.norm.weight)
        blocks = port.body["trunk"].blocks if port.wrapped else port.blocks
        for block, layer in zip(blocks, reference.layers, strict=True):
            attention, mlp = layer.self_attn, layer.mlp
            block.attention_norm.weight.copy_(layer.input_layernorm.weight)
            block.ffn_norm.weight.copy_(layer.post_attention_layernorm.weight)
            block.attention.wo.weight.copy_(attention.o_proj.weight)
            block.feed_forward.w2.weight.copy_(mlp.down_proj.weight)
            if block.attention.fused:
                block.attention.wqkv.weight.copy_(
                    torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
                )
                block.feed_forward.w13.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            else:
                block.attention.wq.weight.copy_(attention.q_proj.weight)
                block.attention.wk.weight.copy_(attention.k_proj.weight)
                block.attention.wv.weight.copy_(attention.v_proj.weight)
                block.feed_forward.w1.weight.copy_(mlp.gate_proj.weight)
                block.feed_forward.w3.weight.copy_(mlp.up_proj.weight)


def reference_model(seed: int = 0) -> nn.Module:
    """transformers' LlamaModel at the port's size, random weights from `seed`."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return LlamaModel(config).eval()


TOKENS = [[1, 17, 42, 99, 5, 63, 120]]


def port_model(variant: str) -> Transformer:
    """The port for one alignment pair: "renamed", "fused", "wrapped" or "attention_block" with the reference's
    weights copied in, or "random" (its own random weights: only structure, signatures and values' scale can align
    it)."""
    torch.manual_seed(1)
    block_class = XAttentionBlock if variant == "attention_block" else TransformerBlock
    port = Transformer(fused=variant == "fused", wrapped=variant == "wrapped", block_class=block_class).eval()
    if variant != "random":
        copy_from_transformers(port, reference_model(seed=0))
    return port
