"""Small readers of `ast` nodes and of the classes of one file, shared by the steps of the recorder analysis.

Each answers one question about a node (its dotted name, its literal value) or about a class name (its short
name, its bases in method resolution order within the file), and gives None when the file does not say.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from modeltrace.recorders.types import ClassInfo


def dotted(node: ast.AST | None) -> str | None:
    """`a.b.c` for a name or an attribute chain, None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def short_name(name: str) -> str:
    """The last part of a dotted name: `nn.ModuleList` -> `ModuleList`."""
    return name.rsplit(".", 1)[-1]


def string_value(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def int_value(node: ast.AST) -> int | None:
    """An integer literal, negative ones (`-1`) included."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) is int
    ):
        return -node.operand.value
    return None


def is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def is_class_name(name: str) -> bool:
    """Spelled like a class (`LlamaAttention`), not like a constant (`ALL_LAYERS`) or a function."""
    short = short_name(name)
    return short[:1].isupper() and not short.isupper()


def union(first: list[str], second: list[str]) -> list[str]:
    """`first` followed by the items of `second` it lacks (an ordered set union)."""
    return first + [item for item in second if item not in first]


def self_attribute(node: ast.AST) -> str | None:
    """`NAME` for `self.NAME`, None for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def parameter_names(arguments: ast.arguments) -> list[str]:
    """The names of a function's positional and keyword parameters, in order (`self` included)."""
    return [argument.arg for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]


def walk_function(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not descending into nested functions, classes or lambdas."""
    pending = list(ast.iter_child_nodes(function))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def class_mro(classes: dict[str, ClassInfo], name: str) -> list[str]:
    """`name` and its bases defined in the file, nearest first (bases of other files are left out)."""
    order: list[str] = []
    pending = [name]
    while pending:
        current = pending.pop(0)
        if current in order or current not in classes:
            continue
        order.append(current)
        pending.extend(short_name(base) for base in classes[current].bases if base)
    return order
