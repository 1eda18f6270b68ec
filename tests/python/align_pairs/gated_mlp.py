"""Two tiny gated-MLP language models for the alignment's evidence tests: a reference with transformers' names
(`gate_proj`, `up_proj`, `down_proj`) and a port with Meta's (`w1`, `w3`, `w2`), its weights copied by
`port_model`, into which one porting bug at a time is injected (tests/python/test_weight_pairing.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HIDDEN, LAYERS = 32, 8, 16, 2
TOKENS = [[3, 1, 4, 1, 5, 9, 2]]


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.up_proj = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, WIDTH, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(hidden_states)) * self.up_proj(hidden_states))


class ReferenceLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = GatedMLP()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.mlp(hidden_states)


class ReferenceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(ReferenceLayer() for _ in range(LAYERS))
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.lm_head(hidden_states)


class FeedForward(nn.Module):
    def __init__(self, silu_on_w3: bool) -> None:
        super().__init__()
        self.w1 = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, WIDTH, bias=False)
        self.w3 = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.silu_on_w3 = silu_on_w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.silu_on_w3:
            return self.w2(F.silu(self.w3(x)) * self.w1(x))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class PortBlock(nn.Module):
    def __init__(self, silu_on_w3: bool) -> None:
        super().__init__()
        self.feed_forward = FeedForward(silu_on_w3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(x)


class PortModel(nn.Module):
    def __init__(self, silu_on_w3: bool = False, last_position_only: bool = False) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(PortBlock(silu_on_w3) for _ in range(LAYERS))
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.last_position_only = last_position_only

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        if self.last_position_only:
            h = h[:, -1:, :]
        return self.lm_head(h)


def reference_model() -> ReferenceModel:
    torch.manual_seed(0)
    return ReferenceModel().eval()


def port_model(bug: str = "") -> PortModel:
    """The port with the reference's weights copied in. `bug`: "silu_on_w3" (the forward applies the SiLU to
    w3), "converter_swap" (w1 loaded from up_proj, w3 from gate_proj), "converter_up_twice" (w1 and w3 both
    from up_proj), "last_position" (only the last position's logits, as Meta's inference code returns)."""
    source = reference_model().state_dict()
    port = PortModel(silu_on_w3=bug == "silu_on_w3", last_position_only=bug == "last_position")
    gate, up = "gate_proj", "up_proj"
    if bug == "converter_swap":
        gate, up = "up_proj", "gate_proj"
    elif bug == "converter_up_twice":
        gate = "up_proj"
    with torch.no_grad():
        port.tok_embeddings.weight.copy_(source["embed_tokens.weight"])
        port.lm_head.weight.copy_(source["lm_head.weight"])
        for index, layer in enumerate(port.layers):
            prefix = f"layers.{index}.mlp."
            layer.feed_forward.w1.weight.copy_(source[prefix + gate + ".weight"])
            layer.feed_forward.w3.weight.copy_(source[prefix + up + ".weight"])
            layer.feed_forward.w2.weight.copy_(source[prefix + "down_proj.weight"])
    return port.eval()
