"""Small values for a plain module's constructor arguments, from their names and annotations, as rows.

`class TinyBlock(nn.Module): def __init__(self, dim, hidden, num_heads=8)` takes no config: the worker builds it
with `dim=64, hidden=128, num_heads=4` (`worker/building/plain.py`), and the editor's lens knows before any trace
whether it can (`lsp/classes.py`). Both ask `guess_argument` here, on names and annotation text only (no torch, no
user code). The sizes are those the config shrink gives the same kinds of field (`worker/building/sizes.py`:
width 64, feed-forward 128, 4 heads of 16, 2 layers), so that heads divide the width as they do in a shrunk config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ArgumentRule:
    """An argument whose name matches `pattern` gets `value`; `reason` says why that value."""

    pattern: re.Pattern[str]
    value: int | float | bool
    reason: str


def _names(pattern: str) -> re.Pattern[str]:
    return re.compile(f"^({pattern})$")


# NOTE: the first matching row wins, so the specific names come before the patterns that would also match them
# (`head_dim` before `…_dim`, `hidden` as the feed-forward size of `TinyBlock(dim, hidden)` before widths).
ARGUMENT_RULES = (
    ArgumentRule(_names(r"layer_idx|layer_id|layer_index|layer_number|block_idx|layer_num"), 0, "the first layer"),
    ArgumentRule(
        _names(r"num_key_value_heads|num_kv_heads|n_kv_heads|kv_heads|num_kv_groups|n_kv_head"),
        2,
        "key/value heads divide the 4 heads",
    ),
    ArgumentRule(
        _names(r"num_heads|n_heads|n_head|heads|num_attention_heads|nhead|attention_heads|[a-z_]*_num_heads"),
        4,
        "4 heads divide the width of 64",
    ),
    ArgumentRule(_names(r"head_dim|d_head|dim_head|head_size|d_kv|attention_head_size"), 16, "width 64 / 4 heads"),
    ArgumentRule(
        _names(
            r"hidden|intermediate_size|intermediate_dim|ffn_dim|ff_dim|d_ff|mlp_dim|mlp_hidden_dim|dim_feedforward"
            r"|hidden_features|inner_dim|ffn_hidden_size|dim_ff|[a-z_]*_ffn_dim|[a-z_]*_intermediate_size"
        ),
        128,
        "a feed-forward size: twice the width",
    ),
    ArgumentRule(
        _names(
            r"dim|d_model|hidden_size|hidden_dim|embed_dim|embedding_dim|emb_dim|n_embd|n_embed|d_embed|model_dim"
            r"|width|channels|in_channels|out_channels|in_features|out_features|in_dim|out_dim|input_dim|output_dim"
            r"|input_size|output_size|features|num_features|num_channels|[a-z_]*_hidden_size|[a-z_]*_embed_dim"
        ),
        64,
        "a width",
    ),
    ArgumentRule(
        _names(r"num_layers|n_layers|n_layer|depth|num_blocks|num_hidden_layers|n_blocks|[a-z_]*_layers"),
        2,
        "two layers show a repeated block",
    ),
    ArgumentRule(
        _names(r"vocab_size|num_embeddings|n_vocab|vocab|num_tokens|[a-z_]*_vocab_size"), 128, "a vocabulary"
    ),
    ArgumentRule(
        _names(
            r"max_position_embeddings|max_seq_len|max_seq_length|max_len|max_length|block_size|context_length"
            r"|seq_len|n_positions|n_ctx|max_positions|num_positions"
        ),
        32,
        "positions: more than the 7 tokens synthesised",
    ),
    ArgumentRule(_names(r"num_experts|n_experts|num_local_experts|n_routed_experts"), 4, "a few experts"),
    ArgumentRule(_names(r"top_k|topk|num_experts_per_tok"), 2, "top-2 of the experts"),
    ArgumentRule(_names(r"num_classes|num_labels|n_classes|num_outputs"), 2, "two classes"),
    ArgumentRule(_names(r"num_groups|groups_count"), 4, "groups divide the width"),
    ArgumentRule(_names(r"kernel_size|conv_kernel|conv_kernel_size|d_conv"), 3, "a small kernel"),
    ArgumentRule(_names(r"stride|dilation|groups"), 1, "the identity setting"),
    ArgumentRule(_names(r"padding"), 0, "no padding"),
    ArgumentRule(_names(r"patch_size"), 4, "a small patch"),
    ArgumentRule(_names(r"image_size|img_size|resolution"), 32, "a small image"),
    ArgumentRule(_names(r"eps|epsilon|[a-z_]*_eps"), 1e-6, "a norm's epsilon"),
    ArgumentRule(
        _names(
            r"dropout|p|drop|drop_rate|drop_prob|attn_drop|proj_drop|[a-z_]*_dropout|dropout_[a-z_]+|drop_path[a-z_]*"
        ),
        0.0,
        "no dropout: a trace is deterministic",
    ),
    ArgumentRule(_names(r"bias|use_bias|[a-z_]*_bias"), True, "with a bias"),
    ArgumentRule(_names(r"rope_theta|theta|base|rotary_base"), 10000.0, "the usual rotary base"),
)

# What an annotation alone says, when the name says nothing (`scale: float`): a small value of that type.
ANNOTATION_VALUES: dict[str, int | float | bool] = {"int": 16, "float": 1.0, "bool": False}


@dataclass(frozen=True)
class Guess:
    """A value for an argument and why (`reason`); `by_name`: from a rule on its name (a size, replacing even a
    default), else from its annotation."""

    value: int | float | bool
    reason: str
    by_name: bool


def _annotation_type(annotation: str | None) -> str | None:
    """`int` for `int`, `Optional[int]`, `int | None`, `"int"`; None for anything else."""
    if not annotation:
        return None
    text = annotation.strip().strip("\"'").replace(" ", "")
    text = re.sub(r"^(typing\.)?Optional\[(.+)\]$", r"\2", text)
    arms = [arm for arm in text.split("|") if arm != "None"]
    return arms[0] if len(arms) == 1 and arms[0] in ANNOTATION_VALUES else None


def guess_argument(name: str, annotation: str | None) -> Guess | None:
    """A small value for a constructor argument named `name` (annotated `annotation`, as source text), or None
    when neither says what it is. A name rule gives a number only where the annotation allows one."""
    kind = _annotation_type(annotation)
    for rule in ARGUMENT_RULES:
        if rule.pattern.match(name):
            value = rule.value
            if kind is None and annotation and annotation.strip().strip("\"'") not in ("", "None"):
                # NOTE: annotated with something else (`norm: nn.Module`, `dim: tuple[int, int]`): not this rule's
                return None
            if kind == "int" and isinstance(value, float) or kind == "float" and isinstance(value, bool):
                return None
            if kind == "float" and isinstance(value, int):
                value = float(value)
            return Guess(value, rule.reason, by_name=True)
    if kind is not None:
        return Guess(ANNOTATION_VALUES[kind], f"a small {kind}", by_name=False)
    return None


def is_config_argument(name: str, has_default: bool) -> bool:
    """Whether a constructor argument takes the model's config (`config`, `text_config` without a default)."""
    return name == "config" or name.endswith("_config") and not has_default
