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
The spec, its style and the random draw are `input_spec.py`; the tensors of each modality are made by the
builders of `input_media.py` (`MediaInputs`, which `InputSynthesizer` extends); the family-specific cases are rows
with their reason in `input_forms.py`: `MODALITY_RULES` (which modalities a signature takes), `IMAGE_FORMS` /
`AUDIO_FORMS` (how a family lays out its images / audio), `STYLE_RULES` (other layouts tried when the plain one
fails), `COMPANION_INPUTS` (inputs that travel with the main ones in a few families). This module is what combines
them: the placeholder counts, the prompt, the candidate input sets and the repairs after a failed trial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building import input_forms
from modeltrace.worker.building.input_media import MediaInputs
from modeltrace.worker.building.input_spec import (
    BATCH_SIZE,
    DECODER_SEQUENCE_LENGTH,
    SEQUENCE_LENGTH,
    Draw,
    InputSpec,
    InputStyle,
    InputVariant,
    first_set,
)

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


class InputSynthesizer(MediaInputs):
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
        super().__init__(model, config, seed, convert, context)
        # NOTE: a memo of what the model's `get_{modality}_features` answered (a pure function of the model and
        # the media), so that every input set does not run the tower again.
        self._counted_features: dict[str, int] = {}

    # --- a fresh synthesiser, a fresh draw -----------------------------------------------------------------------

    def afresh(self) -> InputSynthesizer:
        """A synthesiser for the same model and config with nothing memoised (after the config was repaired)."""
        return InputSynthesizer(self.model, self.config, self.seed, self.convert, self.context)

    def draw(self) -> Draw:
        """A fresh source of random tensors, seeded with the synthesiser's seed."""
        return Draw(self.seed, self.device)

    # --- modalities: the first form that fits -------------------------------------------------------------------

    def image_inputs(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        """`pixel_values` (+ grid / size / mask inputs the signature takes) for one image, in the first of the
        `IMAGE_FORMS` that fits the model."""
        form = next(form for form in input_forms.IMAGE_FORMS if form.fits(self))
        return form.make(self, spec, draw)

    def audio_inputs(self, spec: InputSpec, draw: Draw) -> dict[str, Any]:
        """Audio for one clip in the first of the `AUDIO_FORMS` that fits the model and the spec's layout."""
        form = next(form for form in input_forms.AUDIO_FORMS if form.fits(self, spec.style.layout))
        return form.make(self, spec, draw)

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
        for rule in input_forms.MODALITY_RULES:
            if rule.takes(self, found):
                found.append(rule.modality)
        return found

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
        for rule in input_forms.COMPANION_INPUTS:
            if rule.needed(self, inputs):
                inputs.update(rule.make(self, inputs, draw))
        if self.takes("use_cache"):
            inputs["use_cache"] = False
        return inputs

    def inputs(self, spec: InputSpec) -> dict[str, Any]:
        """`build(spec)` converted for the model (moved to the meta device in shape-only mode)."""
        return {key: self.convert(value) for key, value in self.build(spec).items()}

    def _text_inputs(self, spec: InputSpec, draw: Draw, media: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """`input_ids` with the media's placeholders, and the masks and types that go with them."""
        inputs: dict[str, Any] = {}
        input_ids, token_types = self.prompt(spec, draw, media)
        codebooks = self.codebooks()
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

    def _type_vocab(self) -> bool:
        value = first_set([self.text_config, self.config], "type_vocab_size")
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
        for rule in input_forms.STYLE_RULES:
            if rule.fits(self, option):
                styles.append(dataclasses.replace(first, **rule.style))
        return styles

    def _complete(self, inputs: dict[str, Any]) -> bool:
        return not [name for name in self.required() if name not in inputs]

    def missing(self) -> list[str]:
        """The required forward inputs that no modality of the model gives."""
        best = self.build(InputSpec(modalities=tuple(self.modalities())))
        return [name for name in self.required() if name not in best]


def synthesize_inputs(model: nn.Module, config: Any, seed: int | torch.Generator = 0) -> dict[str, Any]:
    """The richest input set for `model` (no trial run): see `InputSynthesizer`."""
    synthesizer = InputSynthesizer(model, config, seed)
    for variant in synthesizer.variants():
        return variant.inputs
    raise ModelTraceError(
        f"{type(model).__name__}.forward needs {', '.join(synthesizer.missing())}, which ModelTrace cannot "
        "synthesise; pass --recipe with build_inputs(model)"
    )
