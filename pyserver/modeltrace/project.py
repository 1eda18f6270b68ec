"""The project file: what a folder of model code says about how to trace it, read alike by the CLI and the server.

A `modeltrace.toml`, or the `[tool.modeltrace]` table of a `pyproject.toml`, found by walking up from the model
file (the nearest folder holding one wins; in one folder `modeltrace.toml` wins over `pyproject.toml`, and a
`pyproject.toml` without `[tool.modeltrace]` is not a project file). Paths in it are relative to its folder.

    recipe = "recipes/default.py"   # for every model file below (rare)
    config = "configs/small.json"
    maps = ["^transformer\\\\.h\\\\.=>layers."]
    atol = 1e-3

    [[model]]                       # [[tool.modeltrace.model]] in a pyproject.toml
    file = "modeling_tiny.py"
    class = "TinyBlock"             # optional: only when this class is traced
    recipe = "modeling_tiny_TinyBlock_recipe.py"

Precedence (DESIGN: the project file): a CLI option > the project file (its `[[model]]` entry for the file and
class, then its top level) > the editor's settings > the defaults. A broken file (TOML syntax, an unknown key, a
wrong type, a file it names that is not there) is a `ProjectFileError` naming the file and its line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeltrace.errors import ModelTraceError


PROJECT_FILE_NAME = "modeltrace.toml"
PYPROJECT_NAME = "pyproject.toml"
# The table of a pyproject.toml that holds the project file's keys.
PYPROJECT_TABLE = ("tool", "modeltrace")
MODEL_TABLE = "model"

# Keys and what each holds: where a model file's own entry (`[[model]]`) and the top level may both set one, the
# entry's wins. NOTE: `file` and `class` pick the entry; they are not settings.
PATH_KEYS = ("recipe", "config", "mapping")
TOLERANCE_KEYS = ("atol", "rtol", "rel_tol")
LIST_KEYS = ("maps",)
TOP_LEVEL_KEYS = (*PATH_KEYS, *TOLERANCE_KEYS, *LIST_KEYS, MODEL_TABLE)
MODEL_KEYS = ("file", "class", *PATH_KEYS, *TOLERANCE_KEYS, *LIST_KEYS)


class ProjectFileError(ModelTraceError):
    """A project file that cannot be used; `file` and `line` (1-based) place it, `column` (1-based) when known."""

    def __init__(self, message: str, file: str, line: int, column: int = 1) -> None:
        super().__init__(message, file, line)
        self.column = column


@dataclass(frozen=True)
class ProjectChoices:
    """What the project file says for one model file (and class): None / empty where it says nothing.

    `project_file` is the file read (None: there is none); `recipe_line` is the line that names the recipe, so that
    a recipe's own problems can point back to where it was chosen.
    """

    project_file: Path | None = None
    model_class: str | None = None  # the class the model file's entry names (traced when none is asked for)
    recipe: Path | None = None
    config: Path | None = None
    mapping: Path | None = None
    maps: tuple[str, ...] = ()
    atol: float | None = None
    rtol: float | None = None
    rel_tol: float | None = None
    recipe_line: int | None = None
    entry_line: int | None = None  # the `[[model]]` header of the model file's entry, when it has one


@dataclass
class _Located:
    """The lines of a project file's tables and keys (tomllib gives values, not where they are)."""

    tables: dict[tuple[str, ...], int] = field(default_factory=dict)  # (table path..., index) -> header line
    keys: dict[tuple[tuple[str, ...], str], int] = field(default_factory=dict)  # (table, key) -> line


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?")
_KEY = re.compile(r"""^\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_.-]+))\s*=""")


def _locate(text: str, prefix: tuple[str, ...]) -> _Located:
    """Where each table header and key of the project's tables is, by a line scan (arrays of tables get an index)."""
    located = _Located()
    table: tuple[str, ...] | None = () if not prefix else None
    counts: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            parts = tuple(part.strip().strip("\"'") for part in header.group(2).split("."))
            if parts[: len(prefix)] != prefix:
                table = None
                continue
            inner = parts[len(prefix) :]
            if header.group(1) == "[[":
                counts[inner] = counts.get(inner, -1) + 1
                inner = (*inner, str(counts[inner]))
            table = inner
            located.tables.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key is not None and table is not None:
            located.keys.setdefault((table, next(group for group in key.groups() if group)), number)
    return located


def _toml_error_line(message: str) -> tuple[int, int]:
    """(line, column) from tomllib's message: "... (at line 3, column 5)"; (1, 1) when it names none."""
    found = re.search(r"at line (\d+), column (\d+)", message)
    return (int(found.group(1)), int(found.group(2))) if found else (1, 1)


def _load_toml(path: Path) -> tuple[dict[str, Any], str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # NOTE: Python 3.10 has no tomllib; tomli is the same parser
        import tomli as tomllib  # type: ignore[no-redef]

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ProjectFileError(f"{path}: cannot be read ({error})", str(path), 1) from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as error:
        line, column = _toml_error_line(str(error))
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(error))
        raise ProjectFileError(f"{path}:{line}: TOML syntax error: {reason}", str(path), line, column) from None


def _has_project_table(path: Path) -> bool:
    """Whether a pyproject.toml holds `[tool.modeltrace]` (a broken one counts when its text names the table)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(r"^\s*\[\[?\s*tool\s*\.\s*modeltrace\b", text, re.MULTILINE) is not None or (
        "tool.modeltrace" in text
    )


def find_project_file(start: Path) -> Path | None:
    """The project file that applies to `start` (a model file or a folder): the nearest one walking up."""
    folder = start if start.is_dir() else start.parent
    for candidate in (folder.resolve(), *folder.resolve().parents):
        own = candidate / PROJECT_FILE_NAME
        if own.is_file():
            return own
        pyproject = candidate / PYPROJECT_NAME
        if pyproject.is_file() and _has_project_table(pyproject):
            return pyproject
    return None


@dataclass(frozen=True)
class Project:
    """A read and checked project file: its top-level values and its `[[model]]` entries, with their lines."""

    path: Path
    top: dict[str, Any]
    models: tuple[dict[str, Any], ...]
    located: _Located

    def line_of(self, key: str, entry: int | None = None) -> int:
        """The line of `key` at the top level (`entry` None) or in the `entry`-th `[[model]]` (its header when
        the key is not written in it)."""
        table: tuple[str, ...] = () if entry is None else (MODEL_TABLE, str(entry))
        return self.located.keys.get((table, key)) or self.located.tables.get(table) or 1

    def choices(self, model_file: Path, model_class: str | None = None) -> ProjectChoices:
        """What this file says for `model_file` (and `model_class`): its entry for the file and class, else for
        the file, over the top level."""
        model_file = Path(model_file).resolve()
        for_file = [
            (index, entry)
            for index, entry in enumerate(self.models)
            if (self.path.parent / entry["file"]).resolve() == model_file
        ]
        matching = [(index, entry) for index, entry in for_file if entry.get("class") in (None, model_class)]
        if model_class is None and not matching and len(for_file) == 1:
            # NOTE: no class asked for (`modeltrace trace FILE`): the file's one entry names the class to trace
            matching = for_file
        # NOTE: an entry naming the class is more specific than one for the whole file
        matching.sort(key=lambda item: item[1].get("class") is None)
        index, entry = matching[0] if matching else (None, {})
        values = {**self.top, **{key: value for key, value in entry.items() if key not in ("file", "class")}}
        recipe_in_entry = "recipe" in entry

        def path_of(key: str) -> Path | None:
            return (self.path.parent / values[key]).resolve() if key in values else None

        recipe_line = None
        if "recipe" in values:
            recipe_line = self.line_of("recipe", index if recipe_in_entry else None)
        return ProjectChoices(
            project_file=self.path,
            model_class=entry.get("class"),
            recipe=path_of("recipe"),
            config=path_of("config"),
            mapping=path_of("mapping"),
            maps=tuple(values.get("maps", ())),
            atol=values.get("atol"),
            rtol=values.get("rtol"),
            rel_tol=values.get("rel_tol"),
            recipe_line=recipe_line,
            entry_line=self.located.tables.get((MODEL_TABLE, str(index))) if index is not None else None,
        )


def read_project(path: Path) -> Project:
    """Read and check a project file (`modeltrace.toml`, or a `pyproject.toml`'s `[tool.modeltrace]`); raises
    `ProjectFileError` on the offending line."""
    path = Path(path).resolve()
    document, text = _load_toml(path)
    in_pyproject = path.name == PYPROJECT_NAME
    prefix = PYPROJECT_TABLE if in_pyproject else ()
    located = _locate(text, prefix)
    table: Any = document
    for part in prefix:
        table = table.get(part, {}) if isinstance(table, dict) else {}
    if not isinstance(table, dict):
        raise ProjectFileError(f"{path}: [tool.modeltrace] must be a table", str(path), 1)
    where = "[tool.modeltrace]" if in_pyproject else path.name
    project = Project(path=path, top={}, models=(), located=located)
    top = _checked(project, table, TOP_LEVEL_KEYS, None, where)
    models_value = table.get(MODEL_TABLE, [])
    if not isinstance(models_value, list) or not all(isinstance(entry, dict) for entry in models_value):
        raise ProjectFileError(
            f"{path}:{project.line_of(MODEL_TABLE)}: `{MODEL_TABLE}` must be an array of tables ([[{MODEL_TABLE}]])",
            str(path),
            project.line_of(MODEL_TABLE),
        )
    models = []
    for index, entry in enumerate(models_value):
        checked = _checked(project, entry, MODEL_KEYS, index, f"[[{'.'.join((*prefix, MODEL_TABLE))}]]")
        if "file" not in checked:
            line = project.line_of("file", index)
            raise ProjectFileError(
                f"{path}:{line}: this [[{MODEL_TABLE}]] entry names no `file` (the model file it is for)",
                str(path),
                line,
            )
        models.append(checked)
    return Project(path=path, top=top, models=tuple(models), located=located)


def _checked(project: Project, table: dict[str, Any], allowed: tuple[str, ...], entry: int | None, where: str) -> dict:
    """The table's values, each checked for its key; `ProjectFileError` on the line of the first bad one."""
    path = project.path
    values: dict[str, Any] = {}
    for key, value in table.items():
        line = project.line_of(key, entry)

        def fail(reason: str, line: int = line) -> ProjectFileError:
            return ProjectFileError(f"{path}:{line}: {reason}", str(path), line)

        if key not in allowed:
            raise fail(f"unknown key `{key}` in {where} (known: {', '.join(allowed)})")
        if key == MODEL_TABLE:
            continue
        if key in (*PATH_KEYS, "file", "class"):
            if not isinstance(value, str) or not value.strip():
                raise fail(f"`{key}` must be a non-empty string, not {value!r}")
            if key in (*PATH_KEYS, "file") and not (path.parent / value).exists():
                raise fail(f"`{key}` names {value}, which is not there (paths are relative to {path.parent})")
        elif key in TOLERANCE_KEYS:
            if isinstance(value, bool) or not isinstance(value, int | float) or not (0 <= value < math.inf):
                raise fail(f"`{key}` must be a finite number >= 0, not {value!r}")
            value = float(value)
        elif key in LIST_KEYS:
            if not isinstance(value, list) or not all(isinstance(item, str) and "=>" in item for item in value):
                raise fail(f"`{key}` must be a list of 'REGEX=>REPL' strings, not {value!r}")
        values[key] = value
    return values


def project_choices(
    model_file: Path, model_class: str | None = None, project_file: Path | None = None
) -> ProjectChoices:
    """What the project file that applies to `model_file` (or `project_file`, when given) says for it and
    `model_class`; empty choices when there is none. Raises `ProjectFileError` for a broken one."""
    path = Path(project_file) if project_file is not None else find_project_file(Path(model_file))
    if path is None:
        return ProjectChoices()
    if not path.is_file():
        raise ModelTraceError(f"{path}: no such project file")
    return read_project(path).choices(Path(model_file), model_class)
