"""Error types that carry a message meant for the user (one line, naming the file, class or value at fault).

Anything raised as a `ModelTraceError` is printed as-is by the CLI and shown as-is by the editor; any other
exception is a bug in ModelTrace or an error inside the user's model code, reported with its location.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


# NOTE: only for the annotation: this module is imported by everything, the messages by the worker's side.
if TYPE_CHECKING:
    from modeltrace.worker.messages import RecipeDraft, WorkerError


class ModelTraceError(Exception):
    """A problem with the user's input (file, class, config, recipe, trace file) with a one-line explanation.

    `file` and `line`, when the problem sits at a place in the user's code (a syntax error), let the editor
    put a diagnostic there.
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line


class NeedsRecipe(ModelTraceError):
    """A class ModelTrace cannot build or feed unaided: `draft` (a `worker.messages.RecipeDraft`) holds what it
    tried, which the worker reports (`WorkerError.recipe`) for the editor's "Create recipe…"."""

    def __init__(self, message: str, draft: RecipeDraft, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message, file, line)
        self.draft = draft


class TraceFormatError(ModelTraceError):
    """A trace, reference or debugger file that is missing, truncated, corrupt, too large or of another version."""


class TraceFailed(ModelTraceError):
    """The worker could not produce a trace; `error` holds the structured report (its `cause` says why)."""

    def __init__(self, error: WorkerError) -> None:
        self.error = error
        super().__init__(format_worker_error(error))


def format_worker_error(error: WorkerError) -> str:
    """One line: `ExceptionType: message (file:line)` from a structured worker error."""
    location = ""
    if error.file:
        location = f" ({error.file}:{error.line or '?'})"
        if location[2:-1] in error.message:
            location = ""  # the message names the place already
    message = error.message.strip().splitlines()
    first_line = message[0] if message else ""
    # What to provide instead, when the unaided build settled for a model and inputs that never ran (before the
    # location, which ends the line).
    advice = f"; {error.advice}" if error.advice else ""
    if error.cause == "input":
        return f"{first_line}{advice}{location}"
    if error.model_class:
        return f"{error.model_class}.forward raised {error.kind}: {first_line}{advice}{location}"
    return f"{error.kind}: {first_line}{advice}{location}"
