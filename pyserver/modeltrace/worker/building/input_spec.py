"""What an input set is, apart from any model: its spec, its style, its random draw, and the config lookups.

The input synthesiser (`inputs.py`) is stateless given an `InputSpec`: the modalities, their layout
(`InputStyle`), and what trials learnt (a prompt length, an audio frame width, a placeholder count). The same spec
gives the same tensors, drawn from a `Draw` seeded afresh for each input set; a repair after a failed trial is a
new spec (`dataclasses.replace`). An `InputVariant` is one candidate set: its name, its spec and its tensors.

Also here, shared by the per-modality builders (`input_media.py`), the family rows (`input_forms.py`) and the
synthesiser: the sizes of a synthesised input set (`SEQUENCE_LENGTH`, `BATCH_SIZE`, ...) and the lookups that read
a composite config (`sub_config`, `first_set`, `as_int`).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


SEQUENCE_LENGTH = 7
DECODER_SEQUENCE_LENGTH = 5
BATCH_SIZE = 1
AUDIO_SAMPLES = 8000
FEATURE_FRAMES = 64
DEFAULT_IMAGE_SIZE = 224


def forward_parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(model.forward).parameters)


def sub_config(config: Any, kind: str) -> Any:
    """The vision / audio / text part of a composite config (the config itself when it is that part)."""
    names = {
        "vision": (
            "vision_config",
            "vision_encoder_config",
            "visual_config",
            "image_config",
            "vision_tower_config",
            "encoder_config",
            "backbone_config",
        ),
        "audio": ("audio_config", "audio_encoder_config", "speech_config", "encoder_config", "acoustic_config"),
        "text": ("text_config", "language_config", "llm_config", "decoder_config", "decoder", "text_decoder"),
    }[kind]
    for name in names:
        value = getattr(config, name, None)
        if value is not None and hasattr(value, "to_dict"):
            return value
    return config


def first_set(configs: list[Any], *names: str, default: Any = None) -> Any:
    for config in configs:
        for name in names:
            value = getattr(config, name, None)
            if value is not None:
                return value
    return default


def as_int(value: Any, default: int) -> int:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class InputStyle:
    """How an input set is laid out beyond its modalities: the audio feature layout, LLaVA-NeXT's `image_sizes`,
    images stacked per sample ([batch, images, channels, height, width]: IDEFICS; "pair": two images, keypoint
    matchers), token ids per codebook ("first" / "last": MusicGen)."""

    layout: str = "channels_first"
    image_sizes: bool = False
    image_stack: bool | str = False
    codebooks: str | None = None

    def details(self) -> list[str]:
        """The words a variant's name gets for this style (empty for the plain one)."""
        words = ["image sizes"] * self.image_sizes
        if self.image_stack:
            words.append("image pair" if self.image_stack == "pair" else "images per sample")
        return words + [f"codebooks {self.codebooks}"] * bool(self.codebooks)


@dataclass(frozen=True)
class InputSpec:
    """Everything an input set depends on besides the model: the modalities, their layout, and what trials
    learnt from errors that name a size (a prompt length, an audio frame width, placeholder tokens per modality).
    The same spec gives the same tensors; a repair is a new spec (`dataclasses.replace`)."""

    modalities: tuple[str, ...] = ()
    style: InputStyle = InputStyle()
    # The prompt length a model wants (one token per audio frame in a streaming model), learnt from an error
    # naming it (`fit_text_length`); None: the default length.
    text_length: int | None = None
    # The width of each audio feature frame, learnt the same way (stacked mel frames: 4 × 80).
    feature_width: int | None = None
    # Placeholder tokens per modality an error asked for ("tokens: 3, features: 16"), over what the model says.
    feature_counts: tuple[tuple[str, int], ...] = ()

    def counted(self, modality: str) -> int | None:
        return dict(self.feature_counts).get(modality)

    def with_count(self, modality: str, count: int) -> InputSpec:
        counts = {**dict(self.feature_counts), modality: count}
        return dataclasses.replace(self, feature_counts=tuple(counts.items()))


@dataclass(frozen=True)
class InputVariant:
    """One candidate input set: its name (`text+image (image sizes)`), the spec it comes from, and the tensors."""

    name: str
    spec: InputSpec
    inputs: dict[str, Any] = field(default_factory=dict)


class Draw:
    """The random tensors of one input set, from a generator seeded afresh for it (same spec, same tensors)."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.device = device

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator).to(self.device)

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator).to(self.device)

    def randint(self, low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, max(high, low + 1), shape, generator=self.generator).to(self.device)
