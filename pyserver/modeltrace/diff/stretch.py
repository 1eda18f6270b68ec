"""The drill-down's stretch, narrowed to the statements the first differing line depends on.

The first differing line's stretch (`LineDivergence.since`) runs from after the last line of its function whose
value was right to the line itself: the cause lies in between, among values no line record compares (Python
numbers, a complex intermediate). Not every statement in between can be the cause: only those that compute what
the differing line reads. Starting from the names the line reads, the statements of the stretch that assign one
of them are taken, then the names those read, and so on (a backward slice of the source), with the header of
each `if`/`for`/`while`/`with`/`try` that decides whether a taken statement runs (a condition written the wrong
way round runs the other branch). The stretch then starts at the first statement taken.

Names whose value the line records settle before the stretch are left out: a name recorded (as a tensor) only
before the stretch holds a value the drill-down compared or passed as the inputs', and an assignment of it in the
stretch without a record of its own did not run there (`hidden_states = self.norm(hidden_states)` under an `if`
that was false would have been recorded; NOTE: this takes a name that held a tensor to keep holding one). A bare
call (`x.mul_(2)`) counts as assigning every name it reads: it may change them in place. Attributes (`self.ratio`)
are not names: a setting's assignment is evidence of its own (`reads`).
"""

from __future__ import annotations

import ast
import os

from modeltrace.trace.records import LineRecord
from modeltrace.trace.source_files import UnreadableSource, read_source_text

_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)
_tree_cache: dict[tuple[str, float], ast.Module | None] = {}


def narrowed_since(
    file: str, line: int, since: int | None, function: tuple[int, int], cand_body: list[LineRecord], index: int
) -> int | None:
    """The first line of the stretch `since`..`line` of `file` that computes something `line` depends on (see the
    module's docstring), `since` where none is found or the source cannot be read. `cand_body[index]` is the
    record of the differing line; `function` the (first, last) line of the function holding it."""
    if since is None or since >= line:
        return since
    definition = _function_node(file, function[0])
    if definition is None:
        return since
    statements = _statements(definition, since, line)
    target = next((node for node in statements if node.lineno == line), None)
    if target is None:
        return since
    settled = _settled(cand_body, index, file, function, since)
    needed = _reads(target) - settled
    candidates = [node for node in statements if node is not target and node.lineno < line]
    assigned = {id(node): _assigns(node) for node in candidates}
    # NOTE: worked out once: the statements inside each compound statement of the stretch (its header decides them)
    inside = {
        id(node): {id(child) for child in ast.walk(node) if child is not node}
        for node in candidates
        if isinstance(node, _COMPOUND)
    }
    taken: set[int] = {id(target)}
    changed = True
    while changed:  # NOTE: each pass takes at least one more statement, or ends
        changed = False
        for node in candidates:
            if id(node) in taken:
                continue
            if assigned[id(node)] & needed or not inside.get(id(node), set()).isdisjoint(taken):
                taken.add(id(node))
                needed |= _reads(node) - settled
                changed = True
    lines = [node.lineno for node in candidates if id(node) in taken]
    return min(lines) if lines else since


def _function_node(file: str, first: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        key = (file, os.path.getmtime(file))
    except OSError:
        return None
    if key not in _tree_cache:
        if len(_tree_cache) > 16:
            _tree_cache.clear()
        try:
            _tree_cache[key] = ast.parse(read_source_text(file), file)
        except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
            _tree_cache[key] = None
    tree = _tree_cache[key]
    if tree is None:
        return None
    return next(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == first
        ),
        None,
    )


def _statements(definition: ast.AST, start: int, end: int) -> list[ast.stmt]:
    """The statements of the function's own body (not nested functions') starting in start..end, outer first."""
    found: list[ast.stmt] = []
    pending = list(definition.body)  # type: ignore[attr-defined]
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if start <= node.lineno <= end:
            found.append(node)
        for field in ("body", "orelse", "finalbody"):
            pending.extend(getattr(node, field, []) or [])
        for handler in getattr(node, "handlers", []) or []:
            pending.extend(handler.body)
    return found


def _header(node: ast.stmt) -> list[ast.AST]:
    """What a statement evaluates itself: a compound statement's condition, iterable or context managers only."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [item.context_expr for item in node.items]
    if isinstance(node, ast.Try):
        return []
    return [node]


def _reads(node: ast.stmt) -> set[str]:
    return {
        name.id
        for part in _header(node)
        for name in ast.walk(part)
        if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load)
    }


def _assigns(node: ast.stmt) -> set[str]:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    found = {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
    if isinstance(node, ast.Expr):
        # NOTE: a bare call may change what it is given in place (`x.mul_(2)`, `torch.relu_(x)`, `out=x`)
        found |= {name.id for name in ast.walk(node) if isinstance(name, ast.Name)}
    for part in _header(node):
        found |= {walrus.target.id for walrus in ast.walk(part) if isinstance(walrus, ast.NamedExpr)}
    return found


def _settled(cand_body: list[LineRecord], index: int, file: str, function: tuple[int, int], since: int) -> set[str]:
    """Names of the function's current call recorded before the stretch and not in it (back to the `def` line's
    parameter records, where the call began)."""
    before: set[str] = set()
    within: set[str] = set()
    for record in reversed(cand_body[:index]):
        if record.file != file or not function[0] <= record.line <= function[1]:
            continue
        (within if since <= record.line else before).add(record.name)
        if record.line == function[0]:
            break
    return before - within
