"""Fixes for recorder problems as libcst edits that keep the file's formatting."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import libcst as cst

from modeltrace.recorders.checking import analyze_source
from modeltrace.recorders.types import Analysis, Problem, Recorder


def dotted(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def _entry_element(key: str, recorder: Recorder, comma: cst.Comma | cst.MaybeSentinel) -> cst.DictElement:
    return cst.DictElement(cst.SimpleString(f'"{key}"'), cst.parse_expression(recorder.source(key)), comma=comma)


class _FixTransformer(cst.CSTTransformer):
    def __init__(self, problems: list[Problem]) -> None:
        self.by_owner: dict[str, list[Problem]] = {}
        for problem in problems:
            self.by_owner.setdefault(problem.owner or "", []).append(problem)
        self.depth = 0
        self.current: str | None = None
        self.needs_output_recorder = False
        self.applied: list[Problem] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.depth += 1
        if self.depth == 1:
            self.current = node.name.value
        # only the classes a fix edits are descended into (the other ones are left as they are: faster)
        return self.depth == 1 and node.name.value in self.by_owner

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.depth -= 1
        if self.depth != 0:
            return updated
        problems = [
            problem
            for problem in self.by_owner.get(original.name.value, [])
            if problem.code == "no-recorders" and problem not in self.applied
        ]
        self.current = None
        if not problems:
            return updated
        entries: dict[str, Recorder] = problems[0].extra.get("entries", {})
        if not entries:
            return updated
        body = list(updated.body.body)
        lines = ["    _can_record_outputs = {"]
        for key, recorder in entries.items():
            lines.append(f'        "{key}": {recorder.source(key)},')
            if recorder.source(key).startswith("OutputRecorder"):
                self.needs_output_recorder = True
        lines.append("    }")
        statement = cst.parse_statement("\n".join(line[4:] for line in lines) + "\n")
        # after the docstring and class-level assignments, before the first method
        position = next(
            (index for index, item in enumerate(body) if isinstance(item, (cst.FunctionDef, cst.ClassDef))), len(body)
        )
        body.insert(position, statement)
        self.applied.extend(problems)
        return updated.with_changes(body=updated.body.with_changes(body=body))

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if self.depth != 1 or self.current is None or len(original.targets) != 1:
            return updated
        if dotted(original.targets[0].target) != "_can_record_outputs" or not isinstance(updated.value, cst.Dict):
            return updated
        problems = [
            problem
            for problem in self.by_owner.get(self.current, [])
            if problem.recorder is not None and problem.code != "no-recorders"
        ]
        if not problems:
            return updated
        value = updated.value
        elements = list(value.elements)
        for problem in problems:
            key = problem.key or ""
            if problem.recorder.source(key).startswith("OutputRecorder"):
                self.needs_output_recorder = True
            if not _replace_entry(elements, key, problem):
                _append_entry(elements, value, key, problem.recorder)
            self.applied.append(problem)
        return updated.with_changes(value=value.with_changes(elements=elements))


def _replace_entry(elements: list[cst.BaseDictElement], key: str, problem: Problem) -> bool:
    """Whether the dict already has `key`; its value replaced by the fix's entry when the problem says so."""
    found = False
    for position, element in enumerate(elements):
        if (
            isinstance(element, cst.DictElement)
            and isinstance(element.key, cst.SimpleString)
            and element.key.evaluated_value == key
        ):
            if problem.replace:
                elements[position] = element.with_changes(value=cst.parse_expression(problem.recorder.source(key)))
            found = True
    return found


def _without_comments(comma: cst.Comma) -> cst.Comma:
    """A comma's layout (line break, indentation) without the comment lines that follow it: those belong to the
    entry after it, and the new entry must not repeat them."""
    after = comma.whitespace_after
    if isinstance(after, cst.ParenthesizedWhitespace):
        return comma.with_changes(
            whitespace_after=after.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        )
    return comma


def _append_entry(elements: list[cst.BaseDictElement], value: cst.Dict, key: str, recorder: Recorder) -> None:
    """Add `key: recorder` after the last element, in the layout of the ones before it."""
    if not elements:
        elements.append(_entry_element(key, recorder, cst.MaybeSentinel.DEFAULT))
        return
    last = elements[-1]
    if isinstance(last.comma, cst.Comma):
        # the last comma carries the line break before `}`; the one before it, the item indentation
        if len(elements) > 1 and isinstance(elements[-2].comma, cst.Comma):
            between = _without_comments(elements[-2].comma)
        else:
            between = _without_comments(cst.Comma(whitespace_after=value.lbrace.whitespace_after))
        elements[-1] = last.with_changes(comma=between)
        elements.append(_entry_element(key, recorder, last.comma))
    else:
        comma = (
            elements[-2].comma
            if len(elements) > 1 and isinstance(elements[-2].comma, cst.Comma)
            else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
        elements[-1] = last.with_changes(comma=comma)
        elements.append(_entry_element(key, recorder, cst.MaybeSentinel.DEFAULT))


def _ensure_output_recorder_import(module: cst.Module, analysis_imported: set[str]) -> cst.Module:
    if "OutputRecorder" in analysis_imported:
        return module

    class AddToCaptureImport(cst.CSTTransformer):
        done = False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False  # imports of a modeling file sit at module level

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
            if self.done or isinstance(updated.names, cst.ImportStar):
                return updated
            names = [alias.name.value for alias in updated.names if isinstance(alias.name, cst.Name)]
            if "capture_outputs" not in names:
                return updated
            module_name = dotted(updated.module) if updated.module else ""
            if not (module_name or "").endswith("output_capturing"):
                return updated
            self.done = True
            aliases = list(updated.names)
            last = aliases[-1]
            aliases[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            aliases.append(cst.ImportAlias(cst.Name("OutputRecorder"), comma=last.comma))
            aliases.sort(key=lambda alias: alias.name.value if isinstance(alias.name, cst.Name) else "")
            # keep the trailing-comma layout of the original last alias on the new last one
            fixed = [
                alias.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                for alias in aliases[:-1]
            ]
            fixed.append(aliases[-1].with_changes(comma=last.comma))
            return updated.with_changes(names=fixed)

    adder = AddToCaptureImport()
    module = module.visit(adder)
    if adder.done:
        return module
    statement = cst.parse_statement("from transformers.utils.output_capturing import OutputRecorder\n")
    body = list(module.body)
    position = 0
    for position, item in enumerate(body):
        if isinstance(item, cst.SimpleStatementLine) and any(
            isinstance(small_statement, (cst.Import, cst.ImportFrom)) for small_statement in item.body
        ):
            continue
        if position == 0 and isinstance(item, cst.SimpleStatementLine) and isinstance(item.body[0], cst.Expr):
            continue  # module docstring
        break
    body.insert(position, statement)
    return module.with_changes(body=body)


def apply_fixes(
    source: str, problems: list[Problem] | None = None, analysis: Analysis | None = None
) -> tuple[str, list[Problem]]:
    """The source with the fixes of `problems` (all fixable ones when None) applied, and the problems fixed."""
    analysis = analysis or analyze_source(source)
    if analysis.module is None:
        return source, []
    if problems is None:
        problems = [problem for problem in analysis.problems if problem.fix_json() is not None]
    problems = [
        problem
        for problem in problems
        if problem.owner and (problem.recorder is not None or problem.code == "no-recorders")
    ]
    if not problems:
        return source, []
    original = analysis.module
    transformer = _FixTransformer(problems)
    module = original.visit(transformer)
    if transformer.needs_output_recorder:
        module = _ensure_output_recorder_import(module, analysis.imported)
    return _splice(analysis.source or original.code, original, module), transformer.applied


def _splice(source: str, original: cst.Module, fixed: cst.Module) -> str:
    """The text of `fixed`: the source with the code of each changed top-level statement replaced (the edits
    touch one class and maybe an import), which is much faster than generating the whole module again."""
    if len(original.body) != len(fixed.body):
        return fixed.code
    for before, after in zip(original.body, fixed.body):
        if before is after:
            continue
        old, new = original.code_for_node(before), fixed.code_for_node(after)
        if source.count(old) != 1:
            return fixed.code
        source = source.replace(old, new)
    return source


def fix_file(path: str | Path) -> list[Problem]:
    """Apply every available fix to `path` in place (atomically); the problems fixed."""
    path = Path(path)
    source = path.read_text(encoding="utf-8")
    fixed, applied = apply_fixes(source)
    if applied and fixed != source:
        write_atomically(path, fixed)
    return applied


def write_atomically(path: Path, text: str) -> None:
    """Replace the user's file with `text` in one step (a temporary file beside it, fsynced, then renamed)."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())  # the user's source: on disk before it replaces the old one
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
