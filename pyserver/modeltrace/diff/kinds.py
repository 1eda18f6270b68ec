"""What kind of module a call is (linear, norm, embedding, attention, MLP, block, …), for aligning two
implementations whose module names differ.

Two codebases name their modules differently (`q_proj` / `wq`, `mlp` / `feed_forward`), but their classes are
named from a small vocabulary (`Linear`, `Conv1D`, `LayerNorm`, `RMSNorm`, `Attention`, `MLP`, `Block`), and
what a call takes and returns tells the rest (a leaf called with integer ids is an embedding). The vocabulary is
data: one row per pattern, with the reason it means that kind.

A class name often carries two words of the vocabulary (`AttentionBlock`, `MLPBlock`, `BlockAttention`,
`LayerNorm`): as in English, the last word decides (an `AttentionBlock` is a block holding an attention; a
`BlockAttention` is an attention). So every matching row competes by where its match ends, the latest end wins, and
rows that end at the same place are taken in table order (specific before general). A row whose meaning is set by
an earlier word (a `RotaryEmbedding` computes tables, looks nothing up) matches to the end of the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from modeltrace.trace.records import ModuleCall


@dataclass(frozen=True)
class KindRule:
    pattern: re.Pattern
    kind: str
    reason: str


def _rule(pattern: str, kind: str, reason: str) -> KindRule:
    return KindRule(re.compile(pattern, re.IGNORECASE), kind, reason)


# NOTE: the match that ends last wins (the last word decides); among matches ending at the same place, the row
# listed first. So rows are ordered from specific to general, and a row whose kind an earlier word fixes matches
# through to the end of the name ("RotaryEmbedding" is rotary, not an embedding; "SparseMoeBlock" replaces the MLP,
# it is not a layer).
KIND_RULES: tuple[KindRule, ...] = (
    _rule(r"(rotary|rope).*$", "rotary", "rotary position embeddings compute cos/sin tables, no lookup"),
    _rule(
        r"moe\w*block$|sparsemoe\w*$",
        "moe",
        "a mixture-of-experts layer named as a block (Mixtral's SparseMoeBlock) stands where the MLP is",
    ),
    _rule(r"norm", "norm", "LayerNorm, RMSNorm, GroupNorm and the families' own *Norm classes"),
    _rule(r"embed", "embedding", "Embedding and the families' *Embeddings lookups"),
    _rule(
        r"^(linear|conv1d|dense|.*proj.*|lora.*linear|.*linear)$",
        "linear",
        "nn.Linear, transformers' Conv1D (GPT-2: a Linear with the weight transposed), Dense layers",
    ),
    _rule(r"^conv[123]d$|^conv$", "conv", "convolutions"),
    _rule(r"attention|attn", "attention", "self- and cross-attention modules"),
    _rule(r"mlp|feedforward|feed_forward|ffn|swiglu|glu$", "mlp", "the feed-forward part of a block"),
    _rule(r"moe|expert|router|gate$", "moe", "mixture-of-experts routing and experts"),
    _rule(
        r"layer$|block$|decoderlayer|encoderlayer|transformerblock",
        "block",
        "one transformer layer: attention + MLP with residuals",
    ),
    _rule(r"dropout", "dropout", "dropout (identity in eval mode)"),
    _rule(
        r"gelu|silu|relu|swish|tanh|sigmoid|activation|^act|newgelu|quickgelu|softmax|mish",
        "activation",
        "elementwise activations",
    ),
    _rule(r"^(modulelist|moduledict|sequential)$", "container", "containers: called only when Sequential"),
    _rule(r"head$|lmhead|pooler|classifier", "head", "output heads"),
    _rule(r"model$|transformer$|encoder$|decoder$|backbone", "model", "whole models and stacks"),
)
UNKNOWN = "unknown"
# A call that computes nothing: it never anchors a pair, and its values equal to another call's are no evidence of
# role (issue 30, item 3).
NO_OP = "no-op"
# NOTE: Identity (an unused q/k norm, LayerScale or drop path stands in for nothing), Dropout and DropPath (identity
# in eval: the trace runs the model in eval mode), Flatten (the same numbers in another shape); the name must end
# there, and a composite that only mentions one (`OmDetTurboMLPWithDropout`) is not one
_NO_OP_CLASS = re.compile(
    r"^(identity|flatten)$|^(?!.*with)\w*(dropout(\d+d)?|droppath|drop_path|stochasticdepth)$", re.IGNORECASE
)

_cache: dict[str, str] = {}


def deciding_rule(class_name: str) -> KindRule | None:
    """The row that decides a class name's kind: of the rows that match, the one whose match ends last (the last
    word decides), the first listed among those ending at the same place; None when no row matches."""
    best: KindRule | None = None
    best_end = -1
    for rule in KIND_RULES:
        # NOTE: a row may match twice ("AttentionBlockAttention"): its last match is the one that competes
        ends = [match.end() for match in rule.pattern.finditer(class_name)]
        if ends and max(ends) > best_end:
            best, best_end = rule, max(ends)
    return best


def kind_of_class(class_name: str) -> str:
    """The kind named by a class name alone, or "unknown"."""
    found = _cache.get(class_name)
    if found is None:
        rule = deciding_rule(class_name)
        found = UNKNOWN if rule is None else rule.kind
        _cache[class_name] = found
    return found


def is_no_op(call: ModuleCall) -> bool:
    """Whether a call computes nothing, by its class: an Identity, Dropout or DropPath (the trace runs in eval
    mode), a Flatten.

    NOTE: by class, not by values: a leaf whose output equals its input by the statistics may still compute
    something (a chain of calls summarised by their moments, a ReLU of a non-negative input); only the classes
    that are no-ops by definition are taken out of the alignment."""
    return bool(_NO_OP_CLASS.search(call.class_name))


def kind_of(call: ModuleCall, is_leaf: bool) -> str:
    """The kind of one call: `NO_OP` for a no-op class (`is_no_op`), else its class name's kind,
    corrected by what it takes (a leaf whose first input is an integer tensor looks things up: an embedding,
    whatever its class is called)."""
    if is_no_op(call):
        return NO_OP
    kind = kind_of_class(call.class_name)
    if is_leaf and call.inputs and call.inputs[0].dtype.startswith(("int", "uint")) and kind in (UNKNOWN, "linear"):
        return "embedding"
    if kind == "linear" and not is_leaf:
        # a composite whose class name says "Proj" (a projector, a merger): not a single linear map
        return UNKNOWN
    return kind
