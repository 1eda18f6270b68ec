"""Settings a library module applies without holding them (`diff/settings.py`, `IMPLIED_SETTINGS`): open_clip's
attention is torch's nn.MultiheadAttention, which scales the scores by head_dim ** -0.5 and keeps no setting for
it; a port's `self.scale` assigned in `__init__` is compared with that, and named at its assignment line."""

from __future__ import annotations

from modeltrace.diff.settings import compare_settings
from modeltrace.trace.records import ModuleBuild, SourceLocation

MHA = "torch.nn.modules.activation.MultiheadAttention"


def _reference() -> ModuleBuild:
    settings = {"embed_dim": 32, "num_heads": 2, "head_dim": 16, "dropout": 0.0, "batch_first": True}
    return ModuleBuild("attn", "MultiheadAttention", MHA, settings=settings)


def _port(scale: float) -> ModuleBuild:
    assigned = {"scale": SourceLocation("/port/modeling_clip.py", 289, 8)}
    settings = {"embed_dim": 32, "num_heads": 2, "head_dim": 16, "scale": scale, "dropout": 0.0}
    return ModuleBuild(
        "self_attn", "CLIPAttention", "modeling_clip.CLIPAttention", settings=settings, assigned_at=assigned
    )


def test_a_port_scale_against_multihead_attention_is_compared_with_the_scale_it_applies() -> None:
    [difference] = compare_settings(_reference(), _port(16**0.5))
    assert (difference.name, difference.reference, difference.candidate) == ("scaling", 0.25, 4.0)
    assert difference.assigned_at is not None and difference.assigned_at.line == 289


def test_the_right_scale_is_no_difference() -> None:
    assert compare_settings(_reference(), _port(16**-0.5)) == []
