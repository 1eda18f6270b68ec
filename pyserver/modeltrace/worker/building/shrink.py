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

This module is the engine; the knowledge is elsewhere, as data. What a field's name says it is, and the sizes,
are `sizes.py`; the rules are rows in `shrink_rules.py` (`UNSET_SIZE_RULES`, `SIZE_CAPS`, `WIDTH_CAPS`: a test of
the field, the size it gets, and which models need the row), read by one generic loop in `_shrink_values`; the
structural fixes that keep a shrunk config consistent (per-layer lists, layer sums, stage widths, rope sections)
are the rows of `CONSISTENCY_STEPS` in `shrink_steps.py`, run in order after the size rows.
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
import re
from collections.abc import Iterator
from typing import Any

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building.config_tree import is_config, safe_getattr, walk_configs
from modeltrace.worker.building.shrink_rules import KEEP, SIZE_CAPS, UNSET_SIZE_RULES, WIDTH_CAPS, RuleContext
from modeltrace.worker.building.shrink_steps import CONSISTENCY_STEPS, StepContext
from modeltrace.worker.building.sizes import (
    DEPTH_LISTS,
    HEAD_NAMES,
    LAYER_BOUNDS,
    LAYER_INDEX_NAMES,
    LAYER_KIND_LISTS,
    LAYER_NAMES,
    LAYERS,
    NOT_LAYER_COUNTS,
    TOKEN_NAMES,
    VOCAB,
    VOCAB_NAMES,
    int_list,
    is_int,
    is_size_name,
)


LEVELS = ("tiny", "narrow", "shallow", "default")
# Fields never reset to their class default (None) to be derived again: special tokens, the window, label maps, RoPE.
_DERIVED_KEEP = {
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "sliding_window",
    "id2label",
    "label2id",
    "rope_parameters",
}
# Bookkeeping entries of `to_dict()` that are not constructor arguments.
_DROPPED = ("transformers_version", "model_type", "architectures", "_name_or_path", "dtype", "torch_dtype")


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
            if is_int(values.get(value[1])):
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


def _own_values(config: Any) -> dict[str, Any]:
    """The config's fields as keyword arguments: sub-configs as instances, bookkeeping entries dropped."""
    values = config.to_dict()
    for name in _DROPPED:
        values.pop(name, None)
    for name, value in list(vars(config).items()):
        if is_config(value):
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
        if is_config(value):
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
        if TOKEN_NAMES.match(name) and token_map:
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
            for name in LAYER_KIND_LISTS
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


def _still_missing(config: Any) -> dict[str, Any]:
    """Fields the model reads that neither the defaults nor `__post_init__` set (a head size, the layer types)."""
    fields = _field_defaults(type(config))
    missing: dict[str, Any] = {}
    hidden, heads = safe_getattr(config, "hidden_size"), safe_getattr(config, "num_attention_heads")
    unset_head_dim = "head_dim" in fields and safe_getattr(config, "head_dim", 0) is None
    if unset_head_dim and is_int(hidden) and is_int(heads) and heads:
        missing["head_dim"] = hidden // heads
    if "num_key_value_heads" in fields and safe_getattr(config, "num_key_value_heads", 0) is None and is_int(heads):
        missing["num_key_value_heads"] = heads
    layers = safe_getattr(config, "num_hidden_layers")
    if "layer_types" in fields and safe_getattr(config, "layer_types", 0) is None and is_int(layers):
        missing["layer_types"] = ["full_attention"] * layers
    return missing


def _default_sub_config(spec: Any) -> Any:
    try:
        if spec.model_type in ("timm_backbone", "timm_wrapper"):
            return None
        return spec.default_config
    except Exception:  # noqa: BLE001
        return None


# --- one config: the size rows, then the consistency steps ------------------------------------------------


def _shrink_values(config: Any, values: dict[str, Any], level: str, mha: bool = False) -> dict[str, Any]:
    """The rules of the module docstring applied to one config's own values (sub-configs already shrunk)."""
    new = dict(values)
    defaults = _field_defaults(type(config))
    widths = level == "tiny" or level == "narrow"
    core_only = level == "narrow"
    hierarchical = any(HEAD_NAMES.match(name) and int_list(value) for name, value in values.items())
    staged = any(name in DEPTH_LISTS and int_list(value) for name, value in values.items())
    stage_counts = {len(value) for name, value in values.items() if name in DEPTH_LISTS and int_list(value)}

    # Reset what __post_init__ derived, so it is derived again from the shrunk values: fields whose class
    # default is None, or a keyword such as "auto" (Mamba's `time_step_rank`, Falcon-H1's `mamba_d_head`).
    for name, value in values.items():
        if name not in defaults or name in _DERIVED_KEEP or TOKEN_NAMES.match(name) or is_config(value):
            continue
        if LAYER_INDEX_NAMES.match(name) or name in LAYER_KIND_LISTS:
            continue  # kept, and cut or moved inside the new layer count below
        if not is_size_name(name):
            continue  # not a size: whatever __post_init__ made of it stays (and stays equal to its twins)
        default = defaults[name]
        if default is None and value is not None:
            new[name] = None
        elif isinstance(default, str) and is_int(value):
            new[name] = default
    # Sizes a model needs that its default config leaves unset (ESM's vocabulary, DeepSeek-V2's experts).
    context = RuleContext(
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
    if int_list(indices) and isinstance(stages, (list, tuple)) and not staged:
        for name in ("num_hidden_layers", "num_layers"):
            if is_int(values.get(name)) and len(stages) == values[name] + 1 and values[name] > LAYERS:
                backbone_layers = max(LAYERS, len(indices))
                kept = list(range(backbone_layers - len(indices) + 1, backbone_layers + 1))
                new["out_indices"] = kept
                new["stage_names"] = ["stem"] + [f"stage{index}" for index in range(1, backbone_layers + 1)]
                if isinstance(values.get("out_features"), (list, tuple)):
                    new["out_features"] = [f"stage{index}" for index in kept]
    for name, value in values.items():
        if not is_int(value) or is_config(value):
            continue
        if LAYER_NAMES.match(name) and name not in NOT_LAYER_COUNTS and name not in LAYER_BOUNDS:
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
            if size is not KEEP:
                new[name] = size

    step_context = StepContext(config, level, layer_counts, staged)
    for step in CONSISTENCY_STEPS:
        if step.levels is None or level in step.levels:
            if step.applies is None or step.applies(step_context):
                step.fix(values, new, step_context)
    return new


# --- special tokens -----------------------------------------------------------------------------------------


def _token_map(config: Any, level: str) -> dict[int, int]:
    """Old id -> new id for special tokens outside the shrunk vocabulary (one new id per old id, tree-wide)."""
    vocabularies = [
        value
        for node in walk_configs(config)
        for name, value in vars(node).items()
        if VOCAB_NAMES.match(name) and is_int(value) and value > VOCAB and not name.startswith(("type_", "token_type"))
    ]
    if not vocabularies:
        return {}
    used: set[int] = set()
    outside: list[int] = []
    for node in walk_configs(config):
        for _, value in _token_values(node):
            for token in value if isinstance(value, (list, tuple)) else [value]:
                if not is_int(token) or token < 0:
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
        if TOKEN_NAMES.match(name) and (is_int(value) or int_list(value)):
            yield name, value


def _remap_tokens(value: Any, mapping: dict[int, int]) -> Any:
    if is_int(value):
        return mapping.get(value, value)
    if isinstance(value, (list, tuple)) and all(is_int(item) for item in value):
        remapped = [mapping.get(item, item) for item in value]
        return type(value)(remapped) if isinstance(value, tuple) else remapped
    return value
