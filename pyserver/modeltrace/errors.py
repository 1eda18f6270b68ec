"""Error types that carry a message meant for the user (one line, naming the file, class or value at fault).

Anything raised as a `ModelTraceError` is printed as-is by the CLI and shown as-is by the editor; any other
exception is a bug in ModelTrace or an error inside the user's model code, reported with its location.
"""

from __future__ import annotations


class ModelTraceError(Exception):
    """A problem with the user's input (file, class, config, recipe, trace file) with a one-line explanation.

    `file` and `line`, when the problem sits at a place in the user's code (a syntax error), let the editor
    put a diagnostic there.
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line


class TraceFormatError(ModelTraceError):
    """A trace, reference or debugger file that is missing, truncated, corrupt, too large or of another version."""


class TraceFailed(ModelTraceError):
    """The worker could not produce a trace; `error` holds the structured report sent by the worker."""

    def __init__(self, error: dict) -> None:
        self.error = error
        super().__init__(format_worker_error(error))


def format_worker_error(error: dict) -> str:
    """One line: `ExceptionType: message (file:line)` from a structured worker error."""
    location = ""
    if error.get("file"):
        location = f" ({error['file']}:{error.get('line') or '?'})"
        if location[2:-1] in str(error.get("message") or ""):
            location = ""  # the message names the place already
    kind = error.get("type") or "Error"
    message = str(error.get("message") or "").strip().splitlines()
    first_line = message[0] if message else ""
    # What to provide instead, when the unaided build settled for a model and inputs that never ran (before the
    # location, which ends the line).
    advice = f"; {error['advice']}" if error.get("advice") else ""
    if kind in ("ModelTraceError", "TraceFormatError"):
        return f"{first_line}{advice}{location}"
    if error.get("model_class"):
        return f"{error['model_class']}.forward raised {kind}: {first_line}{advice}{location}"
    return f"{kind}: {first_line}{advice}{location}"
