"""`modeltrace trace vendored/modeling_encodec.py --recipe recipe_port.py`: transformers' EnCodec, built from the
reference's hyper-parameters, with the reference's weights converted by `convert.py` (the HF conversion script's
own mapping)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "vendored"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from convert import convert
from modeling_encodec import EncodecModel
from recipe_reference import (
    BANDWIDTH,
    BINS,
    DIMENSION,
    FILTERS,
    RATIOS,
    SAMPLE_RATE,
    TARGET_BANDWIDTHS,
    audio,
    build_reference,
)
from transformers import EncodecConfig


def build_model() -> nn.Module:
    # the 24 kHz model's settings (convert_checkpoint's `encodec_24khz`: the config's defaults), sized as the reference
    config = EncodecConfig(
        target_bandwidths=TARGET_BANDWIDTHS,
        sampling_rate=SAMPLE_RATE,
        audio_channels=1,
        normalize=False,
        chunk_length_s=None,
        overlap=None,
        hidden_size=DIMENSION,
        num_filters=FILTERS,
        upsampling_ratios=RATIOS,
        codebook_size=BINS,
        use_causal_conv=True,
        norm_type="weight_norm",
        pad_mode="reflect",
    )
    model = EncodecModel(config)
    model.load_state_dict(convert(build_reference().state_dict(), model))
    return model.eval()


def build_inputs(model: nn.Module) -> dict[str, torch.Tensor | float]:
    return {"input_values": audio(), "bandwidth": BANDWIDTH}
