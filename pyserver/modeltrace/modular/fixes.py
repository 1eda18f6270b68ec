"""Quick fixes for the `_can_record_outputs` problems of a modular file: they edit the modular file, never the
generated one (the converter overwrites it), and the generated file must be regenerated afterwards.

Two cases, by where the declaration of the problem's class lives:
- written in the modular file (`class XPreTrainedModel(...): _can_record_outputs = {...}`): the entry is fixed
  there, with the libcst edits of `recorders.fixes` (formatting kept, `OutputRecorder` imported when needed);
- inherited from the parent model (the modular class does not write it, or the modular file leaves the whole
  class to the converter): the fix writes the full declaration the generated class should hold (its inherited
  entries plus the fix, computed by fixing the generated text in memory) as a class attribute of the modular
  class, adding the class (`class XPreTrainedModel(ParentPreTrainedModel): ...`) when the modular file has none.
  The converter carries class attributes of a modular class into the generated file.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from modeltrace.modular.twins import generated_path, regenerate_command
from modeltrace.recorders.checking import analyze_source
from modeltrace.recorders.fixes import apply_fixes
from modeltrace.recorders.types import Problem

DECLARATION = "_can_record_outputs"
# NOTE: how a modular file imports its parent model's generated file: `from ..llama.modeling_llama import ...`
PARENT_IMPORT = re.compile(r"^\.\.(?P<model>\w+)\.modeling_(?P=model)$")


class ModularFixError(ValueError):
    """A fix that cannot be written into the modular file (the message says why)."""


def generated_problem(problem: Problem) -> Problem | None:
    """The generated twin's problem a modular problem was moved from (`modular.recorders`), when it has a fix."""
    original = problem.extra.get("generated")
    return original if isinstance(original, Problem) and original.fix_json() is not None else None


def fix_title(problem: Problem, modular_path: str | Path) -> str:
    """The code action's title: what it writes, and that the generated file must be regenerated."""
    original = generated_problem(problem)
    fix = (original.fix_json() if original else None) or {}
    what = (
        f"Record {fix['key']!r} with {fix['entry']}"
        if "entry" in fix
        else f"Add _can_record_outputs to {fix.get('class')}"
    )
    return f"{what} in the modular file (then regenerate: {regenerate_command(modular_path)})"


def _class_nodes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _declares(node: ast.ClassDef) -> bool:
    return any(
        isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == DECLARATION for t in item.targets)
        for item in node.body
    )


def _generated_declaration(generated_source: str, owner: str, problems: list[Problem]) -> str:
    """The text of `owner`'s `_can_record_outputs` in the generated file once `problems` are fixed (in memory)."""
    fixed, applied = apply_fixes(generated_source, problems, analyze_source(generated_source))
    if not applied:
        raise ModularFixError(f"no fix applies to {owner} in the generated file")
    node = _class_nodes(ast.parse(fixed)).get(owner)
    for item in node.body if node else []:
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == DECLARATION for t in item.targets):
            lines = fixed.splitlines(keepends=True)
            return "".join(lines[item.lineno - 1 : item.end_lineno])
    raise ModularFixError(f"{owner} holds no {DECLARATION} in the fixed generated file")


def _parent_files(modular_path: Path, model: str) -> list[Path]:
    """Where the parent model's generated file may be: beside the modular file's folder (a transformers checkout),
    else in the installed transformers (a model folder copied out of it). Found without importing transformers."""
    files = [modular_path.parent.parent / model / f"modeling_{model}.py"]
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        files.append(Path(spec.origin).parent / "models" / model / f"modeling_{model}.py")
    return files


def _parent_pretrained(tree: ast.Module, modular_path: Path) -> tuple[str, str, bool]:
    """The parent model's PreTrainedModel class a new modular class inherits: (its name, the module it is imported
    from, whether the modular file imports it already). The parent is the model the modular classes inherit from
    (their first base imported from `..<parent>.modeling_<parent>`)."""
    imported: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
            dotted = ".." + node.module
            if PARENT_IMPORT.match(dotted):
                for alias in node.names:
                    imported[alias.asname or alias.name] = dotted
    for name, module in imported.items():
        if name.endswith("PreTrainedModel"):
            return name, module, True
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            module = imported.get(base.id) if isinstance(base, ast.Name) else None
            match = PARENT_IMPORT.match(module or "")
            if match is None:
                continue
            for parent_file in _parent_files(modular_path, match["model"]):
                try:
                    parent_tree = ast.parse(parent_file.read_text(encoding="utf-8"))
                except (OSError, SyntaxError, UnicodeDecodeError):
                    continue
                for name in _class_nodes(parent_tree):
                    if name.endswith("PreTrainedModel"):
                        return name, module or "", False
    raise ModularFixError(
        f"{modular_path.name}: no parent model's PreTrainedModel found to inherit from (the modular classes' bases "
        "come from no `..<model>.modeling_<model>` file beside this folder)"
    )


def _insert_lines(source: str, line: int, text: str) -> str:
    """`text` inserted before 1-based `line` (past the end: appended)."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.insert(line - 1, text)
    return "".join(lines)


def _add_import(source: str, tree: ast.Module, module: str, name: str) -> str:
    """`name` imported from `module` (`..x.modeling_x` or `...utils.output_capturing`): a line after the module's
    last top-level import (an import the user formatted is never rewritten)."""
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    line = (imports[-1].end_lineno or imports[-1].lineno) + 1 if imports else 1
    return _insert_lines(source, line, f"from {module} import {name}\n")


def _needs_output_recorder(source: str, declaration: str) -> bool:
    if "OutputRecorder" not in declaration:
        return False
    tree = ast.parse(source)
    return not any(
        isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "OutputRecorder" for a in node.names)
        for node in tree.body
    )


def _inherited_fix(source: str, modular_path: Path, owner: str, declaration: str) -> str:
    """`declaration` (the full `_can_record_outputs` of `owner`) written into the modular class `owner`, the
    class added (inheriting the parent model's PreTrainedModel) when the modular file leaves it to the converter."""
    tree = ast.parse(source)
    node = _class_nodes(tree).get(owner)
    if node is not None:
        # NOTE: after the docstring and class-level assignments, before the first method
        position = next(
            (item.lineno for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))),
            None,
        )
        if position is not None:
            decorated = next(item for item in node.body if item.lineno == position)
            position = min([position, *(d.lineno for d in getattr(decorated, "decorator_list", []))])
        else:
            position = (node.end_lineno or node.lineno) + 1
        fixed = _insert_lines(source, position, declaration)
    else:
        parent, module, imported = _parent_pretrained(tree, modular_path)
        classes = [item for item in tree.body if isinstance(item, ast.ClassDef)]
        # NOTE: before the first model class (the converter orders the generated file by dependency anyway)
        model_class = next(
            (item for item in classes if item.name.endswith("Model") or "For" in item.name),
            None,
        )
        tail = next(
            (
                item
                for item in tree.body
                if isinstance(item, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in item.targets)
            ),
            None,
        )
        anchor = model_class or tail
        position = (
            min([anchor.lineno, *(d.lineno for d in getattr(anchor, "decorator_list", []))])
            if anchor
            else len(source.splitlines()) + 1
        )
        fixed = _insert_lines(source, position, f"class {owner}({parent}):\n{declaration}\n\n")
        if not imported:
            fixed = _add_import(fixed, ast.parse(source), module, parent)
    return fixed


def modular_fixes(modular_source: str, modular_path: str | Path, problems: list[Problem]) -> tuple[str, list[Problem]]:
    """The modular source with the fixes of `problems` (modular problems, from `analyze_modular`) written into it,
    and the problems fixed. Raises ModularFixError when a fix has no place in the modular file."""
    path = Path(modular_path)
    fixable = [(problem, generated_problem(problem)) for problem in problems]
    fixable = [(problem, original) for problem, original in fixable if original is not None and original.owner]
    if not fixable:
        return modular_source, []
    tree = ast.parse(modular_source)
    classes = _class_nodes(tree)
    written = [(p, o) for p, o in fixable if o.owner in classes and _declares(classes[o.owner])]
    inherited = [(p, o) for p, o in fixable if (p, o) not in written]
    source = modular_source
    applied: list[Problem] = []
    declarations = ""
    if written:
        source, fixed = apply_fixes(source, [o for _, o in written], analyze_source(source))
        applied.extend(p for p, o in written if o in fixed)
        declarations += "".join(o.recorder.source(o.key or "") for o in fixed if o.recorder)
    if inherited:
        generated_source = generated_path(path).read_text(encoding="utf-8")
        owners = dict.fromkeys(o.owner or "" for _, o in inherited)
        for owner in owners:
            group = [(p, o) for p, o in inherited if o.owner == owner]
            declaration = _generated_declaration(generated_source, owner, [o for _, o in group])
            source = _inherited_fix(source, path, owner, declaration)
            declarations += declaration
            applied.extend(p for p, _ in group)
    if _needs_output_recorder(source, declarations):
        # NOTE: a file inside transformers imports it relatively, as the other modular files do
        relative = any(isinstance(node, ast.ImportFrom) and node.level == 3 for node in tree.body)
        module = "...utils.output_capturing" if relative else "transformers.utils.output_capturing"
        source = _add_import(source, ast.parse(source), module, "OutputRecorder")
    return source, applied
