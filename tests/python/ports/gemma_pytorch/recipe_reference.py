"""`modeltrace trace MODELING_GEMMA --recipe recipe_reference.py`: the gemma_pytorch pair's reference."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import prompt_ids
from gemma_reference import build_reference


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor | bool]:
    return {"input_ids": prompt_ids(), "use_cache": False}
