"""The size rules of the shrink: what each config field becomes, as rows with their reason.

Three tables of `SizeRule` rows, read by the one generic loop of `shrink._shrink_values`: `UNSET_SIZE_RULES`
(fields a model needs that its default config leaves unset), `SIZE_CAPS` (counts over a bound, at every level but
`default`) and `WIDTH_CAPS` (widths, heads and head sizes, at `tiny` and `narrow`). A row tests a field by what
its name says (`sizes.py`), its value and a `RuleContext`, and gives its new size (`KEEP`: unchanged); the first
row that claims a field decides it. Adding a family's rule is adding a row next to its reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from modeltrace.worker.building.sizes import (
    AUDIO_POSITIONS,
    CORE_FFN_NAMES,
    CORE_HEAD_NAMES,
    CORE_WIDTH_NAMES,
    EXPERT_NAMES,
    EXPERTS,
    FFN,
    FFN_NAMES,
    HEAD_DIM,
    HEAD_DIM_NAMES,
    HEAD_NAMES,
    HEADS,
    KV_HEAD_NAMES,
    LAYER_BOUNDS,
    MAX_POSITIONS,
    POSITION_NAMES,
    ROTARY_DIMS,
    SLIDING_WINDOW,
    TOP_K,
    TOP_K_NAMES,
    VOCAB,
    VOCAB_NAMES,
    WIDTH,
    WIDTH_NAMES,
)

# A multimodal model's placeholder tokens (set by a checkpoint): given ids in the upper half of the vocabulary.
_PLACEHOLDER_TOKENS = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "video_token_index",
    "audio_token_id",
    "audio_token_index",
)


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at besides the field itself: the config's own values and the shrink level."""

    values: dict[str, Any]
    level: str
    heads: int | None  # the config's number of attention heads, under its usual names
    mha: bool  # as many key/value heads as query heads
    core_only: bool  # `narrow`: only the core widths shrink
    hierarchical: bool  # per-stage head counts (Swin): widths follow the stages instead

    def has_experts(self, besides: str | None = None) -> bool:
        return any(EXPERT_NAMES.match(other) for other in self.values if other != besides)


KEEP = object()  # a rule's answer that leaves the field as it is


@dataclass(frozen=True)
class SizeRule:
    """One row: `claims` says whether the rule decides a field (name, value, context), `size` what it becomes
    (`KEEP`: unchanged); the first row that claims a field decides it. `reason`: which models need the row."""

    claims: Callable[[str, Any, RuleContext], bool]
    size: Callable[[str, Any, RuleContext], Any]
    reason: str


def _not_type_vocab(name: str) -> bool:
    return not name.startswith(("type_", "token_type"))


# Fields a model needs that its default config leaves unset (None, and None in the class defaults).
UNSET_SIZE_RULES = (
    SizeRule(
        lambda name, _, c: bool(VOCAB_NAMES.match(name)) and _not_type_vocab(name),
        lambda *_: VOCAB,
        "a vocabulary a checkpoint sets (ESM)",
    ),
    SizeRule(
        lambda name, _, c: bool(EXPERT_NAMES.match(name)),
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
        lambda name, _, c: bool(FFN_NAMES.match(name)),
        lambda *_: FFN,
        "an expert's width that a checkpoint sets (Diffusion-Gemma's moe_intermediate_size)",
    ),
    SizeRule(
        lambda name, _, c: c.level == "tiny" and bool(KV_HEAD_NAMES.match(name)),
        lambda *_: 2,
        "the head layout of a block a checkpoint sets (Qwen4-Exp's indexer)",
    ),
    SizeRule(
        lambda name, _, c: c.level == "tiny" and bool(HEAD_NAMES.match(name)),
        lambda *_: HEADS,
        "a head count a checkpoint sets",
    ),
    SizeRule(
        lambda name, _, c: c.level == "tiny" and bool(HEAD_DIM_NAMES.match(name)) and name != "head_dim",
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
        lambda *_: 2 * SLIDING_WINDOW,
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
        lambda name, _, c: bool(TOP_K_NAMES.match(name)) and c.has_experts(besides=name),
        lambda *_: TOP_K,
        "experts chosen per token, where there are experts",
    ),
)

# Integer fields over a bound, at every level but `default` (layer counts are decided before these rows).
SIZE_CAPS = (
    SizeRule(
        lambda name, _, c: name in LAYER_BOUNDS,
        lambda name, value, c: min(value, LAYER_BOUNDS[name]),
        "layer counts inside the layer count (dense layers before the experts, shared KV layers)",
    ),
    SizeRule(
        lambda name, value, c: bool(EXPERT_NAMES.match(name)) and value > EXPERTS,
        lambda *_: EXPERTS,
        "mixtures of experts",
    ),
    SizeRule(
        lambda name, value, c: bool(TOP_K_NAMES.match(name)) and value > TOP_K,
        lambda *_: TOP_K,
        "experts chosen per token",
    ),
    SizeRule(
        lambda name, value, c: bool(VOCAB_NAMES.match(name)) and value > VOCAB and _not_type_vocab(name),
        lambda *_: VOCAB,
        "vocabularies (not token-type vocabularies)",
    ),
    SizeRule(
        lambda name, value, c: bool(POSITION_NAMES.match(name)) and value > MAX_POSITIONS,
        lambda *_: MAX_POSITIONS,
        "position tables",
    ),
    SizeRule(
        lambda name, value, c: name == "max_source_positions" and value > AUDIO_POSITIONS,
        lambda *_: AUDIO_POSITIONS,
        "audio encoders' positions (Whisper)",
    ),
)


def _capped(bound: int, to: int | None = None) -> Callable[[str, Any, RuleContext], Any]:
    return lambda name, value, c: (bound if to is None else to) if value > bound else KEEP


def _core_width(names: re.Pattern, core: Collection[str]) -> Callable[[str, Any, RuleContext], bool]:
    """A width field matching `names` (at `narrow`, one of the `core` names), outside per-stage models."""
    return lambda name, _, c: bool(names.match(name)) and (not c.core_only or name in core) and not c.hierarchical


# Widths, at `tiny` and `narrow` only (`narrow`: the core names only; per-stage models keep theirs).
WIDTH_CAPS = (
    SizeRule(
        lambda name, _, c: bool(KV_HEAD_NAMES.match(name)),
        lambda name, value, c: (
            (HEADS if (c.heads is None or value >= c.heads or c.mha) else min(value, 2))
            if value > 1 and (not c.core_only or name == "num_key_value_heads")
            else KEEP
        ),
        "grouped key/value heads stay grouped, or as many as the heads (MHA)",
    ),
    SizeRule(
        _core_width(HEAD_NAMES, CORE_HEAD_NAMES),
        _capped(HEADS),
        "attention heads",
    ),
    SizeRule(
        lambda name, _, c: bool(HEAD_DIM_NAMES.match(name)) and not c.core_only and not c.hierarchical,
        lambda name, value, c: (
            (HEAD_DIM // 2 if name in ("qk_rope_head_dim", "qk_nope_head_dim") else HEAD_DIM)
            if value > HEAD_DIM
            else KEEP
        ),
        "head widths (MLA's rope and nope halves)",
    ),
    SizeRule(
        _core_width(FFN_NAMES, CORE_FFN_NAMES),
        _capped(FFN),
        "feed-forward widths",
    ),
    SizeRule(
        _core_width(WIDTH_NAMES, CORE_WIDTH_NAMES),
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
        lambda name, value, c: name in ROTARY_DIMS and value > HEAD_DIM,
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
        lambda name, value, c: name == "sliding_window" and c.level == "tiny" and value > SLIDING_WINDOW,
        lambda *_: SLIDING_WINDOW,
        "smaller than the synthesised sequence, so that the sliding-window mask really cuts",
    ),
)
