"""GPT-2 in plain PyTorch, written from the paper and the released TensorFlow code, the way research
repositories write it (nanoGPT-style), not from transformers.

What differs from transformers' GPT-2 on purpose: `nn.Linear` layers (transformers' `Conv1D` stores weights
transposed, so the converter transposes them), one fused `qkv` projection, a causal-mask buffer instead of an
`attention_mask` argument (blocks and attention take only `x`), position embeddings looked up with `[T]` ids,
attention returning one tensor, and logits for the last position only (what sampling needs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    norm_eps: float = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        causal = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("causal", causal.view(1, 1, config.block_size, config.block_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = F.gelu(h, approximate="tanh")
        return self.proj(h)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.norm_eps)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied, as in the paper

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.head(x[:, [-1], :])  # inference: only the last position's logits are needed


# --- loading the released weights (from a transformers GPT-2 state dict) -------------------------------------

_RENAMES = (
    ("transformer.wte.", "tok_emb."),
    ("transformer.wpe.", "pos_emb."),
    ("transformer.h.", "blocks."),
    ("transformer.ln_f.", "ln_f."),
    (".attn.c_attn.", ".attn.qkv."),
    (".attn.c_proj.", ".attn.proj."),
    (".mlp.c_fc.", ".mlp.fc."),
    (".mlp.c_proj.", ".mlp.proj."),
)
# transformers' Conv1D keeps [in, out] weights; nn.Linear wants [out, in]
_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
_SKIPPED = (".attn.bias", ".attn.masked_bias", "lm_head.weight")  # old mask buffers; the head is tied


def load_hf_weights(model: GPT, hf_state: dict[str, torch.Tensor]) -> GPT:
    own = model.state_dict()
    with torch.no_grad():
        for hf_name, tensor in hf_state.items():
            if hf_name.endswith(_SKIPPED):
                continue
            name = hf_name
            for old, new in _RENAMES:
                name = name.replace(old, new)
            if hf_name.endswith(_CONV1D_WEIGHTS):
                tensor = tensor.t()
            own[name].copy_(tensor)
    return model
