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

`input_variants` yields several candidate input sets, richest first (every modality the signature takes, then
fewer); the builder keeps the first one the model runs with.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError


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
# How an input set is laid out beyond its modalities: audio feature layout, LLaVA-NeXT's `image_sizes`, images
# stacked per sample ([batch, images, channels, height, width]: IDEFICS), token ids per codebook (MusicGen).
_PLAIN_STYLE = {"layout": "channels_first", "image_sizes": False, "image_stack": False, "codebooks": None}
_STYLE_NAMES = {"image_sizes": "image sizes", "image_stack": "images per sample", "codebooks": "codebooks"}
# Config hints for the number of placeholder tokens per image, when the model cannot say.
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


def _tree(config: Any) -> list[Any]:
    """`config` and its sub-configs, depth first."""
    found = [config]
    for value in vars(config).values() if hasattr(config, "__dict__") else ():
        if hasattr(value, "to_dict") and hasattr(value, "__dict__") and value is not config:
            found.extend(_tree(value))
    return found


def _int(value: Any, default: int) -> int:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


class InputSynthesizer:
    """Builds candidate input sets for one model; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        seed: int | torch.Generator = 0,
        convert: Callable[[Any], Any] | None = None,
        context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        self.model = model
        self.config = config
        self.seed = seed.initial_seed() if isinstance(seed, torch.Generator) else int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        # `convert` moves each synthesised tensor where the model is (the meta device in shape-only mode), and
        # `context` wraps the model calls made here (counting a tower's features) as it wraps the forward pass.
        self.convert = convert or (lambda value: value)
        self.context = context or contextlib.nullcontext
        self.device = torch.device("cpu")
        self.parameters = forward_parameters(model)
        self.text_config = sub_config(config, "text")
        self.vision_config = sub_config(config, "vision")
        self.audio_config = sub_config(config, "audio")
        self.feature_counts: dict[str, int] = {}
        self.style: dict[str, Any] = dict(_PLAIN_STYLE)
        # The prompt length a model wants (one token per audio frame in a streaming model), learnt from an error
        # naming it (`fit_text_length`); None: the default length.
        self.text_length: int | None = None
        # The width of each audio feature frame, learnt the same way (stacked mel frames: 4 × 80).
        self.feature_width: int | None = None

    # --- helpers ------------------------------------------------------------------------------------------------

    def _has(self, name: str) -> bool:
        return name in self.parameters

    def _required(self) -> list[str]:
        return [
            name
            for name, parameter in self.parameters.items()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        ]

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator).to(self.device)

    def _randint(self, low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, max(high, low + 1), shape, generator=self.generator).to(self.device)

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

    def text_tokens(self, count: int) -> torch.Tensor:
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
        choice = torch.randint(0, len(pool), (count,), generator=self.generator)
        return torch.tensor([pool[index] for index in choice.tolist()], dtype=torch.long)

    def _token(self, names: tuple[str, ...]) -> int | None:
        for config in (self.config, self.text_config):
            for name in names:
                value = getattr(config, name, None)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    return value
        return None

    # --- modalities ---------------------------------------------------------------------------------------------

    def image_inputs(self) -> dict[str, Any]:
        """`pixel_values` (+ grid / size / mask inputs the signature takes) for one image."""
        vision = self.vision_config
        channels = _int(
            _first(
                [vision, self.config], "num_channels", "in_channels", "in_chans", "input_channels", "image_channels"
            ),
            3,
        )
        patch = _int(_first([vision, self.config], "patch_size", "spatial_patch_size"), 16)
        if self._has("image_grid_thw") or self._has("grid_thw") or self._has("image_grid_hw"):
            return self._patch_images(vision, channels, patch)
        if self._has("flattened_patches"):
            # Pix2Struct: variable-resolution patches, each row [row id, column id, channels × patch²].
            width = _int(_first([vision, self.config], "patch_embed_hidden_size"), channels * patch * patch)
            side = 4
            positions = torch.tensor(
                [[row + 1, column + 1] for row in range(side) for column in range(side)],
                dtype=torch.float32,
                device=self.device,
            )
            patches = torch.cat([positions, self._randn(side * side, width)], dim=-1).unsqueeze(0)
            inputs = {"flattened_patches": patches.repeat(BATCH_SIZE, 1, 1)}
            if self._has("attention_mask"):
                inputs["attention_mask"] = torch.ones(BATCH_SIZE, side * side, device=self.device)
            return inputs
        if self._has("spatial_shapes"):
            # NaFlex towers (SigLIP 2): patches flattened to [batch, patches, channels × patch²], with their
            # grid and a mask of the real patches.
            side = max(1, math.isqrt(_int(_first([vision, self.config], "num_patches", "max_num_patches"), 64)) // 2)
            count = side * side
            inputs = {
                "pixel_values": self._randn(BATCH_SIZE, count, channels * patch * patch),
                "spatial_shapes": torch.tensor([[side, side]] * BATCH_SIZE, device=self.device),
            }
            if self._has("pixel_attention_mask"):
                inputs["pixel_attention_mask"] = torch.ones(BATCH_SIZE, count, dtype=torch.long, device=self.device)
            return inputs
        size = _first([vision, self.config], "image_size", "img_size", "input_size", "resolution", "max_img_size")
        if isinstance(size, dict):
            size = size.get("height") or size.get("shortest_edge")
        if isinstance(size, (list, tuple)) and len(size) >= 2:
            height, width = int(size[-2]), int(size[-1])
        else:
            height = width = _int(size, DEFAULT_IMAGE_SIZE)
        windows = _first([vision, self.config], "num_windows")
        if isinstance(windows, int) and windows > 1 and patch > 0 and isinstance(size, int):
            # A patch grid cut into windows × windows (RF-DETR's windowed DINOv2): a multiple of the windows.
            side = max(windows, height // patch // windows * windows)
            height = width = side * patch
        frames = _first([vision, self.config], "num_frames")
        pinpoints = _first([self.config, vision], "image_grid_pinpoints")
        if isinstance(pinpoints, (list, tuple)) and pinpoints and isinstance(pinpoints[0], (list, tuple)):
            # LLaVA-NeXT "any resolution": the image at one of the pinpoint sizes, cut into tiles of the tower's
            # size, plus the whole image resized: [batch, tiles + 1, channels, size, size].
            full_height, full_width = int(pinpoints[0][0]), int(pinpoints[0][1])
            tiles = max(1, full_height // height) * max(1, full_width // width) + 1
            inputs = {"pixel_values": self._randn(BATCH_SIZE, tiles, channels, height, width)}
            if self._has("image_sizes"):
                inputs["image_sizes"] = torch.tensor([[full_height, full_width]] * BATCH_SIZE, device=self.device)
            return inputs
        if isinstance(frames, int) and frames > 1 and self._video_in_pixel_values():
            pixel_values = self._randn(BATCH_SIZE, frames, channels, height, width)
        else:
            pixel_values = self._randn(BATCH_SIZE, channels, height, width)
        inputs: dict[str, Any] = {"pixel_values": pixel_values}
        if self._has("pixel_mask"):
            inputs["pixel_mask"] = torch.ones(BATCH_SIZE, height, width, dtype=torch.long, device=self.device)
        if self.style["image_stack"] == "pair":  # keypoint matchers (SuperGlue, LightGlue) take two images
            pixel_values = torch.stack([pixel_values, self._randn(*pixel_values.shape)], dim=1)
        elif self.style["image_stack"]:
            pixel_values = pixel_values.unsqueeze(1)
        inputs["pixel_values"] = pixel_values
        if self._has("image_sizes") and (self.style["image_sizes"] or "image_sizes" in self._required()):
            inputs["image_sizes"] = torch.tensor([[height, width]] * BATCH_SIZE, device=self.device)
        return inputs

    def _video_in_pixel_values(self) -> bool:
        # Video classifiers (VideoMAE, TimeSformer, ViViT) take frames in `pixel_values`; multimodal models that
        # also take images have a separate `pixel_values_videos`.
        return not self._has("pixel_values_videos")

    def _patch_images(self, vision: Any, channels: int, patch: int, video: bool = False) -> dict[str, Any]:
        configs = [vision, *_tree(self.config)]
        merge = _int(_first(configs, "spatial_merge_size", "merge_size"), 1)
        temporal = _int(_first(configs, "temporal_patch_size"), 1)
        side = 2 * merge
        frames = 2 if video else 1
        grid = torch.tensor([[frames, side, side]], device=self.device)
        patches = frames * side * side
        pixel_values = self._randn(patches, channels * temporal * patch * patch)
        if video:
            return {"pixel_values_videos": pixel_values, "video_grid_thw": grid}
        if self._has("image_grid_thw"):
            return {"pixel_values": pixel_values, "image_grid_thw": grid}
        if self._has("image_grid_hw"):
            return {"pixel_values": pixel_values, "image_grid_hw": grid[:, 1:]}
        return {"pixel_values": pixel_values, "grid_thw": grid}

    def video_inputs(self) -> dict[str, Any]:
        vision = self.vision_config
        channels = _int(_first([vision, self.config], "num_channels", "in_channels"), 3)
        patch = _int(_first([vision, self.config], "patch_size"), 16)
        if self._has("video_grid_thw"):
            return self._patch_images(vision, channels, patch, video=True)
        size = _int(_first([vision, self.config], "image_size"), DEFAULT_IMAGE_SIZE)
        frames = _int(_first([vision, self.config], "num_frames"), 2)
        return {"pixel_values_videos": self._randn(BATCH_SIZE, frames, channels, size, size)}

    def audio_inputs(self, layout: str = "channels_first") -> dict[str, Any]:
        audio = self.audio_config
        if layout == "hidden":
            # A model without its speech pre-net (SpeechT5Model): the encoder takes hidden states.
            name = "input_values" if self._has("input_values") else "input_features"
            width = _int(_first([audio, self.config], "hidden_size", "d_model"), 64)
            hidden = {name: self._randn(BATCH_SIZE, SEQUENCE_LENGTH, width)}
            if self._has("decoder_input_values"):
                hidden["decoder_input_values"] = self._randn(BATCH_SIZE, DECODER_SEQUENCE_LENGTH, width)
            return hidden
        mel_bins = _first([audio, self.config], "num_mel_bins")
        if self._has("input_values") and isinstance(mel_bins, int) and not self._has("input_features"):
            # A spectrogram in `input_values` (Audio Spectrogram Transformer): [batch, frames, mel bins].
            frames = _int(_first([audio, self.config], "max_length"), FEATURE_FRAMES)
            return {"input_values": self._randn(BATCH_SIZE, frames, mel_bins)}
        if (
            layout == "raw"
            or self._has("input_values")
            and (not self._has("input_features") or "input_values" in self._required())
        ):
            channels = _int(_first([audio, self.config], "audio_channels", "num_channels"), 0)
            hop = _int(_first([audio, self.config], "hop_length", "frame_size"), 0)
            ratios = _first([audio, self.config], "upsampling_ratios", "downsampling_ratios")
            if not hop and isinstance(ratios, (list, tuple)) and ratios:
                hop = math.prod(int(ratio) for ratio in ratios)
            samples = hop * 16 if hop else AUDIO_SAMPLES
            if layout == "image_like":  # a channel axis the config does not name (mono codecs)
                channels = channels or 1
            shape = (BATCH_SIZE, channels, samples) if channels else (BATCH_SIZE, samples)
            raw = {"input_values": self._randn(*shape)}
            if "input_features" in self._required():  # codecs that take the samples and their features (NeuCodec)
                raw.update(self._features("channels_last"))
            return raw
        return self._features(layout)

    def _features(self, layout: str) -> dict[str, Any]:
        audio = self.audio_config
        bins = _int(
            _first(
                [audio, self.config, *_tree(self.config)],
                "feature_projection_input_dim",
                "num_mel_bins",
                "feature_size",
                "input_feat_per_channel",
                "n_mels",
                "input_dim",
                "feature_dim",
                "num_mels",
            ),
            80,
        )
        channels = _int(_first([audio, self.config], "input_channels"), 1)
        if getattr(audio, "input_feat_per_channel", None):
            bins = bins * max(channels, 1)
        if self.feature_width is not None:
            bins = self.feature_width
        positions = _first([audio, self.config], "max_source_positions")
        frames = 2 * int(positions) if isinstance(positions, int) and positions > 0 else FEATURE_FRAMES
        if layout == "channels_first":
            features = self._randn(BATCH_SIZE, bins, frames)
        else:
            features = self._randn(BATCH_SIZE, frames, bins)
        if layout == "image_like":  # a one-channel spectrogram image (CLAP): [batch, 1, frames, bins]
            features = features.unsqueeze(1)
        inputs: dict[str, Any] = {"input_features": features}
        for mask_name in ("input_features_mask", "feature_attention_mask"):
            if self._has(mask_name):
                inputs[mask_name] = torch.ones(BATCH_SIZE, frames, dtype=torch.long, device=self.device)
        return inputs

    def audio_layouts(self) -> list[str]:
        """The feature layout the model's first audio layer suggests first, then the other ones; raw samples last
        for a model that takes both (a speech encoder-decoder whose encoder is wav2vec2-like)."""
        if self._has("input_values") and (not self._has("input_features") or "input_values" in self._required()):
            return ["channels_first", "image_like", "hidden"]  # raw samples, with a channel axis, as hidden states
        raw = ["raw"] if self._has("input_values") else []
        return [*self._feature_layouts(), *raw]

    def _feature_layouts(self) -> list[str]:
        bins = _int(
            _first(
                [self.audio_config, self.config],
                "feature_projection_input_dim",
                "num_mel_bins",
                "feature_size",
                "input_feat_per_channel",
                "n_mels",
                "input_dim",
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
        if self._has("input_features") and not hasattr(self.config, "max_source_positions"):
            return ["channels_last", "channels_first", "image_like", "hidden"]
        return ["channels_first", "channels_last", "image_like", "hidden"]

    # --- feature counts for placeholder tokens -----------------------------------------------------------------

    def count_features(self, modality: str, media: dict[str, Any]) -> int | None:
        """How many placeholder tokens the model wants for `media`: ask its `get_{modality}_features`."""
        if modality in self.feature_counts:
            return self.feature_counts[modality]
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
        self.feature_counts[modality] = count
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

    def fit_text_length(self, inputs: dict[str, Any], error: BaseException) -> bool:
        """After "The size of tensor a (7) must match the size of tensor b (8) at non-singleton dimension 1", where
        one side is the prompt's length: the prompt gets the other length. True if it changed."""
        match = _SIZE_MISMATCH.search(str(error))
        input_ids = inputs.get("input_ids")
        if match is None or not isinstance(input_ids, torch.Tensor) or input_ids.dim() < 2:
            return False
        first, second = int(match.group(1)), int(match.group(2))
        lengths = {input_ids.shape[1], input_ids.shape[-1]}
        wanted = second if first in lengths else first if second in lengths else None
        if wanted is None or wanted in lengths or not 1 < wanted <= 4096 or wanted == self.text_length:
            return False
        self.text_length = wanted
        return True

    def fit_feature_width(self, inputs: dict[str, Any], error: BaseException) -> bool:
        """After "mat1 and mat2 shapes cannot be multiplied (64x80 and 320x64)" on audio features 80 wide: frames
        320 wide. True if it changed."""
        match = _MATMUL_MISMATCH.search(str(error))
        features = inputs.get("input_features")
        if match is None or not isinstance(features, torch.Tensor) or features.dim() != 3:
            return False
        have, wanted = int(match.group(2)), int(match.group(3))
        if have not in features.shape[1:] or wanted == have or wanted == self.feature_width or wanted > 8192:
            return False
        self.feature_width = wanted
        return True

    def note_mismatch(self, modality: str, error: BaseException) -> bool:
        """After an error like 'tokens: 3, features: 16', remember 16 for `modality`; True if it changed."""
        match = _TOKENS_MISMATCH.search(str(error))
        if not match:
            return False
        wanted = int(match.group(2))
        if wanted <= 0 or self.feature_counts.get(modality) == wanted:
            return False
        self.feature_counts[modality] = wanted
        return True

    # --- the prompt ---------------------------------------------------------------------------------------------

    def prompt(self, media: dict[str, dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`input_ids` [1, L] with placeholder runs for each modality in `media`, and `mm_token_type_ids`."""
        pieces: list[torch.Tensor] = []
        types: list[torch.Tensor] = []
        head = self.text_tokens(3)
        pieces.append(head)
        types.append(torch.zeros(len(head), dtype=torch.long))
        marked = False
        for modality, inputs in media.items():
            if modality not in _PLACEHOLDERS:
                continue
            placeholder = self._token(_PLACEHOLDERS[modality])
            if placeholder is None:
                continue
            count = self.count_features(modality, inputs) or 1
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
        tail = self.text_tokens(SEQUENCE_LENGTH - 3 if self.text_length is None else max(1, self.text_length - so_far))
        pieces.append(tail)
        types.append(torch.zeros(len(tail), dtype=torch.long))
        input_ids = torch.cat(pieces).unsqueeze(0).repeat(BATCH_SIZE, 1).to(self.device)
        token_types = torch.cat(types).unsqueeze(0).repeat(BATCH_SIZE, 1).to(self.device) if marked else None
        return input_ids, token_types

    # --- candidate sets -----------------------------------------------------------------------------------------

    def modalities(self) -> list[str]:
        found = []
        if self._has("pixel_values") or self._has("flattened_patches"):
            found.append("image")
        if self._has("pixel_values_videos"):
            found.append("video")
        if self._has("input_features") or self._has("input_values") or self._has("audio_values"):
            found.append("audio")
        if self._has("past_values"):
            found.append("series")
        if self._has("inputs") and not found and ("inputs" in self._required() or not self._has("input_ids")):
            found.append("embeddings")
        if self._has("states") and self._has("actions"):
            found.append("trajectory")
        return found

    def series_inputs(self) -> dict[str, Any]:
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
        inputs: dict[str, Any] = {"past_values": self._randn(*values_shape)}
        time_features = _int(getattr(config, "num_time_features", None), 0) + _int(
            getattr(config, "num_dynamic_real_features", None), 0
        )
        for name, shape in (
            ("past_observed_mask", values_shape),
            ("observed_mask", values_shape),
            ("past_values_padding", values_shape[:2]),
        ):
            if self._has(name):
                inputs[name] = (
                    torch.ones(shape, device=self.device) if "mask" in name else torch.zeros(shape, device=self.device)
                )
        if self._has("past_time_features"):
            inputs["past_time_features"] = self._randn(BATCH_SIZE, past, time_features)
        if self._has("freq"):
            inputs["freq"] = torch.zeros(BATCH_SIZE, 1, dtype=torch.long, device=self.device)
        if self._has("future_time_features") and getattr(config, "is_encoder_decoder", False):
            future_shape = (BATCH_SIZE, prediction) if len(values_shape) == 2 else (BATCH_SIZE, prediction, channels)
            inputs["future_values"] = self._randn(*future_shape)
            inputs["future_time_features"] = self._randn(BATCH_SIZE, prediction, time_features)
        static_real = _int(getattr(config, "num_static_real_features", None), 0)
        if self._has("static_real_features") and static_real:
            inputs["static_real_features"] = self._randn(BATCH_SIZE, static_real)
        categorical = _int(getattr(config, "num_static_categorical_features", None), 0)
        if self._has("static_categorical_features") and categorical:
            # category 0 exists whatever each feature's cardinality
            inputs["static_categorical_features"] = torch.tensor(
                [[0] * categorical] * BATCH_SIZE, dtype=torch.long, device=self.device
            )
        return inputs

    def trajectory_inputs(self) -> dict[str, Any]:
        """A reinforcement-learning trajectory (Decision Transformer): states, actions, rewards, returns, steps."""
        length = SEQUENCE_LENGTH
        state = _int(getattr(self.config, "state_dim", None), 4)
        action = _int(getattr(self.config, "act_dim", None), 2)
        inputs = {
            "states": self._randn(BATCH_SIZE, length, state),
            "actions": self._randn(BATCH_SIZE, length, action),
            "rewards": self._randn(BATCH_SIZE, length, 1),
            "returns_to_go": self._randn(BATCH_SIZE, length, 1),
            "timesteps": torch.arange(length, device=self.device).unsqueeze(0),
        }
        if self._has("attention_mask"):
            inputs["attention_mask"] = torch.ones(BATCH_SIZE, length, dtype=torch.long, device=self.device)
        return {name: value for name, value in inputs.items() if self._has(name)}

    def build(self, modalities: list[str], audio_layout: str = "channels_first") -> dict[str, Any]:
        """One input set with `modalities` (a subset of `self.modalities()`) and text when the model takes it.

        The same arguments give the same tensors: the generator restarts from the seed.
        """
        self.generator.manual_seed(self.seed)
        media: dict[str, dict[str, Any]] = {}
        for modality in modalities:
            if modality == "image":
                media["image"] = self.image_inputs()
            elif modality == "video":
                media["video"] = self.video_inputs()
            elif modality == "audio":
                media["audio"] = self.audio_inputs(audio_layout)
            elif modality == "series":
                media["series"] = self.series_inputs()
            elif modality == "embeddings":
                encoder = getattr(self.config, "encoder", None)
                if encoder is not None and hasattr(encoder, "conv_dim"):
                    # A speech encoder-decoder: `inputs` are the encoder's raw samples.
                    media["embeddings"] = {"inputs": self._randn(BATCH_SIZE, AUDIO_SAMPLES)}
                else:
                    # Perceiver without a preprocessor: ready-made embeddings of the model's input width.
                    width = _int(_first([self.config], "d_model", "hidden_size", "embed_dim"), 64)
                    media["embeddings"] = {"inputs": self._randn(BATCH_SIZE, SEQUENCE_LENGTH, width)}
            elif modality == "trajectory":
                media["trajectory"] = self.trajectory_inputs()
        inputs: dict[str, Any] = {}
        for values in media.values():
            inputs.update(values)
        if self._has("input_ids"):
            input_ids, token_types = self.prompt(media)
            codebooks = _int(_first(_tree(self.config), "num_codebooks"), 0)
            if self.style["codebooks"] == "first":
                input_ids = input_ids.repeat(codebooks, 1)
            elif self.style["codebooks"] == "last":
                input_ids = input_ids.unsqueeze(-1).repeat(1, 1, codebooks)
            inputs["input_ids"] = input_ids
            length = input_ids.shape[1]
            if self._has("attention_mask"):
                inputs["attention_mask"] = torch.ones(BATCH_SIZE, length, dtype=torch.long, device=self.device)
            if self._has("token_type_ids") and self._type_vocab():
                inputs["token_type_ids"] = torch.zeros(BATCH_SIZE, length, dtype=torch.long, device=self.device)
            if self._has("mm_token_type_ids") and token_types is not None:
                inputs["mm_token_type_ids"] = token_types
            if self._has("decoder_input_ids") and (
                getattr(self.config, "is_encoder_decoder", False) or "decoder_input_ids" in self._required()
            ):
                inputs["decoder_input_ids"] = self.text_tokens(DECODER_SEQUENCE_LENGTH).unsqueeze(0).to(self.device)
        elif self._has("decoder_input_ids") and getattr(self.config, "is_encoder_decoder", False):
            # Speech / vision encoder-decoders (Whisper, Speech2Text): the text side is the decoder's.
            inputs["decoder_input_ids"] = self.text_tokens(DECODER_SEQUENCE_LENGTH).unsqueeze(0).to(self.device)
        if self._has("image_attention_mask") and "input_ids" in inputs and "pixel_values" in inputs:
            # Which images each token attends to (IDEFICS): every token, every image of its sample.
            pixels = inputs["pixel_values"]
            images = pixels.shape[1] if pixels.dim() == 5 else 1
            inputs["image_attention_mask"] = torch.ones(
                BATCH_SIZE, inputs["input_ids"].shape[1], images, dtype=torch.long, device=self.device
            )
        if self._has("bbox") and "input_ids" in inputs:
            inputs["bbox"] = self._boxes(inputs["input_ids"].shape[1])
        inputs.update(self._companion_inputs(inputs))
        if self._has("use_cache"):
            inputs["use_cache"] = False
        return inputs

    def _companion_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Inputs that travel with the main ones in a few families: a Q-Former prompt (InstructBLIP), region
        features and boxes (LXMERT), a language id (XLM)."""
        extra: dict[str, Any] = {}
        if self._has("qformer_input_ids") and "input_ids" in inputs:
            vocab = _int(getattr(getattr(self.config, "qformer_config", None), "vocab_size", None), self.vocab_size())
            extra["qformer_input_ids"] = self._randint(0, vocab, (BATCH_SIZE, SEQUENCE_LENGTH))
            if self._has("qformer_attention_mask"):
                extra["qformer_attention_mask"] = torch.ones(
                    BATCH_SIZE, SEQUENCE_LENGTH, dtype=torch.long, device=self.device
                )
        if self._has("image_embeds_position_mask") and "pixel_values" in inputs and "input_ids" in inputs:
            # Kosmos-2: the image's latent queries take the places the mask marks, right after the first token.
            queries = _int(getattr(self.config, "latent_query_num", None), 64)
            input_ids = inputs["input_ids"]
            filler = self.text_tokens(queries).unsqueeze(0).to(self.device)
            inputs["input_ids"] = torch.cat([input_ids[:, :1], filler, input_ids[:, 1:]], dim=1)
            mask = torch.zeros_like(inputs["input_ids"])
            mask[:, 1 : 1 + queries] = 1
            extra["image_embeds_position_mask"] = mask
            if "attention_mask" in inputs:
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if self._has("visual_feats") and self._has("visual_pos"):
            regions = 4
            features = _int(getattr(self.config, "visual_feat_dim", None), 64)
            extra["visual_feats"] = self._randn(BATCH_SIZE, regions, features)
            position_size = _int(getattr(self.config, "visual_pos_dim", None), 4)
            extra["visual_pos"] = torch.rand(BATCH_SIZE, regions, position_size, generator=self.generator).to(
                self.device
            )
        return extra

    def _type_vocab(self) -> bool:
        value = _first([self.text_config, self.config], "type_vocab_size")
        return isinstance(value, int) and value > 0

    def _boxes(self, length: int) -> torch.Tensor:
        corners = self._randint(0, 500, (BATCH_SIZE, length, 2))
        sizes = self._randint(1, 400, (BATCH_SIZE, length, 2))
        return torch.cat([corners, corners + sizes], dim=-1)

    def variants(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Candidate input sets, richest first; each names its modalities."""
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
                self.style = style
                inputs = self.build(option, style["layout"])
                if not self._complete(inputs) or not [key for key in inputs if key != "use_cache"]:
                    continue
                inputs = {key: self.convert(value) for key, value in inputs.items()}
                name = "+".join(["text"] * ("input_ids" in inputs) + option) or "no inputs"
                details = [style["layout"].replace("_", " ")] if "audio" in option and len(layouts) > 1 else []
                details += [_STYLE_NAMES[key] for key in ("image_sizes", "image_stack", "codebooks") if style[key]]
                if style["image_stack"] == "pair":
                    details[-1] = "image pair"
                if details:
                    name += f" ({', '.join(details)})"
                yield name, inputs
        self.style = dict(_PLAIN_STYLE)

    def _styles(self, option: list[str], layouts: list[str]) -> list[dict[str, Any]]:
        """Ways of laying out one modality set, the common one first (tried only when it fails)."""
        styles = [{**_PLAIN_STYLE, "layout": layout} for layout in (layouts if "audio" in option else layouts[:1])]
        first = styles[0]
        if "image" in option:
            if self._has("image_sizes"):
                styles.append({**first, "image_sizes": True})
            styles.append({**first, "image_stack": True})
            styles.append({**first, "image_stack": "pair"})
        codebooks = _int(_first(_tree(self.config), "num_codebooks"), 0)
        if codebooks > 1 and self._has("input_ids"):
            styles.append({**first, "codebooks": "first"})
            styles.append({**first, "codebooks": "last"})
        return styles

    def _complete(self, inputs: dict[str, Any]) -> bool:
        return not [name for name in self._required() if name not in inputs]

    def missing(self) -> list[str]:
        best = self.build(self.modalities())
        return [name for name in self._required() if name not in best]


def synthesize_inputs(model: nn.Module, config: Any, seed: int | torch.Generator = 0) -> dict[str, Any]:
    """The richest input set for `model` (no trial run): see `InputSynthesizer`."""
    synthesizer = InputSynthesizer(model, config, seed)
    for _, inputs in synthesizer.variants():
        return inputs
    raise ModelTraceError(
        f"{type(model).__name__}.forward needs {', '.join(synthesizer.missing())}, which ModelTrace cannot "
        "synthesise; pass --recipe with build_inputs(model)"
    )
