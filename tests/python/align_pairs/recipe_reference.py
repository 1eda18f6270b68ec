"""Recipe: transformers' LlamaModel (the reference of the alignment pairs)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from meta_llama import TOKENS, reference_model  # noqa: E402


def build_model():
    return reference_model(seed=0)


def build_inputs(model):
    return {"input_ids": torch.tensor(TOKENS), "use_cache": False}
