"""Reading one modeling file with `ast`: its classes, the modules each one holds, and what each `forward` returns.

The first step of the recorder analysis. From every method of a class it reads how modules are wired in
(`self.NAME = Cls(...)`, `nn.ModuleList([Cls(...) for ...])`, layers appended to a local list, classes picked
from a module-level table such as `ALL_DECODER_LAYER_TYPES[...]`, modules handed to a constructor that keeps
them); from its `forward`, whether it uses `@capture_outputs`, the shape of each `return` and the output fields
it gives explicitly. `wiring.py` turns this into the module tree under a base model.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import NamedTuple

from modeltrace.recorders.syntax import (
    class_mro,
    dotted,
    is_class_name,
    is_none,
    parameter_names,
    self_attribute,
    short_name,
    string_value,
    union,
    walk_function,
)
from modeltrace.recorders.types import ClassInfo, Returns

# Calls that build a container of modules: every module in their arguments is an item of a list.
CONTAINER_CLASSES = ("ModuleList", "Sequential", "ModuleDict")
# Lower-case calls that are not a module class handed in as an argument (`downsample(...)` is one).
_BUILTIN_CALLS = frozenset(
    "getattr int float bool str len max min range list tuple dict sum round isinstance set abs super type".split()
)
# Names in a return annotation that are not an output class (`Optional[tuple[...] | BaseModelOutput]`).
_NOT_OUTPUT_ANNOTATIONS = frozenset(
    "Optional Union Tuple tuple list dict None Any str int float bool List Dict".split()
)
# Method calls that put modules into a list or into the module itself.
_ADDING_METHODS = ("append", "extend", "insert", "add_module")
# NOTE: a `return` that refers to names assigned from other names is followed this many steps, no further
# (`outputs = (hidden_states,) + outputs` chains); deeper ones count as a single value.
_MAX_SHAPE_DEPTH = 4


@dataclass
class Binding:
    """What a local name (or an expression) holds, as far as wiring goes."""

    refs: list[str] = field(default_factory=list)  # classes the name may refer to (called later)
    instances: list[str] = field(default_factory=list)  # classes of the modules it holds
    in_list: bool = False


class Injection(NamedTuple):
    """Modules passed to a constructor: `Layer(shared_transformer=Block(...))` or `Layer(Block(...))`."""

    called_class: str
    parameter: str | int  # the keyword, or the position of the argument
    module_classes: list[str]


class ForwardLocals(NamedTuple):
    """The local names of a `forward` and its `return`s, as read by `ClassReader.forward`."""

    assigned: dict[str, list[ast.AST]]  # name -> the values assigned to it
    appended: dict[str, list[ast.AST]]  # name -> the values `+=`-ed to it
    returns: list[ast.Return]  # the `return`s of something other than None


class ModuleLevel(NamedTuple):
    """What the top level of a file defines: imported names, class-valued tables, class definitions."""

    imported: set[str]
    tables: dict[str, list[str]]  # name -> the classes a module-level table or alias names
    class_nodes: list[ast.ClassDef]


def table_refs(node: ast.AST) -> list[str]:
    """Classes named by a module-level value: `{"a": A, "b": B}`, `[A, B]`, `A`."""
    if isinstance(node, ast.Dict):
        values = node.values
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = node.elts
    else:
        values = [node]
    refs: list[str] = []
    for value in values:
        name = dotted(value)
        if name and name not in refs and name not in ("None", "True", "False"):
            refs.append(name)
    return refs


class ClassReader:
    """Reads one class: its wiring (from every method) and its forward."""

    def __init__(
        self,
        info: ClassInfo,
        tables: dict[str, list[str]],
        class_names: set[str],
        methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef],
    ) -> None:
        self.info = info
        self.tables = tables
        self.class_names = class_names
        self.methods = methods  # name -> FunctionDef of this class (`self.layers = self.get_layers()`)
        self.methods_being_read: set[str] = set()
        self.parameters: list[str] = []  # parameters of the method being read
        self.injections: list[Injection] = []

    def method_result(self, name: str) -> Binding:
        """What `self.name(...)` returns, when `name` is a method of the class building modules."""
        function = self.methods.get(name)
        result = Binding()
        if function is None or name in self.methods_being_read:
            return result
        self.methods_being_read.add(name)
        bindings: dict[str, Binding] = {}
        self.statements(function.body, bindings)
        for node in walk_function(function):
            if isinstance(node, ast.Return) and node.value is not None:
                binding = self.evaluate(node.value, bindings)
                result.instances = union(result.instances, binding.instances)
                result.in_list = result.in_list or binding.in_list
        self.methods_being_read.discard(name)
        return result

    # ---- expressions
    def refs(self, node: ast.AST, bindings: dict[str, Binding]) -> list[str]:
        """The classes an expression may name (to be called later): a class, a table of classes, a choice."""
        if isinstance(node, ast.Name):
            if node.id in bindings:
                return list(bindings[node.id].refs)
            if node.id in self.tables:
                return list(self.tables[node.id])
            return [node.id] if is_class_name(node.id) or node.id in self.class_names else []
        if isinstance(node, ast.Attribute):
            name = dotted(node)
            return [name] if name and is_class_name(name) else []
        if isinstance(node, ast.Subscript):
            base = node.value
            if isinstance(base, ast.Name):
                if base.id in bindings:
                    return list(bindings[base.id].refs)
                if base.id in self.tables:
                    return list(self.tables[base.id])
            return []
        if isinstance(node, ast.IfExp):
            return union(self.refs(node.body, bindings), self.refs(node.orelse, bindings))
        if isinstance(node, ast.BoolOp):
            result: list[str] = []
            for value in node.values:
                result = union(result, self.refs(value, bindings))
            return result
        return []

    def evaluate(self, node: ast.AST | None, bindings: dict[str, Binding]) -> Binding:
        """The modules an expression builds, and the classes it names."""
        if node is None:
            return Binding()
        if isinstance(node, ast.Call):
            return self._evaluate_call(node, bindings)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return Binding(instances=self.evaluate(node.elt, bindings).instances, in_list=True)
        if isinstance(node, ast.DictComp):
            return Binding(instances=self.evaluate(node.value, bindings).instances, in_list=True)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            elements = [element.value if isinstance(element, ast.Starred) else element for element in node.elts]
            return self._evaluate_items(elements, bindings)
        if isinstance(node, ast.Dict):
            return self._evaluate_items(node.values, bindings)
        if isinstance(node, (ast.IfExp, ast.BoolOp)) or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
            return self._evaluate_alternatives(node, bindings)
        if isinstance(node, ast.Name) and node.id in bindings:
            binding = bindings[node.id]
            return Binding(list(binding.refs), list(binding.instances), binding.in_list)
        return Binding(refs=self.refs(node, bindings))

    def _evaluate_items(self, items: list[ast.AST], bindings: dict[str, Binding]) -> Binding:
        """A literal list, tuple, set or dict of modules."""
        result = Binding(in_list=True)
        for item in items:
            result.instances = union(result.instances, self.evaluate(item, bindings).instances)
        return result

    def _evaluate_alternatives(
        self, node: ast.IfExp | ast.BoolOp | ast.BinOp, bindings: dict[str, Binding]
    ) -> Binding:
        """`A(...) if cond else B(...)`, `a or B(...)`, `[A(...) for ...] + [B(...) for ...]`: either part."""
        if isinstance(node, ast.BinOp):
            parts = [node.left, node.right]
        else:
            parts = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
        result = Binding()
        for part in parts:
            binding = self.evaluate(part, bindings)
            result.instances = union(result.instances, binding.instances)
            result.refs = union(result.refs, binding.refs)
            result.in_list = result.in_list or binding.in_list
        return result

    def _evaluate_call(self, node: ast.Call, bindings: dict[str, Binding]) -> Binding:
        """A container of modules, a method of the class building modules, or a class called."""
        name = dotted(node.func)
        if name and short_name(name) in CONTAINER_CLASSES:
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            return self._evaluate_items(
                [argument.value if isinstance(argument, ast.Starred) else argument for argument in arguments], bindings
            )
        method = self_attribute(node.func)
        if method and method in self.methods:
            return self.method_result(method)
        called = self.refs(node.func, bindings)
        if called:
            self._record_injections(node, called, bindings)
        return Binding(instances=called)

    def _record_injections(self, node: ast.Call, called: list[str], bindings: dict[str, Binding]) -> None:
        """Modules built in the arguments of a constructor call (the constructor may keep them)."""
        passed: list[tuple[str | int, ast.AST]] = [
            (position, argument)
            for position, argument in enumerate(node.args)
            if not isinstance(argument, ast.Starred)
        ]
        passed += [(keyword.arg, keyword.value) for keyword in node.keywords if keyword.arg]
        for parameter, argument in passed:
            if isinstance(argument, (ast.Call, ast.Name, ast.IfExp)):
                modules = self.evaluate(argument, bindings).instances
                if modules:
                    self.injections.extend(Injection(called_class, parameter, modules) for called_class in called)

    # ---- statements
    def statements(self, body: list[ast.stmt], bindings: dict[str, Binding]) -> None:
        """Read the wiring of a block of statements, recursing into compound statements."""
        for statement in body:
            if isinstance(statement, ast.Assign):
                binding = self.evaluate(statement.value, bindings)
                for target in statement.targets:
                    self.assign(target, statement.value, binding, bindings)
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                self.assign(statement.target, statement.value, self.evaluate(statement.value, bindings), bindings)
            elif isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add):
                binding = self.evaluate(statement.value, bindings)
                self.add(statement.target, binding.instances, bindings)
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                self._adding_call(statement.value, bindings)
            elif isinstance(statement, (ast.If, ast.For, ast.AsyncFor, ast.While)):
                self.statements(statement.body, bindings)
                self.statements(statement.orelse, bindings)
            elif isinstance(statement, (ast.With, ast.AsyncWith)):
                self.statements(statement.body, bindings)
            elif isinstance(statement, ast.Try) or type(statement).__name__ == "TryStar":
                self.statements(statement.body, bindings)
                for handler in statement.handlers:
                    self.statements(handler.body, bindings)
                self.statements(statement.orelse, bindings)
                self.statements(statement.finalbody, bindings)

    def _adding_call(self, call: ast.Call, bindings: dict[str, Binding]) -> None:
        """`layers.append(Layer(...))`, `self.add_module("name", Layer(...))` and the like."""
        if not (isinstance(call.func, ast.Attribute) and call.func.attr in _ADDING_METHODS):
            return
        method = call.func.attr
        arguments = call.args[1:] if method in ("insert", "add_module") else call.args
        instances: list[str] = []
        for argument in arguments:
            instances = union(instances, self.evaluate(argument, bindings).instances)
        if method == "add_module" and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
            name = string_value(call.args[0]) if call.args else None
            attribute = name or "*"
            self.info.assigned.add(attribute)
            if instances:
                existing = self.info.attributes.setdefault(attribute, [])
                existing.extend(cls for cls in instances if cls not in existing)
                if name is None:
                    self.info.list_attributes.add(attribute)
        else:
            self.add(call.func.value, instances, bindings)

    def add(self, target: ast.AST, instances: list[str], bindings: dict[str, Binding]) -> None:
        """Modules appended to a local list or to `self.NAME` (a ModuleList filled one layer at a time)."""
        if isinstance(target, ast.Name):
            binding = bindings.setdefault(target.id, Binding())
            binding.instances = union(binding.instances, instances)
            binding.in_list = True
            return
        attribute = self_attribute(target)
        if attribute and instances:
            existing = self.info.attributes.setdefault(attribute, [])
            existing.extend(cls for cls in instances if cls not in existing)
            self.info.list_attributes.add(attribute)

    def assign(self, target: ast.AST, value: ast.AST, binding: Binding, bindings: dict[str, Binding]) -> None:
        """`name = ...` binds a local; `self.NAME = ...` wires the modules of `binding` into the class."""
        if isinstance(target, ast.Name):
            bindings[target.id] = binding
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                if isinstance(element, ast.Name):
                    bindings.pop(element.id, None)
            return
        attribute = self_attribute(target)
        if not attribute:
            return
        info = self.info
        info.assigned.add(attribute)
        if isinstance(value, ast.Name) and value.id in self.parameters:
            info.param_attributes.setdefault(value.id, attribute)
        if not binding.instances and any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id[:1].islower()
            and node.func.id not in _BUILTIN_CALLS
            for node in ast.walk(value)
        ):
            info.dynamic_attributes.add(attribute)  # `downsample(...)`: a module class given as an argument
        if binding.instances:
            existing = info.attributes.setdefault(attribute, [])
            existing.extend(cls for cls in binding.instances if cls not in existing)
            if binding.in_list:
                info.list_attributes.add(attribute)

    # ---- forward
    def forward(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Read `forward`: its parameters and decorators, its return annotation, and each `return`."""
        self._read_forward_signature(function)
        forward_locals = _forward_locals(function)
        for node in forward_locals.returns:
            self._read_return(node, forward_locals)

    def _read_forward_signature(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        info = self.info
        info.has_forward = True
        info.forward_params = parameter_names(function.args)
        for decorator in function.decorator_list:
            expression = decorator.func if isinstance(decorator, ast.Call) else decorator
            if short_name(dotted(expression) or "") == "capture_outputs":
                info.capture_outputs = True
                info.capture_line = decorator.lineno
        if function.returns is not None:
            for name in annotation_names(function.returns):
                if name not in info.output_classes:
                    info.output_classes.append(name)

    def _read_return(self, node: ast.Return, forward_locals: ForwardLocals) -> None:
        """One `return`: its shape, and for a model, the output fields it gives or passes on."""
        info = self.info
        shape = return_shape(node.value, forward_locals.assigned, forward_locals.appended)
        info.returns.append(shape)
        if isinstance(node.value, ast.Name) and info.capture_outputs:
            # `return decoder_outputs`: every field is what that submodule returned
            sources = _submodule_sources(forward_locals.assigned.get(node.value.id, []))
            if sources and all(sources):
                info.output_passed.setdefault("*", []).extend(sources)
        if shape.kind == "output" and isinstance(node.value, ast.Call):
            name = dotted(node.value.func) or ""
            if info.capture_outputs and name not in info.output_classes:
                info.output_classes.append(name)
            for keyword in node.value.keywords:
                if keyword.arg is None or is_none(keyword.value):
                    continue
                value = keyword.value
                if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                    # `hidden_states=encoder_outputs.hidden_states`: passed on from the submodule that made it
                    sources = _submodule_sources(forward_locals.assigned.get(value.value.id, []))
                    if sources and all(sources):
                        info.output_passed.setdefault(keyword.arg, []).extend(sources)
                        continue
                info.output_explicit.add(keyword.arg)


def _submodule_sources(values: list[ast.AST]) -> list[str | None]:
    """For each call among the values of a local, the attribute called (`self.encoder(...)` -> `encoder`)."""
    return [self_attribute(value.func) for value in values if isinstance(value, ast.Call)]


def _forward_locals(function: ast.FunctionDef | ast.AsyncFunctionDef) -> ForwardLocals:
    forward_locals = ForwardLocals({}, {}, [])
    for node in walk_function(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    forward_locals.assigned.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            forward_locals.assigned.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            forward_locals.appended.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.Return) and node.value is not None and not is_none(node.value):
            forward_locals.returns.append(node)
    return forward_locals


def element_name(node: ast.AST) -> str:
    """The name of one element of a returned tuple (`attn_weights`, `outputs` for `outputs[1:]`, `None`)."""
    if isinstance(node, ast.Subscript):
        return element_name(node.value)
    if is_none(node):
        return "None"
    return dotted(node) or ""


def return_shape(
    value: ast.AST,
    assigned: dict[str, list[ast.AST]],
    appended: dict[str, list[ast.AST]],
    depth: int = 0,
) -> Returns:
    """The shape of what a `return` gives, following the local names it refers to."""
    if isinstance(value, ast.Tuple):
        names = [element_name(element) for element in value.elts]
        if any(isinstance(element, ast.Starred) for element in value.elts):
            return Returns("var", names)
        return Returns("tuple", names)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return _concatenation_shape(value, assigned, appended, depth)
    if isinstance(value, ast.Call):
        name = dotted(value.func) or ""
        if name and is_class_name(name) and not name.startswith(("torch.", "nn.")):
            return Returns("output")
        return Returns("value")
    if isinstance(value, ast.Name) and depth < _MAX_SHAPE_DEPTH:
        return _local_shape(value, assigned, appended, depth)
    return Returns("value")


def _concatenation_shape(
    value: ast.BinOp,
    assigned: dict[str, list[ast.AST]],
    appended: dict[str, list[ast.AST]],
    depth: int,
) -> Returns:
    """`(hidden_states,) + outputs`: a tuple whose length is known only at run time."""
    deeper = depth < _MAX_SHAPE_DEPTH
    left = return_shape(value.left, assigned, appended, depth + 1) if deeper else Returns("value")
    right = return_shape(value.right, assigned, appended, depth + 1) if deeper else Returns("value")
    if left.is_tuple or right.is_tuple or isinstance(value.right, ast.Subscript):
        tail = right.names if right.is_tuple else []
        if isinstance(value.right, ast.Subscript) and isinstance(value.right.slice, ast.Slice):
            # `(hidden_states,) + attention_output[1:]`: the rest of a submodule's outputs, weights last
            tail = ["*" + element_name(value.right)]
        return Returns("var", left.names, tail)
    return Returns("value")


def _local_shape(
    value: ast.Name,
    assigned: dict[str, list[ast.AST]],
    appended: dict[str, list[ast.AST]],
    depth: int,
) -> Returns:
    """The shape of a returned local name, from the values assigned and appended to it."""
    shapes = [
        return_shape(assigned_value, assigned, appended, depth + 1) for assigned_value in assigned.get(value.id, [])
    ]
    tuples = [shape for shape in shapes if shape.is_tuple]
    if value.id in appended and tuples:
        tail: list[str] = []
        for extra in appended[value.id]:
            extra_shape = return_shape(extra, assigned, appended, depth + 1)
            tail = extra_shape.names if extra_shape.is_tuple else tail
        return Returns("var", tuples[0].names, tail)
    if tuples:
        lengths = {len(shape.names) for shape in tuples}
        if len(tuples) == len(shapes) and len(lengths) == 1 and all(shape.kind == "tuple" for shape in tuples):
            return tuples[-1]
        return Returns("var", tuples[-1].names, tuples[-1].tail)
    if shapes and all(shape.kind == "output" for shape in shapes):
        return Returns("output")
    return Returns("value")


def annotation_names(node: ast.AST) -> list[str]:
    """The output classes a return annotation names (`tuple | BaseModelOutputWithPast` -> the latter)."""
    names: list[str] = []
    if isinstance(node, ast.BinOp):
        return annotation_names(node.left) + annotation_names(node.right)
    if isinstance(node, ast.Subscript):
        inner = node.slice
        elements = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        for element in elements:
            names.extend(annotation_names(element))
        return names
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return []
    name = dotted(node)
    if name and name not in _NOT_OUTPUT_ANNOTATIONS and not name.startswith(("torch.", "typing.")):
        names.append(name)
    return names


# ------------------------------------------------------------------------------------------------------ the file


def read_module(tree: ast.Module) -> tuple[dict[str, ClassInfo], set[str], dict[str, list[str]]]:
    """The classes of a file (by name), the names it imports, and its module-level tables of classes."""
    module_level = ModuleLevel(set(), {}, [])
    _read_top_level(tree.body, module_level)
    tables = module_level.tables
    class_names = {node.name for node in module_level.class_nodes}
    for name in list(tables):
        tables[name] = [ref for ref in tables[name] if is_class_name(ref) or ref in class_names]
    classes: dict[str, ClassInfo] = {}
    injections: list[Injection] = []
    for node in module_level.class_nodes:
        info, class_injections = _read_class(node, tables, class_names)
        classes[info.name] = info
        injections.extend(class_injections)
    _keep_injected_modules(classes, injections)
    return classes, module_level.imported, tables


def _read_top_level(body: list[ast.stmt], module_level: ModuleLevel) -> None:
    """Imports, tables and classes at the top level (also under a top-level `if` or `try`)."""
    for statement in body:
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if alias.name != "*":
                    module_level.imported.add(alias.asname or alias.name)
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                module_level.imported.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(statement, ast.ClassDef):
            module_level.class_nodes.append(statement)
        elif (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            refs = table_refs(statement.value)
            if refs:
                module_level.tables[statement.targets[0].id] = refs
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.value is not None
        ):
            refs = table_refs(statement.value)
            if refs:
                module_level.tables[statement.target.id] = refs
        elif isinstance(statement, (ast.If, ast.Try)):
            _read_top_level(statement.body, module_level)
            _read_top_level(statement.orelse, module_level)
            for handler in getattr(statement, "handlers", []):
                _read_top_level(handler.body, module_level)


def _read_class(
    node: ast.ClassDef, tables: dict[str, list[str]], class_names: set[str]
) -> tuple[ClassInfo, list[Injection]]:
    """One class: its body's `_can_record_outputs` and dataclass fields, then the wiring of each method."""
    info = ClassInfo(node.name, [dotted(base) or "" for base in node.bases], node.lineno, node)
    methods = {
        statement.name: statement
        for statement in node.body
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    reader = ClassReader(info, tables, class_names, methods)
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
            reader.parameters = parameter_names(statement.args)[1:]
            if statement.name == "__init__":
                info.init_params = list(reader.parameters)
            reader.statements(statement.body, {})
            reader.parameters = []
            if statement.name == "forward":
                reader.forward(statement)
    info.capture_line = info.capture_line or info.line
    return info, reader.injections


def _keep_injected_modules(classes: dict[str, ClassInfo], injections: list[Injection]) -> None:
    """Modules built by a parent and handed to a constructor that keeps them (`ZambaHybridLayer(shared_transformer=
    ZambaAttentionDecoderLayer(...))` with `self.shared_transformer = shared_transformer`)."""
    for injection in injections:
        called = short_name(injection.called_class)
        for owner in class_mro(classes, called):
            info = classes[owner]
            parameter = injection.parameter
            if isinstance(parameter, int):
                parameter = info.init_params[parameter] if parameter < len(info.init_params) else None
            attribute = info.param_attributes.get(parameter) if parameter else None
            if attribute:
                existing = classes[called].attributes.setdefault(attribute, [])
                existing.extend(module for module in injection.module_classes if module not in existing)
                break
