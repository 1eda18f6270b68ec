"""The CLIP pair's weight conversion: open_clip's CLIP (OpenAI layout) -> transformers' `CLIPModel`.

transformers converts OpenAI's CLIP with `convert_clip_original_pytorch_to_hf.py` (a transformers fork's
snapshot, feisenyu/transformers_4573 at e9d73c3118; the `copy_*` functions below). open_clip's `CLIP` keeps OpenAI's module names (`visual.conv1`,
`transformer.resblocks.N.attn` as `nn.MultiheadAttention`, `ln_final`, `text_projection`), so they read it as is.
"""

from __future__ import annotations

from pathlib import Path
from vision_common import upstream_definitions


# transformers' own conversion code, staged from the corpus's mirror (never committed; see ports/sources.py):
# the copy_* functions of models/clip/convert_clip_original_pytorch_to_hf.py, unchanged (the two used below call
# the others)
_UPSTREAM = upstream_definitions(
    Path(__file__).resolve().parent / "upstream" / "convert_clip_original_pytorch_to_hf.py",
    (
        "copy_attn_layer",
        "copy_mlp",
        "copy_linear",
        "copy_layer",
        "copy_layers",
        "copy_encoder",
        "copy_text_model_and_projection",
        "copy_vison_model_and_projection",
    ),
)
copy_text_model_and_projection = _UPSTREAM["copy_text_model_and_projection"]
copy_vison_model_and_projection = _UPSTREAM["copy_vison_model_and_projection"]


def convert(hf_model, pt_model):
    """What `convert_clip_checkpoint` does between loading the two models and checking their logits."""
    copy_text_model_and_projection(hf_model, pt_model)
    copy_vison_model_and_projection(hf_model, pt_model)
    hf_model.logit_scale = pt_model.logit_scale
    return hf_model
