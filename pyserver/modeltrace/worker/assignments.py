"""Where a module class's `__init__` assigns each of its attributes: `self.scaling = self.head_dim**-0.5`.

A setting built differently (`diff/settings.py`) is a bug on the line that assigned it, not on the parent's line
that built the module. These lines come from the source of each `__init__` in the class's MRO (the subclass's
own last, so its assignment wins over its base's, and within one `__init__` the last assignment in source order
wins, as it would at run time on the straight path); torch's own classes are left out (their lines are no
user's code), and so is an attribute that only keeps a constructor argument (`self.eps = eps`: the value is
chosen by the line that builds the module). Read once per class, with `ast`, without running anything.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from types import FunctionType

from modeltrace.trace.records import SourceLocation
from modeltrace.worker import source_map


_cache: dict[type, dict[str, SourceLocation]] = {}


def assignment_lines(module_class: type) -> dict[str, SourceLocation]:
    """`{attribute name: the line of model code in an `__init__` of the class (or a base) that assigns it}`."""
    found = _cache.get(module_class)
    if found is None:
        found = {}
        for klass in reversed(module_class.__mro__):
            init = klass.__dict__.get("__init__")
            if isinstance(init, FunctionType):
                found.update(_init_assignments(init))
        _cache[module_class] = found
    return found


def _init_assignments(init: FunctionType) -> dict[str, SourceLocation]:
    # NOTE: an `__init__` a decorator wrapped (transformers' `use_experts_implementation` on every `…Experts`) is
    # read where it is written, not where its wrapper is: lines and file both from the wrapped function
    try:
        init = inspect.unwrap(init)
    except ValueError:  # a cycle of `__wrapped__`
        return {}
    if not isinstance(init, FunctionType):
        return {}
    path = source_map.real_path(init.__code__.co_filename)
    if source_map.is_torch_file(path):
        return {}
    # NOTE: the `def` from its file's one parse (`source_map.function_node`: lines and columns as in the file);
    # failing that, its own source re-parsed, `getsourcelines` starting at the first decorator as its line number
    # does and `dedent` taking the method's indentation in its class off every line (given back to the columns)
    function: ast.stmt | None = source_map.function_node(init)
    first_line, indent = 1, 0
    if function is None:
        source_map.read_in_part(init.__code__.co_filename)  # NOTE: parsed whole by the zygote for the next trace
        try:
            raw_lines, first_line = inspect.getsourcelines(init)
            tree = ast.parse(textwrap.dedent("".join(raw_lines)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            return {}
        function = tree.body[0] if tree.body else None
        indent = len(raw_lines[0]) - len(raw_lines[0].lstrip())
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or not function.args.args:
        return {}
    arguments = function.args
    self_name = arguments.args[0].arg
    parameters = {item.arg for item in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    lines: dict[str, SourceLocation] = {}
    for node in _statements(function.body):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [item for target in node.targets for item in _flatten(target)]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        # NOTE: `self.variance_epsilon = eps` only keeps what the caller passed: a wrong value is fixed where the
        # module is built (its `built_at`), not here; `self.scaling = self.head_dim**-0.5` is computed here.
        passed = (
            not isinstance(node, ast.AugAssign)
            and isinstance(getattr(node, "value", None), ast.Name)
            and node.value.id in parameters
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == self_name
            ):
                if passed:
                    lines.pop(target.attr, None)
                else:
                    lines[target.attr] = SourceLocation(path, first_line + node.lineno - 1, indent + node.col_offset)
    return lines


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a function body, into `if` / `for` / `with` / `try` blocks, not into nested functions or
    classes (their `self` is another object)."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, field, []) or [])
        for handler in getattr(node, "handlers", []) or []:
            yield from _statements(handler.body)
        for case in getattr(node, "cases", []) or []:
            yield from _statements(case.body)


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [item for element in target.elts for item in _flatten(element)]
    return [target]
