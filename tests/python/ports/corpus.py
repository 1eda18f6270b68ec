"""The corpus as data: the pairs (reference recipe, port recipe, rename maps) and the injected porting bugs.

A pair is a folder holding a transformers reference (`*_reference.py`, `recipe_reference.py`) and an
independently written port (`*_port.py`, `recipe_port.py`) whose converter copies the reference's weights.
A bug is a textual patch of the clean port file (applied to a copy, so the port itself stays plain research
code), with the module path of the port that owns the bug and why it is a bug. The truth line is the line of
the patched text, or, for a bug in the weight converter (which runs before any forward), the line that
builds the module whose weight is wrong (`truth_at`): that module's construction is where the port can show it.
The records are defined in `corpus_types.py`; the speech pair and its bugs in `corpus_encodec.py`.
"""

from __future__ import annotations

from ports.corpus_encodec import ENCODEC_BUGS, ENCODEC_PAIR
from ports.corpus_types import CORPUS_ROOT, Bug, Pair, transformers_conversion
from ports.sources import Source, SourceFile

PAIRS: tuple[Pair, ...] = (
    Pair(
        name="gpt2",
        folder="gpt2",
        port_file="gpt2_port.py",
        reference_module="transformers.models.gpt2.modeling_gpt2",
        maps=(
            r"^tok_emb$=>transformer.wte",
            r"^pos_emb$=>transformer.wpe",
            r"^blocks\.(\d+)=>transformer.h.\1",
            r"^ln_f$=>transformer.ln_f",
            r"^head$=>lm_head",
            r"\.attn\.qkv$=>.attn.c_attn",
            r"\.attn\.proj$=>.attn.c_proj",
            r"\.mlp\.fc$=>.mlp.c_fc",
            r"\.mlp\.proj$=>.mlp.c_proj",
        ),
    ),
    Pair(
        name="llama",
        folder="llama",
        port_file="llama_port.py",
        reference_module="transformers.models.llama.modeling_llama",
        maps=(
            r"^tok_embeddings$=>model.embed_tokens",
            r"^layers\.(\d+)=>model.layers.\1",
            r"^norm$=>model.norm",
            r"^output$=>lm_head",
            r"\.attention\.wv$=>.self_attn.v_proj",
            r"\.attention\.wo$=>.self_attn.o_proj",
            r"\.attention$=>.self_attn",
            r"\.feed_forward\.w1$=>.mlp.gate_proj",
            r"\.feed_forward\.w2$=>.mlp.down_proj",
            r"\.feed_forward\.w3$=>.mlp.up_proj",
            r"\.feed_forward$=>.mlp",
            r"\.attention_norm$=>.input_layernorm",
            r"\.ffn_norm$=>.post_attention_layernorm",
        ),
        unmapped="attention.wq and attention.wk: their rows are permuted for the interleaved rotary layout, so "
        "their outputs are a permutation of q_proj's and k_proj's (equal only after the rotary step)",
    ),
    Pair(
        name="bert",
        folder="bert",
        port_file="bert_port.py",
        reference_module="transformers.models.bert.modeling_bert",
        maps=(
            r"^embed\.tok$=>embeddings.word_embeddings",
            r"^embed\.pos$=>embeddings.position_embeddings",
            r"^embed\.seg$=>embeddings.token_type_embeddings",
            r"^embed\.norm$=>embeddings.LayerNorm",
            r"^embed$=>embeddings",
            r"^layers\.(\d+)=>encoder.layer.\1",
            r"\.attn\.q$=>.attention.self.query",
            r"\.attn\.k$=>.attention.self.key",
            r"\.attn\.v$=>.attention.self.value",
            r"\.attn$=>.attention.self",
            r"\.attn_out$=>.attention.output.dense",
            r"\.norm1$=>.attention.output.LayerNorm",
            r"\.ffn\.fc1$=>.intermediate.dense",
            r"\.ffn\.act$=>.intermediate.intermediate_act_fn",
            r"\.ffn\.fc2$=>.output.dense",
            r"\.norm2$=>.output.LayerNorm",
            r"^pool$=>pooler.dense",
        ),
        unmapped="layers.N.ffn: fc1, act and fc2 together have no single counterpart (transformers splits them "
        "between BertIntermediate and BertOutput, whose output also holds the residual and the norm)",
    ),
    # independent: vision
    Pair(
        name="convnext",
        folder="convnext",
        port_file="vendored/modeling_convnext.py",
        reference_module="transformers.models.convnext.modeling_convnext",
        reference_file="vendored/convnext.py",
        maps=(),
        sources=(
            transformers_conversion(
                "convnext/convert_convnext_to_pytorch.py",
                "6303f75aee446b42836ff5db69b1cc8be27001c791f09750ff17406107d96911",
            ),
        ),
    ),
    Pair(
        name="swin",
        folder="swin",
        port_file="vendored/modeling_swin.py",
        reference_module="transformers.models.swin.modeling_swin",
        reference_file="vendored/swin_transformer.py",
        maps=(),
        sources=(
            transformers_conversion(
                "swin/convert_swin_timm_to_pytorch.py",
                "0f57d0796cb94ab0f3051bb530415c51df9f930b3cc2f27e22bb3d4521240b91",
            ),
        ),
    ),
    Pair(
        name="resnet",
        folder="resnet",
        port_file="vendored/modeling_resnet.py",
        reference_module="transformers.models.resnet.modeling_resnet",
        reference_file="vendored/resnet.py",
        maps=(),
        sources=(
            transformers_conversion(
                "resnet/convert_resnet_to_pytorch.py",
                "b2643d8029c53d814dc54d92a1d5c20f0cc80ffa0af98c02357df95fb979f375",
            ),
        ),
    ),
    Pair(
        name="clip",
        folder="clip",
        port_file="vendored/modeling_clip.py",
        reference_module="transformers.models.clip.modeling_clip",
        reference_file="vendored/open_clip/transformer.py",
        maps=(),
        sources=(
            transformers_conversion(
                "clip/convert_clip_original_pytorch_to_hf.py",
                "0a81a8afee54bcddd6251226118ad07c985ec04d773c505175095ed6249c9d3f",
            ),
        ),
    ),
    # independent: LLMs and speech
    Pair(
        name="meta_llama",
        folder="meta_llama",
        port_file="model.py",
        reference_module="transformers.models.llama.modeling_llama",
        maps=(),
        sources=(
            Source(
                repo="meta-llama/llama",
                commit="689c7f261b9c5514636ecc3c5fefefcbb3e6eed7",
                license="LICENSE",
                files=(
                    SourceFile(
                        "llama/model.py",
                        "model.py",
                        "b409ea3db2a4029afd4129246d3b5e76ea95b6503364842545403dbcd7476281",
                    ),
                ),
            ),
        ),
    ),
    Pair(
        name="mistral",
        folder="mistral",
        port_file="one_file_ref.py",
        reference_module="transformers.models.mistral.modeling_mistral",
        maps=(),
        sources=(
            Source(
                repo="mistralai/mistral-inference",
                commit="a4fe135b68c70f0c7f4b269f8de92f00a0859c88",  # the last commit with the one-file reference
                license="LICENSE",
                files=(
                    SourceFile(
                        "one_file_ref.py",
                        "one_file_ref.py",
                        "56bf64723dc6ee9fcdedfe3acc306eb9a2c18bfc350d52a35d79c0b40fee53f2",
                    ),
                ),
            ),
        ),
    ),
    Pair(
        name="gemma_pytorch",
        folder="gemma_pytorch",
        port_file="gemma/model.py",
        reference_module="transformers.models.gemma.modeling_gemma",
        maps=(),
        sources=(
            Source(
                repo="google/gemma_pytorch",
                commit="014acb7ac4563a5f77c76d7ff98f31b568c16508",
                license="LICENSE",
                files=(
                    SourceFile(
                        "gemma/__init__.py",
                        "gemma/__init__.py",
                        "dc69cf649438f581acb4357fef43a849ae1e14b226cba973abf38181c0de44e4",
                    ),
                    SourceFile(
                        "gemma/config.py",
                        "gemma/config.py",
                        "43bcc8e024815e18e41045fd168509669ffc2af506061fa598db795e021dafd1",
                    ),
                    SourceFile(
                        "gemma/model.py",
                        "gemma/model.py",
                        "0a8d3617867caad99adf5428b3e68242b5c067c9666e5efa578837d34db9b089",
                    ),
                    SourceFile(
                        "gemma/siglip_vision/__init__.py",
                        "gemma/siglip_vision/__init__.py",
                        "dc69cf649438f581acb4357fef43a849ae1e14b226cba973abf38181c0de44e4",
                    ),
                    SourceFile(
                        "gemma/siglip_vision/config.py",
                        "gemma/siglip_vision/config.py",
                        "1225a8ce85973f34fb107cc15e74d9943649c9838dcf3ec94d11c0bb3229a130",
                    ),
                ),
            ),
        ),
    ),
    ENCODEC_PAIR,
)

PAIRS_BY_NAME = {pair.name: pair for pair in PAIRS}


BUGS: tuple[Bug, ...] = (
    # --- GPT-2 ------------------------------------------------------------------------------------------------
    Bug(
        name="causal_mask_dropped",
        pair="gpt2",
        kind="causal mask",
        module="blocks.0.attn",
        old='        att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))',
        new='        # att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))',
        why="the mask line commented out: every position attends to later ones",
    ),
    Bug(
        name="softmax_scale",
        pair="gpt2",
        kind="softmax scale",
        module="blocks.0.attn",
        old="* (1.0 / math.sqrt(k.size(-1)))",
        new="* (1.0 / k.size(-1))",
        why="scores scaled by 1/d instead of 1/sqrt(d)",
    ),
    Bug(
        name="final_norm_eps",
        pair="gpt2",
        kind="norm eps",
        module="ln_f",
        old="self.ln_f = nn.LayerNorm(config.n_embd, eps=config.norm_eps)",
        new="self.ln_f = nn.LayerNorm(config.n_embd, eps=1e-6)",
        why="the final LayerNorm built with eps 1e-6 where GPT-2 uses 1e-5 (a construction bug)",
    ),
    Bug(
        name="relu_for_gelu",
        pair="gpt2",
        kind="activation",
        module="blocks.0.mlp",
        old='h = F.gelu(h, approximate="tanh")',
        new="h = F.relu(h)",
        why="ReLU where GPT-2 uses the tanh GELU (gelu_new)",
    ),
    Bug(
        name="mlp_residual_missing",
        pair="gpt2",
        kind="missing residual",
        module="blocks.0",
        old="x = x + self.mlp(self.ln_2(x))",
        new="x = self.mlp(self.ln_2(x))",
        why="the residual around the MLP dropped",
    ),
    Bug(
        name="c_proj_not_transposed",
        pair="gpt2",
        kind="transposed weight",
        module="blocks.0.attn.proj",
        old='(".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")',
        new='(".attn.c_attn.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")',
        truth_at="self.proj = nn.Linear(config.n_embd, config.n_embd)",
        why="the attention output projection (square, so no shape error) copied from Conv1D without a transpose",
    ),
    Bug(
        name="biases_not_copied",
        pair="gpt2",
        kind="missing weight",
        module="blocks.0.ln_1",
        old='_SKIPPED = (".attn.bias", ".attn.masked_bias", "lm_head.weight")',
        new='_SKIPPED = ("bias", "lm_head.weight")',
        truth_at="self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.norm_eps)",
        why="a filter meant for the old mask buffers skips every bias: the first norm keeps its zero bias",
    ),
    Bug(
        name="qkv_unpacked_as_kqv",
        pair="gpt2",
        kind="weight layout",
        module="blocks.0.attn",
        old="q, k, v = self.qkv(x).split(self.n_embd, dim=2)",
        new="k, q, v = self.qkv(x).split(self.n_embd, dim=2)",
        why="the fused projection unpacked in the wrong order: queries and keys swap, the scores come out transposed",
    ),
    # --- Llama ------------------------------------------------------------------------------------------------
    Bug(
        name="causal_mask_dropped",
        pair="llama",
        kind="causal mask",
        module="layers.0.attention",
        old="        scores = scores + mask\n",
        new="        # scores = scores + mask\n",
        why="the causal mask built but never added",
    ),
    Bug(
        name="softmax_scale",
        pair="llama",
        kind="softmax scale",
        module="layers.0.attention",
        old="/ math.sqrt(self.head_dim)",
        new="/ self.head_dim",
        why="scores scaled by 1/d instead of 1/sqrt(d)",
    ),
    Bug(
        name="rotary_halves",
        pair="llama",
        kind="rotary layout",
        module="layers.0.attention",
        old=(
            "        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))\n"
            "        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))\n"
        ),
        new=(
            "        xq_ = torch.view_as_complex(xq.float().unflatten(-1, (2, -1)).transpose(-1, -2).contiguous())\n"
            "        xk_ = torch.view_as_complex(xk.float().unflatten(-1, (2, -1)).transpose(-1, -2).contiguous())\n"
        ),
        why="rotary pairs taken as (i, i + d/2), transformers' layout, on wq/wk rows already permuted to "
        "interleaved pairs (2i, 2i + 1)",
    ),
    Bug(
        name="ffn_norm_eps_layer_1",
        pair="llama",
        kind="norm eps",
        module="layers.1.ffn_norm",
        old="self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)",
        new="self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps if layer_id == 0 else 1e-5)",
        why="one layer's RMSNorm built with eps 1e-5 where the config says 1e-6 (a construction bug)",
    ),
    Bug(
        name="gelu_for_silu",
        pair="llama",
        kind="activation",
        module="layers.0.feed_forward",
        old="F.silu(self.w1(x))",
        new="F.gelu(self.w1(x))",
        why="GELU where Llama's gated MLP uses SiLU",
    ),
    Bug(
        name="attention_residual_missing",
        pair="llama",
        kind="missing residual",
        module="layers.0",
        old="h = x + self.attention(self.attention_norm(x))",
        new="h = self.attention(self.attention_norm(x))",
        why="the residual around the attention dropped",
    ),
    Bug(
        name="gate_up_swapped",
        pair="llama",
        kind="swapped weights",
        module="layers.0.feed_forward.w1",
        old=(
            'layer.feed_forward.w1.weight.copy_(sd[p + "mlp.gate_proj.weight"])\n'
            '            layer.feed_forward.w2.weight.copy_(sd[p + "mlp.down_proj.weight"])\n'
            '            layer.feed_forward.w3.weight.copy_(sd[p + "mlp.up_proj.weight"])'
        ),
        new=(
            'layer.feed_forward.w1.weight.copy_(sd[p + "mlp.up_proj.weight"])\n'
            '            layer.feed_forward.w2.weight.copy_(sd[p + "mlp.down_proj.weight"])\n'
            '            layer.feed_forward.w3.weight.copy_(sd[p + "mlp.gate_proj.weight"])'
        ),
        truth_at="self.w1 = nn.Linear(dim, hidden_dim, bias=False)",
        why="gate and up projections swapped by the converter (same shapes, so nothing complains)",
    ),
    Bug(
        name="ffn_norm_not_copied",
        pair="llama",
        kind="missing weight",
        module="layers.0.ffn_norm",
        old='            layer.ffn_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])\n',
        new="",
        truth_at="self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)",
        why="the converter forgets the post-attention norm weight: the port keeps its initial ones",
    ),
    # --- BERT -------------------------------------------------------------------------------------------------
    Bug(
        name="causal_mask_added",
        pair="bert",
        kind="causal mask",
        module="layers.0.attn",
        old="        probs = scores.softmax(dim=-1)",
        new=(
            "        probs = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), "
            'float("-inf")).softmax(dim=-1)'
        ),
        why="a causal mask (copied from decoder code) in a bidirectional encoder",
    ),
    Bug(
        name="softmax_scale",
        pair="bert",
        kind="softmax scale",
        module="layers.0.attn",
        old="/ math.sqrt(self.head_dim)",
        new="/ self.head_dim",
        why="scores scaled by 1/d instead of 1/sqrt(d)",
    ),
    Bug(
        name="embedding_norm_eps",
        pair="bert",
        kind="norm eps",
        module="embed.norm",
        old="self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)",
        new="self.norm = nn.LayerNorm(cfg.dim)",
        why="the embeddings' LayerNorm built with PyTorch's default eps 1e-5 where BERT uses 1e-12",
    ),
    Bug(
        name="silu_for_gelu",
        pair="bert",
        kind="activation",
        module="layers.0.ffn.act",
        old="self.act = nn.GELU()",
        new="self.act = nn.SiLU()",
        why="SiLU (from decoder code) where BERT uses the exact GELU (a construction bug)",
    ),
    Bug(
        name="ffn_residual_missing",
        pair="bert",
        kind="missing residual",
        module="layers.0",
        old="x = self.norm2(x + self.ffn(x))",
        new="x = self.norm2(self.ffn(x))",
        why="the residual around the feed-forward dropped",
    ),
    Bug(
        name="query_key_swapped",
        pair="bert",
        kind="swapped weights",
        module="layers.0.attn.q",
        old='    ("attention.self.query", "attn.q"),\n    ("attention.self.key", "attn.k"),\n',
        new='    ("attention.self.query", "attn.k"),\n    ("attention.self.key", "attn.q"),\n',
        truth_at="self.q = nn.Linear(cfg.dim, cfg.dim)",
        why="query and key weights swapped by the converter: the scores come out transposed",
    ),
    Bug(
        name="segment_embedding_not_copied",
        pair="bert",
        kind="missing weight",
        module="embed.seg",
        old='        "embeddings.token_type_embeddings.weight": "embed.seg.weight",\n',
        new="",
        truth_at="self.seg = nn.Embedding(cfg.n_segments, cfg.dim)",
        why="the converter's name table lacks the token-type embedding: the port keeps its random one",
    ),
    Bug(
        name="positions_from_one",
        pair="bert",
        kind="position ids",
        module="embed",
        old="positions = torch.arange(ids.size(1), device=ids.device)",
        new="positions = torch.arange(1, ids.size(1) + 1, device=ids.device)",
        why="position ids counted from 1 (RoBERTa's padding offset) in a BERT, whose positions start at 0",
    ),
    Bug(
        name="mean_pooling",
        pair="bert",
        kind="pooling",
        module="",
        old="pooled = torch.tanh(self.pool(x[:, 0]))",
        new="pooled = torch.tanh(self.pool(x.mean(dim=1)))",
        why="the pooler fed the mean over tokens where BERT takes the first ([CLS]) token: the root owns the line",
    ),
    # independent: vision
    # --- ConvNeXt (timm 1.0.31 reference; transformers' modeling_convnext.py as the port) --------------------------
    Bug(
        name="relu_for_gelu",
        pair="convnext",
        kind="activation",
        module="convnext.encoder.stages.0.layers.0.act",
        old="        self.act = ACT2FN[config.hidden_act]\n        self.pwconv2 = nn.Linear(4 * dim, dim)",
        new='        self.act = ACT2FN["relu"]\n        self.pwconv2 = nn.Linear(4 * dim, dim)',
        why="ReLU where timm's ConvNeXt block uses GELU (nn.GELU)",
    ),
    Bug(
        name="layer_scale_skipped",
        pair="convnext",
        kind="layer scale",
        module="convnext.encoder.stages.0.layers.0",
        old="        if self.layer_scale_parameter is not None:\n            features = self.layer_scale_parameter",
        new="        if self.layer_scale_parameter is None:\n            features = self.layer_scale_parameter",
        why="the layer-scale test inverted: the block's branch is added unscaled (timm multiplies it by gamma)",
    ),
    Bug(
        name="max_pooling",
        pair="convnext",
        kind="pooling",
        module="convnext",
        old="pooled_output = self.layernorm(last_hidden_state.mean([-2, -1]))",
        new="pooled_output = self.layernorm(last_hidden_state.amax([-2, -1]))",
        why="global max pooling where timm's head averages over the feature map (global average pooling)",
    ),
    Bug(
        name="final_norm_eps",
        pair="convnext",
        kind="norm eps",
        module="convnext.layernorm",
        old="self.layernorm = nn.LayerNorm(config.hidden_sizes[-1], eps=config.layer_norm_eps)",
        new="self.layernorm = nn.LayerNorm(config.hidden_sizes[-1], eps=1e-2)",
        why="the head's norm built with eps 1e-2 (a value from another model's config) where timm uses 1e-6",
    ),
    # --- Swin (timm 1.0.31 reference; transformers' modeling_swin.py as the port) -----------------------------------
    Bug(
        name="patch_merging_order",
        pair="swin",
        kind="patch merging",
        module="swin.encoder.layers.0.downsample",
        old="[input_feature[:, row::2, col::2, :] for col in range(2) for row in range(2)]",
        new="[input_feature[:, row::2, col::2, :] for row in range(2) for col in range(2)]",
        why="the 2x2 neighbours concatenated row-major where timm's patch merging takes them column-major "
        "(x0, x1, x2, x3 = (0,0), (1,0), (0,1), (1,1)): the reduction's weights meet the wrong patches",
    ),
    Bug(
        name="shift_not_undone",
        pair="swin",
        kind="window shift",
        module="swin.encoder.layers.0.blocks.1",
        old="window_reverse(attention_windows, self.window_size, height_pad, width_pad), reverse=True",
        new="window_reverse(attention_windows, self.window_size, height_pad, width_pad), reverse=False",
        why="the shifted block rolls its output the same way again instead of back: every token lands 2 places off",
    ),
    Bug(
        name="attention_scale",
        pair="swin",
        kind="softmax scale",
        module="swin.encoder.layers.0.blocks.0.attention",
        old="        self.scaling = self.head_dim**-0.5",
        new="        self.scaling = self.head_dim**0.5",
        why="the scale assigned in __init__ as sqrt(head_dim) where timm multiplies the queries by head_dim ** -0.5",
    ),
    Bug(
        name="position_bias_transposed",
        pair="swin",
        kind="position bias",
        module="swin.encoder.layers.0.blocks.0.attention.relative_position_bias",
        old="return relative_position_bias.permute(2, 0, 1).contiguous().unsqueeze(0)",
        new="return relative_position_bias.permute(2, 1, 0).contiguous().unsqueeze(0)",
        why="the relative position bias laid out key-by-query: each query gets the bias of the transposed offset",
    ),
    # --- ResNet (timm 1.0.31 reference; transformers' modeling_resnet.py as the port) -------------------------------
    Bug(
        name="average_pool_stem",
        pair="resnet",
        kind="pooling",
        module="resnet.embedder.pooler",
        old="self.pooler = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)",
        new="self.pooler = nn.AvgPool2d(kernel_size=3, stride=2, padding=1)",
        why="the stem pooled by averaging where timm's ResNet stem max-pools",
    ),
    Bug(
        name="relu_before_residual",
        pair="resnet",
        kind="residual",
        module="resnet.encoder.stages.0.layers.0",
        old="""        residual = self.shortcut(residual)
        hidden_state += residual
        hidden_state = self.activation(hidden_state)
        return hidden_state


class ResNetStage""",
        new="""        residual = self.shortcut(residual)
        hidden_state = self.activation(hidden_state) + residual
        return hidden_state


class ResNetStage""",
        why="the bottleneck's ReLU applied before the shortcut is added (timm adds, then activates)",
    ),
    Bug(
        name="shortcut_norm_eps",
        pair="resnet",
        kind="norm eps",
        module="resnet.encoder.stages.0.layers.0.shortcut.normalization",
        old="""kernel_size=1, stride=stride, bias=False)
        self.normalization = nn.BatchNorm2d(out_channels)""",
        new="""kernel_size=1, stride=stride, bias=False)
        self.normalization = nn.BatchNorm2d(out_channels, eps=1e-3)""",
        why="the projection shortcut's batch norm with Keras' eps (1e-3) where timm's uses PyTorch's 1e-5",
        truth_at="self.normalization = nn.BatchNorm2d(out_channels, eps=1e-3)",
    ),
    Bug(
        name="stride_on_1x1",
        pair="resnet",
        kind="stride placement",
        module="resnet.encoder.stages.1.layers.0",
        old="""                in_channels, reduces_channels, kernel_size=1, stride=stride if downsample_in_bottleneck else 1
            ),
            ResNetConvLayer(reduces_channels, reduces_channels, stride=stride if not downsample_in_bottleneck else 1),""",
        new="""                in_channels, reduces_channels, kernel_size=1, stride=stride if not downsample_in_bottleneck else 1
            ),
            ResNetConvLayer(reduces_channels, reduces_channels, stride=stride if downsample_in_bottleneck else 1),""",
        why="the stride on the first 1x1 convolution (ResNet v1) where timm strides the 3x3 one (ResNet v1.5): "
        "shows first in stage 1, the first stage that downsamples",
    ),
    # --- CLIP (open_clip_torch 3.3.0 reference; transformers' modeling_clip.py as the port) -------------------------
    Bug(
        name="gelu_for_quick_gelu",
        pair="clip",
        kind="activation",
        module="vision_model.encoder.layers.0.mlp.activation_fn",
        old="        self.activation_fn = ACT2FN[config.hidden_act]",
        new='        self.activation_fn = ACT2FN["gelu"]',
        why="exact GELU where OpenAI's CLIP (open_clip with quick_gelu=True) uses x * sigmoid(1.702 x)",
    ),
    Bug(
        name="class_token_last",
        pair="clip",
        kind="class embedding",
        module="vision_model.embeddings",
        old="embeddings = torch.cat([class_embeds, patch_embeds], dim=1)",
        new="embeddings = torch.cat([patch_embeds, class_embeds], dim=1)",
        why="the class token appended after the patches where open_clip puts it first: positions and pooling miss it",
    ),
    Bug(
        name="attention_scale",
        pair="clip",
        kind="softmax scale",
        module="vision_model.encoder.layers.0.self_attn",
        old="        self.scale = self.head_dim**-0.5",
        new="        self.scale = self.head_dim**0.5",
        why="the scale assigned in __init__ as sqrt(head_dim) where nn.MultiheadAttention scales by head_dim ** -0.5",
    ),
    Bug(
        name="mean_pooling",
        pair="clip",
        kind="pooling",
        module="vision_model",
        old="        pooled_output = last_hidden_state[:, 0, :]\n        pooled_output = self.post_layernorm(pooled_output)",
        new="        pooled_output = last_hidden_state.mean(dim=1)\n        pooled_output = self.post_layernorm(pooled_output)",
        why="the image pooled as the mean over tokens where open_clip's pool_type 'tok' takes the class token",
    ),
    # independent: LLMs and speech
    # --- Meta's Llama 2 model.py -------------------------------------------------------------------------------
    Bug(
        name="rope_base",
        pair="meta_llama",
        kind="rotary base",
        module="layers.0.attention",
        unpaired_input="freqs_cis",
        old="            self.params.dim // self.params.n_heads, self.params.max_seq_len * 2\n",
        new="            self.params.dim // self.params.n_heads, self.params.max_seq_len * 2, theta=500000.0\n",
        why="the rotary table built with Llama 3's base 500000 where this Llama 2 uses 10000 (an `__init__` table)",
    ),
    Bug(
        name="softmax_scale",
        pair="meta_llama",
        kind="softmax scale",
        module="layers.0.attention",
        old="/ math.sqrt(self.head_dim)",
        new="/ self.head_dim",
        why="scores scaled by 1/d instead of 1/sqrt(d)",
    ),
    Bug(
        name="gate_up_swapped",
        pair="meta_llama",
        kind="swapped gate/up",
        module="layers.0.feed_forward",
        old="return self.w2(F.silu(self.w1(x)) * self.w3(x))",
        new="return self.w2(F.silu(self.w3(x)) * self.w1(x))",
        why="the SiLU applied to the up projection (w3) instead of the gate (w1)",
    ),
    Bug(
        name="mask_off_by_one",
        pair="meta_llama",
        kind="causal mask",
        module="",
        old="            mask = torch.triu(mask, diagonal=1)\n",
        new="            mask = torch.triu(mask, diagonal=2)\n",
        why="the causal mask one position late: each token also sees the next one (the root builds the mask)",
    ),
    Bug(
        name="last_layer_not_converted",
        pair="meta_llama",
        kind="missing weight",
        module="layers.2.attention_norm",
        patched_file="meta_convert.py",
        old="    for i in range(n_layers):\n",
        new="    for i in range(n_layers - 1):\n",
        truth_at="self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)",
        why="the converter's layer loop stops one layer short: the last layer keeps its initial weights",
    ),
    # --- Mistral's one-file reference ---------------------------------------------------------------------------
    Bug(
        name="rope_base",
        pair="mistral",
        kind="rotary base",
        module="layers.0",
        unpaired_input="freqs_cis",
        old="        theta = self.args.rope_theta or 1000000.0\n",
        new="        theta = 10000.0\n",
        why="the rotary base hard-coded to Llama's 10000, ignoring the config's 1e6 (an `__init__` table)",
    ),
    Bug(
        name="softmax_scale_in_init",
        pair="mistral",
        kind="softmax scale",
        module="layers.0",
        old="        self.scale = self.args.head_dim**-0.5\n",
        new="        self.scale = self.args.dim**-0.5\n",
        why="the score scale assigned in `__init__` from the model width instead of the head width",
    ),
    Bug(
        name="kv_heads_tiled",
        pair="mistral",
        kind="grouped-query heads",
        module="layers.0",
        helper="repeat_kv",
        old="    keys = torch.repeat_interleave(keys, repeats=repeats, dim=2)\n",
        new="    keys = keys.repeat(1, 1, repeats, 1)\n",
        why="key heads tiled (0, 1, 0, 1) instead of repeated in place (0, 0, 1, 1): query heads meet the wrong keys",
    ),
    Bug(
        name="gelu_for_silu",
        pair="mistral",
        kind="activation",
        module="layers.0",
        old="return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))",
        new="return self.w2(nn.functional.gelu(self.w1(x)) * self.w3(x))",
        why="GELU where Mistral's gated MLP uses SiLU",
    ),
    Bug(
        name="mask_sees_next",
        pair="mistral",
        kind="causal mask",
        module="",
        old="            mask = torch.tril(tensor, diagonal=0).to(h.dtype)\n",
        new="            mask = torch.tril(tensor, diagonal=1).to(h.dtype)\n",
        why="the causal mask keeps one diagonal too many: each token sees the next one (the root builds the mask)",
    ),
    # --- Google's gemma_pytorch ---------------------------------------------------------------------------------
    Bug(
        name="embedding_scale_missing",
        pair="gemma_pytorch",
        kind="embedding scale",
        module="",
        old="    hidden_states = hidden_states * normalizer\n",
        new="    # hidden_states = hidden_states * normalizer\n",
        why="the sqrt(hidden_size) embedding scale left out (the root scales what the embedder returns)",
    ),
    Bug(
        name="final_norm_without_unit_offset",
        pair="gemma_pytorch",
        kind="norm weight offset",
        module="model.norm",
        old="        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n",
        new="        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, add_unit_offset=False)\n",
        why="the final norm built without Gemma's (1 + weight): it scales by the stored weight alone",
    ),
    Bug(
        name="scaling_in_init",
        pair="gemma_pytorch",
        kind="softmax scale",
        module="model.layers.0.self_attn",
        old="            self.scaling = self.head_dim**-0.5\n",
        new="            self.scaling = self.head_dim**-0.25\n",
        why="the query scale assigned in `__init__` as head_dim^-0.25 instead of head_dim^-0.5",
    ),
    Bug(
        name="gate_up_swapped",
        pair="gemma_pytorch",
        kind="swapped gate/up",
        module="model.layers.0.mlp",
        old="        gate = self.gate_proj(x)\n",
        new="        gate = self.up_proj(x)\n",
        why="the GELU gate read from the up projection: gate and up both come from up_proj",
    ),
    Bug(
        name="rotary_interleaved",
        pair="gemma_pytorch",
        kind="rotary layout",
        module="model.layers.0.self_attn",
        helper="apply_rotary_emb",
        old="        torch.stack(torch.chunk(x.transpose(1, 2).float(), 2, dim=-1),\n",
        new="        torch.stack(torch.chunk(x.transpose(1, 2).float(), 2, dim=-1)[::-1],\n",
        why="the rotary halves taken in the wrong order (x2, x1): the rotation turns the other way",
    ),
    *ENCODEC_BUGS,
)


def bugs_of(pair: str) -> list[Bug]:
    return [bug for bug in BUGS if bug.pair == pair]


__all__ = ["BUGS", "CORPUS_ROOT", "PAIRS", "PAIRS_BY_NAME", "Bug", "Pair", "bugs_of"]
