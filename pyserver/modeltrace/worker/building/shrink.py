"""Shrink a transformers config to a size that builds and runs in a blink, keeping the config's own rules.

transformers has several hundred config classes, and their size fields have many names (`hidden_size`,
`d_model`, `n_embd`, `embed_dim`, `depth`, `encoder_layers`, `n_routed_experts`, ...) and many constraints (heads
divide the hidden size, key/value heads divide the heads, `layer_types` has one entry per layer, the special
tokens lie inside the vocabulary, `mrope_section` sums to half the head size, top-k is at most the expert count).
Instead of a table per family, the rules here go by what a field's name says it is:

- widths (`*hidden_size`, `d_model`, `*embed_dim`, ...) all become the same number, so that equalities between
  widths (a vision tower's output size equal to the text model's hidden size) still hold;
- feed-forward sizes likewise all become one (larger) number;
- head counts become 4 and head sizes 16 (64 / 4), key/value heads keep the grouping (MHA, GQA or MQA);
- layer counts become 2, per-layer lists (`layer_types`, a conv stack's `conv_dim`) are cut to match and layer
  indices (`vision_feature_layer`, `mlp_only_layers`) are kept inside the new count;
- expert counts become 4 and top-k at most 2; vocabularies 128, special token ids moved inside;
- fields whose class default is `None` and that `__post_init__` derived from others (`head_dim`,
  `num_key_value_heads`, `layer_types`, `rope_parameters`) are reset to `None` so that they are derived again
  from the shrunk values.

The rules are rows (`UNSET_SIZE_RULES`, `SIZE_CAPS`, `WIDTH_CAPS`: a test of the field, the size it gets, and
which models need the row), read by one generic loop in `_shrink_values`; the structural fixes that keep a
shrunk config consistent (per-layer lists, layer sums, stage widths, rope sections) are the rows of
`CONSISTENCY_STEPS`, run in order after the size rows.
Adding a family's rule is adding a row next to its reason.

Sub-configs (a composite model's `text_config`, `vision_config`, `audio_config`, an encoder-decoder's `encoder`
and `decoder`) are shrunk by the same rules, recursively, and the whole tree is rebuilt through the config
classes' own constructors, so every `__post_init__` and `validate_*` check runs on the result.

Since no rule set fits every family, `shrink_candidates` yields several levels, from most to least shrunk:
`tiny` (all rules), `narrow` (only the standard transformer width names), `shallow` (only counts: layers,
experts, vocabulary, sequence lengths; widths as they are) and `default` (the config as it is, for a model that
is small already). The builder uses the first level whose model builds and runs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from modeltrace.errors import ModelTraceError


LEVELS = ("tiny", "narrow", "shallow", "default")

WIDTH = 64
FFN = 128
HEADS = 4
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
EXPERTS = 4
TOP_K = 2
VOCAB = 128
MAX_POSITIONS = 512
AUDIO_POSITIONS = 64
# NOTE: images and audio frames kept under these many positions after patching (a ViT at 224 px with 16 px
# patches is 196 positions, at 1024 px it is 4096).
MAX_IMAGE_TOKENS = 1024

_WIDTH_NAMES = re.compile(
    r"^(hidden_size|d_model|n_embd|embed_dim|dim|hidden_dim|embedding_size|embedding_dim|emb_dim|projection_dim"
    r"|word_embed_proj_dim|d_embed|n_embed|model_dim|attention_hidden_size|hidden_size_per_layer_input"
    r"|projector_hidden_size|output_hidden_size|out_hidden_size|text_hidden_size|vision_hidden_size"
    r"|encoder_hidden_size|decoder_hidden_size|audio_hidden_size|image_text_hidden_size|pooler_output_size"
    r"|encoder_embed_dim|decoder_embed_dim|text_embed_dim|vision_embed_dim|mm_hidden_size|fusion_hidden_size"
    r"|d_latent|latent_dim|context_dim|cross_attention_dim|pooler_hidden_size|output_dim|proj_dim|codebook_dim"
    r"|[a-z_]*_hidden_size|[a-z_]*_embed_dim|hidden_size_[a-z_]+)$"
)
# The model's hidden width under its usual names, the most usual first (the one spelling of them).
HIDDEN_WIDTH_NAMES = ("hidden_size", "d_model", "n_embd", "embed_dim")
_CORE_WIDTH_NAMES = set(HIDDEN_WIDTH_NAMES)
_FFN_NAMES = re.compile(
    r"^(intermediate_size|d_ff|n_inner|ffn_dim|mlp_dim|d_inner|ffn_hidden_size|inner_dim|dim_feedforward"
    r"|[a-z_]*_intermediate_size|[a-z_]*_ffn_dim|[a-z_]*_ffn_size|[a-z_]*_mlp_dim|[a-z_]*_intermediate_dim)$"
)
_CORE_FFN_NAMES = {"intermediate_size", "d_ff", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim"}
_KV_HEAD_NAMES = re.compile(
    r"^(num_key_value_heads|num_kv_heads|n_kv_heads|multi_query_group_num|[a-z_]*_key_value_heads|[a-z_]*_kv_heads)$"
)
_HEAD_NAMES = re.compile(
    r"^(num_attention_heads|num_heads|n_head|n_heads|attention_heads|[a-z_]*_attention_heads|[a-z_]*_num_heads"
    r"|[a-z_]*_n_heads|num_[a-z_]*_heads)$"
)
_CORE_HEAD_NAMES = {"num_attention_heads", "num_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads"}
_HEAD_DIM_NAMES = re.compile(r"^(head_dim|d_kv|d_head|dim_head|attention_head_size|kv_channels|[a-z_]*_head_dim)$")
_LAYER_NAMES = re.compile(
    r"^(num_hidden_layers|num_layers|n_layer|n_layers|depth|encoder_layers|decoder_layers|num_encoder_layers"
    r"|num_decoder_layers|num_blocks|[a-z_]*_num_layers|num_[a-z_]*_layers|[a-z_]*_depth|[a-z_]*_layers)$"
)
# Names that look like layer counts but index layers, or count something that must stay below the layer count.
_LAYER_BOUNDS = {
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "num_kv_shared_layers": 0,
    "max_window_layers": LAYERS,
    "num_nextn_predict_layers": 1,
    "num_dense_layers_prefix": 1,
}
_NOT_LAYER_COUNTS = {
    "num_feat_extract_layers",
    "num_conv_pos_embedding_groups",
    "num_adapter_layers",
    "num_lstm_layers",
    "num_residual_layers",
    "iou_head_depth",
    "max_depth",
}
_EXPERT_NAMES = re.compile(
    r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|[a-z_]*_num_experts)$"
)
_TOP_K_NAMES = re.compile(
    r"^(num_experts_per_tok|num_experts_per_token|moe_topk|moe_top_k|top_k|moe_k|topk|num_selected_experts"
    r"|router_top_k|top_k_experts|num_activated_experts)$"
)
_VOCAB_NAMES = re.compile(r"^(vocab_size|[a-z_]*_vocab_size|vocab_size_[a-z_]*|[a-z_]*_group_vocab)$")
_POSITION_NAMES = re.compile(
    r"^(max_position_embeddings|n_positions|max_target_positions|n_ctx|max_seq_len|max_sequence_length|seq_length"
    r"|max_length|context_length|model_max_length)$"
)
_LAYER_INDEX_NAMES = re.compile(
    r"^([a-z_]*feature_layers?|[a-z_]*layers_indices|[a-z_]*layer_ids?|[a-z_]*_layers_idx|[a-z_]*_idxs"
    r"|mlp_only_layers|[a-z_]*select_layers?|[a-z_]*layer_idx)$"
)
_TOKEN_NAMES = re.compile(r"^[a-z_]*(_token_id|_token_index|_token_ids|_token)$")
_DEPTH_LISTS = (
    "depths",
    "encoder_depths",
    "decoder_depths",
    "num_layers_per_stage",
    "stage_depths",
    "block_repeats",
    "layers_per_stage",
    "num_blocks_per_stage",
    "num_block_repeats",
    "stage_num_blocks",
)
# Compound scaling of convolutional nets (EfficientNet-B7 is 2.0 wide and 3.1 deep).
_SCALING_FACTORS = {
    "width_coefficient": 0.25,
    "depth_coefficient": 1.0,
    "width_multiplier": 0.25,
    "depth_multiplier": 1.0,
}
CONV_IMAGE_SIZE = 224
_PATTERN_NAMES = re.compile(
    r"^_?([a-z_]*_pattern|[a-z_]*_period|[a-z_]*_interval|[a-z_]*_frequency|[a-z_]*_every|[a-z_]*_freq"
    r"|decoder_sparse_step|sparse_step)$"
)
_KERNEL_SWITCHES = (
    "use_mamba_kernels",
    "use_kernels",
    "use_fused_kernels",
    "use_flash_attention",
    "use_triton",
    "use_timm_backbone",
    "use_pretrained_backbone",
)
_ROTARY_DIMS = ("rotary_dim", "rotary_ndims", "rope_dim", "rotary_emb_dim", "qk_rope_dim")
_SLIDING_WINDOW = 4
_PLACEHOLDER_TOKENS = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "video_token_index",
    "audio_token_id",
    "audio_token_index",
)
_SLIDING_KINDS = ("sliding_attention", "sliding_window", "local", "local_attention")
_LAYER_KIND_LISTS = ("layer_types", "layers_block_type", "mlp_layer_types", "block_types", "layer_block_types")
_DERIVED_KEEP = {
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "sliding_window",
    "id2label",
    "label2id",
    "rope_parameters",
}
_DROPPED = ("transformers_version", "model_type", "architectures", "_name_or_path", "dtype", "torch_dtype")


# --- size rules: what each config field becomes, as rows with their reason ------------------------------------


@dataclass(frozen=True)
class _Context:
    """What a rule may look at besides the field itself: the config's own values and the shrink level."""

    values: dict[str, Any]
    level: str
    heads: int | None  # the config's number of attention heads, under its usual names
    mha: bool  # as many key/value heads as query heads
    core_only: bool  # `narrow`: only the core widths shrink
    hierarchical: bool  # per-stage head counts (Swin): widths follow the stages instead

    def has_experts(self, besides: str | None = None) -> bool:
        return any(_EXPERT_NAMES.match(other) for other in self.values if other != besides)


_KEEP = object()  # a rule's answer that leaves the field as it is


@dataclass(frozen=True)
class SizeRule:
    """One row: `claims` says whether the rule decides a field (name, value, context), `size` what it becomes
    (`_KEEP`: unchanged); the first row that claims a field decides it. `reason`: which models need the row."""

    claims: Callable[[str, Any, _Context], bool]
    size: Callable[[str, Any, _Context], Any]
    reason: str


def _not_type_vocab(name: str) -> bool:
    return not name.startswith(("type_", "token_type"))


# Fields a model needs that its default config leaves unset (None, and None in the class defaults).
UNSET_SIZE_RULES = (
    SizeRule(
        lambda name, _, c: bool(_VOCAB_NAMES.match(name)) and _not_type_vocab(name),
        lambda *_: VOCAB,
        "a vocabulary a checkpoint sets (ESM)",
    ),
    SizeRule(
        lambda name, _, c: bool(_EXPERT_NAMES.match(name)),
        lambda *_: EXPERTS,
        "an expert count a checkpoint sets (DeepSeek-V2)",
    ),
    SizeRule(
        lambda name, _, c: name in ("n_shared_experts", "num_shared_experts") and c.has_experts(),
        lambda *_: 1,
        "shared experts next to routed ones",
    ),
    SizeRule(
        lambda name, _, c: name in _PLACEHOLDER_TOKENS and c.level != "default",
        lambda name, _, c: VOCAB // 2 + _PLACEHOLDER_TOKENS.index(name),
        "a multimodal model whose placeholder token a checkpoint sets (InstructBLIP's image token)",
    ),
    SizeRule(
        lambda name, _, c: name == "prediction_length",
        lambda *_: 8,
        "forecasters that need a horizon (Autoformer, Informer)",
    ),
    SizeRule(
        lambda name, _, c: bool(_FFN_NAMES.match(name)),
        lambda *_: FFN,
        "an expert's width that a checkpoint sets (Diffusion-Gemma's moe_intermediate_size)",
    ),
    SizeRule(
        lambda name, _, c: c.level == "tiny" and bool(_KV_HEAD_NAMES.match(name)),
        lambda *_: 2,
        "the head layout of a block a checkpoint sets (Qwen4-Exp's indexer)",
    ),
    SizeRule(
        lambda name, _, c: c.level == "tiny" and bool(_HEAD_NAMES.match(name)),
        lambda *_: HEADS,
        "a head count a checkpoint sets",
    ),
    SizeRule(
        lambda name, _, c: c.level == "tiny" and bool(_HEAD_DIM_NAMES.match(name)) and name != "head_dim",
        lambda *_: HEAD_DIM,
        "a head width a checkpoint sets",
    ),
    SizeRule(
        lambda name, _, c: name.endswith(("_compress_ratio", "_ratio")) and not name.endswith("dropout_ratio"),
        lambda *_: 2,
        "a compression / pooling ratio a checkpoint sets",
    ),
    SizeRule(
        lambda name, _, c: name.endswith("_budget"),
        lambda *_: 2 * _SLIDING_WINDOW,
        "tokens kept by a sparse-attention indexer",
    ),
    SizeRule(
        lambda name, _, c: name == "sliding_window" and c.level in ("narrow", "shallow"),
        lambda *_: 4096,
        "a model that reads it whatever its layer types say (Step3p7)",
    ),
    SizeRule(
        lambda name, _, c: name == "pad_token_id" and c.level in ("narrow", "shallow"),
        lambda *_: 0,
        "ESM compares ids with it",
    ),
    SizeRule(
        lambda name, _, c: bool(_TOP_K_NAMES.match(name)) and c.has_experts(besides=name),
        lambda *_: TOP_K,
        "experts chosen per token, where there are experts",
    ),
)

# Integer fields over a bound, at every level but `default` (layer counts are decided before these rows).
SIZE_CAPS = (
    SizeRule(
        lambda name, _, c: name in _LAYER_BOUNDS,
        lambda name, value, c: min(value, _LAYER_BOUNDS[name]),
        "layer counts inside the layer count (dense layers before the experts, shared KV layers)",
    ),
    SizeRule(
        lambda name, value, c: bool(_EXPERT_NAMES.match(name)) and value > EXPERTS,
        lambda *_: EXPERTS,
        "mixtures of experts",
    ),
    SizeRule(
        lambda name, value, c: bool(_TOP_K_NAMES.match(name)) and value > TOP_K,
        lambda *_: TOP_K,
        "experts chosen per token",
    ),
    SizeRule(
        lambda name, value, c: bool(_VOCAB_NAMES.match(name)) and value > VOCAB and _not_type_vocab(name),
        lambda *_: VOCAB,
        "vocabularies (not token-type vocabularies)",
    ),
    SizeRule(
        lambda name, value, c: bool(_POSITION_NAMES.match(name)) and value > MAX_POSITIONS,
        lambda *_: MAX_POSITIONS,
        "position tables",
    ),
    SizeRule(
        lambda name, value, c: name == "max_source_positions" and value > AUDIO_POSITIONS,
        lambda *_: AUDIO_POSITIONS,
        "audio encoders' positions (Whisper)",
    ),
)


def _capped(bound: int, to: int | None = None) -> Callable[[str, Any, _Context], Any]:
    return lambda name, value, c: (bound if to is None else to) if value > bound else _KEEP


def _core_width(names: re.Pattern, core: Collection[str]) -> Callable[[str, Any, _Context], bool]:
    """A width field matching `names` (at `narrow`, one of the `core` names), outside per-stage models."""
    return lambda name, _, c: bool(names.match(name)) and (not c.core_only or name in core) and not c.hierarchical


# Widths, at `tiny` and `narrow` only (`narrow`: the core names only; per-stage models keep theirs).
WIDTH_CAPS = (
    SizeRule(
        lambda name, _, c: bool(_KV_HEAD_NAMES.match(name)),
        lambda name, value, c: (
            (HEADS if (c.heads is None or value >= c.heads or c.mha) else min(value, 2))
            if value > 1 and (not c.core_only or name == "num_key_value_heads")
            else _KEEP
        ),
        "grouped key/value heads stay grouped, or as many as the heads (MHA)",
    ),
    SizeRule(
        _core_width(_HEAD_NAMES, _CORE_HEAD_NAMES),
        _capped(HEADS),
        "attention heads",
    ),
    SizeRule(
        lambda name, _, c: bool(_HEAD_DIM_NAMES.match(name)) and not c.core_only and not c.hierarchical,
        lambda name, value, c: (
            (HEAD_DIM // 2 if name in ("qk_rope_head_dim", "qk_nope_head_dim") else HEAD_DIM)
            if value > HEAD_DIM
            else _KEEP
        ),
        "head widths (MLA's rope and nope halves)",
    ),
    SizeRule(
        _core_width(_FFN_NAMES, _CORE_FFN_NAMES),
        _capped(FFN),
        "feed-forward widths",
    ),
    SizeRule(
        _core_width(_WIDTH_NAMES, _CORE_WIDTH_NAMES),
        _capped(WIDTH),
        "hidden widths",
    ),
    SizeRule(
        lambda name, value, c: name in ("q_lora_rank", "kv_lora_rank") and value > 32,
        lambda *_: 32,
        "low-rank attention projections (DeepSeek's MLA)",
    ),
    SizeRule(
        lambda name, value, c: name in ("state_size", "d_state", "mamba_d_state", "ssm_state_size") and value > 16,
        lambda *_: 16,
        "state-space models' state",
    ),
    SizeRule(
        lambda name, value, c: name in ("time_step_rank", "dt_rank", "mamba_dt_rank") and value > 8,
        lambda *_: 8,
        "state-space models' time-step rank",
    ),
    SizeRule(
        lambda name, value, c: name in _ROTARY_DIMS and value > HEAD_DIM,
        lambda *_: HEAD_DIM,
        "partial rotary widths inside a head",
    ),
    SizeRule(
        lambda name, value, c: (
            name in ("mamba_d_ssm", "ssm_inner_size", "mamba_intermediate_size", "d_inner_ssm") and value > FFN
        ),
        lambda *_: FFN,
        "state-space inner widths",
    ),
    SizeRule(
        lambda name, value, c: name == "sliding_window" and c.level == "tiny" and value > _SLIDING_WINDOW,
        lambda *_: _SLIDING_WINDOW,
        "smaller than the synthesised sequence, so that the sliding-window mask really cuts",
    ),
)


def shrink_candidates(defaults: Any, rejected: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """`(level, config)` for each level of `LEVELS` that builds a config different from the previous one.

    A level whose config class rejects the shrunk values is skipped (and said why in `rejected`);
    `ModelTraceError` when every level is.
    """
    rejected = rejected if rejected is not None else []
    errors: list[str] = []
    seen: list[dict] = []
    for level in LEVELS:
        try:
            config = _shrink_as_told(defaults, level)
        except Exception as error:  # noqa: BLE001 - a config class rejecting values is a reason to try the next level
            try:
                config = _shrink_as_told(defaults, level, mha=True)  # some want as many key/value heads as heads
            except Exception:  # noqa: BLE001
                errors.append(f"{level}: {type(error).__name__}: {first_line(error)}")
                rejected.append(errors[-1])
                continue
        fingerprint = _fingerprint(config)
        if fingerprint in seen:
            continue
        seen.append(fingerprint)
        yield level, config
    if not seen:
        raise ModelTraceError(
            f"{type(defaults).__name__} rejects every shrunk size ({'; '.join(errors)}); pass --config with a "
            "small config.json, or --recipe"
        )


# What a config class's validation says a field must be: "requires indexer_kv_heads=1", "x must be 0, got 256",
# "num_key_value_heads must match num_attention_heads".
_MUST_BE = re.compile(
    r"\b(?:requires?|needs?)\s+([a-z_][a-z0-9_]*)\s*(?:=|==)\s*(-?\d+)\b"
    r"|\b([a-z_][a-z0-9_]*)\s+(?:must|should)\s+(?:be|equal)\s+(-?\d+)\b"
)
_MUST_MATCH = re.compile(
    r"\b([a-z_][a-z0-9_]*)\s+(?:must|should)\s+(?:match|equal|be equal to)\s+([a-z_][a-z0-9_]*)\b"
)


def told_values(message: str) -> dict[str, Any]:
    """`{field: value}` (or `{field: ("=", other field)}`) that a validation error message asks for."""
    told: dict[str, Any] = {}
    for match in _MUST_BE.finditer(message):
        name = match.group(1) or match.group(3)
        told[name] = int(match.group(2) or match.group(4))
    for match in _MUST_MATCH.finditer(message):
        if "+" not in message[max(0, match.start() - 3) : match.start()]:  # not a sum ("a + b must equal c")
            told.setdefault(match.group(1), ("=", match.group(2)))
    return told


def _apply_overrides(values: dict[str, Any], overrides: dict[str, Any]) -> None:
    for name, value in overrides.items():
        if name not in values:
            continue
        if isinstance(value, tuple):
            if _is_int(values.get(value[1])):
                values[name] = values[value[1]]
        else:
            values[name] = value


def _shrink_as_told(defaults: Any, level: str, mha: bool = False) -> Any:
    """`shrink`, and where the config class rejects a value with a message that says what it must be, again
    with that value (three times at most)."""
    overrides: dict[str, Any] = {}
    for _ in range(3):
        try:
            return shrink(defaults, level, mha, overrides)
        except Exception as error:  # noqa: BLE001
            told = {name: value for name, value in told_values(str(error)).items() if overrides.get(name) != value}
            if not told or level == "default":
                raise
            overrides.update(told)
    return shrink(defaults, level, mha, overrides)


def _fingerprint(config: Any) -> dict:
    try:
        return config.to_dict()
    except Exception:  # noqa: BLE001
        return {"id": id(config)}


def first_line(error: BaseException) -> str:
    """The line of an exception's message that says what is wrong (at most 300 characters)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # a strict-dataclass validation error: the cause is below
        return f"{lines[0]} {lines[1]}"[:300]
    return lines[0][:300] if lines else ""


def shrink(config: Any, level: str = "tiny", mha: bool = False, overrides: dict[str, Any] | None = None) -> Any:
    """A shrunk copy of `config` (a PreTrainedConfig) at `level` (one of `LEVELS`), with `use_cache=False`.

    `mha`: as many key/value heads as query heads (for configs that accept no grouping of the shrunk sizes).
    """
    if level == "default":
        values = _own_values(config)
        if "use_cache" in values or hasattr(config, "use_cache"):
            values["use_cache"] = False
        return _rebuild(type(config), values, config)
    vocab_map = _token_map(config, level)
    return _shrink_tree(config, level, vocab_map, mha, overrides or {})


# --- the tree -----------------------------------------------------------------------------------------------


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _own_values(config: Any) -> dict[str, Any]:
    """The config's fields as keyword arguments: sub-configs as instances, bookkeeping entries dropped."""
    values = config.to_dict()
    for name in _DROPPED:
        values.pop(name, None)
    for name, value in list(vars(config).items()):
        if _is_config(value):
            values[name] = value
    return values


def _field_defaults(config_class: type) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    if dataclasses.is_dataclass(config_class):
        for item in dataclasses.fields(config_class):
            if item.default is not dataclasses.MISSING:
                defaults[item.name] = item.default
            elif item.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                defaults[item.name] = "<factory>"
    return defaults


def _rebuild(config_class: type, values: dict[str, Any], original: Any) -> Any:
    config = config_class(**values)
    # Private choices made on the original (attention implementation) carry over.
    for name in ("_attn_implementation_internal", "_attn_implementation", "_experts_implementation"):
        if name in vars(original) and vars(original)[name] is not None:
            try:
                setattr(config, name, vars(original)[name])
            except Exception:  # noqa: BLE001
                pass
    return config


def _shrink_tree(
    config: Any, level: str, token_map: dict[int, int], mha: bool = False, overrides: dict[str, Any] | None = None
) -> Any:
    overrides = overrides or {}
    values = _own_values(config)
    specs = getattr(type(config), "sub_configs_defaults", None) or {}
    for name, value in list(values.items()):
        if _is_config(value):
            if getattr(value, "model_type", "") == "timm_backbone" and name in specs:
                # A timm backbone (DETR's ResNet-50) needs the timm library: the config's own default
                # transformers backbone (a ResNet config) replaces it.
                replacement = _default_sub_config(specs[name])
                if replacement is not None:
                    value = replacement
            values[name] = _shrink_tree(value, level, token_map, mha, overrides)
    new_values = _shrink_values(config, values, level, mha)
    _apply_overrides(new_values, overrides)
    for name, value in list(new_values.items()):
        if _TOKEN_NAMES.match(name) and token_map:
            new_values[name] = _remap_tokens(value, token_map)
    if "use_cache" in new_values or hasattr(config, "use_cache"):
        new_values["use_cache"] = False
    try:
        shrunk = _rebuild(type(config), new_values, config)
    except Exception:  # noqa: BLE001
        # Per-layer lists cut to the new depth that `__post_init__` derived from the layer count (Dory's layer
        # types, listed as attention / mlp pairs): derived again from the shrunk count instead.
        defaults = _field_defaults(type(config))
        derived = {
            name: None
            for name in _LAYER_KIND_LISTS
            if new_values.get(name) is not None and name in defaults and defaults[name] is None
        }
        if not derived:
            raise
        new_values = {**new_values, **derived}
        shrunk = _rebuild(type(config), new_values, config)
    missing = _still_missing(shrunk)
    if missing:
        shrunk = _rebuild(type(config), {**new_values, **missing}, config)
    return shrunk


def safe_getattr(config: Any, name: str, default: Any = None) -> Any:
    """`getattr` that takes a config's refusal (an exception) for absence."""
    try:
        return getattr(config, name, default)
    except Exception:  # noqa: BLE001 - per-layer attributes refuse a global read (Gemma 4)
        return default


def _still_missing(config: Any) -> dict[str, Any]:
    """Fields the model reads that neither the defaults nor `__post_init__` set (a head size, the layer types)."""
    fields = _field_defaults(type(config))
    missing: dict[str, Any] = {}
    hidden, heads = safe_getattr(config, "hidden_size"), safe_getattr(config, "num_attention_heads")
    unset_head_dim = "head_dim" in fields and safe_getattr(config, "head_dim", 0) is None
    if unset_head_dim and _is_int(hidden) and _is_int(heads) and heads:
        missing["head_dim"] = hidden // heads
    if "num_key_value_heads" in fields and safe_getattr(config, "num_key_value_heads", 0) is None and _is_int(heads):
        missing["num_key_value_heads"] = heads
    layers = safe_getattr(config, "num_hidden_layers")
    if "layer_types" in fields and safe_getattr(config, "layer_types", 0) is None and _is_int(layers):
        missing["layer_types"] = ["full_attention"] * layers
    return missing


def _default_sub_config(spec: Any) -> Any:
    try:
        if spec.model_type in ("timm_backbone", "timm_wrapper"):
            return None
        return spec.default_config
    except Exception:  # noqa: BLE001
        return None


# --- the rules ----------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_int(item) for item in value)


def _shrink_values(config: Any, values: dict[str, Any], level: str, mha: bool = False) -> dict[str, Any]:
    """The rules of the module docstring applied to one config's own values (sub-configs already shrunk)."""
    new = dict(values)
    defaults = _field_defaults(type(config))
    widths = level == "tiny" or level == "narrow"
    core_only = level == "narrow"
    hierarchical = any(_HEAD_NAMES.match(name) and _int_list(value) for name, value in values.items())
    staged = any(name in _DEPTH_LISTS and _int_list(value) for name, value in values.items())
    stage_counts = {len(value) for name, value in values.items() if name in _DEPTH_LISTS and _int_list(value)}

    # Reset what __post_init__ derived, so it is derived again from the shrunk values: fields whose class
    # default is None, or a keyword such as "auto" (Mamba's `time_step_rank`, Falcon-H1's `mamba_d_head`).
    for name, value in values.items():
        if name not in defaults or name in _DERIVED_KEEP or _TOKEN_NAMES.match(name) or _is_config(value):
            continue
        if _LAYER_INDEX_NAMES.match(name) or name in _LAYER_KIND_LISTS:
            continue  # kept, and cut or moved inside the new layer count below
        if not _is_size_name(name):
            continue  # not a size: whatever __post_init__ made of it stays (and stays equal to its twins)
        default = defaults[name]
        if default is None and value is not None:
            new[name] = None
        elif isinstance(default, str) and _is_int(value):
            new[name] = default
    # Sizes a model needs that its default config leaves unset (ESM's vocabulary, DeepSeek-V2's experts).
    context = _Context(
        values,
        level,
        values.get("num_attention_heads", values.get("num_heads", values.get("n_head"))),
        mha,
        core_only,
        hierarchical,
    )
    for name, value in values.items():
        if value is None and defaults.get(name, 0) is None:
            rule = next((rule for rule in UNSET_SIZE_RULES if rule.claims(name, None, context)), None)
            if rule is not None:
                new[name] = rule.size(name, None, context)
    layer_counts: dict[int, int] = {}
    # A backbone whose stages are its layers (DINOv2 under a depth head) keeps as many layers as it hands out.
    indices, stages = values.get("out_indices"), values.get("stage_names")
    backbone_layers = None
    if _int_list(indices) and isinstance(stages, (list, tuple)) and not staged:
        for name in ("num_hidden_layers", "num_layers"):
            if _is_int(values.get(name)) and len(stages) == values[name] + 1 and values[name] > LAYERS:
                backbone_layers = max(LAYERS, len(indices))
                kept = list(range(backbone_layers - len(indices) + 1, backbone_layers + 1))
                new["out_indices"] = kept
                new["stage_names"] = ["stem"] + [f"stage{index}" for index in range(1, backbone_layers + 1)]
                if isinstance(values.get("out_features"), (list, tuple)):
                    new["out_features"] = [f"stage{index}" for index in kept]
    for name, value in values.items():
        if not _is_int(value) or _is_config(value):
            continue
        if _LAYER_NAMES.match(name) and name not in _NOT_LAYER_COUNTS and name not in _LAYER_BOUNDS:
            # In a staged model (Swin, ConvNeXt) `num_layers` counts stages: the stage depths shrink instead.
            if value > LAYERS and "window" not in name and not (staged and value in stage_counts):
                target = backbone_layers if backbone_layers and name in ("num_hidden_layers", "num_layers") else LAYERS
                new[name] = target
                layer_counts[value] = target
            continue
        rule = next((rule for rule in SIZE_CAPS if rule.claims(name, value, context)), None)
        if rule is None and widths:
            rule = next((rule for rule in WIDTH_CAPS if rule.claims(name, value, context)), None)
        if rule is not None:
            size = rule.size(name, value, context)
            if size is not _KEEP:
                new[name] = size

    step_context = _StepContext(config, level, layer_counts, staged)
    for step in CONSISTENCY_STEPS:
        if step.levels is None or level in step.levels:
            if step.applies is None or step.applies(step_context):
                step.fix(values, new, step_context)
    return new


# --- consistency steps: what keeps a shrunk config consistent, as rows with their reason -----------------------


@dataclass
class _StepContext:
    """What a consistency step may look at besides the old and new values: the config, the shrink level, the
    layer counts changed so far (old count -> new count; a step may add to them), whether the model is staged."""

    config: Any
    level: str
    layer_counts: dict[int, int]
    staged: bool


@dataclass(frozen=True)
class ConsistencyStep:
    """One row: `fix(old values, new values, context)` changes the new values in place; run at `levels` (None:
    all) when `applies(context)` (None: always), in the order of the table. `reason`: which models need it."""

    fix: Callable[[dict[str, Any], dict[str, Any], _StepContext], None]
    reason: str
    levels: tuple[str, ...] | None = None
    applies: Callable[[_StepContext], bool] | None = None


_WIDTH_LEVELS = ("tiny", "narrow")


def _fix_scaling(old: dict[str, Any], new: dict[str, Any], context: _StepContext) -> None:
    """Compound scaling factors capped; the head's width follows the width coefficient."""
    for name, limit in _SCALING_FACTORS.items():
        value = old.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
            new[name] = limit
            # EfficientNet's `hidden_dim` is 1280 × width.
            if name.startswith("width") and _is_int(old.get("hidden_dim")):
                divisor = old.get("depth_divisor") if _is_int(old.get("depth_divisor")) else 8
                scaled = max(divisor, int(old["hidden_dim"] * limit / value + divisor / 2) // divisor * divisor)
                new["hidden_dim"] = scaled


def _fix_layer_patterns(old: dict[str, Any], new: dict[str, Any], context: _StepContext) -> None:
    """One full-attention layer every N layers, attention/expert layers every N from an offset: N inside LAYERS."""
    for name, value in old.items():
        if _is_int(value) and _PATTERN_NAMES.match(name) and value > LAYERS and not _is_config(value):
            new[name] = LAYERS
            offset_name = name.replace("period", "offset")
            if offset_name != name and _is_int(old.get(offset_name)):
                new[offset_name] = min(old[offset_name], LAYERS - 1)


def _fix_kernel_switches(old: dict[str, Any], new: dict[str, Any], context: _StepContext) -> None:
    for name in _KERNEL_SWITCHES:
        if old.get(name) is True:
            new[name] = False


def _fix_sliding_window(old: dict[str, Any], new: dict[str, Any], context: _StepContext) -> None:
    kinds = new.get("layer_types") or old.get("layer_types") or ()
    if (
        "sliding_window" in old
        and old["sliding_window"] is None
        and any(kind in _SLIDING_KINDS for kind in kinds if isinstance(kind, str))
    ):
        new["sliding_window"] = _SLIDING_WINDOW if context.level == "tiny" else 4096


CONSISTENCY_STEPS = (
    ConsistencyStep(
        _fix_scaling,
        "compound scaling of convolutional nets (EfficientNet-B7 is 2.0 wide and 3.1 deep)",
        ("tiny",),
    ),
    ConsistencyStep(
        _fix_layer_patterns, "layer patterns every N layers (Llama 4's no-rope layers, Jamba's attention period)"
    ),
    ConsistencyStep(_fix_kernel_switches, "switches that need kernels this machine may not have (Mamba, timm)"),
    ConsistencyStep(
        lambda old, new, context: _scale_stage_widths(old, new),
        "staged models (Swin, ConvNeXt, PVT): stage widths scaled together, each stage's head size kept",
        ("tiny",),
        lambda context: context.staged,
    ),
    ConsistencyStep(
        _fix_sliding_window,
        "a sliding-window layer needs a window, even where the default config leaves it unset",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_experts(old, new),
        "top-k and expert groups inside the shrunk expert count (DeepSeek-V3's group-limited routing)",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_layer_sums(old, new, context.layer_counts),
        "layer counts that are parts of a total (Dory's input + recurrent + output layers)",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_layer_lists(old, new, context.layer_counts, context.level),
        "per-layer lists cut to the new depth, layer indices kept inside it (layer_types, vision_feature_layer)",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_per_layer(old, new, context.level),
        "per-layer overrides moved onto the kept layers of the same kind",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_depth_lists(old, new),
        "hierarchical models (Swin, ConvNeXt, ResNet): each stage's depth 1",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_images(old, new),
        "image sizes with too many patches halved; convolutional nets at 224 px",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_state_space(old, new),
        "Mamba-2 style heads: heads × head size equal to the expanded width",
        _WIDTH_LEVELS,
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_rope(context.config, new),
        "multimodal RoPE sections add up to half the shrunk head size (Qwen2-VL's mrope_section)",
        _WIDTH_LEVELS,
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_image_tokens(new),
        "pooled image tokens (Gemma 3): tokens per side divide the tower's patches per side",
    ),
    ConsistencyStep(
        lambda old, new, context: _fix_windows_in_context(new),
        "windows cut from a forecaster's context fit inside it (Autoformer's label_length)",
    ),
)


def _fix_windows_in_context(new: dict[str, Any]) -> None:
    """Windows cut from a forecaster's context (Autoformer's `label_length`) fit inside it."""
    context = new.get("context_length") if _is_int(new.get("context_length")) else new.get("prediction_length")
    if not _is_int(context):
        return
    for name in ("label_length",):
        if _is_int(new.get(name)) and new[name] > context:
            new[name] = context


_STAGE_WIDTHS = (
    "embed_dim",
    "embed_dims",
    "hidden_sizes",
    "dims",
    "widths",
    "hidden_dims",
    "embedding_size",
    "hidden_size",
    "stem_channels",
    "channels",
)


def _scale_stage_widths(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Staged models (Swin, ConvNeXt, PVT): every stage width scaled by one factor, heads kept, so that each
    stage keeps its ratio to the others and its head size (16 at the narrowest stage)."""
    widths = {name: old[name] for name in _STAGE_WIDTHS if _is_int(old.get(name)) or _int_list(old.get(name))}
    first = next((value if _is_int(value) else value[0] for value in widths.values()), None)
    if not first:
        return
    heads = next((value for name, value in old.items() if _HEAD_NAMES.match(name) and _int_list(value)), None)
    per_head = first / heads[0] if heads else first
    if per_head <= HEAD_DIM:
        return
    scale = HEAD_DIM / per_head

    def scaled(value: int) -> int | None:
        result = value * scale
        return int(result) if result == int(result) and result >= 1 else None

    for name, value in widths.items():
        if _is_int(value):
            result = scaled(value)
            if result is not None:
                new[name] = result
        else:
            results = [scaled(item) for item in value]
            if all(result is not None for result in results):
                new[name] = type(value)(results) if isinstance(value, tuple) else results


def _is_size_name(name: str) -> bool:
    """Whether `name` reads like a size these rules shrink (so that a derived value of it is derived again)."""
    patterns = (
        _WIDTH_NAMES,
        _FFN_NAMES,
        _KV_HEAD_NAMES,
        _HEAD_NAMES,
        _HEAD_DIM_NAMES,
        _LAYER_NAMES,
        _EXPERT_NAMES,
        _TOP_K_NAMES,
        _VOCAB_NAMES,
        _POSITION_NAMES,
    )
    return any(pattern.match(name) for pattern in patterns) or name in (
        "time_step_rank",
        "dt_rank",
        "mamba_dt_rank",
        "mamba_d_head",
        "mamba_headdim",
        "kv_channels",
        "attention_head_dim",
        "num_query_groups",
        *_ROTARY_DIMS,
    )


def _fix_layer_sums(old: dict[str, Any], new: dict[str, Any], layer_counts: dict[int, int]) -> None:
    """Layer counts that are parts of a total (Dory's input + recurrent + output layers = all layers)."""
    for total_name in ("num_hidden_layers", "num_layers", "n_layer"):
        total = old.get(total_name)
        if not _is_int(total):
            continue
        parts = [
            name
            for name, value in old.items()
            if name != total_name
            and _is_int(value)
            and value > 0
            and _LAYER_NAMES.match(name)
            and name not in _NOT_LAYER_COUNTS
        ]
        for size in range(len(parts), 1, -1):
            for chosen in _combinations(parts, size):
                if sum(old[name] for name in chosen) == total:
                    for name in chosen:
                        new[name] = 1
                    new[total_name] = len(chosen)
                    layer_counts[total] = len(chosen)
                    return


def _combinations(items: list[str], size: int) -> Iterator[tuple[str, ...]]:
    import itertools

    return itertools.combinations(items, size)


def _fix_per_layer(old: dict[str, Any], new: dict[str, Any], level: str) -> None:
    """Per-layer overrides (`per_layer_config`, keyed by layer index) moved onto the kept layers of the same kind."""
    overrides = old.get("per_layer_config")
    if not isinstance(overrides, dict) or not overrides:
        return
    kinds_name = next((name for name in _LAYER_KIND_LISTS if isinstance(old.get(name), (list, tuple))), None)
    old_kinds = list(old[kinds_name]) if kinds_name else []
    new_kinds = list(new.get(kinds_name) or []) if kinds_name else []
    layers = next((new[name] for name in ("num_hidden_layers", "num_layers") if _is_int(new.get(name))), None)
    moved: dict[str, Any] = {}
    for key, values in overrides.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            continue
        target = None
        if old_kinds and index < len(old_kinds) and old_kinds[index] in new_kinds:
            target = new_kinds.index(old_kinds[index])
        elif layers is not None and index < layers:
            target = index
        if target is None or str(target) in moved:
            continue
        if isinstance(values, dict) and level in ("tiny", "narrow"):
            values = {name: _shrink_override(name, value) for name, value in values.items()}
        moved[str(target)] = values
    new["per_layer_config"] = moved or None


def _shrink_override(name: str, value: Any) -> Any:
    if not _is_int(value):
        return value
    if _HEAD_DIM_NAMES.match(name) and value > HEAD_DIM:
        return HEAD_DIM
    if _KV_HEAD_NAMES.match(name) and value > 2:
        return 2
    if _HEAD_NAMES.match(name) and value > HEADS:
        return HEADS
    if _FFN_NAMES.match(name) and value > FFN:
        return FFN
    if _WIDTH_NAMES.match(name) and value > WIDTH:
        return WIDTH
    return value


def _fix_experts(old: dict[str, Any], new: dict[str, Any]) -> None:
    experts = [value for name, value in new.items() if _EXPERT_NAMES.match(name) and _is_int(value)]
    if not experts:
        return
    count = min(experts)
    for name, value in new.items():
        if _TOP_K_NAMES.match(name) and _is_int(value):
            new[name] = min(value, count)
    # Group-limited routing (DeepSeek-V3): the experts split into n_group groups, topk_group of them chosen.
    if _is_int(new.get("n_group")) and new["n_group"] > 1 and count % new["n_group"]:
        new["n_group"] = 1
    if _is_int(new.get("n_group")) and _is_int(new.get("topk_group")):
        new["topk_group"] = min(new["topk_group"], new["n_group"])
    if _is_int(new.get("num_expert_group")) and count % new["num_expert_group"]:
        new["num_expert_group"] = 1
        if _is_int(new.get("topk_group")):
            new["topk_group"] = 1


def _fix_layer_lists(old: dict[str, Any], new: dict[str, Any], layer_counts: dict[int, int], level: str) -> None:
    """Cut per-layer lists to the new layer count; keep layer indices inside it.

    Layer indices are kept inside `LAYERS` in every config of the tree, not just where the count changed: a
    composite config's adapter names layers of its vision tower (Molmo2's `vision_feature_layer`).
    """
    if level != "default":
        for name, value in old.items():
            if not _LAYER_INDEX_NAMES.match(name) or new.get(name) is None:
                continue
            if _int_list(value):
                new[name] = (
                    type(value)(_clamp_indices(list(value), LAYERS))
                    if isinstance(value, tuple)
                    else _clamp_indices(list(value), LAYERS)
                )
            elif _is_int(value) and not -LAYERS <= value < LAYERS:
                new[name] = _clamp_indices([value], LAYERS)[0]
    if not layer_counts:
        return
    for name, value in old.items():
        if not isinstance(value, (list, tuple)) or not value or new.get(name) is None:
            continue
        if len(value) in layer_counts and not _LAYER_INDEX_NAMES.match(name):
            kept = list(value[: layer_counts[len(value)]])
            # A pattern of layer kinds keeps one of each kind when it can (sliding and full attention).
            if all(isinstance(kind, str) for kind in value):
                kinds = list(dict.fromkeys(value))
                if len(kinds) > 1 and len(kept) >= 2:
                    last = [kind for kind in kinds if kind not in kept[:-1]]
                    if last:
                        kept[-1] = last[0]
            new[name] = type(value)(kept) if isinstance(value, tuple) else kept


def _clamp_indices(indices: list[int], layers: int) -> list[int]:
    """Indices into `layers` layers (or their `layers + 1` hidden states) kept in range: -1 stays the last."""
    return [min(index, layers - 1) if index >= 0 else max(index, -layers) for index in indices]


def _fix_depth_lists(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Hierarchical models (Swin, ConvNeXt, ResNet): each stage's depth becomes 1."""
    for name in _DEPTH_LISTS:
        value = old.get(name)
        if _int_list(value) and max(value) > 1:
            new[name] = type(value)(1 for _ in value) if isinstance(value, tuple) else [1 for _ in value]


def _fix_images(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Halve an image size whose patch grid has more than MAX_IMAGE_TOKENS positions."""
    size, patch = old.get("image_size"), old.get("patch_size")
    if (
        _is_int(size)
        and size > CONV_IMAGE_SIZE
        and "patch_size" not in old
        and "patch_sizes" not in old
        and (any(name in _SCALING_FACTORS for name in old) or "kernel_sizes" in old)
    ):
        new["image_size"] = CONV_IMAGE_SIZE  # a convolutional net: any size runs, and 600 px is slow
        return
    if not (_is_int(size) and _is_int(patch) and patch > 0):
        return
    if "window_size" in old or any(name in _DEPTH_LISTS for name in old):
        return  # windowed and staged models tie the image size to their windows
    while (size // patch) ** 2 > MAX_IMAGE_TOKENS and size % 2 == 0 and (size // 2) % patch == 0:
        size //= 2
    if size != old["image_size"]:
        new["image_size"] = size


def _fix_image_tokens(new: dict[str, Any]) -> None:
    """Pooled image tokens (Gemma 3): the tokens per side must divide the vision tower's patches per side."""
    tokens = new.get("mm_tokens_per_image")
    vision = new.get("vision_config")
    if not (
        _is_int(tokens)
        and vision is not None
        and _is_int(getattr(vision, "image_size", None))
        and _is_int(getattr(vision, "patch_size", None))
    ):
        return
    patches = vision.image_size // vision.patch_size
    side = math.isqrt(tokens)
    if side * side == tokens and side <= patches and patches % side == 0:
        return
    divisors = [d for d in range(1, patches + 1) if patches % d == 0 and d <= side]
    pooled = [d for d in divisors if patches // d >= 2] or divisors
    if pooled:
        new["mm_tokens_per_image"] = pooled[-1] ** 2


def _fix_state_space(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Mamba-2 style heads: heads × head size must equal the expanded width (or the explicit SSM width)."""
    hidden, expand = new.get("hidden_size"), new.get("expand", new.get("mamba_expand"))
    if not (_is_int(hidden) and isinstance(expand, (int, float))):
        return
    inner = int(expand * hidden)
    for name in ("mamba_d_ssm", "ssm_inner_size", "mamba_intermediate_size"):
        if _is_int(new.get(name)):
            inner = new[name]
    for heads_name, dim_name in (
        ("num_heads", "head_dim"),
        ("mamba_n_heads", "mamba_d_head"),
        ("mamba_num_heads", "mamba_head_dim"),
        ("ssm_num_heads", "ssm_head_dim"),
    ):
        if _is_int(new.get(heads_name)) and _is_int(new.get(dim_name)) and new[heads_name] * new[dim_name] != inner:
            if inner % new[dim_name] == 0:
                new[heads_name] = inner // new[dim_name]
            elif inner % new[heads_name] == 0:
                new[dim_name] = inner // new[heads_name]
    for groups_name in ("n_groups", "mamba_n_groups", "ssm_n_groups"):
        for heads_name in ("num_heads", "mamba_n_heads", "ssm_num_heads"):
            if _is_int(new.get(groups_name)) and _is_int(new.get(heads_name)) and new[heads_name] % new[groups_name]:
                new[groups_name] = math.gcd(new[heads_name], new[groups_name])


def _fix_rope(config: Any, new: dict[str, Any]) -> None:
    """Multimodal RoPE sections must add up to half the (shrunk) head size.

    A config whose class names `mrope_section` among its RoPE keys but has none gets one: its model then
    falls back to a section list sized for the full head size (`[16, 24, 24]`).
    """
    rope = new.get("rope_parameters")
    if not isinstance(rope, dict) or not ("rope_type" in rope or "rope_theta" in rope or "mrope_section" in rope):
        return
    if "mrope_section" not in rope and "mrope_section" in getattr(type(config), "ignore_keys_at_rope_validation", ()):
        rope = {**rope, "mrope_section": [16, 24, 24]}
        new["rope_parameters"] = rope
    if not _int_list(rope.get("mrope_section")):
        return
    head_dim = new.get("head_dim")
    if not _is_int(head_dim):
        hidden, heads = new.get("hidden_size"), new.get("num_attention_heads")
        head_dim = hidden // heads if _is_int(hidden) and _is_int(heads) and heads else HEAD_DIM
    sections = list(rope["mrope_section"])
    # Rotary embeddings on part of each head (GLM-4V: half of it): the sections cover that part.
    factor = rope.get("partial_rotary_factor", new.get("partial_rotary_factor"))
    factor = factor if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= 1 else 1
    half = int(head_dim * factor) // 2
    total = sum(sections)
    if total == half:
        return
    scaled = [max(1, section * half // total) for section in sections]
    # The remainder goes to a section unlike the others, so that equal sections stay equal (ERNIE-VL stacks its
    # height and width sections).
    unique = [index for index, section in enumerate(sections) if sections.count(section) == 1]
    scaled[unique[0] if unique else 0] += half - sum(scaled)
    new["rope_parameters"] = {**rope, "mrope_section": scaled}


# --- special tokens -----------------------------------------------------------------------------------------


def walk_configs(config: Any) -> Iterator[Any]:
    """A config and every sub-config inside it, depth first (the one walk of the config tree)."""
    yield config
    for value in vars(config).values():
        if _is_config(value):
            yield from walk_configs(value)


def _token_map(config: Any, level: str) -> dict[int, int]:
    """Old id -> new id for special tokens outside the shrunk vocabulary (one new id per old id, tree-wide)."""
    vocabularies = [
        value
        for node in walk_configs(config)
        for name, value in vars(node).items()
        if _VOCAB_NAMES.match(name)
        and _is_int(value)
        and value > VOCAB
        and not name.startswith(("type_", "token_type"))
    ]
    if not vocabularies:
        return {}
    used: set[int] = set()
    outside: list[int] = []
    for node in walk_configs(config):
        for _, value in _token_values(node):
            for token in value if isinstance(value, (list, tuple)) else [value]:
                if not _is_int(token) or token < 0:
                    continue
                if token < VOCAB:
                    used.add(token)
                elif token not in outside:
                    outside.append(token)
    mapping: dict[int, int] = {}
    candidate = VOCAB - 1
    for token in sorted(outside):
        while candidate in used and candidate > 0:
            candidate -= 1
        mapping[token] = candidate
        used.add(candidate)
    return mapping


def _token_values(config: Any) -> Iterator[tuple[str, Any]]:
    for name, value in vars(config).items():
        if _TOKEN_NAMES.match(name) and (_is_int(value) or _int_list(value)):
            yield name, value


def _remap_tokens(value: Any, mapping: dict[int, int]) -> Any:
    if _is_int(value):
        return mapping.get(value, value)
    if isinstance(value, (list, tuple)) and all(_is_int(item) for item in value):
        remapped = [mapping.get(item, item) for item in value]
        return type(value)(remapped) if isinstance(value, tuple) else remapped
    return value
