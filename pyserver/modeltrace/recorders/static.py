"""Static analysis of `_can_record_outputs` (stdlib `ast` only, no torch: the language server imports this).

What it reads from one modeling file: the classes it defines and how they are wired (`self.NAME = Cls(...)`,
`nn.ModuleList([Cls(...) for ...])`, layers appended to a local list, classes picked from a module-level table
such as `ALL_DECODER_LAYER_TYPES[...]`), the base models whose `forward` is decorated with `@capture_outputs`,
the `_can_record_outputs` each of them resolves to (own, inherited from a class of the file, or a dict built
from a parent's with `**Parent._can_record_outputs`), the output dataclass each forward returns with its
fields, and what each module's `forward` returns (a tuple, with which element names, or a single value). From
the module tree this gives (every path from the base model to each module it holds) it infers the entry each
recordable key should have, the way transformers' own files write them.

Reading uses `ast` (fast); the edits that must keep the file's formatting are done with libcst in `fixes.py`,
which parses the file only when a fix is applied (`Analysis.module`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

RECORDABLE_FIELDS = ("hidden_states", "attentions", "cross_attentions", "router_logits")
CROSS_SEGMENT = re.compile(r"cross|encoder_?attn|encdec|enc_dec|encoder_attention", re.I)
ROUTER_NAMES = ("router", "gate")
SELF_ATTENTION_NAMES = ("self_attn", "self_attention", "attention", "attn", "self_attn_layer", "attention_layer", "SelfAttention")
_ATTENTION_CLASS = re.compile(r"Attention|Attn|MLA$", re.I)
_WEIGHTS_NAME = re.compile(r"weights|probs|attn$|attention$|attentions$|attn_output_weights|scores", re.I)
_CONTAINERS = ("ModuleList", "Sequential", "ModuleDict")


@dataclass
class Recorder:
    """One entry of `_can_record_outputs` (a class, a class-name string, or an `OutputRecorder(...)`)."""

    target: str | None  # dotted name of the target class as written
    index: int | None = None  # None: the default (0 for hidden states keys, 1 otherwise)
    layer_name: str | None = None
    class_name: str | None = None
    line: int = 0
    alternatives: list[str] | None = None  # several classes: written as a list

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
        if self.index is not None and self.index != default_index:
            parts.append(f"index={self.index}")
        elif self.index is not None and self.layer_name is not None:
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
    node: ast.expr | None = None
    unresolved: str | None = None  # why analysis gave up on (part of) it


@dataclass
class Returns:
    """What one `return` of a `forward` gives: kind is "tuple" (fixed length), "var" (a tuple built by
    concatenation, length known only at run time), "output" (a ModelOutput instance) or "value"."""

    kind: str
    names: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)  # "var": names appended last


@dataclass
class ClassInfo:
    name: str
    bases: list[str]
    line: int
    node: ast.ClassDef | None
    attributes: dict[str, list[str]] = field(default_factory=dict)  # attr -> classes instantiated
    list_attributes: set[str] = field(default_factory=set)  # attrs holding a ModuleList/Sequential of modules
    dynamic_attributes: set[str] = field(default_factory=set)  # attrs assigned a call of a local name
    assigned: set[str] = field(default_factory=set)  # every `self.NAME = ...` in its methods
    has_forward: bool = False
    returns: list[Returns] = field(default_factory=list)
    capture_outputs: bool = False
    capture_line: int = 0
    output_classes: list[str] = field(default_factory=list)
    output_explicit: set[str] = field(default_factory=set)  # fields given explicitly in `return Output(...)`
    # fields passed on from what a submodule returned (`hidden_states=encoder_outputs.hidden_states`): the
    # attributes holding that submodule
    output_passed: dict[str, list[str]] = field(default_factory=dict)
    forward_params: list[str] = field(default_factory=list)
    init_params: list[str] = field(default_factory=list)
    param_attributes: dict[str, str] = field(default_factory=dict)  # `self.block = block`: parameter -> attribute
    can_record_node: ast.expr | None = None
    can_record_line: int = 0
    dataclass_fields: list[str] = field(default_factory=list)

    @property
    def forward_returns_tuple(self) -> bool | None:
        if not self.returns:
            return None
        return any(r.kind in ("tuple", "var") for r in self.returns)


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
    # "warning": the entry is wrong or missing; "hint": the file does not show it is wrong (an attention class
    # returning no weights, so that all a recorder could keep is its output), the fix writes what
    # transformers' own files usually write
    severity: str = "warning"

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
        return {"code": self.code, "message": self.message, "line": self.line, "severity": self.severity, "fix": self.fix_json()}


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
    source: str | None = None  # None: not parsed (syntax error)
    tables: dict[str, list[str]] = field(default_factory=dict)
    _module: object = None

    @property
    def module(self):
        """The libcst module of the source (parsed on first use: only edits need it), None if unparsable."""
        if self.source is None:
            return None
        if self._module is None:
            import libcst as cst

            try:
                self._module = cst.parse_module(self.source)
            except Exception:  # noqa: BLE001 - ast accepted it; libcst may lag behind the grammar
                self.source = None
                return None
        return self._module


# ----------------------------------------------------------------------------------------------------------- helpers


def dotted(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) and type(node.operand.value) is int:
        return -node.operand.value
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_class_name(name: str) -> bool:
    short = _short(name)
    return short[:1].isupper() and not short.isupper()


def _table_refs(node: ast.AST) -> list[str]:
    """Classes named by a module-level value: `{"a": A, "b": B}`, `[A, B]`, `A`."""
    if isinstance(node, ast.Dict):
        values = node.values
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = node.elts
    else:
        values = [node]
    refs = []
    for value in values:
        name = dotted(value)
        if name and name not in refs and name not in ("None", "True", "False"):
            refs.append(name)
    return refs


@dataclass
class _Binding:
    refs: list[str] = field(default_factory=list)  # classes the name may refer to (called later)
    instances: list[str] = field(default_factory=list)  # classes of the modules it holds
    in_list: bool = False


class _Reader:
    """Reads one class: its wiring (from every method) and its forward."""

    def __init__(self, info: ClassInfo, tables: dict[str, list[str]], class_names: set[str], methods: dict) -> None:
        self.info = info
        self.tables = tables
        self.class_names = class_names
        self.methods = methods  # name -> FunctionDef of this class (`self.layers = self.get_layers()`)
        self.calling: set[str] = set()
        self.params: list[str] = []  # parameters of the method being read
        # modules passed to a constructor: (class called, parameter name or position, classes of the modules)
        self.injections: list[tuple[str, str | int, list[str]]] = []

    def method_result(self, name: str) -> _Binding:
        """What `self.name(...)` returns, when `name` is a method of the class building modules."""
        function = self.methods.get(name)
        result = _Binding()
        if function is None or name in self.calling:
            return result
        self.calling.add(name)
        env: dict[str, _Binding] = {}
        self.statements(function.body, env)
        for node in _walk_function(function):
            if isinstance(node, ast.Return) and node.value is not None:
                binding = self.evaluate(node.value, env)
                result.instances = _union(result.instances, binding.instances)
                result.in_list = result.in_list or binding.in_list
        self.calling.discard(name)
        return result

    # ---- expressions
    def refs(self, node: ast.AST, env: dict[str, _Binding]) -> list[str]:
        if isinstance(node, ast.Name):
            if node.id in env:
                return list(env[node.id].refs)
            if node.id in self.tables:
                return list(self.tables[node.id])
            return [node.id] if _is_class_name(node.id) or node.id in self.class_names else []
        if isinstance(node, ast.Attribute):
            name = dotted(node)
            return [name] if name and _is_class_name(name) else []
        if isinstance(node, ast.Subscript):
            base = node.value
            if isinstance(base, ast.Name):
                if base.id in env:
                    return list(env[base.id].refs)
                if base.id in self.tables:
                    return list(self.tables[base.id])
            return []
        if isinstance(node, ast.IfExp):
            return _union(self.refs(node.body, env), self.refs(node.orelse, env))
        if isinstance(node, ast.BoolOp):
            result: list[str] = []
            for value in node.values:
                result = _union(result, self.refs(value, env))
            return result
        return []

    def evaluate(self, node: ast.AST | None, env: dict[str, _Binding]) -> _Binding:
        if node is None:
            return _Binding()
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            if name and _short(name) in _CONTAINERS:
                result = _Binding(in_list=True)
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    arg = arg.value if isinstance(arg, ast.Starred) else arg
                    result.instances = _union(result.instances, self.evaluate(arg, env).instances)
                return result
            method = _self_attribute(node.func)
            if method and method in self.methods:
                return self.method_result(method)
            called = self.refs(node.func, env)
            if called:
                passed = [(i, a) for i, a in enumerate(node.args) if not isinstance(a, ast.Starred)]
                passed += [(k.arg, k.value) for k in node.keywords if k.arg]
                for where, argument in passed:
                    if isinstance(argument, (ast.Call, ast.Name, ast.IfExp)):
                        modules = self.evaluate(argument, env).instances
                        if modules:
                            self.injections.extend((c, where, modules) for c in called)
            return _Binding(instances=called)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return _Binding(instances=self.evaluate(node.elt, env).instances, in_list=True)
        if isinstance(node, ast.DictComp):
            return _Binding(instances=self.evaluate(node.value, env).instances, in_list=True)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            result = _Binding(in_list=True)
            for element in node.elts:
                element = element.value if isinstance(element, ast.Starred) else element
                result.instances = _union(result.instances, self.evaluate(element, env).instances)
            return result
        if isinstance(node, ast.Dict):
            result = _Binding(in_list=True)
            for value in node.values:
                result.instances = _union(result.instances, self.evaluate(value, env).instances)
            return result
        if isinstance(node, (ast.IfExp, ast.BoolOp)) or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
            if isinstance(node, ast.BinOp):
                parts = [node.left, node.right]  # `[Layer(...) for ...] + [Layer(...) for ...]`
            else:
                parts = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            result = _Binding()
            for part in parts:
                binding = self.evaluate(part, env)
                result.instances = _union(result.instances, binding.instances)
                result.refs = _union(result.refs, binding.refs)
                result.in_list = result.in_list or binding.in_list
            return result
        if isinstance(node, ast.Name) and node.id in env:
            binding = env[node.id]
            return _Binding(list(binding.refs), list(binding.instances), binding.in_list)
        return _Binding(refs=self.refs(node, env))

    # ---- statements
    def statements(self, body: list[ast.stmt], env: dict[str, _Binding]) -> None:
        for statement in body:
            if isinstance(statement, ast.Assign):
                binding = self.evaluate(statement.value, env)
                for target in statement.targets:
                    self.assign(target, statement.value, binding, env)
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                self.assign(statement.target, statement.value, self.evaluate(statement.value, env), env)
            elif isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add):
                binding = self.evaluate(statement.value, env)
                self.add(statement.target, binding.instances, env)
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                call = statement.value
                if isinstance(call.func, ast.Attribute) and call.func.attr in ("append", "extend", "insert", "add_module"):
                    args = call.args[1:] if call.func.attr in ("insert", "add_module") else call.args
                    instances: list[str] = []
                    for arg in args:
                        instances = _union(instances, self.evaluate(arg, env).instances)
                    if call.func.attr == "add_module" and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
                        name = _string(call.args[0]) if call.args else None
                        attribute = name or "*"
                        self.info.assigned.add(attribute)
                        if instances:
                            existing = self.info.attributes.setdefault(attribute, [])
                            existing.extend(c for c in instances if c not in existing)
                            if name is None:
                                self.info.list_attributes.add(attribute)
                    else:
                        self.add(call.func.value, instances, env)
            elif isinstance(statement, (ast.If, ast.For, ast.AsyncFor, ast.While)):
                self.statements(statement.body, env)
                self.statements(statement.orelse, env)
            elif isinstance(statement, (ast.With, ast.AsyncWith)):
                self.statements(statement.body, env)
            elif isinstance(statement, ast.Try) or type(statement).__name__ == "TryStar":
                self.statements(statement.body, env)
                for handler in statement.handlers:
                    self.statements(handler.body, env)
                self.statements(statement.orelse, env)
                self.statements(statement.finalbody, env)

    def add(self, target: ast.AST, instances: list[str], env: dict[str, _Binding]) -> None:
        """Modules appended to a local list or to `self.NAME` (a ModuleList filled one layer at a time)."""
        if isinstance(target, ast.Name):
            binding = env.setdefault(target.id, _Binding())
            binding.instances = _union(binding.instances, instances)
            binding.in_list = True
            return
        attribute = _self_attribute(target)
        if attribute and instances:
            existing = self.info.attributes.setdefault(attribute, [])
            existing.extend(c for c in instances if c not in existing)
            self.info.list_attributes.add(attribute)

    def assign(self, target: ast.AST, value: ast.AST, binding: _Binding, env: dict[str, _Binding]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = binding
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                if isinstance(element, ast.Name):
                    env.pop(element.id, None)
            return
        attribute = _self_attribute(target)
        if not attribute:
            return
        info = self.info
        info.assigned.add(attribute)
        if isinstance(value, ast.Name) and value.id in self.params:
            info.param_attributes.setdefault(value.id, attribute)
        if not binding.instances and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id[:1].islower() and n.func.id not in _BUILTINS
            for n in ast.walk(value)
        ):
            info.dynamic_attributes.add(attribute)  # `downsample(...)`: a module class given as an argument
        if binding.instances:
            existing = info.attributes.setdefault(attribute, [])
            existing.extend(c for c in binding.instances if c not in existing)
            if binding.in_list:
                info.list_attributes.add(attribute)

    # ---- forward
    def forward(self, function: ast.FunctionDef) -> None:
        info = self.info
        info.has_forward = True
        arguments = function.args
        info.forward_params = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
        for decorator in function.decorator_list:
            expression = decorator.func if isinstance(decorator, ast.Call) else decorator
            if _short(dotted(expression) or "") == "capture_outputs":
                info.capture_outputs = True
                info.capture_line = decorator.lineno
        if function.returns is not None:
            for name in _annotation_names(function.returns):
                if name not in info.output_classes:
                    info.output_classes.append(name)
        assigns: dict[str, list[ast.AST]] = {}
        appended: dict[str, list[ast.AST]] = {}
        returns: list[ast.Return] = []
        for node in _walk_function(function):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigns.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                appended.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
                returns.append(node)
        for node in returns:
            shape = _shape(node.value, assigns, appended)
            info.returns.append(shape)
            if isinstance(node.value, ast.Name) and info.capture_outputs:
                # `return decoder_outputs`: every field is what that submodule returned
                sources = [_self_attribute(v.func) for v in assigns.get(node.value.id, []) if isinstance(v, ast.Call)]
                if sources and all(sources):
                    info.output_passed.setdefault("*", []).extend(sources)
            if shape.kind == "output" and isinstance(node.value, ast.Call):
                name = dotted(node.value.func) or ""
                if info.capture_outputs and name not in info.output_classes:
                    info.output_classes.append(name)
                for keyword in node.value.keywords:
                    if keyword.arg is None or _is_none(keyword.value):
                        continue
                    value = keyword.value
                    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                        sources = [
                            _self_attribute(v.func) for v in assigns.get(value.value.id, []) if isinstance(v, ast.Call)
                        ]
                        if sources and all(sources):
                            info.output_passed.setdefault(keyword.arg, []).extend(sources)
                            continue
                    info.output_explicit.add(keyword.arg)


_BUILTINS = {"getattr", "int", "float", "bool", "str", "len", "max", "min", "range", "list", "tuple", "dict", "sum", "round", "isinstance", "set", "abs", "super", "type"}


def _union(first: list[str], second: list[str]) -> list[str]:
    return first + [item for item in second if item not in first]


def _self_attribute(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _walk_function(function: ast.AST):
    """The nodes of a function's body, not descending into nested functions, classes or lambdas."""
    pending = list(ast.iter_child_nodes(function))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _element_name(node: ast.AST) -> str:
    if isinstance(node, ast.Subscript):
        return _element_name(node.value)
    if _is_none(node):
        return "None"
    return dotted(node) or ""


def _shape(value: ast.AST, assigns: dict, appended: dict, depth: int = 0) -> Returns:
    if isinstance(value, ast.Tuple):
        names = [_element_name(e) for e in value.elts]
        if any(isinstance(e, ast.Starred) for e in value.elts):
            return Returns("var", names)
        return Returns("tuple", names)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        left = _shape(value.left, assigns, appended, depth + 1) if depth < 4 else Returns("value")
        right = _shape(value.right, assigns, appended, depth + 1) if depth < 4 else Returns("value")
        if "tuple" in (left.kind, right.kind) or "var" in (left.kind, right.kind) or isinstance(value.right, ast.Subscript):
            tail = right.names if right.kind in ("tuple", "var") else []
            if isinstance(value.right, ast.Subscript) and isinstance(value.right.slice, ast.Slice):
                # `(hidden_states,) + attention_output[1:]`: the rest of a submodule's outputs, weights last
                tail = ["*" + _element_name(value.right)]
            return Returns("var", left.names, tail)
        return Returns("value")
    if isinstance(value, ast.Call):
        name = dotted(value.func) or ""
        if name and _is_class_name(name) and not name.startswith(("torch.", "nn.")):
            return Returns("output")
        return Returns("value")
    if isinstance(value, ast.Name) and depth < 4:
        values = assigns.get(value.id, [])
        shapes = [_shape(v, assigns, appended, depth + 1) for v in values]
        tuples = [s for s in shapes if s.kind in ("tuple", "var")]
        if value.id in appended and tuples:
            tail: list[str] = []
            for extra in appended[value.id]:
                shape = _shape(extra, assigns, appended, depth + 1)
                tail = shape.names if shape.kind in ("tuple", "var") else tail
            return Returns("var", tuples[0].names, tail)
        if tuples:
            lengths = {len(s.names) for s in tuples}
            if len(tuples) == len(shapes) and len(lengths) == 1 and all(s.kind == "tuple" for s in tuples):
                return tuples[-1]
            return Returns("var", tuples[-1].names, tuples[-1].tail)
        if shapes and all(s.kind == "output" for s in shapes):
            return Returns("output")
    return Returns("value")


def _annotation_names(node: ast.AST) -> list[str]:
    names: list[str] = []
    if isinstance(node, ast.BinOp):
        return _annotation_names(node.left) + _annotation_names(node.right)
    if isinstance(node, ast.Subscript):
        inner = node.slice
        elements = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        for element in elements:
            names.extend(_annotation_names(element))
        return names
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return []
    name = dotted(node)
    if name and name not in _NOT_OUTPUTS and not name.startswith(("torch.", "typing.")):
        names.append(name)
    return names


_NOT_OUTPUTS = {"Optional", "Union", "Tuple", "tuple", "list", "dict", "None", "Any", "str", "int", "float", "bool", "List", "Dict"}


def _read_module(tree: ast.Module) -> tuple[dict[str, ClassInfo], set[str], dict[str, list[str]]]:
    imported: set[str] = set()
    tables: dict[str, list[str]] = {}
    class_nodes: list[ast.ClassDef] = []

    def top(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if alias.name != "*":
                        imported.add(alias.asname or alias.name)
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    imported.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(statement, ast.ClassDef):
                class_nodes.append(statement)
            elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
                refs = _table_refs(statement.value)
                if refs:
                    tables[statement.targets[0].id] = refs
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value is not None:
                refs = _table_refs(statement.value)
                if refs:
                    tables[statement.target.id] = refs
            elif isinstance(statement, (ast.If, ast.Try)):
                top(statement.body)
                top(statement.orelse)
                for handler in getattr(statement, "handlers", []):
                    top(handler.body)

    top(tree.body)
    classes: dict[str, ClassInfo] = {}
    class_names = {node.name for node in class_nodes}
    injections: list[tuple[str, str | int, list[str]]] = []
    for name in list(tables):
        tables[name] = [r for r in tables[name] if _is_class_name(r) or r in class_names]
    for node in class_nodes:
        info = ClassInfo(node.name, [dotted(b) or "" for b in node.bases], node.lineno, node)
        classes[info.name] = info
        methods = {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        reader = _Reader(info, tables, class_names, methods)
        for statement in node.body:
            target = value = None
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target, value = dotted(statement.targets[0]), statement.value
            elif isinstance(statement, ast.AnnAssign):
                target, value = dotted(statement.target), statement.value
                if target and not target.startswith("_"):
                    info.dataclass_fields.append(target)
            if target == "_can_record_outputs" and value is not None:
                info.can_record_node = value
                info.can_record_line = statement.lineno
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = statement.args
                reader.params = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]][1:]
                if statement.name == "__init__":
                    info.init_params = list(reader.params)
                reader.statements(statement.body, {})
                reader.params = []
                if statement.name == "forward":
                    reader.forward(statement)
        info.capture_line = info.capture_line or info.line
        injections.extend(reader.injections)
    # modules built by a parent and handed to a constructor that keeps them (`ZambaHybridLayer(shared_transformer=
    # ZambaAttentionDecoderLayer(...))` with `self.shared_transformer = shared_transformer`)
    for called, where, modules in injections:
        for owner in _mro(classes, _short(called)):
            info = classes[owner]
            param = where if isinstance(where, str) else (info.init_params[where] if where < len(info.init_params) else None)
            attribute = info.param_attributes.get(param) if param else None
            if attribute:
                target = classes[_short(called)]
                existing = target.attributes.setdefault(attribute, [])
                existing.extend(m for m in modules if m not in existing)
                break
    return classes, imported, tables


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
        module = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    classes: dict[str, tuple[list[str], list[str]]] = {}
    for statement in module.body:
        if isinstance(statement, ast.ClassDef):
            fields = [dotted(s.target) for s in statement.body if isinstance(s, ast.AnnAssign) and dotted(s.target)]
            classes[statement.name] = ([dotted(b) or "" for b in statement.bases], fields)

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
        tree = ast.parse(source)
    except SyntaxError as error:
        return Analysis(path, {}, set(), [], [], [f"not analysed: syntax error at line {error.lineno}"])
    except Exception as error:  # noqa: BLE001 - never crash on odd input
        return Analysis(path, {}, set(), [], [], [f"not analysed: {type(error).__name__}: {error}"])
    classes, imported, tables = _read_module(tree)
    analysis = Analysis(path, classes, imported, [], [], [], source, tables)
    try:
        _analyze(analysis)
    except Exception as error:  # noqa: BLE001
        analysis.notes.append(f"analysis gave up: {type(error).__name__}: {error}")
    return analysis


def analyze_module(module, source: str | None = None, path: str | None = None) -> Analysis:
    """Analyse a libcst module (kept on the result, so that fixes do not parse it again)."""
    analysis = analyze_source(module.code if source is None else source, path)
    if analysis.source is not None:
        analysis._module = module
    return analysis


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
        pending.extend(_short(b) for b in classes[current].bases if b)
    return order


def _parse_recorder(node: ast.AST, line: int) -> Recorder | None:
    string = _string(node)
    if string is not None:
        return Recorder(None, class_name=string, line=line)
    name = dotted(node)
    if name:
        return Recorder(name, line=line)
    if isinstance(node, ast.Call) and _short(dotted(node.func) or "") == "OutputRecorder":
        recorder = Recorder(None, line=line)
        positional = ["target", "index", "layer_name", "class_name"]
        arguments = [(positional[i] if i < 4 else None, a) for i, a in enumerate(node.args)]
        arguments += [(k.arg, k.value) for k in node.keywords]
        for keyword, value in arguments:
            if keyword in ("target", "target_class"):
                if _is_none(value):
                    recorder.target = None
                else:
                    recorder.target = dotted(value)
                    if recorder.target is None:
                        return None
            elif keyword == "index":
                recorder.index = _int(value)
                if recorder.index is None:
                    return None
            elif keyword in ("layer_name", "class_name"):
                text = None if _is_none(value) else _string(value)
                if text is None and not _is_none(value):
                    return None
                setattr(recorder, keyword, text)
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
    if _is_none(node):
        return result
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left = _dict_from_expression(analysis, node.left, seen)
        right = _dict_from_expression(analysis, node.right, seen)
        if left is None or right is None or left.unresolved or right.unresolved:
            result.unresolved = f"{info.name}._can_record_outputs is built dynamically"
            return result
        result.entries = {**left.entries, **right.entries}
        return result
    if not isinstance(node, ast.Dict):
        result.unresolved = f"{info.name}._can_record_outputs is built dynamically"
        return result
    result.is_literal = True
    for key_node, value_node in zip(node.keys, node.values):
        if key_node is None:
            parent = _dict_from_expression(analysis, value_node, seen)
            if parent is None or parent.unresolved:
                result.unresolved = f"{info.name}._can_record_outputs unpacks something the analysis cannot resolve"
                continue
            result.entries.update(parent.entries)
            result.is_literal = False
            continue
        key = _string(key_node)
        if key is None:
            result.unresolved = f"{info.name}._can_record_outputs has a key that is not a string literal"
            continue
        values = value_node.elts if isinstance(value_node, (ast.List, ast.Tuple)) else [value_node]
        recorders = []
        for value in values:
            recorder = _parse_recorder(value, info.can_record_line)
            if recorder is None:
                result.unresolved = f"{info.name}._can_record_outputs[{key!r}] is built dynamically"
                break
            recorders.append(recorder)
        else:
            result.entries[key] = recorders
            result.entry_lines[key] = key_node.lineno
    return result


def _dict_from_expression(analysis: Analysis, node: ast.AST, seen: frozenset) -> CanRecord | None:
    name = dotted(node)
    if name and name.endswith("._can_record_outputs"):
        owner = _short(name[: -len("._can_record_outputs")])
        if owner in analysis.classes and owner not in seen:
            return _resolve_can_record(analysis, owner, seen)
        return None
    if isinstance(node, ast.Dict):
        fake = ClassInfo("<dict>", [], 0, None)
        fake.can_record_node = node
        return _read_can_record(analysis, fake, seen)
    return None


def _output_fields(analysis: Analysis, info: ClassInfo) -> list[str] | None:
    library = _library_outputs()
    fields: list[str] = []
    found = False
    for name in info.output_classes:
        short = _short(name)
        alias = analysis.tables.get(short, [])
        if short not in analysis.classes and len(alias) == 1:
            short = _short(alias[0])  # `WavLMBaseModelOutput = Wav2Vec2BaseModelOutput`
        if short in analysis.classes:
            found = True
            for owner in reversed(_mro(analysis.classes, short)):
                fields.extend(f for f in analysis.classes[owner].dataclass_fields if f not in fields)
            for base in analysis.classes[short].bases:
                fields.extend(f for f in library.get(_short(base), []) if f not in fields)
        elif short in library:
            found = True
            fields.extend(f for f in library[short] if f not in fields)
    return fields if found else None


# ------------------------------------------------------------------------------------------------------- inference


_NOT_A_LAYER = re.compile(r"(Experts?|Head|Norm|Embeddings?|Embed|Merger|Projector|Pooler|DropPath|Dropout|Context)$|Adapter|Conv(olution)?(Layer|Module)$|Downsampl|Upsampl")
_IS_A_LAYER = re.compile(r"(Encoder|Decoder)Layer")


@dataclass
class Node:
    """One module of the tree under a base model: its path (attribute names, `*` for an item of a list)."""

    path: tuple[str, ...]
    cls: str  # short class name (in the file) or dotted external name
    parent: str | None  # class holding it
    in_list: bool
    up: int | None = None  # index of the node holding it in `Wiring.nodes`


class Wiring:
    """The module tree under a set of base models, as far as the file tells."""

    MAX_NODES = 20000

    def __init__(self, analysis: Analysis, roots: list[str]) -> None:
        self.analysis = analysis
        self.classes = analysis.classes
        self.roots = roots
        self.nodes: list[Node] = []
        self._attributes: dict[str, dict[str, list[str]]] = {}
        for root in roots:
            self._root = root
            self._expand(root, (), frozenset({root}), False, None)
        self.reachable = list(dict.fromkeys([*roots, *(n.cls for n in self.nodes if n.cls in self.classes)]))
        self.layer_paths: set[tuple[str, ...]] = set()  # the lists of layers `layers()` chose

    def attributes(self, name: str) -> dict[str, list[str]]:
        if name not in self._attributes:
            merged: dict[str, list[str]] = {}
            for owner in reversed(_mro(self.classes, name)):
                merged.update(self.classes[owner].attributes)
            self._attributes[name] = merged
        return self._attributes[name]

    def list_attributes(self, name: str) -> set[str]:
        return {a for owner in _mro(self.classes, name) for a in self.classes[owner].list_attributes}

    def is_submodel(self, name: str) -> bool:
        """A PreTrainedModel: its own `_can_record_outputs` applies below it."""
        for owner in _mro(self.classes, name):
            if any("PreTrainedModel" in _short(b) for b in self.classes[owner].bases):
                return True
        return False

    def recorded_by(self, name: str) -> str | None:
        """The class whose `_can_record_outputs` the hooks below a (sub)model `name` follow."""
        return next((o for o in _mro(self.classes, name) if self.classes[o].can_record_node is not None), None)

    def _descends(self, child: str, root: str) -> bool:
        # a submodel has its own hooks: the same ones as the base model's when it follows the same dict
        return not self.is_submodel(child) or self.recorded_by(child) == self.recorded_by(root)

    def _expand(self, name: str, prefix: tuple[str, ...], stack: frozenset, cross: bool, up: int | None) -> None:
        lists = self.list_attributes(name)
        for attribute, classes in self.attributes(name).items():
            in_list = attribute in lists
            path = prefix + ((attribute, "*") if in_list else (attribute,))
            below_cross = cross or bool(CROSS_SEGMENT.search(attribute))
            if not in_list and len(classes) > 1 and any("Cross" in c for c in classes) and not all("Cross" in c for c in classes):
                # `attention_class = XCrossAttention if is_cross_attention else XSelfAttention`: the cross one
                # under a cross-attention module, the other one elsewhere
                classes = [c for c in classes if ("Cross" in c) == below_cross]
            for cls in classes:
                short = _short(cls)
                if len(self.nodes) >= self.MAX_NODES:
                    return
                target = short if short in self.classes else cls
                self.nodes.append(Node(path, target, name, in_list, up))
                if short in self.classes and short not in stack and len(path) < 16 and self._descends(short, self._root):
                    self._expand(short, path, stack | {short}, below_cross, len(self.nodes) - 1)

    def subclass_of(self, cls: str, target: str) -> bool:
        return _short(target) in _mro(self.classes, cls) if cls in self.classes else cls == target

    def returns(self, name: str) -> list[Returns]:
        for owner in _mro(self.classes, name):
            if self.classes[owner].has_forward:
                return self.classes[owner].returns
        return []

    def returns_tuple(self, name: str) -> bool | None:
        returns = self.returns(name)
        if not returns:
            return None
        return any(r.kind in ("tuple", "var") for r in returns)

    def is_module(self, name: str) -> bool:
        """A class of the file that is an nn.Module (it has a forward somewhere in its bases, or a known base)."""
        return name in self.classes and (bool(self.returns(name)) or any(
            re.search(r"Module|Layer|PreTrainedModel", _short(b)) for o in _mro(self.classes, name) for b in self.classes[o].bases
        ))

    # ---- layers
    def layers(self) -> list[str]:
        """The classes recorded for `hidden_states`: the repeated layers directly under the base models."""
        candidates: dict[tuple[str, ...], list[str]] = {}
        everything: dict[tuple[str, ...], list[str]] = {}  # every module class of each list
        for node in self.nodes:
            if not node.in_list or node.cls not in self.classes:
                continue
            if self.is_module(node.cls):
                everything.setdefault(node.path, [])
                if node.cls not in everything[node.path]:
                    everything[node.path].append(node.cls)
            if any(re.search(r"expert|head|conv|embed|pool|adapter|merger|downsampl|upsampl|fpn|pan|lateral", s, re.I) for s in node.path if s != "*"):
                continue
            if _NOT_A_LAYER.search(node.cls) and not _IS_A_LAYER.search(node.cls):
                continue
            if not self.is_module(node.cls) or re.search(r"Attention$|Attn$|MLP$|FeedForward$|FFN$", node.cls):
                continue
            candidates.setdefault(node.path, [])
            if node.cls not in candidates[node.path]:
                candidates[node.path].append(node.cls)
        if not candidates:
            return []
        # nested lists: a stage holding a list of layers and other modules (a downsampling, a norm) is what is
        # recorded (ConvNext, Swin); a group holding nothing but its list is transparent (Albert's layer groups);
        # a layer holding a list of several kinds of sublayers is the layer (T5's block)
        paths = sorted(candidates, key=len)
        dropped: set[tuple[str, ...]] = set()
        for outer in paths:
            inner_paths = [p for p in paths if len(p) > len(outer) and p[: len(outer)] == outer]
            if not inner_paths:
                continue
            if any(len(everything.get(p, [])) > 1 for p in inner_paths if len(p) == len(outer) + 2):
                dropped.update(inner_paths)  # a list of several kinds of sublayers: parts of the layer
                continue
            others = False
            for cls in candidates[outer]:
                attributes = set(self.attributes(cls)) | {a for o in _mro(self.classes, cls) for a in self.classes[o].dynamic_attributes}
                inner_attributes = {p[len(outer)] for p in inner_paths}
                rest = [a for a in attributes - inner_attributes if not re.search(r"norm|drop|act", a, re.I)]
                others = others or bool(rest)
            if others:
                dropped.update(inner_paths)
            else:
                dropped.add(outer)
        # of several lists side by side, those of an encoder and a decoder are all recorded; a list reached only
        # inside a single (non-repeated) block next to the main list is a part of a block, not a layer
        kept = [p for p in paths if p not in dropped]
        shallow = min(len([s for s in p if s == "*"]) for p in kept)
        kept = [p for p in kept if len([s for s in p if s == "*"]) == shallow]
        # lists of blocks without any attention (convolution blocks, an upscaling head) beside lists of
        # attention layers: the attention layers are the transformer's layers
        def attends(path: tuple[str, ...]) -> bool:
            return any(
                self._is_attention(n.cls) and n.path[: len(path)] == path and len(n.path) > len(path) for n in self.nodes
            )

        with_attention = [p for p in kept if attends(p)]
        kept = with_attention or kept
        # cross-attention layers inserted beside the main layers (Idefics' gated cross-attention layers) are not
        # the layers whose outputs are the hidden states
        plain = [p for p in kept if not any(CROSS_SEGMENT.search(s) for s in p)]
        kept = plain or kept
        self.layer_paths = set(kept)
        layers: list[str] = []
        for path in kept:
            layers = _union(layers, candidates[path])
        layers.sort(key=lambda c: self.classes[c].line)
        return layers

    # ---- attention
    def attention_chains(self, layer_classes: list[str]) -> list[tuple[tuple[str, ...], list[tuple[str, tuple[str, ...]]]]]:
        """For each attention module under a layer: (path from the layer, [(attention class, path)] outermost first)."""
        chains = []
        inner_attention = set()
        for node in self.nodes:
            if self._is_attention(node.cls):
                up = node.up
                while up is not None:
                    inner_attention.add(up)
                    up = self.nodes[up].up
        for position, node in enumerate(self.nodes):
            if not self._is_attention(node.cls) or position in inner_attention:
                continue
            # walk up to the layer holding it
            chain = [(node.cls, node.path)]
            up = node.up
            layer_path = None
            while up is not None:
                holder = self.nodes[up]
                if holder.cls in layer_classes and (not self.layer_paths or holder.path in self.layer_paths):
                    layer_path = holder.path
                    break
                if self._is_attention(holder.cls):
                    chain.append((holder.cls, holder.path))
                up = holder.up
            if layer_path is None:
                continue
            chain = [(cls, path[len(layer_path) :], path) for cls, path in reversed(chain)]
            chains.append((node.path[len(layer_path) :], chain))
        return chains

    def _is_attention(self, cls: str) -> bool:
        return cls in self.classes and bool(_ATTENTION_CLASS.search(cls)) and not _IS_A_LAYER.search(cls)

    def weights_index(self, cls: str, cross: bool | None = None) -> int | None:
        """The index of the attention weights in what `cls.forward` returns (None: the default, 1). With
        `cross`, of the cross-attention (True) or self-attention (False) weights of a module returning both."""
        returns = [r for r in self.returns(cls) if r.kind in ("tuple", "var")]
        positions = set()
        for shape in returns:
            if shape.kind == "tuple":
                found = [i for i, n in enumerate(shape.names) if i > 0 and _WEIGHTS_NAME.search(_short(n))]
                if cross is not None and len(found) > 1:
                    found = [i for i in found if bool(re.search("cross", shape.names[i], re.I)) == cross] or found
                if found:
                    positions.add(found[0] if cross is not None else found[-1])
            elif shape.tail and (_WEIGHTS_NAME.search(_short(shape.tail[-1])) or shape.tail[-1].startswith("*")):
                positions.add(-1)
        if len(positions) == 1:
            return positions.pop()
        return None


def _is_cross(path: tuple[str, ...], cls: str) -> bool:
    return any(CROSS_SEGMENT.search(s) for s in path) or "Cross" in cls


def infer_recorder(analysis: Analysis, use_roots: list[str], key: str, existing: dict[str, list[Recorder]], keys: set[str] | None = None) -> Recorder | None:
    """The entry `key` should have, from the module tree under the base models."""
    wiring = Wiring(analysis, use_roots)
    layers = [layer for layer in wiring.layers() if layer not in use_roots]
    keys = set(RECORDABLE_FIELDS) if keys is None else keys
    if key == "hidden_states":
        if len(layers) > 1:
            return Recorder(layers[0], alternatives=layers)
        if not layers:
            return None
        # the layer class also used in another list (V-JEPA 2's predictor): a layer name picks these layers
        wanted = {n.path for n in wiring.nodes if n.cls == layers[0] and n.path in wiring.layer_paths}
        others = {n.path for n in wiring.nodes if wiring.subclass_of(n.cls, layers[0]) and "*" in n.path} - wanted
        name = _separating_name(wanted, others, []) if others and wanted else None
        return Recorder(layers[0], layer_name=name)
    if key in ("attentions", "cross_attentions"):
        return _infer_attention(wiring, layers, key, "cross_attentions" in keys)
    if key == "router_logits":
        return _infer_router(wiring)
    return None


def _separating_name(wanted: set[tuple[str, ...]], unwanted: set[tuple[str, ...]], first: list[str]) -> str | None:
    """A module name (one attribute) in every path of `wanted` and in none of `unwanted`: a `layer_name`."""
    candidates = list(first)
    for path in sorted(wanted):
        candidates.extend(s for s in path if s != "*" and s not in candidates)
    for name in candidates:
        if all(name in path for path in wanted) and not any(name in path for path in unwanted):
            return name
    return None


def _infer_attention(wiring: Wiring, layers: list[str], key: str, split: bool) -> Recorder | None:
    chains = wiring.attention_chains(layers)
    if not chains:
        return None
    cross_chains = [c for p, c in chains if split and _is_cross(p, c[-1][0])]
    self_chains = [c for p, c in chains if not (split and _is_cross(p, c[-1][0]))]
    wanted, other = (cross_chains, self_chains) if key == "cross_attentions" else (self_chains, cross_chains)
    merged = [
        c for c in self_chains
        if any(re.search("cross", n, re.I) and _WEIGHTS_NAME.search(n) for r in wiring.returns(c[-1][0]) for n in r.names)
    ]
    if split and merged and not cross_chains:
        # one module attending to itself and to the encoder, returning both weights (T5Gemma2's merged attention)
        cls = merged[0][-1][0]
        index = wiring.weights_index(cls, cross=key == "cross_attentions")
        return Recorder(cls, index=None if index == 1 else index)
    if not wanted:
        return None
    # a class under the usual self-attention name and under another one in the same layer (X-CLIP's
    # `message_attn`): the usual one is the layer's attention
    usual = {(c[0][2][: len(c[0][2]) - len(c[0][1])], c[0][0]) for c in wanted if c[0][1][0] in SELF_ATTENTION_NAMES}
    wanted = [
        c for c in wanted
        if c[0][1][0] in SELF_ATTENTION_NAMES or CROSS_SEGMENT.search(c[0][1][0]) or (c[0][2][: len(c[0][2]) - len(c[0][1])], c[0][0]) not in usual
    ] or wanted
    other_classes = {item[0] for chain in other for item in chain}
    recorders: list[Recorder] = []
    hooked: dict[str, set] = {}  # target -> the paths it should hook
    firsts: dict[str, list[str]] = {}
    for chain in wanted:
        # the innermost attention class not shared with the other kind; else the innermost with a layer name
        # a kernel module under the attention (returning only its output) is not what records the weights
        returning = [item for item in chain if wiring.returns_tuple(item[0])]
        chain = returning or chain
        choice = next((item for item in reversed(chain) if item[0] not in other_classes), None) or chain[-1]
        cls, relative, absolute = choice
        hooked.setdefault(cls, set()).add(absolute)
        firsts.setdefault(cls, [relative[0]])
    for cls, paths in hooked.items():
        recorder = Recorder(cls, index=wiring.weights_index(cls))
        everywhere = {n.path for n in wiring.nodes if wiring.subclass_of(n.cls, cls)}
        if any("*" in p for p in everywhere - paths):
            # the class also sits in other repeated layers (the other kind of attention, adapter layers): a
            # layer name picks these (a single module elsewhere, such as a pooling head, is recorded too)
            name = _separating_name(paths, everywhere - paths, firsts[cls])
            if name is not None:
                recorder = Recorder(cls, index=recorder.index if recorder.index is not None else 1, layer_name=name)
        recorders.append(recorder)
    # a class and its subclass: the base class records both
    targets = [r.target for r in recorders]
    recorders = [r for r in recorders if not any(t != r.target and wiring.subclass_of(r.target, t) for t in targets if t)]
    if len(recorders) == 1:
        return recorders[0]
    if all(r.index is None and r.layer_name is None for r in recorders):
        ordered = sorted({r.target for r in recorders}, key=lambda c: wiring.classes[c].line)
        return Recorder(ordered[0], alternatives=ordered)
    return recorders[0]


def _infer_router(wiring: Wiring) -> Recorder | None:
    for node in wiring.nodes:
        if node.cls not in wiring.classes or not node.path or node.path[-1] not in ROUTER_NAMES:
            continue
        index = None
        for shape in wiring.returns(node.cls):
            names = shape.names
            for position, element in enumerate(names):
                if "logits" in element:
                    index = position
                    break
            if index is not None:
                break
        return Recorder(node.cls, index=0 if index is None else index)
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
            if any(_short(b) not in classes for b in info.bases if b and b != "nn.Module" and "PreTrainedModel" not in b):
                analysis.notes.append(f"line {use.line}: {use.cls} inherits from a class of another file; not checked")
                continue
            owner = pretrained or use.cls
            keys = _recordable(analysis, use)
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
                recorder = infer_recorder(analysis, [use.cls], key, {}, set(keys))
                if recorder:
                    recorders[key] = recorder
            problem.extra["entries"] = recorders
            if not recorders:
                problem.owner = None
            analysis.problems.append(problem)
    for users in by_owner.values():
        can_record = _resolve_can_record(analysis, users[0])
        if can_record is None or can_record.unresolved:
            continue
        _check_entries(analysis, can_record, users)


def _weights_evidence(analysis: Analysis, users: list[str], key: str, recorder: Recorder) -> str:
    """For an attention key: "weights" when the target returns something at the index, "none" when it
    returns a literal None there, "output only" when it never returns a tuple."""
    if "attentions" not in key or recorder.alternatives or recorder.target not in analysis.classes:
        return "weights"
    wiring = Wiring(analysis, users)
    returns = wiring.returns(recorder.target)
    if not returns:
        return "weights"
    if all(r.kind in ("value", "output") for r in returns):
        return "output only"
    index = recorder.effective_index(key)
    if all(r.kind == "tuple" and -len(r.names) <= index < len(r.names) and r.names[index] == "None" for r in returns):
        return "none"
    return "weights"


def _explicit(analysis: Analysis, name: str, seen: frozenset = frozenset()) -> set[str]:
    """The output fields `name.forward` gives a value of its own (the hooks' value then is not needed): given
    explicitly, or passed on from a submodule that records or gives them itself."""
    classes = analysis.classes
    info = classes[name]
    explicit = set(info.output_explicit)
    attributes: dict[str, list[str]] = {}
    for owner in reversed(_mro(classes, name)):
        attributes.update(classes[owner].attributes)
    passed = dict(info.output_passed)
    if "*" in passed:
        for key in RECORDABLE_FIELDS:
            passed.setdefault(key, []).extend(passed["*"])
        del passed["*"]
    for key, sources in passed.items():
        for attribute in sources:
            for cls in attributes.get(attribute, []):
                cls = _short(cls)
                if cls not in classes or cls in seen:
                    explicit.add(key)  # a module of another file: assume it fills it
                    continue
                if any(classes[o].capture_outputs for o in _mro(classes, cls)) or key in _explicit(analysis, cls, seen | {name}):
                    explicit.add(key)
    return explicit


_CROSS_INPUT = re.compile(r"encoder|cross|key_value|memory|context|condition", re.I)


def _recordable(analysis: Analysis, use: ModelUse) -> list[str]:
    """The recordable output fields of `use` its hooks must fill. Cross-attention only runs on encoder states
    (or other states to attend to), so `cross_attentions` counts only for a forward that takes them."""
    keys = _keys_to_record(use, _explicit(analysis, use.cls))
    params = next((analysis.classes[o].forward_params for o in _mro(analysis.classes, use.cls) if analysis.classes[o].has_forward), [])
    if "cross_attentions" in keys and not any(_CROSS_INPUT.search(p) for p in params):
        keys.remove("cross_attentions")
    return keys


def _keys_to_record(use: ModelUse, explicit: set[str] = frozenset()) -> list[str]:
    if use.output_fields is None:
        return []
    return [f for f in RECORDABLE_FIELDS if f in use.output_fields and f not in explicit]


def _check_entries(analysis: Analysis, can_record: CanRecord, users: list[str]) -> None:
    classes = analysis.classes
    writable = isinstance(classes[can_record.owner].can_record_node, ast.Dict)
    line = can_record.line
    uses = [u for u in analysis.uses if u.cls in users]
    keys = {k for u in uses for k in _recordable(analysis, u)}
    known = set(classes) | analysis.imported
    for key, recorders in can_record.entries.items():
        for recorder in recorders:
            if recorder.target and recorder.target.split(".")[0] not in known:
                analysis.problems.append(Problem("unknown-class", f"_can_record_outputs[{key!r}]: {recorder.target} is neither defined nor imported in this file", line, key))
    # layer names
    attribute_names = {a for info in classes.values() for a in info.assigned}
    dynamic = any(info.dynamic_attributes or "*" in info.assigned for info in classes.values())
    fields = None if any(u.output_fields is None for u in uses) else {f for u in uses for f in u.output_fields}
    for key, recorders in can_record.entries.items():
        if fields is not None and key not in fields:
            analysis.notes.append(f"line {line}: _can_record_outputs[{key!r}]: no output of {', '.join(users)} has this field; entry not checked")
            continue
        for recorder in recorders:
            if recorder.layer_name is None:
                continue
            parts = [p for p in recorder.layer_name.strip(".").split(".") if p and not p.isdigit()]
            if parts and attribute_names and not all(p in attribute_names for p in parts) and not ("*" in attribute_names and dynamic):
                replacement = infer_recorder(analysis, users, key, can_record.entries, keys)
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
    # self- and cross-attention sharing a class with no layer_name (only when both keys are recorded)
    if "cross_attentions" in keys and "attentions" in keys:
        wiring = Wiring(analysis, users)
        chains = wiring.attention_chains([c for c in wiring.layers() if c not in users])
        self_classes = {chain[-1][0] for p, chain in chains if not _is_cross(p, chain[-1][0])}
        cross_classes = {chain[-1][0] for p, chain in chains if _is_cross(p, chain[-1][0])}
        shared = self_classes & cross_classes
        for key in ("attentions", "cross_attentions"):
            for recorder in can_record.entries.get(key, []):
                short = _short(recorder.target or "")
                if short in shared and recorder.layer_name is None:
                    replacement = infer_recorder(analysis, users, key, can_record.entries, keys)
                    if replacement is None or _short(replacement.target or "") == short and replacement.layer_name is None:
                        continue
                    analysis.problems.append(
                        Problem(
                            "shared-attention-class",
                            f"_can_record_outputs[{key!r}]: {short} is used for both self- and cross-attention; without layer_name both land in {key!r}",
                            line,
                            key,
                            can_record.owner if writable else None,
                            replacement,
                            replace=True,
                        )
                    )
    # output fields with no recorder
    missing_reported = set()
    for use in uses:
        for key in _recordable(analysis, use):
            if key in can_record.entries or key in missing_reported:
                continue
            recorder = infer_recorder(analysis, users, key, can_record.entries, keys)
            if recorder is None:
                continue  # no evidence the model has such a module: no alarm
            missing_reported.add(key)
            evidence = _weights_evidence(analysis, users, key, recorder)
            if evidence == "none":
                analysis.notes.append(f"line {line}: {key!r} has no recorder, but {recorder.target} returns None where attention weights would be; nothing to record")
                continue
            problem = Problem(
                "missing-recorder",
                f"{use.cls} returns {key!r} but {can_record.owner}._can_record_outputs has no recorder for it (expected {recorder.source(key)})",
                line,
                key,
                can_record.owner if writable else None,
                recorder,
            )
            if evidence == "output only":
                problem.severity = "hint"
                problem.message = (
                    f"{use.cls} returns {key!r} and {can_record.owner}._can_record_outputs has no recorder for it; "
                    f"{recorder.target} returns its output only (no attention weights), which transformers' files "
                    f"often record anyway: {recorder.source(key)}"
                )
            analysis.problems.append(problem)
