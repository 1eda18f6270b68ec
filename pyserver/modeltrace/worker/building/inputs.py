"""Synthesise the inputs of a transformers model's `forward` from its signature and its config, for every modality.

- text: `input_ids` (ordinary tokens: never a special id), `attention_mask`, `token_type_ids` when the config has
  a token-type vocabulary, `decoder_input_ids` for encoder-decoders;
- images: `pixel_values` at the vision config's image size and channel count, or as the flattened patches of
  Qwen-VL-style towers with their `image_grid_thw`; video as frames (`num_frames`) or patches and `video_grid_thw`;
  `pixel_mask`, `image_sizes` where asked;
- audio: raw `input_values` (one or several channels, a multiple of the codec's hop length) or `input_features`
  (mel bins at the length the encoder expects, in either layout);
- multimodal prompts: as many image / video / audio placeholder tokens as the towers produce features (counted
  by running the model's own `get_image_features`), wrapped in the start/end tokens the config names, with
  `mm_token_type_ids` marking them.

`InputSynthesizer.variants` yields several candidate input sets, richest first (every modality the signature
takes, then fewer); the builder keeps the first one the model runs with (`trials.py`).

The synthesiser is stateless given an `InputSpec` (the modalities, their layout, and what trials learnt: a prompt
length, an audio frame width, a placeholder count): the same spec gives the same tensors, and a repair after a
failed trial is a new spec (`fit_text_length`, `fit_feature_width`, `note_mismatch`), never a changed synthesiser.
The family-specific cases are rows with their reason: `MODALITY_RULES` (which modalities a signature takes),
`IMAGE_FORMS` (how a family lays out its images), `STYLE_RULES` (other layouts tried when the plain one fails),
`COMPANION_INPUTS` (inputs that travel with the main ones in a few families).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building.config_tree import walk_configs
from modeltrace.worker.building.sizes import HIDDEN_WIDTH_NAMES


SEQUENCE_LENGTH = 7
DECODER_SEQUENCE_LENGTH = 5
BATCH_SIZE = 1
AUDIO_SAMPLES = 8000
FEATURE_FRAMES = 64
DEFAULT_IMAGE_SIZE = 224

# Names of the config fields that give a modality's placeholder token, and the tokens that open / close it.
_PLACEHOLDERS = {
    "image": ("image_token_id", "image_token_index", "image_token"),
    "video": ("video_token_id", "video_token_index", "video_token"),
    "audio": ("audio_token_id", "audio_token_index", "audio_token"),
}
_OPENERS = {
    "image": (
        "vision_start_token_id",
        "boi_token_id",
        "boi_token_index",
        "image_start_token_id",
        "im_start_token_id",
        "image_begin_token_id",
    ),
    "video": ("vision_start_token_id", "video_start_token_id"),
    "audio": ("audio_start_token_id", "boa_token_id", "boa_token_index", "audio_bos_token_id", "audio_begin_token_id"),
}
_CLOSERS = {
    "image": ("vision_end_token_id", "eoi_token_id", "eoi_token_index", "image_end_token_id", "im_end_token_id"),
    "video": ("vision_end_token_id", "video_end_token_id"),
    "audio": ("audio_end_token_id", "eoa_token_id", "eoa_token_index", "audio_eos_token_id"),
}
_MODALITY_TYPE = {"image": 1, "video": 2, "audio": 3}
# Config hints for the number of placeholder tokens per image, when the model cannot say.
# The config fields that give an audio model's feature width (mel bins), most specific first.
_FEATURE_WIDTH_NAMES = (
    "feature_projection_input_dim",
    "num_mel_bins",
    "feature_size",
    "input_feat_per_channel",
    "n_mels",
    "input_dim",
)
_IMAGE_TOKEN_HINTS = (
    "image_seq_length",
    "mm_tokens_per_image",
    "num_image_tokens",
    "image_token_count",
    "num_query_tokens",
    "tokens_per_image",
)
_TOKENS_MISMATCH = re.compile(
    r"(?:tokens?|placeholders?)\D{0,12}?(\d+)\D{1,40}?features?\D{0,12}?(\d+)", re.IGNORECASE
)


_MATMUL_MISMATCH = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
_SIZE_MISMATCH = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


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


def _first(configs: list[Any], *names: str, default: Any = None) -> Any:
    for config in configs:
        for name in names:
            value = getattr(config, name, None)
            if value is not None:
                return value
    return default


def _int(value: Any, default: int) -> int:
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


class InputSynthesizer:
    """Builds candidate input sets for one model; see the module docstring.

    It holds what is fixed for the model (its forward signature, its configs) and a memo of the placeholder
    counts the model's own `get_*_features` gave; what varies between input sets is the `InputSpec`.
    """

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        seed: int | torch.Generator = 0,
        convert: Callable[[Any], Any] | None = None,
        context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.seed = seed.initial_seed() if isinstance(seed, torch.Generator) else int(seed)
        # `convert` moves each synthesised tensor where the model is (the meta device in shape-only mode), and
        # `context` wraps the model calls made here (counting a tower's features) as it wraps the forward pass.
        self.convert = convert or (lambda value: value)
        self.context = context or contextlib.nullcontext
        self.device = torch.device("cpu")
        self.parameters = forward_parameters(model)
        self.text_config = sub_config(config, "text")
        self.vision_config = sub_config(config, "vision")
        self.audio_config = sub_config(config, "audio")
        # NOTE: a memo of what the model's `get_{modality}_features` answered (a pure function of the model and
        # the media), so that every input set does not run the tower again.
        self._counted_features: dict[str, int] = {}

    # --- helpers ------------------------------------------------------------------------------------------------

    def takes(self, name: str) -> bool:
        """Whether the model's forward has a parameter `name`."""
        return name in self.parameters

    def required(self) -> list[str]:
        """The forward's parameters without a default (besides *args and **kwargs)."""
        return [
            name
            for name, parameter in self.parameters.items()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        ]

    def afresh(self) -> InputSynthesizer:
        """A synthesiser for the same model and config with nothing memoised (after the config was repaired)."""
        return InputSynthesizer(self.model, self.config, self.seed, self.convert, self.context)

    def draw(self) -> Draw:
        """A fresh source of random tensors, seeded with the synthesiser's seed."""
        return Draw(self.seed, self.device)

    def vocab_size(self) -> int:
        vocab = _first([self.text_config, self.config], "vocab_size")
        if isinstance(vocab, int) and vocab > 0:
            return vocab
        embeddings = self._input_embeddings()
        return embeddings.num_embeddings if embeddings is not None else 128

    def _input_embeddings(self) -> nn.Embedding | None:
        try:
            embeddings = self.model.get_input_embeddings()
        except Exception:  # noqa: BLE001 - not every model has (or implements) input embeddings
            return None
        return embeddings if isinstance(embeddings, nn.Embedding) else None

    def special_ids(self) -> set[int]:
        ids: set[int] = set()
        parts = (self.config, self.text_config, self.vision_config, self.audio_config)
        for config in {id(part): part for part in parts}.values():
            for name, value in config.to_dict().items() if hasattr(config, "to_dict") else ():
                if name.endswith(("_token_id", "_token_index", "_token_ids")):
                    for item in value if isinstance(value, (list, tuple)) else [value]:
                        if isinstance(item, int) and not isinstance(item, bool):
                            ids.add(item)
        return ids

    def text_tokens(self, draw: Draw, count: int) -> torch.Tensor:
        """`count` ordinary token ids: inside the vocabulary (and the embedding table), never a special id."""
        vocab = self.vocab_size()
        embeddings = self._input_embeddings()
        if embeddings is not None:
            vocab = min(vocab, embeddings.num_embeddings)
        special = self.special_ids()
        ordinary = [token for token in range(min(vocab, 4096)) if token not in special]
        if not ordinary:
            ordinary = list(range(vocab))
        # Low ids are often reserved (padding, unknown, bos): prefer the upper part of the range.
        pool = ordinary[len(ordinary) // 4 :] or ordinary
        choice = torch.randint(0, len(pool), (count,), generator=draw.generator)
        return torch.tensor([pool[index] for index in choice.tolist()], dtype=torch.long)

    def _token(self, names: tuple[str, ...]) -> int | None:
        for config in (self.config, self.text_config):
            for name in names:
                value = getattr(config, name, None)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    return value
        return None

    # --- modalities ---------------------------------------------------------------------------------------------

    def image_inputs(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        """`pixel_values` (+ grid / size / mask inputs the signature takes) for one image, in the first of the
        `IMAGE_FORMS` that fits the model."""
        form = next(form for form in IMAGE_FORMS if form.fits(self))
        return form.make(self, spec, draw)

    def _channels_and_patch(self) -> tuple[int, int]:
        configs = [self.vision_config, self.config]
        channels = _int(
            _first(configs, "num_channels", "in_channels", "in_chans", "input_channels", "image_channels"), 3
        )
        return channels, _int(_first(configs, "patch_size", "spatial_patch_size"), 16)

    def _image_size(self) -> tuple[int, int]:
        """The height and width the vision config names (a multiple of its windows where it has several)."""
        configs = [self.vision_config, self.config]
        _, patch = self._channels_and_patch()
        size = _first(configs, "image_size", "img_size", "input_size", "resolution", "max_img_size")
        if isinstance(size, dict):
            size = size.get("height") or size.get("shortest_edge")
        if isinstance(size, (list, tuple)) and len(size) >= 2:
            height, width = int(size[-2]), int(size[-1])
        else:
            height = width = _int(size, DEFAULT_IMAGE_SIZE)
        windows = _first(configs, "num_windows")
        if isinstance(windows, int) and windows > 1 and patch > 0 and isinstance(size, int):
            # A patch grid cut into windows × windows (RF-DETR's windowed DINOv2): a multiple of the windows.
            side = max(windows, height // patch // windows * windows)
            height = width = side * patch
        return height, width

    def _flattened_patches(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, patch = self._channels_and_patch()
        width = _int(_first([self.vision_config, self.config], "patch_embed_hidden_size"), channels * patch * patch)
        side = 4
        positions = torch.tensor(
            [[row + 1, column + 1] for row in range(side) for column in range(side)],
            dtype=torch.float32,
            device=self.device,
        )
        patches = torch.cat([positions, draw.randn(side * side, width)], dim=-1).unsqueeze(0)
        inputs = {"flattened_patches": patches.repeat(BATCH_SIZE, 1, 1)}
        if self.takes("attention_mask"):
            inputs["attention_mask"] = torch.ones(BATCH_SIZE, side * side, device=self.device)
        return inputs

    def _naflex_patches(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, patch = self._channels_and_patch()
        patches = _int(_first([self.vision_config, self.config], "num_patches", "max_num_patches"), 64)
        side = max(1, math.isqrt(patches) // 2)
        count = side * side
        inputs = {
            "pixel_values": draw.randn(BATCH_SIZE, count, channels * patch * patch),
            "spatial_shapes": torch.tensor([[side, side]] * BATCH_SIZE, device=self.device),
        }
        if self.takes("pixel_attention_mask"):
            inputs["pixel_attention_mask"] = torch.ones(BATCH_SIZE, count, dtype=torch.long, device=self.device)
        return inputs

    def _pinpoints(self) -> Any:
        pinpoints = _first([self.config, self.vision_config], "image_grid_pinpoints")
        if isinstance(pinpoints, (list, tuple)) and pinpoints and isinstance(pinpoints[0], (list, tuple)):
            return pinpoints
        return None

    def _tiled_images(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, _ = self._channels_and_patch()
        height, width = self._image_size()
        pinpoints = self._pinpoints()
        full_height, full_width = int(pinpoints[0][0]), int(pinpoints[0][1])
        tiles = max(1, full_height // height) * max(1, full_width // width) + 1
        inputs = {"pixel_values": draw.randn(BATCH_SIZE, tiles, channels, height, width)}
        if self.takes("image_sizes"):
            inputs["image_sizes"] = torch.tensor([[full_height, full_width]] * BATCH_SIZE, device=self.device)
        return inputs

    def _pixel_images(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, _ = self._channels_and_patch()
        height, width = self._image_size()
        frames = _first([self.vision_config, self.config], "num_frames")
        if isinstance(frames, int) and frames > 1 and self._video_in_pixel_values():
            pixel_values = draw.randn(BATCH_SIZE, frames, channels, height, width)
        else:
            pixel_values = draw.randn(BATCH_SIZE, channels, height, width)
        inputs: dict[str, Any] = {"pixel_values": pixel_values}
        if self.takes("pixel_mask"):
            inputs["pixel_mask"] = torch.ones(BATCH_SIZE, height, width, dtype=torch.long, device=self.device)
        if spec.style.image_stack == "pair":  # keypoint matchers (SuperGlue, LightGlue) take two images
            pixel_values = torch.stack([pixel_values, draw.randn(*pixel_values.shape)], dim=1)
        elif spec.style.image_stack:
            pixel_values = pixel_values.unsqueeze(1)
        inputs["pixel_values"] = pixel_values
        if self.takes("image_sizes") and (spec.style.image_sizes or "image_sizes" in self.required()):
            inputs["image_sizes"] = torch.tensor([[height, width]] * BATCH_SIZE, device=self.device)
        return inputs

    def _video_in_pixel_values(self) -> bool:
        # Video classifiers (VideoMAE, TimeSformer, ViViT) take frames in `pixel_values`; multimodal models that
        # also take images have a separate `pixel_values_videos`.
        return not self.takes("pixel_values_videos")

    def _patch_images(self, draw: Draw, channels: int, patch: int, video: bool = False) -> dict[str, Any]:
        configs = [self.vision_config, *walk_configs(self.config)]
        merge = _int(_first(configs, "spatial_merge_size", "merge_size"), 1)
        temporal = _int(_first(configs, "temporal_patch_size"), 1)
        side = 2 * merge
        frames = 2 if video else 1
        grid = torch.tensor([[frames, side, side]], device=self.device)
        patches = frames * side * side
        pixel_values = draw.randn(patches, channels * temporal * patch * patch)
        if video:
            return {"pixel_values_videos": pixel_values, "video_grid_thw": grid}
        if self.takes("image_grid_thw"):
            return {"pixel_values": pixel_values, "image_grid_thw": grid}
        if self.takes("image_grid_hw"):
            return {"pixel_values": pixel_values, "image_grid_hw": grid[:, 1:]}
        return {"pixel_values": pixel_values, "grid_thw": grid}

    def _grid_images(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        return self._patch_images(draw, *self._channels_and_patch())

    def video_inputs(self, draw: Draw) -> dict[str, Any]:
        vision = self.vision_config
        channels = _int(_first([vision, self.config], "num_channels", "in_channels"), 3)
        patch = _int(_first([vision, self.config], "patch_size"), 16)
        if self.takes("video_grid_thw"):
            return self._patch_images(draw, channels, patch, video=True)
        size = _int(_first([vision, self.config], "image_size"), DEFAULT_IMAGE_SIZE)
        frames = _int(_first([vision, self.config], "num_frames"), 2)
        return {"pixel_values_videos": draw.randn(BATCH_SIZE, frames, channels, size, size)}

    def audio_inputs(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        """Audio for one clip in the first of the `AUDIO_FORMS` that fits the model and the spec's layout."""
        form = next(form for form in AUDIO_FORMS if form.fits(self, spec.style.layout))
        return form.make(self, spec, draw)

    def _hidden_audio(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        name = "input_values" if self.takes("input_values") else "input_features"
        width = _int(_first([self.audio_config, self.config], *HIDDEN_WIDTH_NAMES), 64)
        hidden = {name: draw.randn(BATCH_SIZE, SEQUENCE_LENGTH, width)}
        if self.takes("decoder_input_values"):
            hidden["decoder_input_values"] = draw.randn(BATCH_SIZE, DECODER_SEQUENCE_LENGTH, width)
        return hidden

    def _mel_bins_in_values(self) -> int | None:
        """The mel bins of a spectrogram the model takes in `input_values` (None: it takes no such thing)."""
        mel_bins = _first([self.audio_config, self.config], "num_mel_bins")
        if self.takes("input_values") and isinstance(mel_bins, int) and not self.takes("input_features"):
            return mel_bins
        return None

    def _spectrogram_values(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        frames = _int(_first([self.audio_config, self.config], "max_length"), FEATURE_FRAMES)
        return {"input_values": draw.randn(BATCH_SIZE, frames, self._mel_bins_in_values())}

    def _prefers_samples(self) -> bool:
        """Whether the model's audio input is raw samples (`input_values`) rather than features."""
        return self.takes("input_values") and (not self.takes("input_features") or "input_values" in self.required())

    def _raw_samples(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        audio = self.audio_config
        channels = _int(_first([audio, self.config], "audio_channels", "num_channels"), 0)
        hop = _int(_first([audio, self.config], "hop_length", "frame_size"), 0)
        ratios = _first([audio, self.config], "upsampling_ratios", "downsampling_ratios")
        if not hop and isinstance(ratios, (list, tuple)) and ratios:
            hop = math.prod(int(ratio) for ratio in ratios)
        samples = hop * 16 if hop else AUDIO_SAMPLES
        if spec.style.layout == "image_like":  # a channel axis the config does not name (mono codecs)
            channels = channels or 1
        shape = (BATCH_SIZE, channels, samples) if channels else (BATCH_SIZE, samples)
        raw = {"input_values": draw.randn(*shape)}
        if "input_features" in self.required():  # codecs that take the samples and their features (NeuCodec)
            raw.update(self._features(spec, draw, "channels_last"))
        return raw

    def _feature_frames(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        return self._features(spec, draw, spec.style.layout)

    def _features(self, spec: InputSpec, draw: Draw, layout: str) -> dict[str, Any]:
        audio = self.audio_config
        bins = _int(
            _first(
                [audio, self.config, *walk_configs(self.config)],
                *_FEATURE_WIDTH_NAMES,
                "feature_dim",
                "num_mels",
            ),
            80,
        )
        channels = _int(_first([audio, self.config], "input_channels"), 1)
        if getattr(audio, "input_feat_per_channel", None):
            bins = bins * max(channels, 1)
        if spec.feature_width is not None:
            bins = spec.feature_width
        positions = _first([audio, self.config], "max_source_positions")
        frames = 2 * int(positions) if isinstance(positions, int) and positions > 0 else FEATURE_FRAMES
        if layout == "channels_first":
            features = draw.randn(BATCH_SIZE, bins, frames)
        else:
            features = draw.randn(BATCH_SIZE, frames, bins)
        if layout == "image_like":  # a one-channel spectrogram image (CLAP): [batch, 1, frames, bins]
            features = features.unsqueeze(1)
        inputs: dict[str, Any] = {"input_features": features}
        for mask_name in ("input_features_mask", "feature_attention_mask"):
            if self.takes(mask_name):
                inputs[mask_name] = torch.ones(BATCH_SIZE, frames, dtype=torch.long, device=self.device)
        return inputs

    def audio_layouts(self) -> list[str]:
        """The feature layout the model's first audio layer suggests first, then the other ones; raw samples last
        for a model that takes both (a speech encoder-decoder whose encoder is wav2vec2-like)."""
        if self._prefers_samples():
            return ["channels_first", "image_like", "hidden"]  # raw samples, with a channel axis, as hidden states
        raw = ["raw"] if self.takes("input_values") else []
        return [*self._feature_layouts(), *raw]

    def _feature_layouts(self) -> list[str]:
        bins = _int(
            _first(
                [self.audio_config, self.config],
                *_FEATURE_WIDTH_NAMES,
            ),
            80,
        )
        for module in self.model.modules():
            if isinstance(module, nn.Conv1d):
                if module.in_channels == bins:
                    return ["channels_first", "channels_last", "image_like"]
                return ["channels_last", "channels_first", "image_like"]
            if isinstance(module, nn.Conv2d) and module.in_channels == 1:
                return ["image_like", "channels_last", "channels_first"]
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                break
        if self.takes("input_features") and not hasattr(self.config, "max_source_positions"):
            return ["channels_last", "channels_first", "image_like", "hidden"]
        return ["channels_first", "channels_last", "image_like", "hidden"]

    # --- feature counts for placeholder tokens -----------------------------------------------------------------

    def count_features(self, spec: InputSpec, modality: str, media: dict[str, Any]) -> int | None:
        """How many placeholder tokens the model wants for `media`: what an error said (`spec`), else ask its
        `get_{modality}_features` (once per model), else the config's hints."""
        if spec.counted(modality) is not None:
            return spec.counted(modality)
        if modality in self._counted_features:
            return self._counted_features[modality]
        getter = getattr(self.model, f"get_{modality}_features", None)
        count = None
        if callable(getter):
            try:
                accepted = inspect.signature(getter).parameters
                takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
                arguments = {
                    name: self.convert(value) for name, value in media.items() if name in accepted or takes_kwargs
                }
                with torch.no_grad(), self.context():
                    output = getter(**arguments)
                count = self._count(output)
            except Exception:  # noqa: BLE001 - fall back to the config's hints
                count = None
        if count is None and modality == "image":
            for config in (self.config, self.vision_config):
                for name in _IMAGE_TOKEN_HINTS:
                    value = getattr(config, name, None)
                    if isinstance(value, int) and value > 0:
                        count = value
                        break
                if count:
                    break
        if count is None:
            count = 1
        self._counted_features[modality] = count
        return count

    def _count(self, output: Any) -> int | None:
        width = None
        embeddings = self._input_embeddings()
        if embeddings is not None:
            width = embeddings.embedding_dim
        features = output
        if hasattr(output, "pooler_output") and getattr(output, "pooler_output", None) is not None:
            features = output.pooler_output
        elif hasattr(output, "last_hidden_state") and getattr(output, "last_hidden_state", None) is not None:
            features = output.last_hidden_state
        elif isinstance(output, tuple) and output and not isinstance(output[0], (int, float)):
            features = (
                output[0]
                if isinstance(output[0], torch.Tensor)
                and len(output) > 1
                and not all(isinstance(item, torch.Tensor) and item.dim() == output[0].dim() for item in output)
                else output
            )
        tensors = (
            [features]
            if isinstance(features, torch.Tensor)
            else [
                item
                for item in (features if isinstance(features, (list, tuple)) else [])
                if isinstance(item, torch.Tensor)
            ]
        )
        if not tensors:
            return None
        if width is None:
            width = tensors[0].shape[-1]
        total = sum(tensor.numel() for tensor in tensors)
        if width and total % width == 0:
            return total // width
        return None

    def fit_text_length(self, spec: InputSpec, inputs: dict[str, Any], error: BaseException) -> InputSpec | None:
        """After "The size of tensor a (7) must match the size of tensor b (8) at non-singleton dimension 1", where
        one side is the prompt's length: the spec whose prompt has the other length (None: no such repair)."""
        match = _SIZE_MISMATCH.search(str(error))
        input_ids = inputs.get("input_ids")
        if match is None or not isinstance(input_ids, torch.Tensor) or input_ids.dim() < 2:
            return None
        first, second = int(match.group(1)), int(match.group(2))
        lengths = {input_ids.shape[1], input_ids.shape[-1]}
        wanted = second if first in lengths else first if second in lengths else None
        if wanted is None or wanted in lengths or not 1 < wanted <= 4096 or wanted == spec.text_length:
            return None
        return dataclasses.replace(spec, text_length=wanted)

    def fit_feature_width(self, spec: InputSpec, inputs: dict[str, Any], error: BaseException) -> InputSpec | None:
        """After "mat1 and mat2 shapes cannot be multiplied (64x80 and 320x64)" on audio features 80 wide: the spec
        with frames 320 wide (None: no such repair)."""
        match = _MATMUL_MISMATCH.search(str(error))
        features = inputs.get("input_features")
        if match is None or not isinstance(features, torch.Tensor) or features.dim() != 3:
            return None
        have, wanted = int(match.group(2)), int(match.group(3))
        if have not in features.shape[1:] or wanted == have or wanted == spec.feature_width or wanted > 8192:
            return None
        return dataclasses.replace(spec, feature_width=wanted)

    def note_mismatch(self, spec: InputSpec, modality: str, error: BaseException) -> InputSpec | None:
        """After an error like 'tokens: 3, features: 16': the spec with 16 placeholders for `modality` (None: the
        error names no count, or the spec has it already)."""
        match = _TOKENS_MISMATCH.search(str(error))
        if not match:
            return None
        wanted = int(match.group(2))
        current = spec.counted(modality)
        if current is None:
            current = self._counted_features.get(modality)
        if wanted <= 0 or current == wanted:
            return None
        return spec.with_count(modality, wanted)

    # --- the prompt ---------------------------------------------------------------------------------------------

    def prompt(
        self, spec: InputSpec, draw: Draw, media: dict[str, dict[str, Any]]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`input_ids` [1, L] with placeholder runs for each modality in `media`, and `mm_token_type_ids`."""
        pieces: list[torch.Tensor] = []
        types: list[torch.Tensor] = []
        head = self.text_tokens(draw, 3)
        pieces.append(head)
        types.append(torch.zeros(len(head), dtype=torch.long))
        marked = False
        for modality, inputs in media.items():
            if modality not in _PLACEHOLDERS:
                continue
            placeholder = self._token(_PLACEHOLDERS[modality])
            if placeholder is None:
                continue
            count = self.count_features(spec, modality, inputs) or 1
            opener, closer = self._token(_OPENERS[modality]), self._token(_CLOSERS[modality])
            if opener is not None and opener != placeholder:
                pieces.append(torch.tensor([opener]))
                types.append(torch.zeros(1, dtype=torch.long))
            pieces.append(torch.full((count,), placeholder, dtype=torch.long))
            types.append(torch.full((count,), _MODALITY_TYPE[modality], dtype=torch.long))
            marked = True
            if closer is not None and closer != placeholder:
                pieces.append(torch.tensor([closer]))
                types.append(torch.zeros(1, dtype=torch.long))
        so_far = sum(len(piece) for piece in pieces)
        length = SEQUENCE_LENGTH - 3 if spec.text_length is None else max(1, spec.text_length - so_far)
        tail = self.text_tokens(draw, length)
        pieces.append(tail)
        types.append(torch.zeros(len(tail), dtype=torch.long))
        input_ids = torch.cat(pieces).unsqueeze(0).repeat(BATCH_SIZE, 1).to(self.device)
        token_types = torch.cat(types).unsqueeze(0).repeat(BATCH_SIZE, 1).to(self.device) if marked else None
        return input_ids, token_types

    # --- candidate sets -----------------------------------------------------------------------------------------

    def modalities(self) -> list[str]:
        """The modalities the forward signature takes, in the order of `MODALITY_RULES`."""
        found: list[str] = []
        for rule in MODALITY_RULES:
            if rule.takes(self, found):
                found.append(rule.modality)
        return found

    def series_inputs(self, draw: Draw) -> dict[str, Any]:
        """A time series (PatchTST, Informer, TimesFM): past values over the context plus the lags, time
        features, observed masks, and the future window for the encoder-decoder forecasters."""
        config = self.config
        prediction = _int(getattr(config, "prediction_length", None), 8)
        context = _int(getattr(config, "context_length", None), prediction) or prediction
        lags = getattr(config, "lags_sequence", None)
        past = context + (max(lags) if isinstance(lags, (list, tuple)) and lags else 0)
        channels = _int(_first([config], "num_input_channels", "input_size"), 1)
        values_shape = (
            (BATCH_SIZE, past)
            if channels == 1 and not hasattr(config, "num_input_channels")
            else (BATCH_SIZE, past, channels)
        )
        inputs: dict[str, Any] = {"past_values": draw.randn(*values_shape)}
        time_features = _int(getattr(config, "num_time_features", None), 0) + _int(
            getattr(config, "num_dynamic_real_features", None), 0
        )
        for name, shape in (
            ("past_observed_mask", values_shape),
            ("observed_mask", values_shape),
            ("past_values_padding", values_shape[:2]),
        ):
            if self.takes(name):
                inputs[name] = (
                    torch.ones(shape, device=self.device) if "mask" in name else torch.zeros(shape, device=self.device)
                )
        if self.takes("past_time_features"):
            inputs["past_time_features"] = draw.randn(BATCH_SIZE, past, time_features)
        if self.takes("freq"):
            inputs["freq"] = torch.zeros(BATCH_SIZE, 1, dtype=torch.long, device=self.device)
        if self.takes("future_time_features") and getattr(config, "is_encoder_decoder", False):
            future_shape = (BATCH_SIZE, prediction) if len(values_shape) == 2 else (BATCH_SIZE, prediction, channels)
            inputs["future_values"] = draw.randn(*future_shape)
            inputs["future_time_features"] = draw.randn(BATCH_SIZE, prediction, time_features)
        static_real = _int(getattr(config, "num_static_real_features", None), 0)
        if self.takes("static_real_features") and static_real:
            inputs["static_real_features"] = draw.randn(BATCH_SIZE, static_real)
        categorical = _int(getattr(config, "num_static_categorical_features", None), 0)
        if self.takes("static_categorical_features") and categorical:
            # category 0 exists whatever each feature's cardinality
            inputs["static_categorical_features"] = torch.tensor(
                [[0] * categorical] * BATCH_SIZE, dtype=torch.long, device=self.device
            )
        return inputs

    def trajectory_inputs(self, draw: Draw) -> dict[str, Any]:
        """A reinforcement-learning trajectory (Decision Transformer): states, actions, rewards, returns, steps."""
        length = SEQUENCE_LENGTH
        state = _int(getattr(self.config, "state_dim", None), 4)
        action = _int(getattr(self.config, "act_dim", None), 2)
        inputs = {
            "states": draw.randn(BATCH_SIZE, length, state),
            "actions": draw.randn(BATCH_SIZE, length, action),
            "rewards": draw.randn(BATCH_SIZE, length, 1),
            "returns_to_go": draw.randn(BATCH_SIZE, length, 1),
            "timesteps": torch.arange(length, device=self.device).unsqueeze(0),
        }
        if self.takes("attention_mask"):
            inputs["attention_mask"] = torch.ones(BATCH_SIZE, length, dtype=torch.long, device=self.device)
        return {name: value for name, value in inputs.items() if self.takes(name)}

    def build(self, spec: InputSpec) -> dict[str, Any]:
        """One input set with `spec.modalities` (a subset of `self.modalities()`) and text when the model takes it,
        on the CPU (`inputs` converts it for the model). The same spec gives the same tensors."""
        draw = self.draw()
        media: dict[str, dict[str, Any]] = {}
        for modality in spec.modalities:
            if modality == "image":
                media["image"] = self.image_inputs(spec, draw)
            elif modality == "video":
                media["video"] = self.video_inputs(draw)
            elif modality == "audio":
                media["audio"] = self.audio_inputs(spec, draw)
            elif modality == "series":
                media["series"] = self.series_inputs(draw)
            elif modality == "embeddings":
                media["embeddings"] = self.embeddings_inputs(draw)
            elif modality == "trajectory":
                media["trajectory"] = self.trajectory_inputs(draw)
        inputs: dict[str, Any] = {}
        for values in media.values():
            inputs.update(values)
        if self.takes("input_ids"):
            inputs.update(self._text_inputs(spec, draw, media))
        elif self.takes("decoder_input_ids") and getattr(self.config, "is_encoder_decoder", False):
            # Speech / vision encoder-decoders (Whisper, Speech2Text): the text side is the decoder's.
            inputs["decoder_input_ids"] = self.text_tokens(draw, DECODER_SEQUENCE_LENGTH).unsqueeze(0).to(self.device)
        for rule in COMPANION_INPUTS:
            if rule.needed(self, inputs):
                inputs.update(rule.make(self, inputs, draw))
        if self.takes("use_cache"):
            inputs["use_cache"] = False
        return inputs

    def inputs(self, spec: InputSpec) -> dict[str, Any]:
        """`build(spec)` converted for the model (moved to the meta device in shape-only mode)."""
        return {key: self.convert(value) for key, value in self.build(spec).items()}

    def embeddings_inputs(self, draw: Draw) -> dict[str, Any]:
        """`inputs` that are not token ids: a speech encoder-decoder's raw samples, or ready-made embeddings."""
        encoder = getattr(self.config, "encoder", None)
        if encoder is not None and hasattr(encoder, "conv_dim"):
            # A speech encoder-decoder: `inputs` are the encoder's raw samples.
            return {"inputs": draw.randn(BATCH_SIZE, AUDIO_SAMPLES)}
        # Perceiver without a preprocessor: ready-made embeddings of the model's input width.
        width = _int(_first([self.config], *HIDDEN_WIDTH_NAMES), 64)
        return {"inputs": draw.randn(BATCH_SIZE, SEQUENCE_LENGTH, width)}

    def _text_inputs(self, spec: InputSpec, draw: Draw, media: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """`input_ids` with the media's placeholders, and the masks and types that go with them."""
        inputs: dict[str, Any] = {}
        input_ids, token_types = self.prompt(spec, draw, media)
        codebooks = self._codebooks()
        if spec.style.codebooks == "first":
            input_ids = input_ids.repeat(codebooks, 1)
        elif spec.style.codebooks == "last":
            input_ids = input_ids.unsqueeze(-1).repeat(1, 1, codebooks)
        inputs["input_ids"] = input_ids
        length = input_ids.shape[1]
        if self.takes("attention_mask"):
            inputs["attention_mask"] = torch.ones(BATCH_SIZE, length, dtype=torch.long, device=self.device)
        if self.takes("token_type_ids") and self._type_vocab():
            inputs["token_type_ids"] = torch.zeros(BATCH_SIZE, length, dtype=torch.long, device=self.device)
        if self.takes("mm_token_type_ids") and token_types is not None:
            inputs["mm_token_type_ids"] = token_types
        if self.takes("decoder_input_ids") and (
            getattr(self.config, "is_encoder_decoder", False) or "decoder_input_ids" in self.required()
        ):
            inputs["decoder_input_ids"] = self.text_tokens(draw, DECODER_SEQUENCE_LENGTH).unsqueeze(0).to(self.device)
        return inputs

    def _codebooks(self) -> int:
        return _int(_first(walk_configs(self.config), "num_codebooks"), 0)

    def _type_vocab(self) -> bool:
        value = _first([self.text_config, self.config], "type_vocab_size")
        return isinstance(value, int) and value > 0

    def variants(self) -> Iterator[InputVariant]:
        """Candidate input sets, richest first; each names its modalities and style."""
        modalities = self.modalities()
        layouts = self.audio_layouts() if "audio" in modalities else ["channels_first"]
        seen: list[tuple[str, ...]] = []
        options: list[list[str]] = [modalities]
        # Then drop video, then each other modality, and last text alone (a multimodal LM can run on text).
        if "video" in modalities:
            options.append([m for m in modalities if m != "video"])
        for modality in modalities:
            options.append([m for m in modalities if m != modality and m != "video"])
        options.append([])
        for option in options:
            key = tuple(option)
            if key in seen:
                continue
            seen.append(key)
            styles = self._styles(option, layouts)
            if len(seen) > 1 and len(option) > 1:
                styles = styles[:1]  # other layouts only for the richest set and for single modalities
            for style in styles:
                spec = InputSpec(modalities=key, style=style)
                inputs = self.build(spec)
                if not self._complete(inputs) or not [key for key in inputs if key != "use_cache"]:
                    continue
                inputs = {name: self.convert(value) for name, value in inputs.items()}
                name = "+".join(["text"] * ("input_ids" in inputs) + option) or "no inputs"
                details = [style.layout.replace("_", " ")] if "audio" in option and len(layouts) > 1 else []
                details += style.details()
                if details:
                    name += f" ({', '.join(details)})"
                yield InputVariant(name, spec, inputs)

    def _styles(self, option: list[str], layouts: list[str]) -> list[InputStyle]:
        """Ways of laying out one modality set: the plain one per audio layout, then the `STYLE_RULES` that fit
        (tried only when the plain one fails)."""
        styles = [InputStyle(layout=layout) for layout in (layouts if "audio" in option else layouts[:1])]
        first = styles[0]
        for rule in STYLE_RULES:
            if rule.fits(self, option):
                styles.append(dataclasses.replace(first, **rule.style))
        return styles

    def _complete(self, inputs: dict[str, Any]) -> bool:
        return not [name for name in self.required() if name not in inputs]

    def missing(self) -> list[str]:
        """The required forward inputs that no modality of the model gives."""
        best = self.build(InputSpec(modalities=tuple(self.modalities())))
        return [name for name in self.required() if name not in best]


# --- family rules: rows with their reason --------------------------------------------------------------------


@dataclass(frozen=True)
class ModalityRule:
    """A modality the model takes when `takes(synthesizer, found so far)`; `reason`: which models."""

    modality: str
    takes: Callable[[InputSynthesizer, list[str]], bool]
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

    fits: Callable[[InputSynthesizer], bool]
    make: Callable[[InputSynthesizer, InputSpec, Draw], dict[str, Any]]
    reason: str


IMAGE_FORMS = (
    ImageForm(
        lambda s: s.takes("image_grid_thw") or s.takes("grid_thw") or s.takes("image_grid_hw"),
        InputSynthesizer._grid_images,
        "Qwen-VL-style towers: the flattened patches of one image and its grid (time, height, width)",
    ),
    ImageForm(
        lambda s: s.takes("flattened_patches"),
        InputSynthesizer._flattened_patches,
        "Pix2Struct: variable-resolution patches, each row [row id, column id, channels × patch²]",
    ),
    ImageForm(
        lambda s: s.takes("spatial_shapes"),
        InputSynthesizer._naflex_patches,
        "NaFlex towers (SigLIP 2): patches [batch, patches, channels × patch²], their grid and a mask of the real ones",
    ),
    ImageForm(
        lambda s: s._pinpoints() is not None,
        InputSynthesizer._tiled_images,
        'LLaVA-NeXT "any resolution": the image at a pinpoint size cut into tiles of the tower\'s size, plus the '
        "whole image resized: [batch, tiles + 1, channels, size, size]",
    ),
    ImageForm(
        lambda s: True,
        InputSynthesizer._pixel_images,
        "every other vision model: [batch, channels, height, width] at the config's image size (frames for video "
        "classifiers), with the mask and sizes the signature asks for",
    ),
)


@dataclass(frozen=True)
class AudioForm:
    """A way a family takes its audio: the first row that `fits(synthesizer, layout)` `make`s it."""

    fits: Callable[[InputSynthesizer, str], bool]
    make: Callable[[InputSynthesizer, InputSpec, Draw], dict[str, Any]]
    reason: str


AUDIO_FORMS = (
    AudioForm(
        lambda s, layout: layout == "hidden",
        InputSynthesizer._hidden_audio,
        "a model without its speech pre-net (SpeechT5Model): the encoder takes hidden states",
    ),
    AudioForm(
        lambda s, layout: s._mel_bins_in_values() is not None,
        InputSynthesizer._spectrogram_values,
        "a spectrogram in `input_values` (Audio Spectrogram Transformer): [batch, frames, mel bins]",
    ),
    AudioForm(
        lambda s, layout: layout == "raw" or s._prefers_samples(),
        InputSynthesizer._raw_samples,
        "raw samples (wav2vec 2.0, codecs: a multiple of the hop length, channels where the config names them)",
    ),
    AudioForm(
        lambda s, layout: True,
        InputSynthesizer._feature_frames,
        "mel features (Whisper, Speech2Text) in the spec's layout, at the length the encoder expects",
    ),
)


@dataclass(frozen=True)
class StyleRule:
    """Another layout of an input set, tried after the plain one when it `fits` the model and the modalities."""

    fits: Callable[[InputSynthesizer, list[str]], bool]
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
        lambda s, option: s._codebooks() > 1 and s.takes("input_ids"),
        {"codebooks": "first"},
        "token ids per codebook, codebooks first (MusicGen's decoder)",
    ),
    StyleRule(
        lambda s, option: s._codebooks() > 1 and s.takes("input_ids"),
        {"codebooks": "last"},
        "token ids per codebook, codebooks last",
    ),
)


@dataclass(frozen=True)
class CompanionInput:
    """Inputs that travel with the main ones in a family: made when `needed(synthesizer, inputs so far)`."""

    needed: Callable[[InputSynthesizer, dict[str, Any]], bool]
    make: Callable[[InputSynthesizer, dict[str, Any], Draw], dict[str, Any]]
    reason: str


def _image_attention_mask(synthesizer: InputSynthesizer, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    pixels = inputs["pixel_values"]
    images = pixels.shape[1] if pixels.dim() == 5 else 1
    shape = (BATCH_SIZE, inputs["input_ids"].shape[1], images)
    return {"image_attention_mask": torch.ones(*shape, dtype=torch.long, device=synthesizer.device)}


def _boxes(synthesizer: InputSynthesizer, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    length = inputs["input_ids"].shape[1]
    corners = draw.randint(0, 500, (BATCH_SIZE, length, 2))
    sizes = draw.randint(1, 400, (BATCH_SIZE, length, 2))
    return {"bbox": torch.cat([corners, corners + sizes], dim=-1)}


def _qformer_prompt(synthesizer: InputSynthesizer, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    qformer = getattr(synthesizer.config, "qformer_config", None)
    vocab = _int(getattr(qformer, "vocab_size", None), synthesizer.vocab_size())
    extra = {"qformer_input_ids": draw.randint(0, vocab, (BATCH_SIZE, SEQUENCE_LENGTH))}
    if synthesizer.takes("qformer_attention_mask"):
        shape = (BATCH_SIZE, SEQUENCE_LENGTH)
        extra["qformer_attention_mask"] = torch.ones(*shape, dtype=torch.long, device=synthesizer.device)
    return extra


def _latent_query_places(synthesizer: InputSynthesizer, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    queries = _int(getattr(synthesizer.config, "latent_query_num", None), 64)
    input_ids = inputs["input_ids"]
    filler = synthesizer.text_tokens(draw, queries).unsqueeze(0).to(synthesizer.device)
    extra = {"input_ids": torch.cat([input_ids[:, :1], filler, input_ids[:, 1:]], dim=1)}
    mask = torch.zeros_like(extra["input_ids"])
    mask[:, 1 : 1 + queries] = 1
    if "attention_mask" in inputs:
        extra["attention_mask"] = torch.ones_like(extra["input_ids"])
    extra["image_embeds_position_mask"] = mask
    return extra


def _region_features(synthesizer: InputSynthesizer, inputs: dict[str, Any], draw: Draw) -> dict[str, Any]:
    regions = 4
    features = _int(getattr(synthesizer.config, "visual_feat_dim", None), 64)
    position_size = _int(getattr(synthesizer.config, "visual_pos_dim", None), 4)
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


def synthesize_inputs(model: nn.Module, config: Any, seed: int | torch.Generator = 0) -> dict[str, Any]:
    """The richest input set for `model` (no trial run): see `InputSynthesizer`."""
    synthesizer = InputSynthesizer(model, config, seed)
    for variant in synthesizer.variants():
        return variant.inputs
    raise ModelTraceError(
        f"{type(model).__name__}.forward needs {', '.join(synthesizer.missing())}, which ModelTrace cannot "
        "synthesise; pass --recipe with build_inputs(model)"
    )
