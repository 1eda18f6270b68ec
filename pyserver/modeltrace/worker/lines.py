"""Line-level capture: the tensors each executed line of the selected files assigned to local variables.

Module hooks see what enters and leaves a module; the lines authors debug are the ones in between
(`query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)`). A `sys.settrace` tracer,
active only in frames whose code comes from the selected files (library frames get no local tracer and cost
one dictionary lookup per call), diffs the frame's tensor locals each time execution moves to another
statement and attributes what changed to the statement that just ran, at its first line, so multi-line
statements and tuple unpacking land on the line the reader sees. Parameters are recorded on the `def` line
and returned tensors on the `return` line. Tensor summaries are shared with module capture: a tensor a
module returned is summarised once.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from types import CodeType, FrameType
from typing import Any

import torch

from modeltrace.trace.records import LineRecord
from modeltrace.worker.capture import SummaryCache, iter_tensor_leaves
from modeltrace.worker.source_map import real_path
from modeltrace.worker.stats import PendingStats, summarize


# NOTE: a bound on what one trace records, so a long loop in model code cannot grow a trace without limit.
MAX_LINE_RECORDS = 200_000
MAX_LEAVES_PER_VARIABLE = 8


class _FileLayout:
    """Statement boundaries of one source file: the first line of the statement each line belongs to,
    and the `def` line of each function (a decorated function's code starts at its first decorator)."""

    def __init__(self, path: str) -> None:
        self.statement_of_line: dict[int, int] = {}
        self.def_line_of_first_line: dict[int, int] = {}
        try:
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), filename=path)
        except (OSError, SyntaxError, ValueError):
            return
        self._index(tree)

    def _index(self, tree: ast.AST) -> None:
        # ast.walk goes outer to inner, so inner statements overwrite the lines of the statements holding them.
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
                self.def_line_of_first_line[first] = node.lineno
            if not isinstance(node, ast.stmt) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            body = getattr(node, "body", None)
            last = (body[0].lineno - 1) if isinstance(body, list) and body else (node.end_lineno or node.lineno)
            for line in range(node.lineno, max(last, node.lineno) + 1):
                self.statement_of_line[line] = node.lineno

    def statement(self, line: int) -> int:
        return self.statement_of_line.get(line, line)


class _FrameState:
    __slots__ = ("statement", "seen")

    def __init__(self, statement: int) -> None:
        self.statement = statement
        self.seen: dict[str, tuple[int, int]] = {}


def _identity(value: Any) -> tuple[int, int]:
    """What tells a rebound or modified variable apart: object identity, plus the version for tensors."""
    if isinstance(value, torch.Tensor):
        try:
            return id(value), value._version
        except RuntimeError:
            return id(value), -1
    return id(value), 0


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(isinstance(item, torch.Tensor) for item in value[:MAX_LEAVES_PER_VARIABLE])
    return False


class LineCapture:
    """Context manager recording `LineRecord`s for the selected files while active (current thread)."""

    def __init__(self, files: Iterable[str], cache: SummaryCache | None = None, pending: PendingStats | None = None) -> None:
        self.files = {real_path(file) for file in files}
        self.records: list[LineRecord] = []
        self.truncated = False
        self._cache = cache if cache is not None else SummaryCache()
        self._pending = pending
        self._selected: dict[int, tuple[CodeType, _FileLayout | None]] = {}
        self._layouts: dict[str, _FileLayout] = {}
        self._states: dict[FrameType, _FrameState] = {}
        self._counts: dict[tuple[str, int, str], int] = {}
        self._previous_tracer = None

    def __enter__(self) -> LineCapture:
        self._previous_tracer = sys.gettrace()
        sys.settrace(self._global_tracer)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(self._previous_tracer)
        self._states.clear()

    def _layout_for(self, code: CodeType) -> _FileLayout | None:
        # NOTE: keyed by identity: code objects compare equal across files (co_filename is not compared), and
        # a port and its original are often the same code in two files. Holding `code` keeps the id unique.
        selected = self._selected.get(id(code))
        if selected is not None and selected[0] is code:
            return selected[1]
        path = real_path(code.co_filename)
        layout = None
        if path in self.files:
            layout = self._layouts.get(path)
            if layout is None:
                layout = self._layouts[path] = _FileLayout(path)
        self._selected[id(code)] = (code, layout)
        return layout

    def _global_tracer(self, frame: FrameType, event: str, argument: Any):
        code = frame.f_code
        layout = self._layout_for(code)
        # NOTE: comprehensions, generator expressions and lambdas (`<listcomp>`...) are not traced themselves:
        # what they build is recorded in the enclosing frame, on the line that assigns it.
        if layout is None or code.co_name.startswith("<"):
            return None
        state = self._states[frame] = _FrameState(layout.statement(frame.f_lineno))
        def_line = layout.def_line_of_first_line.get(code.co_firstlineno, code.co_firstlineno)
        frame_locals = frame.f_locals
        for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            value = frame_locals.get(name)
            if _holds_tensors(value):
                self._record(code.co_filename, def_line, name, value)
        state.seen = {name: _identity(value) for name, value in frame_locals.items() if _holds_tensors(value)}
        return self._local_tracer

    def _local_tracer(self, frame: FrameType, event: str, argument: Any):
        state = self._states.get(frame)
        if state is None:
            return None
        if event == "line":
            layout = self._selected[id(frame.f_code)][1]
            statement = layout.statement(frame.f_lineno)
            if statement != state.statement:
                self._diff(frame, state)
                state.statement = statement
        elif event == "return":
            self._diff(frame, state)
            if argument is not None and _holds_tensors(argument):
                self._record(frame.f_code.co_filename, state.statement, "return", argument)
            del self._states[frame]
        return self._local_tracer

    def _diff(self, frame: FrameType, state: _FrameState) -> None:
        """Record the tensor locals that the statement just run bound or modified."""
        seen = state.seen
        for name, value in frame.f_locals.items():
            if not _holds_tensors(value):
                continue
            identity = _identity(value)
            if seen.get(name) != identity:
                seen[name] = identity
                self._record(frame.f_code.co_filename, state.statement, name, value)

    def _record(self, filename: str, line: int, name: str, value: Any) -> None:
        if len(self.records) >= MAX_LINE_RECORDS:
            self.truncated = True
            return
        file = real_path(filename)
        leaves = list(iter_tensor_leaves(value, name))[:MAX_LEAVES_PER_VARIABLE]
        for key, tensor in leaves:
            summary = self._cache.get(tensor, key)
            if summary is None:
                summary = summarize(tensor, key, self._pending)
                self._cache.put(tensor, summary)
            count_key = (file, line, key)
            call_index = self._counts.get(count_key, 0)
            self._counts[count_key] = call_index + 1
            self.records.append(LineRecord(file=file, line=line, name=key, call_index=call_index, tensor=summary))

