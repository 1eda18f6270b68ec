"""The inputs of the first divergence that have no counterpart on the other side, and where they come from.

A verdict "inputs match" rests on the inputs that were paired. Two implementations often pass different
helper tensors: Meta's Llama hands each attention one complex rotary table `freqs_cis` `[T, d/2]`, transformers
hands it `cos`, `sin` `[1, T, d]`. A candidate input left out of the pairing may be where the bug is (a rotary
base set wrong where the table is built), so the verdict says that it rests on partial inputs and names, for
each unpaired candidate input, where it was produced:

- `produced_at`: the first candidate line (with `--lines`) that assigned a tensor holding the same values (same
  shape, dtype and statistics), run by the diverging call's callers (the callers in between pass it on);
  without line records, the caller's line that assigns the local name passed as that parameter, found by
  following the parameter's name up the calls that pass it on (`h = layer(h, start_pos, freqs_cis, mask)`);
- `assigned_at`: when that line reads an attribute the class set in `__init__` (`self.freqs_cis[...]`), the
  `__init__` statement that assigned it, widened to the earlier statements of that `__init__` that assigned
  the local names it reads (`theta = ...` then `self.freqs_cis = precompute_freqs_cis(..., theta)`): a table
  built once, at construction, is where a wrong setting of it lives.

Torch-free: reads the trace's records and the candidate's source with `ast`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from modeltrace.diff.result import DiffResult, Divergence
from modeltrace.trace.records import LineRecord, TensorSummary
from modeltrace.trace.source_files import UnreadableSource, read_source_text

_ATTRIBUTE_READ = re.compile(r"\bself\.([A-Za-z_]\w*)")


@dataclass(frozen=True)
class Where:
    """A candidate source line, or a range of lines (`end_line`)."""

    file: str
    line: int
    end_line: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"file": self.file, "line": self.line}
        if self.end_line is not None and self.end_line != self.line:
            data["end_line"] = self.end_line
        return data


@dataclass(frozen=True)
class UnpairedInput:
    """A candidate input of the first divergence compared with nothing: its key, shape and dtype, why it was
    left out, and where it was produced (None where the trace cannot tell: no line records)."""

    key: str
    shape: list[int]
    dtype: str
    reason: str
    produced_at: Where | None = None
    name: str | None = None
    attribute: str | None = None
    assigned_at: Where | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "shape": self.shape,
            "dtype": self.dtype,
            "reason": self.reason,
            "produced_at": self.produced_at.to_json() if self.produced_at is not None else None,
            "name": self.name,
            "attribute": self.attribute,
            "assigned_at": self.assigned_at.to_json() if self.assigned_at is not None else None,
        }

    def text(self) -> str:
        """`freqs_cis [7, 8] complex64 (produced at model.py:472 as freqs_cis; self.freqs_cis assigned at
        model.py:450-454)`."""
        parts = []
        if self.produced_at is not None:
            parts.append(f"produced at {_short(self.produced_at)}" + (f" as {self.name}" if self.name else ""))
        if self.assigned_at is not None:
            parts.append(f"self.{self.attribute} assigned at {_short(self.assigned_at)}")
        where = f" ({'; '.join(parts)})" if parts else " (not produced by a compared line: trace with --lines)"
        return f"{self.key or '(input)'} {list(self.shape)} {self.dtype}{where}"


def _short(where: Where) -> str:
    name = where.file.rsplit("/", 1)[-1]
    end = f"-{where.end_line}" if where.end_line is not None and where.end_line != where.line else ""
    return f"{name}:{where.line}{end}"


def unpaired_inputs(result: DiffResult, divergence: Divergence) -> list[UnpairedInput]:
    """The divergence's candidate inputs that the pairing left out, each with where it was produced."""
    module = divergence.module
    pairing = module.input_pairing
    if module.reference is None or pairing is None:
        return []
    summaries = {summary.key: summary for summary in module.candidate.inputs}
    found = []
    for left in pairing.left_out:
        summary = summaries.get(left.key)
        if left.owner != "candidate" or summary is None:
            continue
        record = _producing_line(result, module.candidate.index, summary)
        if record is None:
            record = _named_origin(result, module.candidate.index, left.key.split(".")[0])
        attribute, assigned = _init_assignment(record) if record is not None else (None, None)
        found.append(
            UnpairedInput(
                left.key,
                list(left.shape),
                summary.dtype,
                left.reason,
                Where(record.file, record.line) if record is not None else None,
                record.name if record is not None else None,
                attribute,
                assigned,
            )
        )
    return found


@dataclass(frozen=True)
class _Origin:
    """A line that assigned a local name (found in the source, not recorded): `file`, `line`, `name`."""

    file: str
    line: int
    name: str


def _named_origin(result: DiffResult, call: int, name: str) -> _Origin | None:
    """Without line records: follow the input's parameter name up the call chain, through each caller whose
    function takes a parameter of that name and passes it on, to the caller that assigns it before the call
    (`freqs_cis = self.freqs_cis[...]`)."""
    records = {record.index: record for record in result.candidate.trace.modules}
    record = records.get(call)
    seen: set[int] = set()
    while record is not None and record.called_at is not None and record.index not in seen and name:
        seen.add(record.index)
        file, line = record.called_at.file, record.called_at.line
        function = _enclosing_function(file, line)
        if function is None:
            return None
        if name in {argument.arg for argument in function.args.args + function.args.kwonlyargs}:
            record = records.get(record.parent)
            continue
        assigned = [
            statement.lineno
            for statement in ast.walk(function)
            if isinstance(statement, (ast.Assign, ast.AnnAssign))
            and statement.lineno < line
            and any(isinstance(target, ast.Name) and target.id == name for target in _targets(statement))
        ]
        return _Origin(file, max(assigned), name) if assigned else None
    return None


def _enclosing_function(file: str, line: int) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(read_source_text(file), file)
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return max(functions, key=lambda node: node.lineno) if functions else None


def _targets(statement: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return statement.targets if isinstance(statement, ast.Assign) else [statement.target]


def _same_values(first: TensorSummary, second: TensorSummary) -> bool:
    if list(first.shape) != list(second.shape) or first.dtype != second.dtype:
        return False
    return all(getattr(first, name) == getattr(second, name) for name in ("mean", "std", "min", "max"))


def _producing_line(result: DiffResult, call: int, summary: TensorSummary) -> LineRecord | None:
    """The first line record run by a caller of `call` (an enclosing call) whose tensor holds the input's values:
    where it was produced (the callers in between only pass it on, and their argument lines hold it too)."""
    records = {record.index: record for record in result.candidate.trace.modules}
    callers = set()
    parent = records[call].parent if call in records else -1
    while parent in records and parent not in callers:
        callers.add(parent)
        parent = records[parent].parent
    matching = [
        line
        for line in result.candidate.trace.lines
        if line.module_call in callers and _same_values(line.tensor, summary) and not _is_def_line(line)
    ]
    return matching[0] if matching else None


def _is_def_line(record: LineRecord) -> bool:
    """A function's parameters are recorded on its `def` line: receiving a value is not producing it."""
    text = _source_line(record.file, record.line)
    return text is not None and text.lstrip().startswith(("def ", "async def "))


def _source_line(file: str, line: int) -> str | None:
    try:
        lines = read_source_text(file).splitlines()
    except (UnreadableSource, ValueError):
        return None
    return lines[line - 1] if 0 < line <= len(lines) else None


def settings_read(file: str, line: int) -> list[tuple[str, Where]]:
    """The attributes a candidate line reads (`* self.scale`) that its class's `__init__` assigns, each with that
    statement: where the first differing line's inputs all matched before it, a setting it reads is the
    narrowest place left for the cause (issue 30, item 5, where the module has no counterpart to compare the
    setting with)."""
    found = []
    text = _source_line(file, line) or ""
    for attribute in _ATTRIBUTE_READ.findall(text):
        if re.search(rf"\bself\.{attribute}\s*\(", text):
            continue  # a submodule called on the line (`self.down_proj(fuse)`): it has a call of its own
        named, assigned = _init_assignment(_Origin(file, line, attribute), only=attribute, settings_only=True)
        if named is not None and assigned is not None and (named, assigned) not in found:
            found.append((named, assigned))
    return found


def _init_assignment(
    record: LineRecord | _Origin, only: str | None = None, settings_only: bool = False
) -> tuple[str | None, Where | None]:
    """The attribute the line reads that the enclosing class's `__init__` assigns, and that statement (widened
    to the statements before it assigning the local names it reads)."""
    try:
        source = read_source_text(record.file)
        tree = ast.parse(source, record.file)
    except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
        return None, None
    lines = source.splitlines()
    if not 0 < record.line <= len(lines):
        return None, None
    attributes = [only] if only is not None else _ATTRIBUTE_READ.findall(lines[record.line - 1])
    owner = _enclosing_class(tree, record.line)
    init = next(
        (
            item
            for item in (owner.body if owner else [])
            if isinstance(item, ast.FunctionDef) and item.name == "__init__"
        ),
        None,
    )
    if init is None:
        return None, None
    statements = [statement for statement in ast.walk(init) if isinstance(statement, (ast.Assign, ast.AnnAssign))]
    for attribute in attributes:
        assigning = [statement for statement in statements if attribute in _self_targets(statement)]
        if not assigning:
            continue
        statement = max(assigning, key=lambda item: item.lineno)  # the last assignment wins on the straight path
        if settings_only and not _computed(statement.value):
            continue
        start = _first_input_line(statement, statements)
        return attribute, Where(record.file, start, statement.end_lineno or statement.lineno)
    return None, None


def _computed(value: ast.expr | None) -> bool:
    """Whether an `__init__` value is a setting computed there (`self.head_dim**-0.5`, `rope_theta or 1e6`), not
    a kept argument (`self.eps = eps`) nor a built object (`nn.Parameter(...)`, `RMSNorm(...)`: capitalised
    callees are classes)."""
    if value is None or isinstance(value, ast.Name):
        return False
    if isinstance(value, ast.Call):
        callee = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        return not callee[:1].isupper()
    return True


def _enclosing_class(tree: ast.Module, line: int) -> ast.ClassDef | None:
    classes = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return max(classes, key=lambda node: node.lineno) if classes else None


def _self_targets(statement: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = _targets(statement)
    return {
        target.attr
        for target in targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }


def _first_input_line(statement: ast.Assign | ast.AnnAssign, statements: list[ast.Assign | ast.AnnAssign]) -> int:
    """The first line of the statements before `statement` that assign the plain names its value reads."""
    value = statement.value
    read = {node.id for node in ast.walk(value) if isinstance(node, ast.Name)} if value is not None else set()
    start = statement.lineno
    for earlier in statements:
        if earlier.lineno >= statement.lineno:
            continue
        if any(isinstance(target, ast.Name) and target.id in read for target in _targets(earlier)):
            start = min(start, earlier.lineno)
    return start


__all__ = ["UnpairedInput", "Where", "settings_read", "unpaired_inputs"]
