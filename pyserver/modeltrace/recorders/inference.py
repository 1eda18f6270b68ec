"""Inferring the entry each recordable key of `_can_record_outputs` should have, from the module tree.

`hidden_states`: the model's repeated layers; `attentions` / `cross_attentions`: the innermost attention class
under each layer that records the weights, split into self- and cross-attention by where it sits; `router_logits`:
the router of a mixture of experts. Each is written the way transformers' own files write them: a bare class, a
list of classes, or an `OutputRecorder` with an index or a layer name where the class alone is not enough.
"""

from __future__ import annotations

from modeltrace.recorders.types import RECORDABLE_FIELDS, Analysis, Recorder
from modeltrace.recorders.wiring import (
    CROSS_NAME,
    CROSS_SEGMENT,
    WEIGHTS_NAME,
    AttentionChain,
    ChainLink,
    ModulePath,
    Wiring,
    is_cross,
)

# Attribute names of a router in a mixture-of-experts block; its output holds the router logits.
ROUTER_NAMES = ("router", "gate")
# Attribute names under which a layer usually holds its self-attention.
SELF_ATTENTION_NAMES = (
    "self_attn",
    "self_attention",
    "attention",
    "attn",
    "self_attn_layer",
    "attention_layer",
    "SelfAttention",
)


def infer_recorder(
    analysis: Analysis,
    use_roots: list[str],
    key: str,
    existing: dict[str, list[Recorder]],
    keys: set[str] | None = None,
) -> Recorder | None:
    """The entry `key` should have, from the module tree under the base models.

    `keys` are the keys the models record (self- and cross-attention are told apart only when both are).
    """
    wiring = Wiring(analysis, use_roots)
    layers = [layer for layer in wiring.layers() if layer not in use_roots]
    keys = set(RECORDABLE_FIELDS) if keys is None else keys
    if key == "hidden_states":
        return _infer_layers(wiring, layers)
    if key in ("attentions", "cross_attentions"):
        return _infer_attention(wiring, layers, key, "cross_attentions" in keys)
    if key == "router_logits":
        return _infer_router(wiring)
    return None


def _infer_layers(wiring: Wiring, layers: list[str]) -> Recorder | None:
    if len(layers) > 1:
        return Recorder(layers[0], alternatives=layers)
    if not layers:
        return None
    # the layer class also used in another list (V-JEPA 2's predictor): a layer name picks these layers
    layer = layers[0]
    wanted = {node.path for node in wiring.nodes if node.cls == layer and node.path in wiring.layer_paths}
    others = {node.path for node in wiring.nodes if wiring.subclass_of(node.cls, layer) and "*" in node.path} - wanted
    name = separating_name(wanted, others, []) if others and wanted else None
    return Recorder(layer, layer_name=name)


def separating_name(wanted: set[ModulePath], unwanted: set[ModulePath], first: list[str]) -> str | None:
    """A module name (one attribute) in every path of `wanted` and in none of `unwanted`: a `layer_name`."""
    candidates = list(first)
    for path in sorted(wanted):
        candidates.extend(segment for segment in path if segment != "*" and segment not in candidates)
    for name in candidates:
        if all(name in path for path in wanted) and not any(name in path for path in unwanted):
            return name
    return None


def _infer_attention(wiring: Wiring, layers: list[str], key: str, split: bool) -> Recorder | None:
    """`split`: the models record cross-attention too, so the self-attention entry must leave it out."""
    chains = wiring.attention_chains(layers)
    if not chains:
        return None
    cross_chains = [chain for chain in chains if split and is_cross(chain.relative_path, chain.innermost)]
    self_chains = [chain for chain in chains if not (split and is_cross(chain.relative_path, chain.innermost))]
    wanted, other = (cross_chains, self_chains) if key == "cross_attentions" else (self_chains, cross_chains)
    merged = [chain for chain in self_chains if _returns_cross_weights(wiring, chain.innermost)]
    if split and merged and not cross_chains:
        # one module attending to itself and to the encoder, returning both weights (T5Gemma2's merged attention)
        cls = merged[0].innermost
        index = wiring.weights_index(cls, cross=key == "cross_attentions")
        return Recorder(cls, index=None if index == 1 else index)
    if not wanted:
        return None
    wanted = _prefer_usual_attention(wanted)
    other_classes = {link.cls for chain in other for link in chain.links}
    hooked: dict[str, set[ModulePath]] = {}  # target -> the paths it should hook
    first_segments: dict[str, list[str]] = {}  # target -> the attribute holding it in the first chain
    for chain in wanted:
        choice = _recording_link(wiring, chain, other_classes)
        hooked.setdefault(choice.cls, set()).add(choice.path)
        first_segments.setdefault(choice.cls, [choice.relative_path[0]])
    recorders = [_attention_recorder(wiring, cls, paths, first_segments[cls]) for cls, paths in hooked.items()]
    return _one_entry(wiring, recorders)


def _returns_cross_weights(wiring: Wiring, cls: str) -> bool:
    """`cls.forward` returns a cross-attention's weights (it attends to itself and to the encoder)."""
    return any(
        CROSS_NAME.search(name) and WEIGHTS_NAME.search(name) for shape in wiring.returns(cls) for name in shape.names
    )


def _prefer_usual_attention(wanted: list[AttentionChain]) -> list[AttentionChain]:
    """A class under the usual self-attention name and under another one in the same layer (X-CLIP's
    `message_attn`): the usual one is the layer's attention."""

    def holder(chain: AttentionChain) -> ChainLink:
        return chain.links[0]

    usual = {
        (holder(chain).layer_path, holder(chain).cls)
        for chain in wanted
        if holder(chain).relative_path[0] in SELF_ATTENTION_NAMES
    }
    return [
        chain
        for chain in wanted
        if holder(chain).relative_path[0] in SELF_ATTENTION_NAMES
        or CROSS_SEGMENT.search(holder(chain).relative_path[0])
        or (holder(chain).layer_path, holder(chain).cls) not in usual
    ] or wanted


def _recording_link(wiring: Wiring, chain: AttentionChain, other_classes: set[str]) -> ChainLink:
    """The innermost attention class not shared with the other kind; else the innermost with a layer name.
    A kernel module under the attention (returning only its output) is not what records the weights."""
    returning = [link for link in chain.links if wiring.returns_tuple(link.cls)]
    links = returning or chain.links
    return next((link for link in reversed(links) if link.cls not in other_classes), None) or links[-1]


def _attention_recorder(wiring: Wiring, cls: str, paths: set[ModulePath], first_segment: list[str]) -> Recorder:
    """The entry recording `cls` at `paths`, with a layer name when the class also sits elsewhere."""
    recorder = Recorder(cls, index=wiring.weights_index(cls))
    everywhere = {node.path for node in wiring.nodes if wiring.subclass_of(node.cls, cls)}
    if any("*" in path for path in everywhere - paths):
        # the class also sits in other repeated layers (the other kind of attention, adapter layers): a
        # layer name picks these (a single module elsewhere, such as a pooling head, is recorded too)
        name = separating_name(paths, everywhere - paths, first_segment)
        if name is not None:
            recorder = Recorder(cls, index=recorder.index if recorder.index is not None else 1, layer_name=name)
    return recorder


def _one_entry(wiring: Wiring, recorders: list[Recorder]) -> Recorder:
    """One entry for the classes found: a base class records its subclasses; bare classes become a list."""
    targets = [recorder.target for recorder in recorders]
    recorders = [
        recorder
        for recorder in recorders
        if not any(
            target != recorder.target and wiring.subclass_of(recorder.target, target) for target in targets if target
        )
    ]
    if len(recorders) == 1:
        return recorders[0]
    if all(recorder.index is None and recorder.layer_name is None for recorder in recorders):
        ordered = sorted({recorder.target for recorder in recorders}, key=lambda cls: wiring.classes[cls].line)
        return Recorder(ordered[0], alternatives=ordered)
    return recorders[0]


def _infer_router(wiring: Wiring) -> Recorder | None:
    """The first router module of the tree; the index of the element whose name says logits (else 0)."""
    for node in wiring.nodes:
        if node.cls not in wiring.classes or not node.path or node.path[-1] not in ROUTER_NAMES:
            continue
        index = None
        for shape in wiring.returns(node.cls):
            index = next((position for position, name in enumerate(shape.names) if "logits" in name), None)
            if index is not None:
                break
        return Recorder(node.cls, index=0 if index is None else index)
    return None
