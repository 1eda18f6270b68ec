"""What every reference of the port corpus shares: the seed, the prompt, and weights that look trained.

Each pair folder (`gpt2/`, `llama/`, `bert/`) imports this module from its parent folder, so a copy of a pair
folder beside a copy of this file traces the same way as the original (the harness patches such copies).
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0
# NOTE: seven tokens, below every vocabulary size of the corpus (128); the same ids on both sides of a pair.
PROMPT = (5, 17, 42, 9, 101, 3, 64)


def prompt_ids() -> torch.Tensor:
    """The prompt as a `[1, T]` batch of token ids."""
    return torch.tensor([PROMPT], dtype=torch.long)


def make_trained_like(model: nn.Module, seed: int = SEED) -> nn.Module:
    """Give biases and norm weights seeded values like a trained model's (in place; returns the model).

    NOTE: transformers initialises biases to 0 and norm weights to 1, and so does PyTorch for norms: a port
    that forgets to copy a norm weight, or a bias its converter skips, would then look right by accident.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            if name.endswith("bias"):
                parameter.copy_(noise * 0.02)
            elif parameter.dim() == 1:  # norm weights (LayerNorm, RMSNorm)
                parameter.copy_(1.0 + noise * 0.1)
    return model
