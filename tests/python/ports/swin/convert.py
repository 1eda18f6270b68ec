"""The Swin pair's weight conversion: timm's Swin Transformer state dict -> transformers' `SwinForImageClassification`.

transformers converts timm's Swin checkpoints with `convert_swin_timm_to_pytorch.py` (`rename_key` and
`convert_state_dict` below, staged from a snapshot of a transformers fork, feisenyu/transformers_4573 at e9d73c3118), written for timm's names before timm 0.9
moved each patch merging to the start of the next stage (`layers.N.downsample` -> `layers.N+1.downsample`) and the
classifier into `head.fc`; `timm_to_original` undoes those two moves (timm's `checkpoint_filter_fn` reversed).
transformers 5 then reads those names through its own checkpoint conversion (`conversion_mapping.py`, "swin":
`attention.self.query` -> `attention.q_proj` ...), whose renamings `to_transformers_5` applies.
"""

from __future__ import annotations

from pathlib import Path

import re
from types import SimpleNamespace

import torch
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from vision_common import upstream_definitions


def timm_to_original(name: str) -> str:
    """The pre-0.9 timm (original Microsoft) name of a timm 1.0 Swin parameter."""
    found = re.match(r"^layers\.([0-9]+)\.downsample\.(.*)$", name)
    if found:
        return f"layers.{int(found.group(1)) - 1}.downsample.{found.group(2)}"
    return name.replace("head.fc.", "head.")


# transformers' own conversion code, staged from the corpus's mirror (never committed; see ports/sources.py):
# rename_key, convert_state_dict from models/swin/convert_swin_timm_to_pytorch.py, unchanged
_UPSTREAM = upstream_definitions(
    Path(__file__).resolve().parent / "upstream" / "convert_swin_timm_to_pytorch.py",
    ("rename_key", "convert_state_dict"),
)
rename_key = _UPSTREAM["rename_key"]
convert_state_dict = _UPSTREAM["convert_state_dict"]


def _head_sizes(config) -> SimpleNamespace:
    """What `convert_state_dict` reads of the HF model (`...attention.self.all_head_size` in transformers 4), for
    the transformers 5 model whose attention no longer has `.self`: each stage's width."""
    layers = []
    for stage, depth in enumerate(config.depths):
        width = int(config.embed_dim * 2**stage)
        block = SimpleNamespace(attention=SimpleNamespace(self=SimpleNamespace(all_head_size=width)))
        layers.append(SimpleNamespace(blocks=[block] * depth))
    return SimpleNamespace(swin=SimpleNamespace(encoder=SimpleNamespace(layers=layers)))


def to_transformers_5(name: str) -> str:
    """A transformers 4 Swin name as transformers 5 loads it (its "swin" checkpoint renamings, in order)."""
    for renaming in get_checkpoint_conversion_mapping("swin"):
        for source, target in zip(renaming.source_patterns, renaming.target_patterns):
            name = re.sub(source, target, name)
    return name


def convert(config, timm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The transformers 5 state dict of a timm 1.0 Swin's."""
    original = {timm_to_original(key): value.clone() for key, value in timm_state.items()}
    state = convert_state_dict(original, _head_sizes(config))
    return {to_transformers_5(key): value for key, value in state.items()}
