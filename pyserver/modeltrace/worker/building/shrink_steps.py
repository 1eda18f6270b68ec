"""The consistency steps of the shrink: what keeps a shrunk config consistent, as rows with their reason.

After the size rules (`shrink_rules.py`) have shrunk each field on its own, the steps of `CONSISTENCY_STEPS` fix
what ties fields together, in the order of the table: per-layer lists cut to the new depth and layer indices kept
inside it, layer counts that are parts of a total, top-k inside the expert count, stage widths scaled together,
image sizes and pooled image tokens, Mamba-2 heads, multimodal RoPE sections. Each row says at which levels it
runs and which models need it; the engine (`shrink._shrink_values`) runs the table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from modeltrace.worker.building.config_tree import is_config
from modeltrace.worker.building.sizes import (
    DEPTH_LISTS,
    EXPERT_NAMES,
    FFN,
    FFN_NAMES,
    HEAD_DIM,
    HEAD_DIM_NAMES,
    HEAD_NAMES,
    HEADS,
    KV_HEAD_NAMES,
    LAYER_INDEX_NAMES,
    LAYER_KIND_LISTS,
    LAYER_NAMES,
    LAYERS,
    MAX_IMAGE_TOKENS,
    NOT_LAYER_COUNTS,
    SLIDING_WINDOW,
    TOP_K_NAMES,
    WIDTH,
    WIDTH_NAMES,
    int_list,
    is_int,
)

# Compound scaling of convolutional nets (EfficientNet-B7 is 2.0 wide and 3.1 deep).
_SCALING_FACTORS = {
    "width_coefficient": 0.25,
    "depth_coefficient": 1.0,
    "width_multiplier": 0.25,
    "depth_multiplier": 1.0,
}
# The image size of a convolutional net (any size runs, and 600 px is slow).
CONV_IMAGE_SIZE = 224
# Layer patterns: one kind of layer every N layers (Llama 4's no-rope layers, Jamba's attention period).
_PATTERN_NAMES = re.compile(
    r"^_?([a-z_]*_pattern|[a-z_]*_period|[a-z_]*_interval|[a-z_]*_frequency|[a-z_]*_every|[a-z_]*_freq"
    r"|decoder_sparse_step|sparse_step)$"
)
# Switches that need kernels or libraries this machine may not have.
_KERNEL_SWITCHES = (
    "use_mamba_kernels",
    "use_kernels",
    "use_fused_kernels",
    "use_flash_attention",
    "use_triton",
    "use_timm_backbone",
    "use_pretrained_backbone",
)
# Layer kinds that attend through a sliding window.
_SLIDING_KINDS = ("sliding_attention", "sliding_window", "local", "local_attention")


@dataclass
class StepContext:
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

    fix: Callable[[dict[str, Any], dict[str, Any], StepContext], None]
    reason: str
    levels: tuple[str, ...] | None = None
    applies: Callable[[StepContext], bool] | None = None


_WIDTH_LEVELS = ("tiny", "narrow")


def _fix_scaling(old: dict[str, Any], new: dict[str, Any], context: StepContext) -> None:
    """Compound scaling factors capped; the head's width follows the width coefficient."""
    for name, limit in _SCALING_FACTORS.items():
        value = old.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
            new[name] = limit
            # EfficientNet's `hidden_dim` is 1280 × width.
            if name.startswith("width") and is_int(old.get("hidden_dim")):
                divisor = old.get("depth_divisor") if is_int(old.get("depth_divisor")) else 8
                scaled = max(divisor, int(old["hidden_dim"] * limit / value + divisor / 2) // divisor * divisor)
                new["hidden_dim"] = scaled


def _fix_layer_patterns(old: dict[str, Any], new: dict[str, Any], context: StepContext) -> None:
    """One full-attention layer every N layers, attention/expert layers every N from an offset: N inside LAYERS."""
    for name, value in old.items():
        if is_int(value) and _PATTERN_NAMES.match(name) and value > LAYERS and not is_config(value):
            new[name] = LAYERS
            offset_name = name.replace("period", "offset")
            if offset_name != name and is_int(old.get(offset_name)):
                new[offset_name] = min(old[offset_name], LAYERS - 1)


def _fix_kernel_switches(old: dict[str, Any], new: dict[str, Any], context: StepContext) -> None:
    for name in _KERNEL_SWITCHES:
        if old.get(name) is True:
            new[name] = False


def _fix_sliding_window(old: dict[str, Any], new: dict[str, Any], context: StepContext) -> None:
    kinds = new.get("layer_types") or old.get("layer_types") or ()
    if (
        "sliding_window" in old
        and old["sliding_window"] is None
        and any(kind in _SLIDING_KINDS for kind in kinds if isinstance(kind, str))
    ):
        new["sliding_window"] = SLIDING_WINDOW if context.level == "tiny" else 4096


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
    context = new.get("context_length") if is_int(new.get("context_length")) else new.get("prediction_length")
    if not is_int(context):
        return
    for name in ("label_length",):
        if is_int(new.get(name)) and new[name] > context:
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
    widths = {name: old[name] for name in _STAGE_WIDTHS if is_int(old.get(name)) or int_list(old.get(name))}
    first = next((value if is_int(value) else value[0] for value in widths.values()), None)
    if not first:
        return
    heads = next((value for name, value in old.items() if HEAD_NAMES.match(name) and int_list(value)), None)
    per_head = first / heads[0] if heads else first
    if per_head <= HEAD_DIM:
        return
    scale = HEAD_DIM / per_head

    def scaled(value: int) -> int | None:
        result = value * scale
        return int(result) if result == int(result) and result >= 1 else None

    for name, value in widths.items():
        if is_int(value):
            result = scaled(value)
            if result is not None:
                new[name] = result
        else:
            results = [scaled(item) for item in value]
            if all(result is not None for result in results):
                new[name] = type(value)(results) if isinstance(value, tuple) else results


def _fix_layer_sums(old: dict[str, Any], new: dict[str, Any], layer_counts: dict[int, int]) -> None:
    """Layer counts that are parts of a total (Dory's input + recurrent + output layers = all layers)."""
    for total_name in ("num_hidden_layers", "num_layers", "n_layer"):
        total = old.get(total_name)
        if not is_int(total):
            continue
        parts = [
            name
            for name, value in old.items()
            if name != total_name
            and is_int(value)
            and value > 0
            and LAYER_NAMES.match(name)
            and name not in NOT_LAYER_COUNTS
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
    kinds_name = next((name for name in LAYER_KIND_LISTS if isinstance(old.get(name), (list, tuple))), None)
    old_kinds = list(old[kinds_name]) if kinds_name else []
    new_kinds = list(new.get(kinds_name) or []) if kinds_name else []
    layers = next((new[name] for name in ("num_hidden_layers", "num_layers") if is_int(new.get(name))), None)
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
    if not is_int(value):
        return value
    if HEAD_DIM_NAMES.match(name) and value > HEAD_DIM:
        return HEAD_DIM
    if KV_HEAD_NAMES.match(name) and value > 2:
        return 2
    if HEAD_NAMES.match(name) and value > HEADS:
        return HEADS
    if FFN_NAMES.match(name) and value > FFN:
        return FFN
    if WIDTH_NAMES.match(name) and value > WIDTH:
        return WIDTH
    return value


def _fix_experts(old: dict[str, Any], new: dict[str, Any]) -> None:
    experts = [value for name, value in new.items() if EXPERT_NAMES.match(name) and is_int(value)]
    if not experts:
        return
    count = min(experts)
    for name, value in new.items():
        if TOP_K_NAMES.match(name) and is_int(value):
            new[name] = min(value, count)
    # Group-limited routing (DeepSeek-V3): the experts split into n_group groups, topk_group of them chosen.
    if is_int(new.get("n_group")) and new["n_group"] > 1 and count % new["n_group"]:
        new["n_group"] = 1
    if is_int(new.get("n_group")) and is_int(new.get("topk_group")):
        new["topk_group"] = min(new["topk_group"], new["n_group"])
    if is_int(new.get("num_expert_group")) and count % new["num_expert_group"]:
        new["num_expert_group"] = 1
        if is_int(new.get("topk_group")):
            new["topk_group"] = 1


def _fix_layer_lists(old: dict[str, Any], new: dict[str, Any], layer_counts: dict[int, int], level: str) -> None:
    """Cut per-layer lists to the new layer count; keep layer indices inside it.

    Layer indices are kept inside `LAYERS` in every config of the tree, not just where the count changed: a
    composite config's adapter names layers of its vision tower (Molmo2's `vision_feature_layer`).
    """
    if level != "default":
        for name, value in old.items():
            if not LAYER_INDEX_NAMES.match(name) or new.get(name) is None:
                continue
            if int_list(value):
                new[name] = (
                    type(value)(_clamp_indices(list(value), LAYERS))
                    if isinstance(value, tuple)
                    else _clamp_indices(list(value), LAYERS)
                )
            elif is_int(value) and not -LAYERS <= value < LAYERS:
                new[name] = _clamp_indices([value], LAYERS)[0]
    if not layer_counts:
        return
    for name, value in old.items():
        if not isinstance(value, (list, tuple)) or not value or new.get(name) is None:
            continue
        if len(value) in layer_counts and not LAYER_INDEX_NAMES.match(name):
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
    for name in DEPTH_LISTS:
        value = old.get(name)
        if int_list(value) and max(value) > 1:
            new[name] = type(value)(1 for _ in value) if isinstance(value, tuple) else [1 for _ in value]


def _fix_images(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Halve an image size whose patch grid has more than MAX_IMAGE_TOKENS positions."""
    size, patch = old.get("image_size"), old.get("patch_size")
    if (
        is_int(size)
        and size > CONV_IMAGE_SIZE
        and "patch_size" not in old
        and "patch_sizes" not in old
        and (any(name in _SCALING_FACTORS for name in old) or "kernel_sizes" in old)
    ):
        new["image_size"] = CONV_IMAGE_SIZE  # a convolutional net: any size runs, and 600 px is slow
        return
    if not (is_int(size) and is_int(patch) and patch > 0):
        return
    if "window_size" in old or any(name in DEPTH_LISTS for name in old):
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
        is_int(tokens)
        and vision is not None
        and is_int(getattr(vision, "image_size", None))
        and is_int(getattr(vision, "patch_size", None))
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
    if not (is_int(hidden) and isinstance(expand, (int, float))):
        return
    inner = int(expand * hidden)
    for name in ("mamba_d_ssm", "ssm_inner_size", "mamba_intermediate_size"):
        if is_int(new.get(name)):
            inner = new[name]
    for heads_name, dim_name in (
        ("num_heads", "head_dim"),
        ("mamba_n_heads", "mamba_d_head"),
        ("mamba_num_heads", "mamba_head_dim"),
        ("ssm_num_heads", "ssm_head_dim"),
    ):
        if is_int(new.get(heads_name)) and is_int(new.get(dim_name)) and new[heads_name] * new[dim_name] != inner:
            if inner % new[dim_name] == 0:
                new[heads_name] = inner // new[dim_name]
            elif inner % new[heads_name] == 0:
                new[dim_name] = inner // new[heads_name]
    for groups_name in ("n_groups", "mamba_n_groups", "ssm_n_groups"):
        for heads_name in ("num_heads", "mamba_n_heads", "ssm_num_heads"):
            if is_int(new.get(groups_name)) and is_int(new.get(heads_name)) and new[heads_name] % new[groups_name]:
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
    if not int_list(rope.get("mrope_section")):
        return
    head_dim = new.get("head_dim")
    if not is_int(head_dim):
        hidden, heads = new.get("hidden_size"), new.get("num_attention_heads")
        head_dim = hidden // heads if is_int(hidden) and is_int(heads) and heads else HEAD_DIM
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
