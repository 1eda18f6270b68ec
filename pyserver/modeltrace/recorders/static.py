"""Static analysis of `_can_record_outputs` (libcst only, no torch: the language server imports this).

What it reads from one modeling file: the classes it defines and how they are wired (`self.NAME = Cls(...)`,
`nn.ModuleList([Cls(...) for ...])`), the base models whose `forward` is decorated with `@capture_outputs`,
the `_can_record_outputs` each of them resolves to (own, inherited from a class of the file, or a dict built
from a parent's with `**Parent._can_record_outputs`), and the output dataclass each forward returns with its
fields. From the wiring it infers the entry each recordable key should have, the way transformers' own files
write them.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

RECORDABLE_FIELDS = ("hidden_states", "attentions", "cross_attentions", "router_logits")
SELF_ATTENTION_NAMES = ("self_attn", "self_attention", "attention", "attn", "self_attn_layer", "attention_layer")
CROSS_ATTENTION_NAMES = ("encoder_attn", "cross_attn", "crossattention", "cross_attention", "encoder_attention")
ROUTER_NAMES = ("router", "gate")


@dataclass
class Recorder:
    """One entry of `_can_record_outputs` (a class, a class-name string, or an `OutputRecorder(...)`)."""

    target: str | None  # dotted name of the target class as written
    index: int | None = None  # None: the default (0 for hidden states keys, 1 otherwise)
    layer_name: str | None = None
    class_name: str | None = None
    line: int = 0
    alternatives: list[str] | None = None  # several layer classes: written as a list

    def effective_index(self, key: str) -> int:
        if self.index is not None:
            return self.index
        return 0 if "hidden_states" in key else 1

    def normalized(self, key: str) -> tuple:
        layer = self.layer_name.strip(".") if self.layer_name is not None else None
        return (self.target, self.effective_index(key), layer, self.class_name)

    def source(self, key: str) -> str:
        """The simplest form that is right: the bare class, else `OutputRecorder(...)`."""
        if self.alternatives:
            return "[" + ", ".join(self.alternatives) + "]"
        default_index = 0 if "hidden_states" in key else 1
        if self.index in (None, default_index) and self.layer_name is None and self.class_name is None:
            return self.target or ""
        parts = [self.target or "None"]
        if self.index is not None:
            parts.append(f"index={self.index}")
        if self.layer_name is not None:
            parts.append(f'layer_name="{self.layer_name}"')
        return f"OutputRecorder({', '.join(parts)})"


@dataclass
class CanRecord:
    """A resolved `_can_record_outputs`: where it is written and its entries per key."""

    owner: str  # class whose body writes it
    line: int
    entries: dict[str, list[Recorder]]
    entry_lines: dict[str, int]
    is_literal: bool  # a dict literal written in `owner` that a fix can edit
    node: cst.BaseExpression | None = None
    unresolved: str | None = None  # why analysis gave up on (part of) it


@dataclass
class ClassInfo:
    name: str
    bases: list[str]
    line: int
    node: cst.ClassDef
    attributes: dict[str, list[str]] = field(default_factory=dict)  # attr -> classes instantiated
    list_attributes: set[str] = field(default_factory=set)  # attrs holding a ModuleList of layers
    dynamic_attributes: set[str] = field(default_factory=set)  # attrs assigned a call of a local name
    assigned: set[str] = field(default_factory=set)  # every `self.NAME = ...` in its methods
    forward_returns_tuple: bool | None = None
    forward_return_names: list[str] | None = None  # element names of a returned tuple
    capture_outputs: bool = False
    capture_line: int = 0
    output_classes: list[str] = field(default_factory=list)
    output_explicit: set[str] = field(default_factory=set)  # fields given explicitly in `return Output(...)`
    can_record_node: cst.BaseExpression | None = None
    can_record_line: int = 0
    dataclass_fields: list[str] = field(default_factory=list)


@dataclass
class Problem:
    code: str
    message: str
    line: int
    key: str | None = None
    owner: str | None = None
    recorder: Recorder | None = None  # the entry a fix writes for `key`
    replace: bool = False  # the fix replaces the key's entry instead of adding it
    extra: dict = field(default_factory=dict)

    def fix_json(self) -> dict | None:
        if self.code == "no-recorders" and self.owner and self.extra.get("entries"):
            entries = self.extra["entries"]
            return {"class": self.owner, "entries": {k: r.source(k) for k, r in entries.items()}, "replace": False}
        if self.recorder is None or self.owner is None:
            return None
        return {
            "class": self.owner,
            "key": self.key,
            "entry": self.recorder.source(self.key or ""),
            "replace": self.replace,
        }

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message, "line": self.line, "fix": self.fix_json()}


@dataclass
class ModelUse:
    """A class whose forward is decorated with `@capture_outputs` and what it records."""

    cls: str
    line: int
    can_record: CanRecord | None
    output_fields: list[str] | None


@dataclass
class Analysis:
    path: str | None
    classes: dict[str, ClassInfo]
    imported: set[str]
    uses: list[ModelUse]
    problems: list[Problem]
    notes: list[str]
    module: cst.Module | None = None


# ----------------------------------------------------------------------------------------------------------- helpers


def dotted(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def _string(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _int(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def _called_classes(node: cst.BaseExpression) -> tuple[list[str], bool]:
    """Classes instantiated by an assigned value, and whether they sit in a ModuleList (repeated layers)."""
    found: list[str] = []
    in_list = False

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            nonlocal in_list
            name = dotted(call.func)
            if not name:
                return
            short = name.rsplit(".", 1)[-1]
            if short in ("ModuleList", "Sequential"):
                in_list = True
            elif short[:1].isupper() and short not in ("ModuleDict",):
                found.append(name)

    node.visit(Finder())
    return found, in_list


class _Collector(cst.CSTVisitor):
    """One pass over the module; lines are filled in afterwards from the text (position metadata is slow)."""

    def __init__(self) -> None:
        self.classes: dict[str, ClassInfo] = {}
        self.imported: set[str] = set()
        self.stack: list[ClassInfo] = []
        self.function_depth = 0
        self.current_function: str | None = None

    def _line(self, node: cst.CSTNode) -> int:
        return 0

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = alias.asname.name if alias.asname else alias.name
            if isinstance(name, cst.Name):
                self.imported.add(name.value)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            target = alias.asname.name if alias.asname else alias.name
            name = dotted(target)
            if name:
                self.imported.add(name.split(".")[0])

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if self.stack or self.function_depth:
            self.stack.append(ClassInfo(node.name.value, [], self._line(node), node))  # nested: ignored
            return
        bases = [dotted(arg.value) or "" for arg in node.bases]
        info = ClassInfo(node.name.value, bases, self._line(node), node)
        self.classes[info.name] = info
        self.stack.append(info)
        # class-level assignments
        for statement in node.body.body:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    target = None
                    value = None
                    if isinstance(small, cst.Assign) and len(small.targets) == 1:
                        target, value = dotted(small.targets[0].target), small.value
                    elif isinstance(small, cst.AnnAssign):
                        target, value = dotted(small.target), small.value
                        if target and "_" != target[:1]:
                            info.dataclass_fields.append(target)
                    if target == "_can_record_outputs" and value is not None:
                        info.can_record_node = value
                        info.can_record_line = self._line(small)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.function_depth += 1
        if len(self.stack) == 1 and self.function_depth == 1:
            info = self.stack[0]
            self.current_function = node.name.value
            if node.name.value == "forward":
                for decorator in node.decorators:
                    expression = decorator.decorator
                    if isinstance(expression, cst.Call):
                        expression = expression.func
                    if (dotted(expression) or "").rsplit(".", 1)[-1] == "capture_outputs":
                        info.capture_outputs = True
                        info.capture_line = self._line(decorator)
                annotation = node.returns.annotation if node.returns else None
                if annotation is not None:
                    for name in _annotation_names(annotation):
                        if name not in info.output_classes:
                            info.output_classes.append(name)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.function_depth -= 1
        if self.function_depth == 0:
            self.current_function = None

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(self.stack) != 1 or not self.function_depth:
            return
        info = self.stack[0]
        for target in node.targets:
            name = dotted(target.target)
            if name and name.startswith("self.") and name.count(".") == 1:
                classes, in_list = _called_classes(node.value)
                attribute = name[5:]
                info.assigned.add(attribute)
                if isinstance(node.value, cst.Call) and isinstance(node.value.func, cst.Name) and node.value.func.value[:1].islower():
                    info.dynamic_attributes.add(attribute)
                if classes:
                    existing = info.attributes.setdefault(attribute, [])
                    existing.extend(c for c in classes if c not in existing)
                    if in_list:
                        info.list_attributes.add(attribute)

    def visit_Call(self, node: cst.Call) -> None:
        # `self.layers.append(Layer(...))` in a loop: a ModuleList filled one layer at a time
        if len(self.stack) != 1 or not self.function_depth:
            return
        name = dotted(node.func)
        if not name or not name.startswith("self.") or name.count(".") != 2 or not name.endswith(".append"):
            return
        attribute = name.split(".")[1]
        info = self.stack[0]
        for arg in node.args:
            classes, _ = _called_classes(arg.value)
            if classes:
                existing = info.attributes.setdefault(attribute, [])
                existing.extend(c for c in classes if c not in existing)
                info.list_attributes.add(attribute)

    def visit_Return(self, node: cst.Return) -> None:
        if len(self.stack) != 1 or self.current_function != "forward" or self.function_depth != 1:
            return
        info = self.stack[0]
        value = node.value
        if value is None:
            return
        if isinstance(value, cst.Tuple):
            info.forward_returns_tuple = True
            info.forward_return_names = [dotted(element.value) or "" for element in value.elements]
        elif info.forward_returns_tuple is None:
            info.forward_returns_tuple = False
        if isinstance(value, cst.Call):
            name = dotted(value.func)
            if name and name[:1].isupper():
                if info.capture_outputs and name not in info.output_classes:
                    info.output_classes.append(name)
                for arg in value.args:
                    if arg.keyword is not None:
                        info.output_explicit.add(arg.keyword.value)


def _annotation_names(node: cst.BaseExpression) -> list[str]:
    names: list[str] = []
    if isinstance(node, cst.BinaryOperation):
        return _annotation_names(node.left) + _annotation_names(node.right)
    if isinstance(node, cst.Subscript):
        for element in node.slice:
            if isinstance(element.slice, cst.Index):
                names.extend(_annotation_names(element.slice.value))
        return names
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return [value] if isinstance(value, str) and value.isidentifier() else []
    name = dotted(node)
    if name and name[:1].isupper() and name not in ("Optional", "Union", "Tuple"):
        names.append(name)
    return names


# ------------------------------------------------------------------------------------------------- output classes


@functools.lru_cache(maxsize=1)
def _library_outputs() -> dict[str, list[str]]:
    """Fields of the output dataclasses of transformers' `modeling_outputs.py`, read as text (no import)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "modeling_outputs.py"
    try:
        module = cst.parse_module(path.read_text(encoding="utf-8"))
    except (OSError, cst.ParserSyntaxError):
        return {}
    classes: dict[str, tuple[list[str], list[str]]] = {}
    for statement in module.body:
        if isinstance(statement, cst.ClassDef):
            fields = []
            for line in statement.body.body:
                if isinstance(line, cst.SimpleStatementLine):
                    for small in line.body:
                        if isinstance(small, cst.AnnAssign):
                            name = dotted(small.target)
                            if name:
                                fields.append(name)
            classes[statement.name.value] = ([dotted(arg.value) or "" for arg in statement.bases], fields)

    def resolve(name: str, seen: frozenset = frozenset()) -> list[str]:
        if name not in classes or name in seen:
            return []
        bases, fields = classes[name]
        result: list[str] = []
        for base in bases:
            result.extend(f for f in resolve(base, seen | {name}) if f not in result)
        result.extend(f for f in fields if f not in result)
        return result

    return {name: resolve(name) for name in classes}


# --------------------------------------------------------------------------------------------------------- analysis


def analyze_source(source: str, path: str | None = None) -> Analysis:
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        return Analysis(path, {}, set(), [], [], [f"not analysed: syntax error at line {error.raw_line}"])
    except Exception as error:  # noqa: BLE001 - never crash on odd input
        return Analysis(path, {}, set(), [], [], [f"not analysed: {type(error).__name__}: {error}"])
    return analyze_module(module, source, path)


def analyze_module(module: cst.Module, source: str | None = None, path: str | None = None) -> Analysis:
    source = module.code if source is None else source
    collector = _Collector()
    module.visit(collector)
    _fill_lines(source, collector.classes)
    analysis = Analysis(path, collector.classes, collector.imported, [], [], [], module)
    try:
        _analyze(analysis)
    except Exception as error:  # noqa: BLE001
        analysis.notes.append(f"analysis gave up: {type(error).__name__}: {error}")
    return analysis


def _fill_lines(source: str, classes: dict[str, ClassInfo]) -> None:
    lines = source.splitlines()
    starts = {}
    for number, text in enumerate(lines, 1):
        match = re.match(r"class\s+(\w+)", text)
        if match and match.group(1) in classes and match.group(1) not in starts:
            starts[match.group(1)] = number
    ordered = sorted(starts.items(), key=lambda item: item[1])
    for position, (name, start) in enumerate(ordered):
        end = ordered[position + 1][1] if position + 1 < len(ordered) else len(lines) + 1
        info = classes[name]
        info.line = start
        for number in range(start, end):
            text = lines[number - 1]
            if info.can_record_node is not None and not info.can_record_line and re.match(r"\s+_can_record_outputs\b", text):
                info.can_record_line = number
            if info.capture_outputs and not info.capture_line and re.match(r"\s+@(\w+\.)*capture_outputs\b", text):
                info.capture_line = number
        info.can_record_line = info.can_record_line or start
        info.capture_line = info.capture_line or start


def analyze_file(path: str | Path) -> Analysis:
    path = Path(path)
    return analyze_source(path.read_text(encoding="utf-8"), str(path))


def _mro(classes: dict[str, ClassInfo], name: str) -> list[str]:
    order: list[str] = []
    pending = [name]
    while pending:
        current = pending.pop(0)
        if current in order or current not in classes:
            continue
        order.append(current)
        pending.extend(b.rsplit(".", 1)[-1] for b in classes[current].bases if b)
    return order


def _parse_recorder(node: cst.BaseExpression, line: int) -> Recorder | None:
    string = _string(node)
    if string is not None:
        return Recorder(None, class_name=string, line=line)
    name = dotted(node)
    if name:
        return Recorder(name, line=line)
    if isinstance(node, cst.Call) and (dotted(node.func) or "").rsplit(".", 1)[-1] == "OutputRecorder":
        recorder = Recorder(None, line=line)
        positional = ["target", "index", "layer_name", "class_name"]
        for position, arg in enumerate(node.args):
            keyword = arg.keyword.value if arg.keyword else (positional[position] if position < 4 else None)
            if keyword in ("target", "target_class"):
                recorder.target = dotted(arg.value)
                if recorder.target is None and not (isinstance(arg.value, cst.Name) and arg.value.value == "None"):
                    return None
                if recorder.target == "None":
                    recorder.target = None
            elif keyword == "index":
                recorder.index = _int(arg.value)
                if recorder.index is None:
                    return None
            elif keyword in ("layer_name", "class_name"):
                value = None if (isinstance(arg.value, cst.Name) and arg.value.value == "None") else _string(arg.value)
                if value is None and not isinstance(arg.value, cst.Name):
                    return None
                setattr(recorder, keyword, value)
            elif keyword in ("capture_initial_hidden_state", "num_hidden_layers_key"):
                pass
            else:
                return None
        return recorder
    return None


def _resolve_can_record(analysis: Analysis, name: str, seen: frozenset = frozenset()) -> CanRecord | None:
    """The `_can_record_outputs` class `name` resolves to, following its bases inside the file."""
    classes = analysis.classes
    for owner in _mro(classes, name):
        info = classes[owner]
        if info.can_record_node is None:
            continue
        return _read_can_record(analysis, info, seen | {owner})
    return None


def _read_can_record(analysis: Analysis, info: ClassInfo, seen: frozenset) -> CanRecord:
    node = info.can_record_node
    result = CanRecord(info.name, info.can_record_line, {}, {}, False, node)
    positions = analysis.module and None
    if isinstance(node, cst.Name) and node.value == "None":
        return result
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        left = _dict_from_expression(analysis, node.left, seen)
        right = _dict_from_expression(analysis, node.right, seen)
        if left is None or right is None:
            result.unresolved = f"{info.name}._can_record_outputs is built dynamically"
            return result
        result.entries = {**left.entries, **right.entries}
        return result
    if not isinstance(node, cst.Dict):
        result.unresolved = f"{info.name}._can_record_outputs is built dynamically"
        return result
    result.is_literal = True
    for element in node.elements:
        if isinstance(element, cst.StarredDictElement):
            parent = _dict_from_expression(analysis, element.value, seen)
            if parent is None or parent.unresolved:
                result.unresolved = f"{info.name}._can_record_outputs unpacks something the analysis cannot resolve"
                continue
            result.entries.update(parent.entries)
            result.is_literal = False
            continue
        key = _string(element.key)
        if key is None:
            result.unresolved = f"{info.name}._can_record_outputs has a key that is not a string literal"
            continue
        values = element.value.elements if isinstance(element.value, (cst.List, cst.Tuple)) else [element.value]
        recorders = []
        for value in values:
            value = value.value if isinstance(value, cst.Element) else value
            recorder = _parse_recorder(value, info.can_record_line)
            if recorder is None:
                result.unresolved = f"{info.name}._can_record_outputs[{key!r}] is built dynamically"
                break
            recorders.append(recorder)
        else:
            result.entries[key] = recorders
    del positions
    return result


def _dict_from_expression(analysis: Analysis, node: cst.BaseExpression, seen: frozenset) -> CanRecord | None:
    name = dotted(node)
    if name and name.endswith("._can_record_outputs"):
        owner = name[: -len("._can_record_outputs")].rsplit(".", 1)[-1]
        if owner in analysis.classes and owner not in seen:
            return _resolve_can_record(analysis, owner, seen)
        return None
    if isinstance(node, cst.Dict):
        fake = ClassInfo("<dict>", [], 0, None)  # type: ignore[arg-type]
        fake.can_record_node = node
        return _read_can_record(analysis, fake, seen)
    return None


def _output_fields(analysis: Analysis, info: ClassInfo) -> list[str] | None:
    library = _library_outputs()
    fields: list[str] = []
    found = False
    for name in info.output_classes:
        short = name.rsplit(".", 1)[-1]
        if short in analysis.classes:
            found = True
            for owner in reversed(_mro(analysis.classes, short)):
                fields.extend(f for f in analysis.classes[owner].dataclass_fields if f not in fields)
            for base in analysis.classes[short].bases:
                base = base.rsplit(".", 1)[-1]
                fields.extend(f for f in library.get(base, []) if f not in fields)
        elif short in library:
            found = True
            fields.extend(f for f in library[short] if f not in fields)
    return fields if found else None


# ------------------------------------------------------------------------------------------------------- inference


_NOT_A_LAYER = re.compile(r"(Experts?|Head|Norm|Embeddings?)$|Adapter|Conv(olution)?(Layer|Module)$")


_IS_A_LAYER = re.compile(r"(Encoder|Decoder)Layer")


class Wiring:
    """How the classes of a file are wired, seen from a set of base models."""

    def __init__(self, analysis: Analysis, roots: list[str]) -> None:
        self.analysis = analysis
        self.classes = analysis.classes
        self.reachable: list[str] = []
        pending = list(roots)
        while pending:
            name = pending.pop(0)
            if name in self.reachable or name not in self.classes:
                continue
            self.reachable.append(name)
            for owner in _mro(self.classes, name):
                for classes in self.classes[owner].attributes.values():
                    pending.extend(c.rsplit(".", 1)[-1] for c in classes)

    def attributes(self, name: str) -> dict[str, list[str]]:
        merged: dict[str, list[str]] = {}
        for owner in reversed(_mro(self.classes, name)):
            for attribute, classes in self.classes[owner].attributes.items():
                merged[attribute] = classes
        return merged

    def layer_classes(self) -> list[str]:
        layers = []
        for name in self.reachable:
            for owner in _mro(self.classes, name):
                info = self.classes[owner]
                for attribute in info.list_attributes:
                    if re.search(r"expert|head", attribute, re.I):
                        continue
                    for cls in info.attributes[attribute]:
                        short = cls.rsplit(".", 1)[-1]
                        if short in self.classes and short not in layers and (
                            _IS_A_LAYER.search(short) or not _NOT_A_LAYER.search(short)
                        ):
                            layers.append(short)
        return layers

    def _assigns_dynamic(self, name: str, attribute: str) -> bool:
        return any(attribute in self.classes[o].dynamic_attributes for o in _mro(self.classes, name))

    def attention_in(self, layer: str, names: tuple[str, ...]) -> tuple[str, str] | None:
        """The attention class held under one of `names` in `layer` (descending into wrappers) and the attribute."""
        attributes = self.attributes(layer)
        for attribute in names:
            for cls in attributes.get(attribute, []):
                short = cls.rsplit(".", 1)[-1]
                if short in self.classes:
                    return self._innermost_attention(short, cross=names is CROSS_ATTENTION_NAMES), attribute
        return None

    def _innermost_attention(self, name: str, depth: int = 0, cross: bool = False) -> str:
        if depth > 3:
            return name
        attributes = self.attributes(name)
        if "self" in attributes or self._assigns_dynamic(name, "self"):
            # BERT style: `self.self = attention_class(...)` picks XSelfAttention or XCrossAttention
            stem = name[: -len("Attention")] if name.endswith("Attention") else None
            if stem:
                wanted = f"{stem}CrossAttention" if cross else f"{stem}SelfAttention"
                if wanted in self.classes:
                    return wanted
                if cross and f"{stem}SelfAttention" in self.classes:
                    return f"{stem}SelfAttention"
        for attribute, classes in attributes.items():
            for cls in classes:
                short = cls.rsplit(".", 1)[-1]
                if short in self.classes and "Attention" in short and short != name and attribute in ("self", "attention", "attn", "self_attn"):
                    return self._innermost_attention(short, depth + 1)
        return name


def infer_recorder(analysis: Analysis, use_roots: list[str], key: str, existing: dict[str, list[Recorder]]) -> Recorder | None:
    """The entry `key` should have, from the wiring of the classes the base models reach."""
    wiring = Wiring(analysis, use_roots)
    layers = [layer for layer in wiring.layer_classes() if layer not in use_roots]
    if key == "hidden_states":
        # a layer holding a ModuleList of other layers is a container: the inner layer is the one recorded
        # (Albert's layer groups); one holding several kinds of sublayers is the layer (T5's block)
        dropped = set()
        for layer in layers:
            for owner in _mro(analysis.classes, layer):
                for attribute in analysis.classes[owner].list_attributes:
                    inner = {c.rsplit(".", 1)[-1] for c in analysis.classes[owner].attributes.get(attribute, [])}
                    inner &= set(layers)
                    if len(inner) == 1:
                        dropped.add(layer)
                    elif len(inner) > 1:
                        dropped |= inner
        layers = [layer for layer in layers if layer not in dropped]
        layers.sort(key=lambda layer: analysis.classes[layer].line)
        if len(layers) > 1:
            return Recorder(layers[0], alternatives=layers)
        if layers:
            return Recorder(layers[0])
        return None
    if key == "attentions":
        for layer in layers:
            found = wiring.attention_in(layer, SELF_ATTENTION_NAMES)
            if found:
                cls, attribute = found
                crossed = any((wiring.attention_in(l, CROSS_ATTENTION_NAMES) or ("",))[0] == cls for l in layers)
                existing_cross = existing.get("cross_attentions") or []
                if any(r.layer_name for r in existing_cross) and any(r.target == cls for r in existing_cross):
                    crossed = True
                if crossed:
                    return Recorder(cls, index=1, layer_name=attribute)
                return Recorder(cls)
        return None
    if key == "cross_attentions":
        for layer in layers:
            found = wiring.attention_in(layer, CROSS_ATTENTION_NAMES)
            if found:
                cls, attribute = found
                self_found = [wiring.attention_in(l, SELF_ATTENTION_NAMES) for l in layers]
                if any(f and f[0] == cls for f in self_found) or any(r.layer_name for r in existing.get("attentions") or []):
                    return Recorder(cls, index=1, layer_name=attribute)
                return Recorder(cls)
        return None
    if key == "router_logits":
        for name in wiring.reachable:
            attributes = wiring.attributes(name)
            for attribute in ROUTER_NAMES:
                for cls in attributes.get(attribute, []):
                    short = cls.rsplit(".", 1)[-1]
                    if short in analysis.classes:
                        info = analysis.classes[short]
                        index = None
                        for owner in _mro(analysis.classes, short):
                            names = analysis.classes[owner].forward_return_names
                            if names:
                                for position, element in enumerate(names):
                                    if "logits" in element:
                                        index = position
                                        break
                                break
                        del info
                        return Recorder(short, index=0 if index is None else index)
        return None
    return None


# ---------------------------------------------------------------------------------------------------------- checks


def _analyze(analysis: Analysis) -> None:
    classes = analysis.classes
    by_owner: dict[str, list[str]] = {}
    for info in classes.values():
        if not info.capture_outputs:
            continue
        can_record = _resolve_can_record(analysis, info.name)
        use = ModelUse(info.name, info.capture_line, can_record, _output_fields(analysis, info))
        analysis.uses.append(use)
        if can_record is not None:
            by_owner.setdefault(can_record.owner, []).append(info.name)
            if can_record.unresolved:
                analysis.notes.append(f"line {can_record.line}: {can_record.unresolved}; not checked")
    for use in analysis.uses:
        info = classes[use.cls]
        if use.can_record is None:
            pretrained = next((c for c in _mro(classes, use.cls) if c != use.cls and "PreTrainedModel" in c), None)
            if any(b.rsplit(".", 1)[-1] not in classes for b in info.bases if b and b != "nn.Module" and "PreTrainedModel" not in b):
                analysis.notes.append(f"line {use.line}: {use.cls} inherits from a class of another file; not checked")
                continue
            owner = pretrained or use.cls
            if owner not in classes or any(b.rsplit(".", 1)[-1] not in classes for b in classes[owner].bases if b and not b.endswith("PreTrainedModel")):
                pass
            keys = _keys_to_record(use, info.output_explicit)
            if not keys:
                continue  # every recordable output is given explicitly: nothing for hooks to record
            problem = Problem(
                "no-recorders",
                f"{use.cls}.forward uses @capture_outputs but {owner} has no _can_record_outputs",
                use.line,
                owner=owner,
            )
            recorders = {}
            for key in keys:
                recorder = infer_recorder(analysis, [use.cls], key, {})
                if recorder:
                    recorders[key] = recorder
            problem.extra["entries"] = recorders
            if not recorders:
                problem.owner = None
            analysis.problems.append(problem)
    for owner, users in by_owner.items():
        can_record = _resolve_can_record(analysis, users[0])
        if can_record is None or can_record.unresolved:
            continue
        _check_entries(analysis, can_record, users)


def _keys_to_record(use: ModelUse, explicit: set[str] = frozenset()) -> list[str]:
    if use.output_fields is None:
        return []
    return [f for f in RECORDABLE_FIELDS if f in use.output_fields and f not in explicit]


def _check_entries(analysis: Analysis, can_record: CanRecord, users: list[str]) -> None:
    classes = analysis.classes
    writable = classes[can_record.owner].can_record_node is not None and isinstance(classes[can_record.owner].can_record_node, cst.Dict)
    line = can_record.line
    # names known in the file
    known = set(classes) | analysis.imported
    for key, recorders in can_record.entries.items():
        for recorder in recorders:
            if recorder.target and recorder.target.split(".")[0] not in known:
                analysis.problems.append(Problem("unknown-class", f"_can_record_outputs[{key!r}]: {recorder.target} is neither defined nor imported in this file", line, key))
    # layer names
    attribute_names = {a for info in classes.values() for a in info.assigned}
    for key, recorders in can_record.entries.items():
        for recorder in recorders:
            if recorder.layer_name is None:
                continue
            parts = [p for p in recorder.layer_name.strip(".").split(".") if p and not p.isdigit()]
            if parts and attribute_names and not all(p in attribute_names for p in parts):
                replacement = infer_recorder(analysis, users, key, can_record.entries)
                analysis.problems.append(
                    Problem(
                        "unknown-layer-name",
                        f"_can_record_outputs[{key!r}]: layer_name {recorder.layer_name!r} matches no module of this file",
                        line,
                        key,
                        can_record.owner if writable and replacement else None,
                        replacement,
                        replace=True,
                    )
                )
    # self- and cross-attention sharing a class with no layer_name
    wiring = Wiring(analysis, users)
    layers = wiring.layer_classes()
    self_classes = {(wiring.attention_in(l, SELF_ATTENTION_NAMES) or ("",))[0] for l in layers} - {""}
    cross_classes = {(wiring.attention_in(l, CROSS_ATTENTION_NAMES) or ("",))[0] for l in layers} - {""}
    shared = self_classes & cross_classes
    for key in ("attentions", "cross_attentions"):
        for recorder in can_record.entries.get(key, []):
            short = (recorder.target or "").rsplit(".", 1)[-1]
            if short in shared and recorder.layer_name is None:
                replacement = infer_recorder(analysis, users, key, can_record.entries)
                analysis.problems.append(
                    Problem(
                        "shared-attention-class",
                        f"_can_record_outputs[{key!r}]: {short} is used for both self- and cross-attention; without layer_name both land in {key!r}",
                        line,
                        key,
                        can_record.owner if writable and replacement and replacement.layer_name else None,
                        replacement if replacement and replacement.layer_name else None,
                        replace=True,
                    )
                )
    # output fields with no recorder
    missing_reported = set()
    for user in users:
        use = next(u for u in analysis.uses if u.cls == user)
        for key in _keys_to_record(use, classes[user].output_explicit):
            if key in can_record.entries or key in missing_reported:
                continue
            if key in classes[user].output_explicit:
                continue
            recorder = infer_recorder(analysis, users, key, can_record.entries)
            if recorder is None:
                continue  # no evidence the model has such a module: no alarm
            missing_reported.add(key)
            analysis.problems.append(
                Problem(
                    "missing-recorder",
                    f"{use.cls} returns {key!r} but {can_record.owner}._can_record_outputs has no recorder for it (expected {recorder.source(key)})",
                    line,
                    key,
                    can_record.owner if writable else None,
                    recorder,
                )
            )
