"""Writing a recipe from what a failed trace tried, and registering it in the project file ("Create recipe…").

The worker reports what it had got to when only a recipe can build a class (`messages.RecipeDraft`: the config
it built, the constructor arguments it guessed and those it could not, the inputs it synthesised). Here that
becomes a recipe file next to the model file, a new name each time (an existing file is never overwritten), and
a `[[model]]` entry of the project file (`project.py`) that names it, so that the CLI and the editor both trace
the class with it. Values ModelTrace could not choose are `None` with a `TODO` comment on their line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from modeltrace.errors import ModelTraceError
from modeltrace.plain_arguments import is_config_argument
from modeltrace.project import (
    MODEL_TABLE,
    PROJECT_FILE_NAME,
    PYPROJECT_NAME,
    PYPROJECT_TABLE,
    find_project_file,
    read_project,
)
from modeltrace.worker.messages import RecipeArgument, RecipeDraft


INDENT = "    "
# The name a placeholder line sets: `scale=None,  # TODO…` or `"mask": None,  # TODO…`.
_TODO_NAME = re.compile(r'^\s*"?(\w+)"?\s*[:=]')


@dataclass(frozen=True)
class WrittenRecipe:
    """A recipe written and registered: where, in which project file, and the lines (1-based) still to fill in."""

    path: Path
    project_file: Path
    todo_lines: tuple[int, ...]
    todo_names: tuple[str, ...]


def recipe_path_for(model_file: Path, model_class: str) -> Path:
    """A free name next to the model file: `modeling_tiny_TinyBlock_recipe.py`, else `…_recipe_2.py`, …"""
    stem = f"{model_file.stem}_{model_class}_recipe"
    candidate = model_file.with_name(f"{stem}.py")
    number = 2
    while candidate.exists():
        candidate = model_file.with_name(f"{stem}_{number}.py")
        number += 1
    return candidate


def _import_lines(draft: RecipeDraft, model_file: Path) -> list[str]:
    """The recipe's imports: torch, and the class by the dotted name the worker used, with the package root on the
    path when the file sits in a package (the recipe's own folder is on the path already)."""
    module = draft.module or model_file.stem
    depth = module.count(".")
    lines = ["import sys", "from pathlib import Path", "", "import torch", ""] if depth else ["import torch", ""]
    if depth:
        # NOTE: the file sits in a package: its root goes on the path, as the worker imported it
        lines += [f"sys.path.insert(0, str(Path(__file__).resolve().parents[{depth}]))", ""]
    lines.append(f"from {module} import {draft.model_class}")
    if draft.config_class and draft.config_module and draft.config_module != module:
        lines.append(f"from {draft.config_module} import {draft.config_class}")
    elif draft.config_class and draft.config_module == module and draft.config_class != draft.model_class:
        lines[-1] = f"from {module} import {draft.config_class}, {draft.model_class}"
    return lines


def _value_lines(items: tuple[RecipeArgument, ...], indent: str, keyed: bool) -> list[str]:
    """`name=value,` (or `"name": value,` when `keyed`) per item, a TODO comment on each placeholder."""
    lines = []
    for item in items:
        head = f'"{item.name}": ' if keyed else f"{item.name}="
        line = f"{indent}{head}{item.expression},"
        if not item.guessed:
            line += f"  # TODO: ModelTrace could not choose {item.name} ({item.note})" if item.note else "  # TODO"
        lines.append(line)
    return lines


def _model_arguments(draft: RecipeDraft) -> tuple[RecipeArgument, ...]:
    """The constructor's arguments as the recipe passes them: its config argument is the `config` it builds (a
    placeholder when the config class is not known)."""
    arguments = []
    for item in draft.arguments:
        if is_config_argument(item.name, False) and not item.guessed:
            if draft.config_class:
                item = RecipeArgument(item.name, "config")
            else:
                item = RecipeArgument(
                    item.name, "None", guessed=False, note=f"the config {draft.model_class} is built from"
                )
        arguments.append(item)
    return tuple(arguments)


def recipe_text(draft: RecipeDraft, model_file: Path, project_file: Path | None) -> str:
    """The source of a recipe for `draft`'s class: `build_model()` with the config and arguments it tried,
    `build_inputs(model)` with the inputs it synthesised."""
    registered = f" (registered in {project_file.name})" if project_file is not None else ""
    arguments = _model_arguments(draft)
    todo = not draft.inputs or any(not item.guessed for item in (*arguments, *draft.inputs))
    lines = [
        f'"""A recipe for tracing {draft.model_class} ({model_file.name}), written by ModelTrace\'s "Create recipe…".',
        "",
        f"ModelTrace tried what is below on its own and stopped: {draft.reason or 'it needs a recipe'}.",
        ("Fill in the values marked TODO, then save: " if todo else "Edit what you need, then save: ")
        + f"the editor traces {draft.model_class} with this recipe{registered},",
        f"and so does `modeltrace trace {model_file.name}` from a terminal.",
        '"""',
        "",
        *_import_lines(draft, model_file),
        "",
        "",
        "def build_model():",
    ]
    if draft.config_class:
        lines.append(f"{INDENT}config = {draft.config_class}(")
        lines += _value_lines(draft.config, INDENT * 2, keyed=False)
        lines.append(f"{INDENT})")
    if arguments:
        lines.append(f"{INDENT}return {draft.model_class}(")
        lines += _value_lines(arguments, INDENT * 2, keyed=False)
        lines.append(f"{INDENT}).eval()")
    else:
        lines.append(f"{INDENT}return {draft.model_class}().eval()")
    lines += ["", "", "def build_inputs(model):", f"{INDENT}return {{"]
    lines += _value_lines(draft.inputs, INDENT * 2, keyed=True)
    if not draft.inputs:
        lines.append(f"{INDENT * 2}# TODO: the keyword arguments of {draft.model_class}.forward, as tensors")
    lines.append(f"{INDENT}}}")
    return "\n".join(lines) + "\n"


def _entry_text(in_pyproject: bool, file: str, model_class: str, recipe: str) -> str:
    table = ".".join((*PYPROJECT_TABLE, MODEL_TABLE)) if in_pyproject else MODEL_TABLE
    return f'\n[[{table}]]\nfile = "{file}"\nclass = "{model_class}"\nrecipe = "{recipe}"\n'


def _relative(path: Path, folder: Path) -> str:
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def register_recipe(
    model_file: Path,
    model_class: str,
    recipe: Path,
    default_folder: Path | None = None,
    project_file: Path | None = None,
) -> Path:
    """Name `recipe` in the project file's entry for `model_file` and `model_class` (its `recipe` line replaced,
    or a new `[[model]]` entry appended), creating `modeltrace.toml` in `default_folder` (else the model file's
    folder) when there is no project file (`project_file`: the one to use, when it is set). The file is read back:
    an edit that would break it is not kept."""
    if project_file is None or not project_file.is_file():
        project_file = find_project_file(model_file)
    if project_file is None:
        project_file = (default_folder or model_file.parent) / PROJECT_FILE_NAME
        project_file.write_text(
            "# ModelTrace's project file: how to trace the model files below (docs: DESIGN.md, the project file)\n",
            encoding="utf-8",
        )
    project = read_project(project_file)
    original = project.path.read_text(encoding="utf-8")
    folder = project.path.parent
    relative_file = _relative(model_file, folder)
    relative_recipe = _relative(recipe, folder)
    index = next(
        (
            position
            for position, entry in enumerate(project.models)
            if (folder / entry["file"]).resolve() == model_file.resolve() and entry.get("class") == model_class
        ),
        None,
    )
    lines = original.splitlines(keepends=True)
    if index is not None and "recipe" in project.models[index]:
        line = project.line_of("recipe", index)
        lines[line - 1] = re.sub(r"=.*", f'= "{relative_recipe}"', lines[line - 1].rstrip("\n")) + "\n"
        text = "".join(lines)
    elif index is not None:
        line = project.line_of("file", index)
        lines.insert(line, f'recipe = "{relative_recipe}"\n')
        text = "".join(lines)
    else:
        text = original + ("" if original.endswith("\n") or not original else "\n")
        text += _entry_text(project.path.name == PYPROJECT_NAME, relative_file, model_class, relative_recipe)
    project.path.write_text(text, encoding="utf-8")
    try:
        read_project(project.path).choices(model_file, model_class)
    except ModelTraceError:
        project.path.write_text(original, encoding="utf-8")
        raise
    return project.path


def write_recipe(
    draft: RecipeDraft, model_file: Path, default_folder: Path | None = None, project_file: Path | None = None
) -> WrittenRecipe:
    """Write a recipe for `draft` next to `model_file` (a new file) and register it in the project file."""
    model_file = Path(model_file).resolve()
    path = recipe_path_for(model_file, draft.model_class)
    existing = project_file if project_file is not None and project_file.is_file() else find_project_file(model_file)
    project_file = existing or (default_folder or model_file.parent) / PROJECT_FILE_NAME
    text = recipe_text(draft, model_file, project_file)
    with open(path, "x", encoding="utf-8") as handle:  # NOTE: "x": never replaces a file made meanwhile
        handle.write(text)
    try:
        registered = register_recipe(model_file, draft.model_class, path, default_folder, existing)
    except ModelTraceError:
        path.unlink(missing_ok=True)
        raise
    todo = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if "# TODO" in line]
    return WrittenRecipe(
        path=path,
        project_file=registered,
        todo_lines=tuple(number for number, _ in todo),
        # NOTE: a TODO line that sets no name is the inputs' (`build_inputs` returns nothing yet)
        todo_names=tuple(named.group(1) if (named := _TODO_NAME.match(line)) else "the inputs" for _, line in todo),
    )
