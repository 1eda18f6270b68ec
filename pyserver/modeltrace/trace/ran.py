"""What ran, in one line, from a trace header: the config class, the sizes it ran at against the config's own,
the sequence length and where the weights came from.

`Qwen3Config shrunk: hidden 64 of 4096, layers 2 of 36, heads 4 of 32 · 7 tokens · random weights (seed 0)`.
The editor shows it atop every hover and in the status bar's tooltip, so that `[1,7,64]` is read as the shrunk
model's shape, not the real one's. Pure: reads the header's `config`, `build` (`config_class`, `own_sizes`,
written by the worker's builders), `inputs` and `options`; headers written before `own_sizes` existed say
the sizes without the config's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The fields named in the line, in order: (label, the config fields that hold it, first found wins).
_SHOWN_SIZES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hidden", ("hidden_size", "d_model", "n_embd", "dim")),
    ("layers", ("num_hidden_layers", "num_layers", "n_layer", "n_layers")),
    ("heads", ("num_attention_heads", "n_head", "num_heads")),
)
# Inputs whose second dimension is the sequence length.
_SEQUENCE_INPUTS = ("input_ids", "inputs_embeds", "decoder_input_ids", "hidden_states")


def what_ran(model: Mapping[str, Any]) -> str:
    """The one line (see the module docstring); `model` is a trace header's `model` section."""
    build = model.get("build") if isinstance(model.get("build"), Mapping) else {}
    options = model.get("options") if isinstance(model.get("options"), Mapping) else {}
    config = model.get("config") if isinstance(model.get("config"), Mapping) else {}
    parts = [_sizes(build, options, config)]
    tokens = _sequence_length(model.get("inputs"))
    if tokens is not None:
        parts.append(f"{tokens} token{'s' if tokens != 1 else ''}")
    parts.append(_weights(model, options))
    return " · ".join(part for part in parts if part)


def _sizes(build: Mapping[str, Any], options: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    config_class = build.get("config_class") if isinstance(build.get("config_class"), str) else None
    own = build.get("own_sizes") if isinstance(build.get("own_sizes"), Mapping) else None
    text = _text_part(config)
    sizes: list[str] = []
    for label, fields in _SHOWN_SIZES:
        for field in fields:
            changed = own.get(field) if own is not None else None
            if changed is None and own is not None:
                changed = own.get(f"text_config.{field}")
            if isinstance(changed, list) and len(changed) == 2:
                sizes.append(f"{label} {changed[0]} of {changed[1]}")
                break
            value = text.get(field)
            if type(value) is int:
                sizes.append(f"{label} {value}")
                break
    if options.get("shape_only"):
        how = "full size, shapes only (meta device)"
    elif own:
        how = "shrunk"
    elif build.get("config"):
        how = "as given"
    elif own is not None or options.get("checkpoint"):
        how = "as is"
    else:
        how = ""
    name = config_class or "the model's config"
    if not sizes and not config_class:
        return ""
    head = f"{name} {how}".strip()
    return f"{head}: {', '.join(sizes)}" if sizes else head


def _text_part(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config's own fields, else its text part's (a multimodal config keeps its sizes in `text_config`)."""
    if any(field in config for _, fields in _SHOWN_SIZES for field in fields):
        return config
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _sequence_length(inputs: Any) -> int | None:
    if not isinstance(inputs, list):
        return None
    for name in _SEQUENCE_INPUTS:
        for summary in inputs:
            if isinstance(summary, Mapping) and summary.get("key") == name:
                shape = summary.get("shape")
                if isinstance(shape, list) and len(shape) >= 2 and type(shape[1]) is int:
                    return shape[1]
    return None


def _weights(model: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    if options.get("shape_only"):
        return "no weights"
    if options.get("checkpoint"):
        return f"checkpoint weights ({options['checkpoint']})"
    if model.get("recipe"):
        return "the recipe's weights"
    seed = options.get("seed")
    return f"random weights (seed {seed})" if type(seed) is int else "random weights"
