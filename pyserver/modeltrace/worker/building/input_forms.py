"""The family rows of the input synthesiser: which modalities a model takes and how a family lays them out.

Each table is rows with their reason, read by small generic code in `inputs.py`:

- `MODALITY_RULES`: which modalities a forward signature takes (images, video, audio, series, ...);
- `IMAGE_FORMS` / `AUDIO_FORMS`: how a family lays out its images / audio (the first row that fits makes them, with
  a builder of `input_media.py`);
- `STYLE_RULES`: other layouts tried when the plain one fails (image sizes, images per sample, codebooks);
- `COMPANION_INPUTS`: inputs that travel with the main ones in a few families (IDEFICS' image mask, LayoutLM's
  boxes, InstructBLIP's Q-Former prompt).

Adding a family's input layout is adding a row next to its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from modeltrace.worker.building.input_media import MediaInputs
from modeltrace.worker.building.input_spec import BATCH_SIZE, SEQUENCE_LENGTH, Draw, InputSpec, as_int


@dataclass(frozen=True)
class ModalityRule:
    """A modality the model takes when `takes(synthesizer, found so far)`; `reason`: which models."""

    modality: str
    takes: Callable[[MediaInputs, list[str]], bool]
    reason: str


MODALITY_RULES = (
    ModalityRule(
        "image",
        lambda s, found: s.takes("pixel_values") or s.takes("flattened_patches"),
        "vision models and towers; Pix2Struct's flattened patches",
    ),
    ModalityRule(
        "video", lambda s, found: s.takes("pixel_values_videos"), "video-language models (Qwen-VL, LLaVA-OV)"
    ),
    ModalityRule(
        "audio",
        lambda s, found: s.takes("input_features") or s.takes("input_values") or s.takes("audio_values"),
        "speech encoders (mel features), codecs and wav2vec-style models (raw samples)",
    ),
    ModalityRule("series", lambda s, found: s.takes("past_values"), "time-series forecasters (PatchTST, Informer)"),
    ModalityRule(
        "embeddings",
        lambda s, found: s.takes("inputs") and not found and ("inputs" in s.required() or not s.takes("input_ids")),
        "Perceiver without a preprocessor; speech encoder-decoders that name their samples `inputs`",
    ),
    ModalityRule(
        "trajectory",
        lambda s, found: s.takes("states") and s.takes("actions"),
        "reinforcement-learning trajectories (Decision Transformer)",
    ),
)


@dataclass(frozen=True)
class ImageForm:
    """A way a family lays out its images: the first row that `fits` the model `make`s them."""

    fits: Callable[[MediaInputs], bool]
    make: Callable[[MediaInputs, InputSpec, Draw], dict[str, Any]]
    reason: str


IMAGE_FORMS = (
    ImageForm(
        lambda s: s.takes("image_grid_thw") or s.takes("grid_thw") or s.takes("image_grid_hw"),
        MediaInputs.grid_images,
        "Qwen-VL-style towers: the flattened patches of one image and its grid (time, height, width)",
    ),
    ImageForm(
        lambda s: s.takes("flattened_patches"),
        MediaInputs.flattened_patches,
        "Pix2Struct: variable-resolution patches, each row [row id, column id, channels × patch²]",
    ),
    ImageForm(
        lambda s: s.takes("spatial_shapes"),
        MediaInputs.naflex_patches,
        "NaFlex towers (SigLIP 2): patches [batch, patches, channels × patch²], their grid and a mask of the real "
        "ones",
    ),
    ImageForm(
        lambda s: s.pinpoints() is not None,
        MediaInputs.tiled_images,
        'LLaVA-NeXT "any resolution": the image at a pinpoint size cut into tiles of the tower\'s size, plus the '
        "whole image resized: [batch, tiles + 1, channels, size, size]",
    ),
    ImageForm(
        lambda s: True,
        MediaInputs.pixel_images,
        "every other vision model: [batch, channels, height, width] at the config's image size (frames for video "
        "classifiers), with the mask and sizes the signature asks for",
    ),
)


@dataclass(frozen=True)
class AudioForm:
    """A way a family takes its audio: the first row that `fits(synthesizer, layout)` `make`s it."""

    fits: Callable[[MediaInputs, str], bool]
    make: Callable[[MediaInputs, InputSpec, Draw], dict[str, Any]]
    reason: str


AUDIO_FORMS = (
    AudioForm(
        lambda s, layout: layout == "hidden",
        MediaInputs.hidden_audio,
        "a model without its speech pre-net (SpeechT5Model): the encoder takes hidden states",
    ),
    AudioForm(
        lambda s, layout: s.mel_bins_in_values() is not None,
        MediaInputs.spectrogram_values,
        "a spectrogram in `input_values` (Audio Spectrogram Transformer): [batch, frames, mel bins]",
    ),
    AudioForm(
        lambda s, layout: layout == "raw" or s.prefers_samples(),
        MediaInputs.raw_samples,
        "raw samples (wav2vec 2.0, codecs: a multiple of the hop length, channels where the config names them)",
    ),
    AudioForm(
        lambda s, layout: True,
        MediaInputs.feature_frames,
        "mel features (Whisper, Speech2Text) in the spec's layout, at the length the encoder expects",
    ),
)


@dataclass(frozen=True)
class StyleRule:
    """Another layout of an input set, tried after the plain one when it `fits` the model and the modalities."""

    fits: Callable[[MediaInputs, list[str]], bool]
    style: dict[str, Any]
    reason: str


STYLE_RULES = (
    StyleRule(
        lambda s, option: "image" in option and s.takes("image_sizes"),
        {"image_sizes": True},
        "LLaVA-NeXT-style models that want each image's size",
    ),
    StyleRule(
        lambda s, option: "image" in option,
        {"image_stack": True},
        "images stacked per sample, [batch, images, channels, height, width] (IDEFICS)",
    ),
    StyleRule(
        lambda s, option: "image" in option,
        {"image_stack": "pair"},
        "keypoint matchers that take two images (SuperGlue, LightGlue)",
    ),
    StyleRule(
        lambda s, option: s.codebooks() > 1 and s.takes("input_ids"),
        {"codebooks": "first"},
        "token ids per codebook, codebooks first (MusicGen's decoder)",
    ),
    StyleRule(
        lambda s, option: s.codebooks() > 1 and s.takes("input_ids"),
        {"codebooks": "last"},
        "token ids per codebook, codebooks last",
    ),
)


@dataclass(frozen=True)
class CompanionInput:
    """Inputs that travel with the main ones in a family: made when `needed(synthesizer, inputs so far)`."""

    needed: Callable[[MediaInputs, dict[str, Any]], bool]
    make: Callable[[MediaInputs, dict[str, Any], Draw], dict[str, Any]]
    reason: str


def _image_attention_mask(synthesizer: MediaInputs, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    pixels = inputs["pixel_values"]
    images = pixels.shape[1] if pixels.dim() == 5 else 1
    shape = (BATCH_SIZE, inputs["input_ids"].shape[1], images)
    return {"image_attention_mask": torch.ones(*shape, dtype=torch.long, device=synthesizer.device)}


def _boxes(synthesizer: MediaInputs, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    length = inputs["input_ids"].shape[1]
    corners = draw.randint(0, 500, (BATCH_SIZE, length, 2))
    sizes = draw.randint(1, 400, (BATCH_SIZE, length, 2))
    return {"bbox": torch.cat([corners, corners + sizes], dim=-1)}


def _qformer_prompt(synthesizer: MediaInputs, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    qformer = getattr(synthesizer.config, "qformer_config", None)
    vocab = as_int(getattr(qformer, "vocab_size", None), synthesizer.vocab_size())
    extra = {"qformer_input_ids": draw.randint(0, vocab, (BATCH_SIZE, SEQUENCE_LENGTH))}
    if synthesizer.takes("qformer_attention_mask"):
        shape = (BATCH_SIZE, SEQUENCE_LENGTH)
        extra["qformer_attention_mask"] = torch.ones(*shape, dtype=torch.long, device=synthesizer.device)
    return extra


def _latent_query_places(synthesizer: MediaInputs, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    queries = as_int(getattr(synthesizer.config, "latent_query_num", None), 64)
    input_ids = inputs["input_ids"]
    filler = synthesizer.text_tokens(draw, queries).unsqueeze(0).to(synthesizer.device)
    extra = {"input_ids": torch.cat([input_ids[:, :1], filler, input_ids[:, 1:]], dim=1)}
    mask = torch.zeros_like(extra["input_ids"])
    mask[:, 1 : 1 + queries] = 1
    if "attention_mask" in inputs:
        extra["attention_mask"] = torch.ones_like(extra["input_ids"])
    extra["image_embeds_position_mask"] = mask
    return extra


def _region_features(synthesizer: MediaInputs, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    regions = 4
    features = as_int(getattr(synthesizer.config, "visual_feat_dim", None), 64)
    position_size = as_int(getattr(synthesizer.config, "visual_pos_dim", None), 4)
    visual_feats = draw.randn(BATCH_SIZE, regions, features)
    return {"visual_feats": visual_feats, "visual_pos": draw.rand(BATCH_SIZE, regions, position_size)}


COMPANION_INPUTS = (
    CompanionInput(
        lambda s, inputs: s.takes("image_attention_mask") and "input_ids" in inputs and "pixel_values" in inputs,
        _image_attention_mask,
        "IDEFICS: which images each token attends to (every token, every image of its sample)",
    ),
    CompanionInput(
        lambda s, inputs: s.takes("bbox") and "input_ids" in inputs,
        _boxes,
        "LayoutLM-style document models: a box per token",
    ),
    CompanionInput(
        lambda s, inputs: s.takes("qformer_input_ids") and "input_ids" in inputs,
        _qformer_prompt,
        "InstructBLIP: the Q-Former's own prompt",
    ),
    CompanionInput(
        lambda s, inputs: s.takes("image_embeds_position_mask") and "pixel_values" in inputs and "input_ids" in inputs,
        _latent_query_places,
        "Kosmos-2: the image's latent queries take the places the mask marks, right after the first token",
    ),
    CompanionInput(
        lambda s, inputs: s.takes("visual_feats") and s.takes("visual_pos"),
        _region_features,
        "LXMERT: region features and their boxes",
    ),
)
