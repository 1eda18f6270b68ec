"""The module tree under a base model, as far as one file tells: which classes are wired where.

From the classes read by `reading.py`, every path from the base models to each module they hold (`*` for an
item of a list); on it, which lists hold the model's layers (recorded for `hidden_states`) and, under each
layer, the chains of attention modules (recorded for `attentions` and `cross_attentions`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from modeltrace.recorders.syntax import class_mro, short_name, union
from modeltrace.recorders.types import Analysis, Returns

# A module name on the path to a cross-attention (`crossattention`, `encoder_attn`, `enc_dec_attention`, ...).
CROSS_SEGMENT = re.compile(r"cross|encoder_?attn|encdec|enc_dec|encoder_attention", re.I)
# A class that attends (`LlamaAttention`, `SiglipAttn`, DeepSeek's `...MLA`).
_ATTENTION_CLASS = re.compile(r"Attention|Attn|MLA$", re.I)
# A returned name that holds attention weights (`attn_weights`, `attention_probs`, `attn_output_weights`).
WEIGHTS_NAME = re.compile(r"weights|probs|attn$|attention$|attentions$|attn_output_weights|scores", re.I)
# The name of cross-attention weights in a module returning both kinds (`cross_attn_weights`).
CROSS_NAME = re.compile("cross", re.I)
# A class that is a part of a layer or sits beside the layers, never a layer itself.
_NOT_A_LAYER = re.compile(
    r"(Experts?|Head|Norm|Embeddings?|Embed|Merger|Projector|Pooler|DropPath|Dropout|Context)$"
    r"|Adapter|Conv(olution)?(Layer|Module)$|Downsampl|Upsampl"
)
# A class that is a layer whatever else its name says (`...EncoderLayer`, `...DecoderLayer`).
_IS_A_LAYER = re.compile(r"(Encoder|Decoder)Layer")
# A module name on the path to lists that are not the model's layers (experts, heads, convolutions, ...).
_NOT_A_LAYER_LIST = re.compile(r"expert|head|conv|embed|pool|adapter|merger|downsampl|upsampl|fpn|pan|lateral", re.I)
# The sublayers of a layer (an attention, an MLP): a list of them is not a list of layers.
_SUBLAYER_CLASS = re.compile(r"Attention$|Attn$|MLP$|FeedForward$|FFN$")
# Modules beside a list of layers that do not make its holder a stage (a norm, a dropout, an activation).
_INCIDENTAL_ATTRIBUTE = re.compile(r"norm|drop|act", re.I)
# Base classes that make a class of the file an nn.Module even without a forward of its own.
_MODULE_BASE = re.compile(r"Module|Layer|PreTrainedModel")

ModulePath = tuple[str, ...]


@dataclass
class Node:
    """One module of the tree under a base model: its path (attribute names, `*` for an item of a list)."""

    path: ModulePath
    cls: str  # short class name (in the file) or dotted external name
    parent: str | None  # class holding it
    in_list: bool
    up: int | None = None  # index of the node holding it in `Wiring.nodes`


class ChainLink(NamedTuple):
    """One attention module on the way from a layer down to an attention: its class and where it sits."""

    cls: str
    relative_path: ModulePath  # from the layer holding it
    path: ModulePath  # from the base model

    @property
    def layer_path(self) -> ModulePath:
        """The path of the layer holding the module."""
        return self.path[: len(self.path) - len(self.relative_path)]


class AttentionChain(NamedTuple):
    """An innermost attention module under a layer, and the attention modules holding it, outermost first."""

    relative_path: ModulePath  # of the innermost attention, from the layer
    links: list[ChainLink]

    @property
    def innermost(self) -> str:
        return self.links[-1].cls


def is_cross(path: ModulePath, cls: str) -> bool:
    """A cross-attention by where it sits or by its class name."""
    return any(CROSS_SEGMENT.search(segment) for segment in path) or "Cross" in cls


def _list_depth(path: ModulePath) -> int:
    """How many lists the path goes through."""
    return len([segment for segment in path if segment == "*"])


class Wiring:
    """The module tree under a set of base models, as far as the file tells."""

    MAX_NODES = 20000
    # NOTE: a tree deeper than this is a recursion the file's reading did not see through; stop there.
    MAX_DEPTH = 16

    def __init__(self, analysis: Analysis, roots: list[str]) -> None:
        self.analysis = analysis
        self.classes = analysis.classes
        self.roots = roots
        self.nodes: list[Node] = []
        self._attributes: dict[str, dict[str, list[str]]] = {}
        for root in roots:
            self._root = root
            self._expand(root, (), frozenset({root}), False, None)
        self.layer_paths: set[ModulePath] = set()  # the lists of layers `layers()` chose

    def attributes(self, name: str) -> dict[str, list[str]]:
        """The modules a class holds, attribute -> classes, its bases' included."""
        if name not in self._attributes:
            merged: dict[str, list[str]] = {}
            for owner in reversed(class_mro(self.classes, name)):
                merged.update(self.classes[owner].attributes)
            self._attributes[name] = merged
        return self._attributes[name]

    def list_attributes(self, name: str) -> set[str]:
        return {
            attribute for owner in class_mro(self.classes, name) for attribute in self.classes[owner].list_attributes
        }

    def is_submodel(self, name: str) -> bool:
        """A PreTrainedModel: its own `_can_record_outputs` applies below it."""
        for owner in class_mro(self.classes, name):
            if any("PreTrainedModel" in short_name(base) for base in self.classes[owner].bases):
                return True
        return False

    def recorded_by(self, name: str) -> str | None:
        """The class whose `_can_record_outputs` the hooks below a (sub)model `name` follow."""
        return next(
            (owner for owner in class_mro(self.classes, name) if self.classes[owner].can_record_node is not None), None
        )

    def _descends(self, child: str, root: str) -> bool:
        # a submodel has its own hooks: the same ones as the base model's when it follows the same dict
        return not self.is_submodel(child) or self.recorded_by(child) == self.recorded_by(root)

    def _expand(self, name: str, prefix: ModulePath, stack: frozenset[str], cross: bool, up: int | None) -> None:
        lists = self.list_attributes(name)
        for attribute, classes in self.attributes(name).items():
            in_list = attribute in lists
            path = prefix + ((attribute, "*") if in_list else (attribute,))
            below_cross = cross or bool(CROSS_SEGMENT.search(attribute))
            if (
                not in_list
                and len(classes) > 1
                and any("Cross" in cls for cls in classes)
                and not all("Cross" in cls for cls in classes)
            ):
                # `attention_class = XCrossAttention if is_cross_attention else XSelfAttention`: the cross one
                # under a cross-attention module, the other one elsewhere
                classes = [cls for cls in classes if ("Cross" in cls) == below_cross]
            for cls in classes:
                short = short_name(cls)
                if len(self.nodes) >= self.MAX_NODES:
                    return
                target = short if short in self.classes else cls
                self.nodes.append(Node(path, target, name, in_list, up))
                if (
                    short in self.classes
                    and short not in stack
                    and len(path) < self.MAX_DEPTH
                    and self._descends(short, self._root)
                ):
                    self._expand(short, path, stack | {short}, below_cross, len(self.nodes) - 1)

    def subclass_of(self, cls: str, target: str) -> bool:
        return short_name(target) in class_mro(self.classes, cls) if cls in self.classes else cls == target

    def returns(self, name: str) -> list[Returns]:
        """The shapes of what the `forward` of `name` (or of the nearest base defining one) returns."""
        for owner in class_mro(self.classes, name):
            if self.classes[owner].has_forward:
                return self.classes[owner].returns
        return []

    def returns_tuple(self, name: str) -> bool | None:
        returns = self.returns(name)
        if not returns:
            return None
        return any(shape.is_tuple for shape in returns)

    def is_module(self, name: str) -> bool:
        """A class of the file that is an nn.Module (it has a forward somewhere in its bases, or a known base)."""
        return name in self.classes and (
            bool(self.returns(name))
            or any(
                _MODULE_BASE.search(short_name(base))
                for owner in class_mro(self.classes, name)
                for base in self.classes[owner].bases
            )
        )

    # ---- layers
    def layers(self) -> list[str]:
        """The classes recorded for `hidden_states`: the repeated layers directly under the base models."""
        candidates, module_classes = self._layer_candidates()
        if not candidates:
            return []
        kept = self._outermost_layer_lists(candidates, module_classes)
        kept = self._main_layer_lists(kept)
        self.layer_paths = set(kept)
        layers: list[str] = []
        for path in kept:
            layers = union(layers, candidates[path])
        layers.sort(key=lambda cls: self.classes[cls].line)
        return layers

    def _layer_candidates(self) -> tuple[dict[ModulePath, list[str]], dict[ModulePath, list[str]]]:
        """For each list of modules: the classes in it that may be layers, and every module class in it."""
        candidates: dict[ModulePath, list[str]] = {}
        module_classes: dict[ModulePath, list[str]] = {}
        for node in self.nodes:
            if not node.in_list or node.cls not in self.classes:
                continue
            if self.is_module(node.cls):
                module_classes.setdefault(node.path, [])
                if node.cls not in module_classes[node.path]:
                    module_classes[node.path].append(node.cls)
            if any(_NOT_A_LAYER_LIST.search(segment) for segment in node.path if segment != "*"):
                continue
            if _NOT_A_LAYER.search(node.cls) and not _IS_A_LAYER.search(node.cls):
                continue
            if not self.is_module(node.cls) or _SUBLAYER_CLASS.search(node.cls):
                continue
            candidates.setdefault(node.path, [])
            if node.cls not in candidates[node.path]:
                candidates[node.path].append(node.cls)
        return candidates, module_classes

    def _outermost_layer_lists(
        self, candidates: dict[ModulePath, list[str]], module_classes: dict[ModulePath, list[str]]
    ) -> list[ModulePath]:
        """Of nested lists: a stage holding a list of layers and other modules (a downsampling, a norm) is what
        is recorded (ConvNext, Swin); a group holding nothing but its list is transparent (Albert's layer
        groups); a layer holding a list of several kinds of sublayers is the layer (T5's block)."""
        paths = sorted(candidates, key=len)
        dropped: set[ModulePath] = set()
        for outer in paths:
            inner_paths = [path for path in paths if len(path) > len(outer) and path[: len(outer)] == outer]
            if not inner_paths:
                continue
            if any(len(module_classes.get(path, [])) > 1 for path in inner_paths if len(path) == len(outer) + 2):
                dropped.update(inner_paths)  # a list of several kinds of sublayers: parts of the layer
                continue
            if self._holds_more_than_lists(candidates[outer], {path[len(outer)] for path in inner_paths}):
                dropped.update(inner_paths)
            else:
                dropped.add(outer)
        return [path for path in paths if path not in dropped]

    def _holds_more_than_lists(self, layer_classes: list[str], list_attributes: set[str]) -> bool:
        """Whether one of the classes holds modules other than the lists inside it (and norms, dropouts)."""
        others = False
        for cls in layer_classes:
            attributes = set(self.attributes(cls)) | {
                attribute
                for owner in class_mro(self.classes, cls)
                for attribute in self.classes[owner].dynamic_attributes
            }
            rest = [
                attribute for attribute in attributes - list_attributes if not _INCIDENTAL_ATTRIBUTE.search(attribute)
            ]
            others = others or bool(rest)
        return others

    def _main_layer_lists(self, kept: list[ModulePath]) -> list[ModulePath]:
        """Of several lists side by side, those of an encoder and a decoder are all recorded; a list reached only
        inside a single (non-repeated) block next to the main list is a part of a block, not a layer."""
        shallowest = min(_list_depth(path) for path in kept)
        kept = [path for path in kept if _list_depth(path) == shallowest]

        # lists of blocks without any attention (convolution blocks, an upscaling head) beside lists of
        # attention layers: the attention layers are the transformer's layers
        def attends(path: ModulePath) -> bool:
            return any(
                self._is_attention(node.cls) and node.path[: len(path)] == path and len(node.path) > len(path)
                for node in self.nodes
            )

        with_attention = [path for path in kept if attends(path)]
        kept = with_attention or kept
        # cross-attention layers inserted beside the main layers (Idefics' gated cross-attention layers) are not
        # the layers whose outputs are the hidden states
        plain = [path for path in kept if not any(CROSS_SEGMENT.search(segment) for segment in path)]
        return plain or kept

    # ---- attention
    def attention_chains(self, layer_classes: list[str]) -> list[AttentionChain]:
        """For each innermost attention module under a layer: its path from the layer, and the attention
        modules from the layer down to it."""
        chains: list[AttentionChain] = []
        inner_attention = self._holders_of_attention()
        for position, node in enumerate(self.nodes):
            if not self._is_attention(node.cls) or position in inner_attention:
                continue
            # walk up to the layer holding it
            found: list[tuple[str, ModulePath]] = [(node.cls, node.path)]  # innermost first
            up = node.up
            layer_path = None
            while up is not None:
                holder = self.nodes[up]
                if holder.cls in layer_classes and (not self.layer_paths or holder.path in self.layer_paths):
                    layer_path = holder.path
                    break
                if self._is_attention(holder.cls):
                    found.append((holder.cls, holder.path))
                up = holder.up
            if layer_path is None:
                continue
            links = [ChainLink(cls, path[len(layer_path) :], path) for cls, path in reversed(found)]
            chains.append(AttentionChain(node.path[len(layer_path) :], links))
        return chains

    def _holders_of_attention(self) -> set[int]:
        """The nodes (by index) that hold an attention module somewhere below them."""
        holders: set[int] = set()
        for node in self.nodes:
            if self._is_attention(node.cls):
                up = node.up
                while up is not None:
                    holders.add(up)
                    up = self.nodes[up].up
        return holders

    def _is_attention(self, cls: str) -> bool:
        return cls in self.classes and bool(_ATTENTION_CLASS.search(cls)) and not _IS_A_LAYER.search(cls)

    def weights_index(self, cls: str, cross: bool | None = None) -> int | None:
        """The index of the attention weights in what `cls.forward` returns (None: the default, 1). With
        `cross`, of the cross-attention (True) or self-attention (False) weights of a module returning both."""
        positions: set[int] = set()
        for shape in self.returns(cls):
            if shape.kind == "tuple":
                found = [
                    position
                    for position, name in enumerate(shape.names)
                    if position > 0 and WEIGHTS_NAME.search(short_name(name))
                ]
                if cross is not None and len(found) > 1:
                    found = [
                        position for position in found if bool(CROSS_NAME.search(shape.names[position])) == cross
                    ] or found
                if found:
                    positions.add(found[0] if cross is not None else found[-1])
            elif (
                shape.kind == "var"
                and shape.tail
                and (WEIGHTS_NAME.search(short_name(shape.tail[-1])) or shape.tail[-1].startswith("*"))
            ):
                positions.add(-1)
        if len(positions) == 1:
            return positions.pop()
        return None
