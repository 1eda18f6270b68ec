"""BERT encoder in plain PyTorch, written from the paper the way a from-scratch research repository writes it.

What differs from transformers' BERT on purpose: other names (`embed.tok/pos/seg`, `layers.N.attn.q/k/v`,
`attn_out`, `norm1`, `ffn.fc1/fc2`, `norm2`, `pool`), post-LN residuals written in the layer's forward (no
`SelfOutput` / `Intermediate` / `Output` modules), attention that takes only `x` (no mask: one unpadded
sequence) and returns one tensor, position embeddings looked up with `[T]` ids, and a tuple
`(sequence, pooled)` for an output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class BertArgs:
    vocab_size: int = 30522
    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    ffn_dim: int = 3072
    max_len: int = 512
    n_segments: int = 2
    norm_eps: float = 1e-12


class Embeddings(nn.Module):
    def __init__(self, cfg: BertArgs) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        self.seg = nn.Embedding(cfg.n_segments, cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.size(1), device=ids.device)
        segments = torch.zeros_like(ids)  # a single segment
        return self.norm(self.tok(ids) + self.pos(positions) + self.seg(segments))


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertArgs) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.k = nn.Linear(cfg.dim, cfg.dim)
        self.v = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        probs = scores.softmax(dim=-1)
        context = probs @ v
        return context.transpose(1, 2).reshape(b, t, d)


class FeedForward(nn.Module):
    def __init__(self, cfg: BertArgs) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.ffn_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: BertArgs) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_out = nn.Linear(cfg.dim, cfg.dim)
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.ffn = FeedForward(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn_out(self.attn(x)))
        x = self.norm2(x + self.ffn(x))
        return x


class Bert(nn.Module):
    def __init__(self, cfg: BertArgs) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.n_layers)])
        self.pool = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        pooled = torch.tanh(self.pool(x[:, 0]))
        return x, pooled


# --- loading weights from a transformers BertModel state dict ------------------------------------------------

_LAYER_NAMES = (
    ("attention.self.query", "attn.q"),
    ("attention.self.key", "attn.k"),
    ("attention.self.value", "attn.v"),
    ("attention.output.dense", "attn_out"),
    ("attention.output.LayerNorm", "norm1"),
    ("intermediate.dense", "ffn.fc1"),
    ("output.dense", "ffn.fc2"),
    ("output.LayerNorm", "norm2"),
)


def hf_names(n_layers: int) -> dict[str, str]:
    """transformers' parameter names -> ours."""
    names = {
        "embeddings.word_embeddings.weight": "embed.tok.weight",
        "embeddings.position_embeddings.weight": "embed.pos.weight",
        "embeddings.token_type_embeddings.weight": "embed.seg.weight",
        "embeddings.LayerNorm.weight": "embed.norm.weight",
        "embeddings.LayerNorm.bias": "embed.norm.bias",
        "pooler.dense.weight": "pool.weight",
        "pooler.dense.bias": "pool.bias",
    }
    for i in range(n_layers):
        for theirs, ours in _LAYER_NAMES:
            for kind in ("weight", "bias"):
                names[f"encoder.layer.{i}.{theirs}.{kind}"] = f"layers.{i}.{ours}.{kind}"
    return names


def load_hf_weights(model: Bert, sd: dict[str, torch.Tensor]) -> Bert:
    own = model.state_dict()
    with torch.no_grad():
        for theirs, ours in hf_names(model.cfg.n_layers).items():
            own[ours].copy_(sd[theirs])
    return model
