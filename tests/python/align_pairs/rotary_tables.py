"""A tiny rotary projection written two ways, for the rotary-table pairing (tests/python/test_weight_pairing.py):
the reference hands its module `cos`, `sin` `[1, T, d]` (transformers), the port one table `freqs_cis` of complex
numbers `[T, d/2]` (Meta's Llama) or of (cos, sin) pairs `[T, d/2, 2]`. `layout` says how the reference writes
each angle twice along d: as two halves (rotate-half) or as interleaved pairs (adjacent pairs rotated)."""

from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH = 32, 16
TOKENS = [[3, 1, 4, 1, 5, 9, 2]]


def _angles(positions: int, base: float) -> torch.Tensor:
    inverse = 1.0 / (base ** (torch.arange(0, WIDTH, 2, dtype=torch.float32) / WIDTH))
    return torch.outer(torch.arange(positions, dtype=torch.float32), inverse)


class ReferenceRotation(nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.q_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.layout = layout

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        query = self.q_proj(hidden_states)
        if self.layout == "halves":
            first, second = query.chunk(2, dim=-1)
            rotated = torch.cat((-second, first), dim=-1)
        else:
            rotated = torch.stack((-query[..., 1::2], query[..., 0::2]), dim=-1).flatten(-2)
        return query * cos + rotated * sin


class ReferenceModel(nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.rotation = ReferenceRotation(layout)
        self.layout = layout

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        angles = _angles(input_ids.shape[1], 10000.0)
        if self.layout == "halves":
            angles = torch.cat((angles, angles), dim=-1)
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)
        return self.rotation(self.embed_tokens(input_ids), angles.cos()[None], angles.sin()[None])


class PortRotation(nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.wq = nn.Linear(WIDTH, WIDTH, bias=False)
        self.layout = layout

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        if not freqs_cis.is_complex():
            freqs_cis = torch.view_as_complex(freqs_cis.contiguous())
        q = self.wq(x)
        if self.layout == "halves":
            first, second = q.chunk(2, dim=-1)
            turned = torch.complex(first, second) * freqs_cis
            return torch.cat((turned.real, turned.imag), dim=-1)
        turned = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2)) * freqs_cis
        return torch.view_as_real(turned).flatten(-2)


class PortModel(nn.Module):
    def __init__(self, layout: str, base: float, as_pairs: bool) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, WIDTH)
        self.rotation = PortRotation(layout)
        self.base = base
        self.as_pairs = as_pairs

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        angles = _angles(tokens.shape[1], self.base)
        freqs_cis = torch.polar(torch.ones_like(angles), angles)
        return self.rotation(
            self.tok_embeddings(tokens), torch.view_as_real(freqs_cis) if self.as_pairs else freqs_cis
        )


def reference_model(layout: str = "halves") -> ReferenceModel:
    torch.manual_seed(0)
    return ReferenceModel(layout).eval()


def port_model(layout: str = "halves", base: float = 10000.0, as_pairs: bool = False) -> PortModel:
    """The port with the reference's weights copied in; `base` other than 10000 is the bug of a wrong rotary base."""
    source = reference_model(layout)
    port = PortModel(layout, base, as_pairs)
    with torch.no_grad():
        port.tok_embeddings.weight.copy_(source.embed_tokens.weight)
        port.rotation.wq.weight.copy_(source.rotation.q_proj.weight)
    return port.eval()
