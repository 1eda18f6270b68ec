"""`modeltrace trace MODELING_BERT --recipe recipe_reference.py`: the BERT pair's reference."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_reference import build_reference
from corpus_common import prompt_ids


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    return {"input_ids": prompt_ids()}
