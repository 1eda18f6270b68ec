"""What a config field's name says it is, and the size the shrink gives each kind.

transformers' config classes name their sizes in many ways (`hidden_size`, `d_model`, `n_embd`, `embed_dim`,
`depth`, `encoder_layers`, `n_routed_experts`, ...). The shrink (`shrink.py`) goes by what a field's name says,
so the names are the patterns here: widths, feed-forward sizes, heads and head sizes, layer counts and the names
that look like layer counts but are not, experts and top-k, vocabularies, positions, layer indices, special
tokens, per-stage depth lists. Next to them are the sizes each kind becomes (`WIDTH`, `HEADS`, `LAYERS`, ...) and
the value tests every shrink module shares (`is_int`, `int_list`).

The size rules (`shrink_rules.py`), the consistency steps (`shrink_steps.py`) and the engine (`shrink.py`) read
these names; this module imports nothing of theirs.
"""

from __future__ import annotations

import re
from typing import Any


# --- the sizes each kind of field becomes -----------------------------------------------------------------

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
# NOTE: smaller than the synthesised sequence, so that a sliding-window mask really cuts.
SLIDING_WINDOW = 4


# --- what a field's name says it is ------------------------------------------------------------------------

WIDTH_NAMES = re.compile(
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
CORE_WIDTH_NAMES = set(HIDDEN_WIDTH_NAMES)
FFN_NAMES = re.compile(
    r"^(intermediate_size|d_ff|n_inner|ffn_dim|mlp_dim|d_inner|ffn_hidden_size|inner_dim|dim_feedforward"
    r"|[a-z_]*_intermediate_size|[a-z_]*_ffn_dim|[a-z_]*_ffn_size|[a-z_]*_mlp_dim|[a-z_]*_intermediate_dim)$"
)
CORE_FFN_NAMES = {"intermediate_size", "d_ff", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim"}
KV_HEAD_NAMES = re.compile(
    r"^(num_key_value_heads|num_kv_heads|n_kv_heads|multi_query_group_num|[a-z_]*_key_value_heads|[a-z_]*_kv_heads)$"
)
HEAD_NAMES = re.compile(
    r"^(num_attention_heads|num_heads|n_head|n_heads|attention_heads|[a-z_]*_attention_heads|[a-z_]*_num_heads"
    r"|[a-z_]*_n_heads|num_[a-z_]*_heads)$"
)
CORE_HEAD_NAMES = {"num_attention_heads", "num_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads"}
HEAD_DIM_NAMES = re.compile(r"^(head_dim|d_kv|d_head|dim_head|attention_head_size|kv_channels|[a-z_]*_head_dim)$")
LAYER_NAMES = re.compile(
    r"^(num_hidden_layers|num_layers|n_layer|n_layers|depth|encoder_layers|decoder_layers|num_encoder_layers"
    r"|num_decoder_layers|num_blocks|[a-z_]*_num_layers|num_[a-z_]*_layers|[a-z_]*_depth|[a-z_]*_layers)$"
)
# Names that look like layer counts but index layers, or count something that must stay below the layer count.
LAYER_BOUNDS = {
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "num_kv_shared_layers": 0,
    "max_window_layers": LAYERS,
    "num_nextn_predict_layers": 1,
    "num_dense_layers_prefix": 1,
}
# Names that match the layer-count pattern but count something else.
NOT_LAYER_COUNTS = {
    "num_feat_extract_layers",
    "num_conv_pos_embedding_groups",
    "num_adapter_layers",
    "num_lstm_layers",
    "num_residual_layers",
    "iou_head_depth",
    "max_depth",
}
EXPERT_NAMES = re.compile(
    r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|[a-z_]*_num_experts)$"
)
TOP_K_NAMES = re.compile(
    r"^(num_experts_per_tok|num_experts_per_token|moe_topk|moe_top_k|top_k|moe_k|topk|num_selected_experts"
    r"|router_top_k|top_k_experts|num_activated_experts)$"
)
VOCAB_NAMES = re.compile(r"^(vocab_size|[a-z_]*_vocab_size|vocab_size_[a-z_]*|[a-z_]*_group_vocab)$")
POSITION_NAMES = re.compile(
    r"^(max_position_embeddings|n_positions|max_target_positions|n_ctx|max_seq_len|max_sequence_length|seq_length"
    r"|max_length|context_length|model_max_length)$"
)
LAYER_INDEX_NAMES = re.compile(
    r"^([a-z_]*feature_layers?|[a-z_]*layers_indices|[a-z_]*layer_ids?|[a-z_]*_layers_idx|[a-z_]*_idxs"
    r"|mlp_only_layers|[a-z_]*select_layers?|[a-z_]*layer_idx)$"
)
TOKEN_NAMES = re.compile(r"^[a-z_]*(_token_id|_token_index|_token_ids|_token)$")
# Per-stage depths of hierarchical models (Swin, ConvNeXt, ResNet).
DEPTH_LISTS = (
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
# Partial rotary widths inside a head.
ROTARY_DIMS = ("rotary_dim", "rotary_ndims", "rope_dim", "rotary_emb_dim", "qk_rope_dim")
# Per-layer lists of layer kinds (one entry per layer).
LAYER_KIND_LISTS = ("layer_types", "layers_block_type", "mlp_layer_types", "block_types", "layer_block_types")


def is_int(value: Any) -> bool:
    """Whether `value` is an integer (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_list(value: Any) -> bool:
    """Whether `value` is a non-empty list or tuple of integers."""
    return isinstance(value, (list, tuple)) and bool(value) and all(is_int(item) for item in value)


def is_size_name(name: str) -> bool:
    """Whether `name` reads like a size these rules shrink (so that a derived value of it is derived again)."""
    patterns = (
        WIDTH_NAMES,
        FFN_NAMES,
        KV_HEAD_NAMES,
        HEAD_NAMES,
        HEAD_DIM_NAMES,
        LAYER_NAMES,
        EXPERT_NAMES,
        TOP_K_NAMES,
        VOCAB_NAMES,
        POSITION_NAMES,
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
        *ROTARY_DIMS,
    )
