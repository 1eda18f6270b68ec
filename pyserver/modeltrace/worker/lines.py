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
import os
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


# NOTE: parsing a 500-line modeling file takes ~8 ms: layouts are kept per process while the file is unchanged
# (the bench's repeated captures; in the worker each trace is a fresh fork and parses once).
_layout_cache: dict[str, tuple[tuple[int, int], _FileLayout]] = {}


def _layout_of_file(path: str) -> _FileLayout:
    try:
        status = os.stat(path)
        stamp = (status.st_mtime_ns, status.st_size)
    except OSError:
        return _FileLayout(path)
    cached = _layout_cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    layout = _FileLayout(path)
    _layout_cache[path] = (stamp, layout)
    return layout


class _FrameState:
    """What the tracer of one running frame carries: the statement running now, the identity of each tensor
    local when last seen, and (bound once per frame) the file's statement table and real path."""

    __slots__ = ("statement", "seen", "statements", "file")

    def __init__(self, statement: int, statements: dict[int, int], file: str) -> None:
        self.statement = statement
        self.seen: dict[str, tuple[int, int]] = {}
        self.statements = statements
        self.file = file


def _identity(value: Any) -> tuple[int, int] | None:
    """What tells a rebound or modified variable apart (object identity, plus the version for tensors), or
    None for values that hold no tensors."""
    if isinstance(value, torch.Tensor):
        try:
            return id(value), value._version
        except RuntimeError:  # inference tensors track no version
            return id(value), -1
    if isinstance(value, (tuple, list)):
        for item in value[:MAX_LEAVES_PER_VARIABLE]:
            if isinstance(item, torch.Tensor):
                return id(value), 0
    return None


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
        self._counts: dict[tuple[str, int, str], int] = {}
        self._previous_tracer = None

    def __enter__(self) -> LineCapture:
        self._previous_tracer = sys.gettrace()
        sys.settrace(self._global_tracer)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(self._previous_tracer)

    def _layout_for(self, code: CodeType) -> _FileLayout | None:
        """The layout of `code`'s file when it is selected and traced, else None (cached per code object)."""
        # NOTE: keyed by identity: code objects compare equal across files (co_filename is not compared), and
        # a port and its original are often the same code in two files. Holding `code` keeps the id unique.
        selected = self._selected.get(id(code))
        if selected is not None and selected[0] is code:
            return selected[1]
        path = real_path(code.co_filename)
        layout = None
        # NOTE: comprehensions, generator expressions and lambdas (`<listcomp>`...) are not traced themselves:
        # what they build is recorded in the enclosing frame, on the line that assigns it.
        if path in self.files and not code.co_name.startswith("<"):
            layout = self._layouts.get(path)
            if layout is None:
                layout = self._layouts[path] = _layout_of_file(path)
        self._selected[id(code)] = (code, layout)
        return layout

    def _global_tracer(self, frame: FrameType, event: str, argument: Any):
        # NOTE: called on every Python call while tracing (~3,500 per medium Llama forward): the library
        # frames must leave after one dictionary lookup.
        code = frame.f_code
        selected = self._selected.get(id(code))
        if selected is not None and selected[0] is code:
            layout = selected[1]
        else:
            layout = self._layout_for(code)
        if layout is None:
            return None
        statements = layout.statement_of_line
        file = real_path(code.co_filename)
        line = frame.f_lineno
        state = _FrameState(statements.get(line, line), statements, file)
        def_line = layout.def_line_of_first_line.get(code.co_firstlineno, code.co_firstlineno)
        frame_locals = frame.f_locals
        seen = state.seen
        for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            value = frame_locals.get(name)
            identity = _identity(value)
            if identity is not None:
                seen[name] = identity
                self._record(file, def_line, name, value)
        for name, value in frame_locals.items():
            if name not in seen:
                identity = _identity(value)
                if identity is not None:
                    seen[name] = identity
        return self._local_tracer_for(state)

    def _local_tracer_for(self, state: _FrameState):
        """The local tracer of one frame, with its state bound (no lookup per line event)."""
        statements = state.statements
        diff = self._diff
        record = self._record

        def local_tracer(frame: FrameType, event: str, argument: Any):
            if event == "line":
                line = frame.f_lineno
                statement = statements.get(line, line)
                if statement != state.statement:
                    diff(frame, state)
                    state.statement = statement
            elif event == "return":
                diff(frame, state)
                if argument is not None and _identity(argument) is not None:
                    record(state.file, state.statement, "return", argument)
            return local_tracer

        return local_tracer

    def _diff(self, frame: FrameType, state: _FrameState) -> None:
        """Record the tensor locals that the statement just run bound or modified."""
        seen = state.seen
        for name, value in frame.f_locals.items():
            identity = _identity(value)
            if identity is not None and seen.get(name) != identity:
                seen[name] = identity
                self._record(state.file, state.statement, name, value)

    def _record(self, file: str, line: int, name: str, value: Any) -> None:
        if len(self.records) >= MAX_LINE_RECORDS:
            self.truncated = True
            return
        if isinstance(value, torch.Tensor):
            leaves: Iterable[tuple[str, torch.Tensor]] = ((name, value),)
        else:
            leaves = list(iter_tensor_leaves(value, name))[:MAX_LEAVES_PER_VARIABLE]
        cache = self._cache
        counts = self._counts
        for key, tensor in leaves:
            summary = cache.get(tensor, key)
            if summary is None:
                summary = summarize(tensor, key, self._pending)
                cache.put(tensor, summary)
            count_key = (file, line, key)
            call_index = counts.get(count_key, 0)
            counts[count_key] = call_index + 1
            self.records.append(LineRecord(file, line, key, call_index, summary))
