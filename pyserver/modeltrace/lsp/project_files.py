"""The project file in the server: what a trace is built with, its errors as diagnostics, "Create recipe…".

Each trace reads the project file that applies to its document (`modeltrace/project.py`, or the one
`modelTrace.projectFile` names): its entry's recipe and config win over `modelTrace.recipe` / `modelTrace.config`
(DESIGN: the project file). A broken project file stops the trace before any worker starts; its diagnostic sits
on the offending line of that file, as the session's failure (so the next good trace removes it) and the trace
on view stays. "Create recipe…" writes a recipe from the draft a failed trace left (`recipe_writer.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from modeltrace.errors import ModelTraceError
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.publish import file_uri, publish_diagnostics
from modeltrace.lsp.reference import workspace_path
from modeltrace.lsp.remap import split_lines
from modeltrace.lsp.store import read_lines
from modeltrace.project import ProjectChoices, ProjectFileError, find_project_file, project_choices, read_project
from modeltrace.recipe_writer import WrittenRecipe, write_recipe
from modeltrace.worker.messages import RecipeDraft


DIAGNOSTIC_SOURCE = "ModelTrace"


@dataclass(frozen=True)
class TraceSources:
    """What a trace of a document is built with: the recipe and config (absolute paths, or None), the class when
    the project file's entry names one, and the project file read (None: there is none)."""

    recipe: str | None
    config: str | None
    model: str | None
    project_file: Path | None


def _explicit_project(ls: ModelTraceServer) -> Path | None:
    return Path(workspace_path(ls, ls.settings.project_file)) if ls.settings.project_file else None


def trace_sources(ls: ModelTraceServer, path: str, model: str | None) -> TraceSources:
    """The recipe, config and class a trace of `path` uses: the project file's, else the settings'. Raises
    `ProjectFileError` (a broken project file) or `ModelTraceError` (`modelTrace.projectFile` names no file)."""
    choices: ProjectChoices = project_choices(Path(path), model, _explicit_project(ls))
    settings = ls.settings
    recipe = (
        str(choices.recipe) if choices.recipe else (workspace_path(ls, settings.recipe) if settings.recipe else None)
    )
    config = (
        str(choices.config) if choices.config else (workspace_path(ls, settings.config) if settings.config else None)
    )
    chosen_model = model or (choices.model_class if choices.recipe else None)
    return TraceSources(recipe, config, chosen_model, choices.project_file)


def has_recipe(ls: ModelTraceServer, path: str, model_class: str) -> bool:
    """Whether a trace of `model_class` in `path` has a recipe (project file or setting); a broken project file
    counts as none (its trace says what is wrong)."""
    if ls.settings.recipe:
        return True
    try:
        return project_choices(Path(path), model_class, _explicit_project(ls)).recipe is not None
    except ModelTraceError:
        return False


def project_diagnostic(ls: ModelTraceServer, error: ProjectFileError) -> tuple[str, types.Diagnostic]:
    """`(uri, diagnostic)` for a broken project file: an Error on its offending line."""
    file = str(error.file)
    document = ls.open_document(file)
    lines = split_lines(document.source) if document is not None else (read_lines(file) or [])
    line = max(int(error.line or 1), 1)
    text = lines[line - 1] if line - 1 < len(lines) else ""
    units = ls.workspace.position_codec.client_num_units
    start = len(text) - len(text.lstrip())
    message = str(error).split(": ", 1)[1] if str(error).startswith(f"{file}:") else str(error)
    return file_uri(ls, file), types.Diagnostic(
        range=types.Range(
            start=types.Position(line=line - 1, character=units(text[:start])),
            end=types.Position(line=line - 1, character=units(text)),
        ),
        message=message,
        severity=types.DiagnosticSeverity.Error,
        source=DIAGNOSTIC_SOURCE,
    )


def publish_project_error(ls: ModelTraceServer, owner: str, error: ProjectFileError) -> None:
    """Show a broken project file as the failure of `owner`'s session (its trace, if any, stays on view)."""
    session = ls.sessions.open(owner)
    previous, session.failure = session.failure, project_diagnostic(ls, error)
    publish_diagnostics(ls, {located[0] for located in (previous, session.failure) if located is not None})


def recheck_project_file(ls: ModelTraceServer, path: str) -> None:
    """A project file changed on disk (`workspace/didChangeWatchedFiles`): read it again at once, so that a fixed
    file loses its diagnostic and a broken one shows where it is broken, without waiting for a trace. Its holders
    are the sessions whose failure it is, and the open sessions it applies to (their traces stay on view)."""
    uri = file_uri(ls, path)
    changed = Path(path).resolve()
    holders = [
        session
        for session in ls.sessions
        if (session.failure is not None and session.failure[0] == uri)
        or (session.failure is None and _applies_to(ls, changed, session.owner))
    ]
    if not holders:
        return
    try:
        read_project(Path(path))
        located = None
    except ProjectFileError as error:
        located = project_diagnostic(ls, error)
    for session in holders:
        session.failure = located
    publish_diagnostics(ls, {uri})


def _applies_to(ls: ModelTraceServer, project_file: Path, model_file: str) -> bool:
    """Whether `project_file` is the one a trace of `model_file` reads (`modelTrace.projectFile`, else the nearest
    one walking up)."""
    chosen = _explicit_project(ls) or find_project_file(Path(model_file))
    return chosen is not None and chosen.resolve() == project_file


def _workspace_folder_of(ls: ModelTraceServer, path: str) -> Path | None:
    """The workspace folder holding `path` (where a new project file goes), else None."""
    for folder in ls.workspace.folders.values():
        root = to_fs_path(folder.uri)
        if root and Path(path).resolve().is_relative_to(Path(root).resolve()):
            return Path(root)
    root = ls.workspace.root_path
    if root and Path(path).resolve().is_relative_to(Path(root).resolve()):
        return Path(root)
    return None


def create_recipe(ls: ModelTraceServer, path: str, draft: RecipeDraft) -> WrittenRecipe:
    """Write a recipe for `draft` next to `path` and register it in the project file (a new `modeltrace.toml` in
    the workspace folder when there is none). Runs in a thread: it writes files."""
    explicit = _explicit_project(ls)
    folder = explicit.parent if explicit is not None else _workspace_folder_of(ls, path)
    return write_recipe(draft, Path(path), folder, explicit)


def recipe_uri(written: WrittenRecipe) -> str:
    return from_fs_path(str(written.path)) or str(written.path)
