"""The per-modality builders of the input synthesiser: text tokens, images, video, audio, series, trajectories.

`MediaInputs` holds what is fixed for one model (its forward signature, its configs) and makes each modality's
tensors for an `InputSpec` and a `Draw` (`input_spec.py`): ordinary token ids (never a special id), images in each
family's layout (pixels, flattened patches, NaFlex patches, LLaVA-NeXT tiles, Qwen-VL grids), video frames,
audio as raw samples, mel features in any layout, or a spectrogram, a time series with its masks and time
features, a reinforcement-learning trajectory, ready-made embeddings.

Which layout a family uses is decided by the rows of `input_forms.py` (`IMAGE_FORMS`, `AUDIO_FORMS`), which name
the builders here; `InputSynthesizer` (`inputs.py`) adds what combines the modalities into candidate input sets.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from modeltrace.worker.building.config_tree import walk_configs
from modeltrace.worker.building.input_spec import (
    AUDIO_SAMPLES,
    BATCH_SIZE,
    DECODER_SEQUENCE_LENGTH,
    DEFAULT_IMAGE_SIZE,
    FEATURE_FRAMES,
    SEQUENCE_LENGTH,
    Draw,
    InputSpec,
    as_int,
    first_set,
    forward_parameters,
    sub_config,
)
from modeltrace.worker.building.sizes import HIDDEN_WIDTH_NAMES

# The config fields that give an audio model's feature width (mel bins), most specific first.
_FEATURE_WIDTH_NAMES = (
    "feature_projection_input_dim",
    "num_mel_bins",
    "feature_size",
    "input_feat_per_channel",
    "n_mels",
    "input_dim",
)


class MediaInputs:
    """The tensors of each modality for one model, given an `InputSpec` and a `Draw`; see the module docstring."""

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

    # --- the forward's signature, the vocabulary, text tokens ---------------------------------------------------

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

    def vocab_size(self) -> int:
        vocab = first_set([self.text_config, self.config], "vocab_size")
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

    def codebooks(self) -> int:
        """How many codebooks the model's token ids come in (MusicGen; 0: none named)."""
        return as_int(first_set(walk_configs(self.config), "num_codebooks"), 0)

    # --- images and video ---------------------------------------------------------------------------------------

    def _channels_and_patch(self) -> tuple[int, int]:
        configs = [self.vision_config, self.config]
        channels = as_int(
            first_set(configs, "num_channels", "in_channels", "in_chans", "input_channels", "image_channels"), 3
        )
        return channels, as_int(first_set(configs, "patch_size", "spatial_patch_size"), 16)

    def _image_size(self) -> tuple[int, int]:
        """The height and width the vision config names (a multiple of its windows where it has several)."""
        configs = [self.vision_config, self.config]
        _, patch = self._channels_and_patch()
        size = first_set(configs, "image_size", "img_size", "input_size", "resolution", "max_img_size")
        if isinstance(size, dict):
            size = size.get("height") or size.get("shortest_edge")
        if isinstance(size, (list, tuple)) and len(size) >= 2:
            height, width = int(size[-2]), int(size[-1])
        else:
            height = width = as_int(size, DEFAULT_IMAGE_SIZE)
        windows = first_set(configs, "num_windows")
        if isinstance(windows, int) and windows > 1 and patch > 0 and isinstance(size, int):
            # A patch grid cut into windows × windows (RF-DETR's windowed DINOv2): a multiple of the windows.
            side = max(windows, height // patch // windows * windows)
            height = width = side * patch
        return height, width

    def flattened_patches(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, patch = self._channels_and_patch()
        width = as_int(
            first_set([self.vision_config, self.config], "patch_embed_hidden_size"), channels * patch * patch
        )
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

    def naflex_patches(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, patch = self._channels_and_patch()
        patches = as_int(first_set([self.vision_config, self.config], "num_patches", "max_num_patches"), 64)
        side = max(1, math.isqrt(patches) // 2)
        count = side * side
        inputs = {
            "pixel_values": draw.randn(BATCH_SIZE, count, channels * patch * patch),
            "spatial_shapes": torch.tensor([[side, side]] * BATCH_SIZE, device=self.device),
        }
        if self.takes("pixel_attention_mask"):
            inputs["pixel_attention_mask"] = torch.ones(BATCH_SIZE, count, dtype=torch.long, device=self.device)
        return inputs

    def pinpoints(self) -> Any:
        pinpoints = first_set([self.config, self.vision_config], "image_grid_pinpoints")
        if isinstance(pinpoints, (list, tuple)) and pinpoints and isinstance(pinpoints[0], (list, tuple)):
            return pinpoints
        return None

    def tiled_images(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, _ = self._channels_and_patch()
        height, width = self._image_size()
        pinpoints = self.pinpoints()
        full_height, full_width = int(pinpoints[0][0]), int(pinpoints[0][1])
        tiles = max(1, full_height // height) * max(1, full_width // width) + 1
        inputs = {"pixel_values": draw.randn(BATCH_SIZE, tiles, channels, height, width)}
        if self.takes("image_sizes"):
            inputs["image_sizes"] = torch.tensor([[full_height, full_width]] * BATCH_SIZE, device=self.device)
        return inputs

    def pixel_images(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        channels, _ = self._channels_and_patch()
        height, width = self._image_size()
        frames = first_set([self.vision_config, self.config], "num_frames")
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
        merge = as_int(first_set(configs, "spatial_merge_size", "merge_size"), 1)
        temporal = as_int(first_set(configs, "temporal_patch_size"), 1)
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

    def grid_images(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        return self._patch_images(draw, *self._channels_and_patch())

    def video_inputs(self, draw: Draw) -> dict[str, Any]:
        vision = self.vision_config
        channels = as_int(first_set([vision, self.config], "num_channels", "in_channels"), 3)
        patch = as_int(first_set([vision, self.config], "patch_size"), 16)
        if self.takes("video_grid_thw"):
            return self._patch_images(draw, channels, patch, video=True)
        size = as_int(first_set([vision, self.config], "image_size"), DEFAULT_IMAGE_SIZE)
        frames = as_int(first_set([vision, self.config], "num_frames"), 2)
        return {"pixel_values_videos": draw.randn(BATCH_SIZE, frames, channels, size, size)}

    # --- audio --------------------------------------------------------------------------------------------------

    def hidden_audio(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        name = "input_values" if self.takes("input_values") else "input_features"
        width = as_int(first_set([self.audio_config, self.config], *HIDDEN_WIDTH_NAMES), 64)
        hidden = {name: draw.randn(BATCH_SIZE, SEQUENCE_LENGTH, width)}
        if self.takes("decoder_input_values"):
            hidden["decoder_input_values"] = draw.randn(BATCH_SIZE, DECODER_SEQUENCE_LENGTH, width)
        return hidden

    def mel_bins_in_values(self) -> int | None:
        """The mel bins of a spectrogram the model takes in `input_values` (None: it takes no such thing)."""
        mel_bins = first_set([self.audio_config, self.config], "num_mel_bins")
        if self.takes("input_values") and isinstance(mel_bins, int) and not self.takes("input_features"):
            return mel_bins
        return None

    def spectrogram_values(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        frames = as_int(first_set([self.audio_config, self.config], "max_length"), FEATURE_FRAMES)
        return {"input_values": draw.randn(BATCH_SIZE, frames, self.mel_bins_in_values())}

    def prefers_samples(self) -> bool:
        """Whether the model's audio input is raw samples (`input_values`) rather than features."""
        return self.takes("input_values") and (not self.takes("input_features") or "input_values" in self.required())

    def raw_samples(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        audio = self.audio_config
        channels = as_int(first_set([audio, self.config], "audio_channels", "num_channels"), 0)
        hop = as_int(first_set([audio, self.config], "hop_length", "frame_size"), 0)
        ratios = first_set([audio, self.config], "upsampling_ratios", "downsampling_ratios")
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

    def feature_frames(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        return self._features(spec, draw, spec.style.layout)

    def _features(self, spec: InputSpec, draw: Draw, layout: str) -> dict[str, Any]:
        audio = self.audio_config
        bins = as_int(
            first_set(
                [audio, self.config, *walk_configs(self.config)],
                *_FEATURE_WIDTH_NAMES,
                "feature_dim",
                "num_mels",
            ),
            80,
        )
        channels = as_int(first_set([audio, self.config], "input_channels"), 1)
        if getattr(audio, "input_feat_per_channel", None):
            bins = bins * max(channels, 1)
        if spec.feature_width is not None:
            bins = spec.feature_width
        positions = first_set([audio, self.config], "max_source_positions")
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
        if self.prefers_samples():
            return ["channels_first", "image_like", "hidden"]  # raw samples, with a channel axis, as hidden states
        raw = ["raw"] if self.takes("input_values") else []
        return [*self._feature_layouts(), *raw]

    def _feature_layouts(self) -> list[str]:
        bins = as_int(
            first_set(
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

    # --- series, trajectories, embeddings -----------------------------------------------------------------------

    def series_inputs(self, draw: Draw) -> dict[str, Any]:
        """A time series (PatchTST, Informer, TimesFM): past values over the context plus the lags, time
        features, observed masks, and the future window for the encoder-decoder forecasters."""
        config = self.config
        prediction = as_int(getattr(config, "prediction_length", None), 8)
        context = as_int(getattr(config, "context_length", None), prediction) or prediction
        lags = getattr(config, "lags_sequence", None)
        past = context + (max(lags) if isinstance(lags, (list, tuple)) and lags else 0)
        channels = as_int(first_set([config], "num_input_channels", "input_size"), 1)
        values_shape = (
            (BATCH_SIZE, past)
            if channels == 1 and not hasattr(config, "num_input_channels")
            else (BATCH_SIZE, past, channels)
        )
        inputs: dict[str, Any] = {"past_values": draw.randn(*values_shape)}
        time_features = as_int(getattr(config, "num_time_features", None), 0) + as_int(
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
        static_real = as_int(getattr(config, "num_static_real_features", None), 0)
        if self.takes("static_real_features") and static_real:
            inputs["static_real_features"] = draw.randn(BATCH_SIZE, static_real)
        categorical = as_int(getattr(config, "num_static_categorical_features", None), 0)
        if self.takes("static_categorical_features") and categorical:
            # category 0 exists whatever each feature's cardinality
            inputs["static_categorical_features"] = torch.tensor(
                [[0] * categorical] * BATCH_SIZE, dtype=torch.long, device=self.device
            )
        return inputs

    def trajectory_inputs(self, draw: Draw) -> dict[str, Any]:
        """A reinforcement-learning trajectory (Decision Transformer): states, actions, rewards, returns, steps."""
        length = SEQUENCE_LENGTH
        state = as_int(getattr(self.config, "state_dim", None), 4)
        action = as_int(getattr(self.config, "act_dim", None), 2)
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

    def embeddings_inputs(self, draw: Draw) -> dict[str, Any]:
        """`inputs` that are not token ids: a speech encoder-decoder's raw samples, or ready-made embeddings."""
        encoder = getattr(self.config, "encoder", None)
        if encoder is not None and hasattr(encoder, "conv_dim"):
            # A speech encoder-decoder: `inputs` are the encoder's raw samples.
            return {"inputs": draw.randn(BATCH_SIZE, AUDIO_SAMPLES)}
        # Perceiver without a preprocessor: ready-made embeddings of the model's input width.
        width = as_int(first_set([self.config], *HIDDEN_WIDTH_NAMES), 64)
        return {"inputs": draw.randn(BATCH_SIZE, SEQUENCE_LENGTH, width)}
