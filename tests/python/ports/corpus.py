"""The corpus as data: the pairs (reference recipe, port recipe, rename maps) and the injected porting bugs.

A pair is a folder holding a transformers reference (`*_reference.py`, `recipe_reference.py`) and an
independently written port (`*_port.py`, `recipe_port.py`) whose converter copies the reference's weights.
A bug is a textual patch of the clean port file (applied to a copy, so the port itself stays plain research
code), with the module path of the port that owns the bug and why it is a bug. The truth line is the line of
the patched text, or, for a bug in the weight converter (which runs before any forward), the line that
builds the module whose weight is wrong (`truth_at`): that module's construction is where the port can show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CORPUS_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Pair:
    """A reference and its port. `maps` rename candidate module paths to the reference's (`--map` rules, full
    paths on both sides); `unmapped` names port modules left unaligned on purpose, with the reason."""

    name: str
    folder: str
    port_file: str
    reference_module: str  # the transformers modeling module (its file is the reference's traced file)
    maps: tuple[str, ...]
    unmapped: str = ""

    @property
    def path(self) -> Path:
        return CORPUS_ROOT / self.folder


@dataclass(frozen=True)
class Bug:
    """One porting bug: replace `old` (exactly one occurrence in the port file) by `new`; `module` is the port's
    path of the module owning the bug; `truth_at` (optional) the text on the truth line when it is not the
    patched line; `why` says what is wrong, as a reviewer would."""

    name: str
    pair: str
    kind: str
    old: str
    new: str
    module: str
    why: str
    truth_at: str | None = None


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
)

PAIRS_BY_NAME = {pair.name: pair for pair in PAIRS}


BUGS: tuple[Bug, ...] = (
    # --- GPT-2 ------------------------------------------------------------------------------------------------
    Bug(
        name="causal_mask_dropped", pair="gpt2", kind="causal mask", module="blocks.0.attn",
        old='        att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))',
        new='        # att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))',
        why="the mask line commented out: every position attends to later ones",
    ),
    Bug(
        name="softmax_scale", pair="gpt2", kind="softmax scale", module="blocks.0.attn",
        old="* (1.0 / math.sqrt(k.size(-1)))",
        new="* (1.0 / k.size(-1))",
        why="scores scaled by 1/d instead of 1/sqrt(d)",
    ),
    Bug(
        name="final_norm_eps", pair="gpt2", kind="norm eps", module="ln_f",
        old="self.ln_f = nn.LayerNorm(config.n_embd, eps=config.norm_eps)",
        new="self.ln_f = nn.LayerNorm(config.n_embd, eps=1e-6)",
        why="the final LayerNorm built with eps 1e-6 where GPT-2 uses 1e-5 (a construction bug)",
    ),
    Bug(
        name="relu_for_gelu", pair="gpt2", kind="activation", module="blocks.0.mlp",
        old='h = F.gelu(h, approximate="tanh")',
        new="h = F.relu(h)",
        why="ReLU where GPT-2 uses the tanh GELU (gelu_new)",
    ),
    Bug(
        name="mlp_residual_missing", pair="gpt2", kind="missing residual", module="blocks.0",
        old="x = x + self.mlp(self.ln_2(x))",
        new="x = self.mlp(self.ln_2(x))",
        why="the residual around the MLP dropped",
    ),
    Bug(
        name="c_proj_not_transposed", pair="gpt2", kind="transposed weight", module="blocks.0.attn.proj",
        old='_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")',
        new='_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")',
        truth_at="self.proj = nn.Linear(config.n_embd, config.n_embd)",
        why="the attention output projection (square, so no shape error) copied from Conv1D without a transpose",
    ),
    Bug(
        name="biases_not_copied", pair="gpt2", kind="missing weight", module="blocks.0.ln_1",
        old='_SKIPPED = (".attn.bias", ".attn.masked_bias", "lm_head.weight")',
        new='_SKIPPED = ("bias", "lm_head.weight")',
        truth_at="self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.norm_eps)",
        why="a filter meant for the old mask buffers skips every bias: the first norm keeps its zero bias",
    ),
)


def bugs_of(pair: str) -> list[Bug]:
    return [bug for bug in BUGS if bug.pair == pair]
