"""Find a file's `nn.Module` classes without importing it (no torch): where "Trace forward" lenses go.

The file is parsed with `ast`; a class counts as a module when one of its bases is a torch module, a
transformers model or layer, a name that reads like one (`…Model`, `…Layer`, `…Attention`), or another module
class of the same file. The base model is chosen by the rule the worker uses (`rules.pick_base_model`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from modeltrace.lsp.remap import split_lines
from modeltrace.plain_arguments import guess_argument
from modeltrace.rules import is_abstract_model, is_task_head, pick_base_model


# Imported base names (last dotted part) that make a class a module. Names from other modeling files
# (`LlamaMLP` in a modular file) can only be recognised by how transformers names its building blocks.
_MODULE_SUFFIXES = tuple(
    "Module Layer Model MLP Attention Embedding Embeddings Norm Block Encoder Decoder Head Experts MoE "
    "Sequential ModuleList ModuleDict Linear Conv1d Conv2d Conv3d".split()
)
_NOT_MODULE_SUFFIXES = ("Config", "Output", "Mixin", "Tokenizer", "Processor", "Cache")


@dataclass(frozen=True, slots=True)
class ModuleClass:
    """One `nn.Module` subclass defined in the file; `line`/`column` (0-based) locate its name."""

    name: str
    line: int
    column: int
    is_model: bool
    # NOTE: defines `forward` or inherits one (from a class of the file, or an imported model or layer):
    # a composite that only generates (`BarkModel`) has none, and the worker never builds it for a trace
    has_forward: bool = True
    # NOTE: it or a base of the file derives from transformers' `GenerationMixin`: a "Trace generate" lens
    generates: bool = False
    # NOTE: a plain module whose own `__init__` takes no config, names no `config_class`, and takes an argument
    # whose name and annotation say nothing ModelTrace can choose (`Scaled(dim, scale)`; `TinyBlock(dim, hidden)`
    # is built with dim=64, hidden=128): on its own (no model in the file to run it inside) only a recipe builds it
    needs_recipe: bool = False

    @property
    def is_abstract_model(self) -> bool:
        """The `…PreTrainedModel` base class: a model class that cannot be built on its own."""
        return is_abstract_model(self.name)


def _dotted_name(node: ast.expr) -> str | None:
    """`nn.Module` for `nn.Module`, `Base` for `Base[T]`; None for anything that is not a plain name."""
    if isinstance(node, ast.Subscript):
        return _dotted_name(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted_name(node.value)
        return f"{owner}.{node.attr}" if owner else node.attr
    return None


def _classify_imported_base(dotted: str) -> tuple[bool, bool]:
    """(is a module, is a transformers model) for a base class that is not defined in the file."""
    name = dotted.rsplit(".", 1)[-1]
    if name.endswith("PreTrainedModel"):
        return True, True
    if name.endswith(_NOT_MODULE_SUFFIXES):
        return False, False
    owner = dotted.rsplit(".", 1)[0] if "." in dotted else ""
    if owner in ("nn", "torch.nn") and name[:1].isupper():
        return True, False
    if is_task_head(name):
        # NOTE: an imported head (`LlamaForCausalLM`, in modular files) is itself a PreTrainedModel.
        return True, True
    if name == "GradientCheckpointingLayer" or name.endswith(_MODULE_SUFFIXES):
        return True, name.endswith("Model")
    return False, False


def _has_no_forward(dotted: str) -> bool:
    """Imported bases whose `forward` is `nn.Module`'s (which raises): a subclass must define its own."""
    name = dotted.rsplit(".", 1)[-1]
    return name in ("Module", "GradientCheckpointingLayer") or is_abstract_model(name)


def _class_definitions(body: list[ast.stmt]) -> list[ast.ClassDef]:
    """Classes defined at module level, including inside `if`/`try`/`with` blocks (not in functions)."""
    found: list[ast.ClassDef] = []
    for statement in body:
        if isinstance(statement, ast.ClassDef):
            found.append(statement)
        elif isinstance(statement, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(statement, block, []):
                    found.extend(_class_definitions(child.body if isinstance(child, ast.ExceptHandler) else [child]))
    return found


def _needs_recipe(definition: ast.ClassDef) -> bool:
    """Whether the class defines an `__init__` that takes no config, names no `config_class`, and has an argument
    without a default whose name and annotation say nothing ModelTrace can choose (`plain_arguments`)."""
    names_config_class = any(
        isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(isinstance(target, ast.Name) and target.id == "config_class" for target in _targets(node))
        for node in definition.body
    )
    init = next(
        (node for node in definition.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"), None
    )
    if init is None or names_config_class:
        return False
    arguments = init.args
    positional = [*arguments.posonlyargs, *arguments.args]
    # NOTE: defaults belong to the last positional arguments; keyword-only ones have one each (None: required)
    required = positional[: len(positional) - len(arguments.defaults)][1:] + [
        argument for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults) if default is None
    ]
    names = [argument.arg for argument in (*positional, *arguments.kwonlyargs)][1:]
    if any(name == "config" or name.endswith("_config") for name in names):
        return False
    return any(
        guess_argument(argument.arg, ast.unparse(argument.annotation) if argument.annotation else None) is None
        for argument in required
    )


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def find_module_classes(source: str) -> list[ModuleClass]:
    """The module classes of a Python source, in source order; raises SyntaxError for unparsable code."""
    tree = ast.parse(source)
    lines = split_lines(source)
    known: dict[str, ModuleClass] = {}
    for definition in sorted(_class_definitions(tree.body), key=lambda node: node.lineno):
        is_module = is_model = generates = False
        has_forward = any(
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "forward"
            for node in definition.body
        )
        for base in definition.bases:
            dotted = _dotted_name(base)
            if dotted is None:
                continue
            local = known.get(dotted)
            generates |= dotted.rsplit(".", 1)[-1] == "GenerationMixin" or bool(local and local.generates)
            base_is_module, base_is_model = (True, local.is_model) if local else _classify_imported_base(dotted)
            is_module |= base_is_module
            is_model |= base_is_model
            if local is not None:
                has_forward |= local.has_forward
            elif base_is_module and not _has_no_forward(dotted):
                has_forward = True
        if is_module:
            # NOTE: `lineno` is the `class` line (decorators come before it); ast does not locate the name.
            line = definition.lineno - 1
            column = max(lines[line].find(definition.name, definition.col_offset), 0)
            needs_recipe = not is_model and _needs_recipe(definition)
            known[definition.name] = ModuleClass(
                definition.name, line, column, is_model, has_forward, generates, needs_recipe
            )
    return list(known.values())


def base_model_name(classes: list[ModuleClass]) -> str | None:
    """The class a plain trace builds, by the worker's rule (`rules.pick_base_model`)."""
    return pick_base_model(
        [cls.name for cls in classes if cls.is_model and not cls.is_abstract_model and cls.has_forward]
    )


def trace_arguments(uri: str, target: ModuleClass, classes: list[ModuleClass]) -> list[str]:
    """`modelTrace.trace` arguments for a lens above `target`: the model to build, then the class to highlight.

    A model class is built as it is; any other module is reached through the file's base model, and named
    third so that a client can highlight it. Without a model in the file, the class itself is asked for
    (the worker then says what it needs: a config or a recipe).
    """
    if target.is_model and not target.is_abstract_model:
        return [uri, target.name]
    base = base_model_name(classes)
    if base is None:
        return [uri, target.name]
    return [uri, base, target.name]
