"""Map the lines of a transformers modular file onto the generated modeling file that runs in its place.

transformers' modular converter writes `modeling_<name>.py` from `modular_<name>.py`: it copies each method body,
renames the parents' class-name prefixes to the model's (`LlamaAttention` -> `Qwen3Attention`), inlines
`super().forward(...)` / `super().__init__(...)` calls, drops `del self.x` lines and unrolls every member a class
inherits. A trace runs the generated file, so its hints belong to the generated lines; this module says, from the
two source texts alone (syntax trees and sequence matching of normalized lines, per class and per function), which
generated line each modular line is. The converter itself never runs here: this is torch-free and cheap enough for
the language server.

What cannot be mapped is reported: methods a modular class inherits unchanged (`InheritedMethod`: shown as
"inherited from `LlamaAttention.forward`, 24 lines: modeling_qwen3.py:66"), and code of the modular file that the
generated one does not carry (`StaleLine`, `missing`): the generated file is out of date.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from modeltrace.modular.twins import generated_path, regenerate_command, twin_rule

# NOTE: a line the converter rewrote a little (a rename this module does not know, a default changed) still gets
# its twin's hints when the two lines are this similar; it does not count as matching for staleness.
SIMILAR_LINE_RATIO = 0.8
# A parent prefix is renamed where the name goes on with a capital or an underscore (`LlamaAttention`,
# `LLAMA_INPUTS`) or ends (`llama`), never inside another word (`Llamas`).
_IDENTIFIER_TAIL = r"(?=[A-Z_]|\b)"
_BLANK = re.compile(r"\s+")


@dataclass(frozen=True)
class InheritedMethod:
    """A method a modular class inherits unchanged: the converter copied it from `parent` into the generated
    class, at `generated_start` (its `def` line) to `generated_end` (1-based, inclusive)."""

    class_name: str
    method: str
    parent: str
    class_line: int  # the modular class's line (1-based)
    generated_start: int
    generated_end: int

    @property
    def line_count(self) -> int:
        return self.generated_end - self.generated_start + 1

    def describe(self, generated_name: str) -> str:
        return (
            f"inherited from `{self.parent}.{self.method}`, {self.line_count} lines: "
            f"{generated_name}:{self.generated_start}"
        )


@dataclass(frozen=True)
class StaleLine:
    """A code line of the modular file the generated file does not carry (edited since it was generated)."""

    line: int
    text: str
    where: str  # `Qwen3Attention.forward`


@dataclass
class ModularMap:
    """Modular line -> generated lines (1-based). One generated line for code the converter copied; the lines of
    the inlined parent body for a `super()` call. `inherited`, `stale` and `missing` say what has no twin."""

    modular: str
    generated: str
    lines: dict[int, tuple[int, ...]] = field(default_factory=dict)
    inherited: list[InheritedMethod] = field(default_factory=list)
    stale: list[StaleLine] = field(default_factory=list)
    # Classes and functions of the modular file (`Qwen3Attention.forward`) that no generated file defines.
    missing: list[str] = field(default_factory=list)
    # Classes of the modular file and their 1-based lines, with their twin's line in the generated file.
    classes: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def is_stale(self) -> bool:
        return bool(self.stale or self.missing)

    def staleness(self) -> str | None:
        """One sentence saying why the generated file is out of date, with the command that regenerates it."""
        if not self.is_stale:
            return None
        reasons = [f"{name} is not in any generated file" for name in self.missing[:3]]
        reasons += [
            f"line {stale.line} ({stale.where}) is not in {Path(self.generated).name}" for stale in self.stale[:3]
        ]
        more = len(self.missing) + len(self.stale) - len(reasons)
        return (
            f"{Path(self.generated).name} is out of date with {Path(self.modular).name}: "
            + "; ".join(reasons)
            + (f" (and {more} more)" if more > 0 else "")
            + f"; regenerate it from a transformers checkout: `{regenerate_command(self.modular)}`"
        )

    def generated_lines(self, modular_line: int) -> tuple[int, ...]:
        return self.lines.get(modular_line, ())

    def modular_lines(self) -> dict[int, list[int]]:
        """Generated line -> the modular lines that map onto it."""
        reverse: dict[int, list[int]] = {}
        for modular_line, generated in self.lines.items():
            for generated_line in generated:
                reverse.setdefault(generated_line, []).append(modular_line)
        return reverse


@dataclass
class _Source:
    """A parsed file: its lines, each line's code without its comment, and its classes and functions."""

    lines: list[str]
    code: list[str]
    tree: ast.Module
    classes: dict[str, ast.ClassDef]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]


def _parse(text: str, name: str) -> _Source:
    tree = ast.parse(text, filename=name)
    lines = text.splitlines()
    code = list(lines)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                row, column = token.start
                code[row - 1] = code[row - 1][:column]
    except (tokenize.TokenError, IndentationError):
        pass
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    return _Source(lines=lines, code=code, tree=tree, classes=classes, functions=functions)


def _common_suffix(first: str, second: str) -> str:
    size = 0
    while size < min(len(first), len(second)) and first[-1 - size] == second[-1 - size]:
        size += 1
    return first[len(first) - size :] if size else ""


def _renames(modular: _Source, modular_path: Path) -> dict[str, str]:
    """The converter's renames, parent prefix -> model prefix, in the cased, lower and upper forms: from each
    class `Qwen3Attention(LlamaAttention)` (same suffix, different prefix) and the folders of the parents'
    imports (`from ..llama.modeling_llama import` -> `llama`)."""
    pairs: Counter[tuple[str, str]] = Counter()
    for cls in modular.classes.values():
        for base in cls.bases:
            base_name = _last_name(base)
            if base_name is None:
                continue
            suffix = _common_suffix(cls.name, base_name)
            # NOTE: the suffix starts a CamelCase word (`Attention`, `MLP`), so that `Qwen3Model`/`Qwen2Model` splits
            # at `Model`, not inside the prefixes
            while suffix and not suffix[0].isupper():
                suffix = suffix[1:]
            model_prefix, parent_prefix = (
                cls.name[: len(cls.name) - len(suffix)],
                base_name[: len(base_name) - len(suffix)],
            )
            if suffix and model_prefix and parent_prefix and model_prefix != parent_prefix:
                pairs[(parent_prefix, model_prefix)] += 1
    renames: dict[str, str] = {}
    model_prefixes = Counter(model for (_, model), count in pairs.items() for _ in range(count))
    model_prefix = model_prefixes.most_common(1)[0][0] if model_prefixes else None
    for parent, model in pairs:
        renames.setdefault(parent, model)
        renames.setdefault(parent.upper(), model.upper())
    model_folder = modular_path.stem[len(twin_rule(modular_path).modular_prefix) :] if twin_rule(modular_path) else ""
    for node in modular.tree.body:
        # NOTE: `from ..llama.modeling_llama import` (a parent model); not `from ...utils.x import`
        parts = node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.ImportFrom) and node.level == 2 and len(parts) == 2 and parts[1].endswith(parts[0]):
            folder = parts[0]
            if folder != model_folder and model_folder:
                renames.setdefault(folder, model_folder)
                if model_prefix:
                    renames.setdefault(folder.upper(), model_prefix.upper())
    return {parent: model for parent, model in renames.items() if parent and parent != model}


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):
        return _last_name(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


class _Normalizer:
    """A line as the comparison sees it: no comment, blanks collapsed, the parents' prefixes renamed."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames
        names = sorted(renames, key=len, reverse=True)
        self.pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + ")" + _IDENTIFIER_TAIL) if names else None

    def __call__(self, text: str) -> str:
        text = _BLANK.sub(" ", text.strip())
        if self.pattern is not None:
            text = self.pattern.sub(lambda match: self.renames[match.group(1)], text)
        return text


def _docstring_lines(node: ast.AST) -> set[int]:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return set(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return set()


def _removes_member(statement: ast.stmt) -> bool:
    """`raise AttributeError(...)` in a method, `x = AttributeError()` in a class body: how a modular class
    removes what it inherits; the converter drops both."""
    value = statement.exc if isinstance(statement, ast.Raise) else getattr(statement, "value", None)
    if isinstance(value, ast.Call):
        value = value.func
    return (
        isinstance(statement, ast.Raise | ast.Assign | ast.AnnAssign) and _last_name(value) == "AttributeError"
        if value is not None
        else False
    )


def _is_parent_method_call(node: ast.AST) -> bool:
    """`PreTrainedModel._init_weights(self, module)`, `nn.Module.__init__(self)`: a parent's method called by its
    class; the converter inlines or rewrites it (`super()._init_weights(module)`)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
            owner = _last_name(child.func.value)
            if not owner or not owner[0].isupper() or isinstance(child.func.value, ast.Call):
                continue
            first = child.args[0] if child.args else None
            if (
                child.func.attr.startswith("_")
                or (isinstance(first, ast.Name) and first.id in ("self", "cls"))
                or isinstance(first, ast.Starred)
            ):
                return True
    return False


def _is_super_call(node: ast.AST) -> bool:
    """`super().x(...)` or `super(Cls, self).x(...)` somewhere in `node`."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
            owner = child.func.value
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                return True
    return False


def _own_lines(statement: ast.stmt) -> range:
    """The lines of a statement without its nested body (`if x:` of an `if` block)."""
    end = statement.end_lineno or statement.lineno
    for name in ("body", "orelse", "finalbody", "handlers"):
        nested = getattr(statement, name, None)
        if isinstance(nested, list) and nested and isinstance(nested[0], ast.AST):
            end = min(end, nested[0].lineno - 1)
    return range(statement.lineno, max(end, statement.lineno) + 1)


def _header_parts(statement: ast.stmt) -> list[ast.AST]:
    """What a statement evaluates itself: all of a simple statement, the header of a compound one (`if x:`)."""
    if not isinstance(getattr(statement, "body", None), list):
        return [statement]
    parts: list[ast.AST] = []
    for name in ("test", "iter", "target", "subject"):
        part = getattr(statement, name, None)
        if isinstance(part, ast.AST):
            parts.append(part)
    parts.extend(getattr(statement, "items", None) or [])
    return parts


def _expected_gone(function: ast.AST, code: list[str]) -> tuple[set[int], set[int]]:
    """(lines of `super()` calls the converter inlines, other lines it drops or rewrites by design)."""
    inlined: set[int] = set()
    dropped: set[int] = set()
    for statement in ast.walk(function):
        if not isinstance(statement, ast.stmt) or statement is function:
            continue
        own = _own_lines(statement)
        if isinstance(statement, ast.Delete | ast.Pass) or _removes_member(statement):
            dropped.update(own)
        elif not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and any(
            _is_super_call(part) or _is_parent_method_call(part) for part in _header_parts(statement)
        ):
            inlined.update(own)
    return inlined, dropped


def _header_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> range:
    """The signature's lines after the `def` line (the converter rewrites a `**super_kwargs` signature)."""
    first_body = function.body[0].lineno if function.body else (function.end_lineno or function.lineno)
    return range(function.lineno + 1, first_body)


class _Mapper:
    def __init__(self, modular: _Source, generated: _Source, normalize: _Normalizer, result: ModularMap) -> None:
        self.modular, self.generated, self.normalize, self.result = modular, generated, normalize, result

    def _sequence(self, source: _Source, lines: list[int]) -> tuple[list[int], list[str]]:
        kept = [(line, self.normalize(source.code[line - 1])) for line in lines]
        kept = [(line, text) for line, text in kept if text]
        return [line for line, _ in kept], [text for _, text in kept]

    def match(
        self,
        modular_lines: list[int],
        generated_lines: list[int],
        where: str,
        inlined: set[int] | frozenset[int] = frozenset(),
        tolerated: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        """Map `modular_lines` onto `generated_lines` by sequence matching of their normalized text."""
        modular_numbers, modular_texts = self._sequence(self.modular, modular_lines)
        generated_numbers, generated_texts = self._sequence(self.generated, generated_lines)
        matcher = difflib.SequenceMatcher(None, modular_texts, generated_texts, autojunk=False)
        unmatched: list[tuple[int, list[int]]] = []
        claimed: set[int] = set()
        for tag, first, last, generated_first, generated_last in matcher.get_opcodes():
            if tag == "equal":
                for offset in range(last - first):
                    self.result.lines[modular_numbers[first + offset]] = (generated_numbers[generated_first + offset],)
                    claimed.add(generated_first + offset)
            elif tag != "insert":
                unmatched.extend((index, list(range(generated_first, generated_last))) for index in range(first, last))
        # NOTE: the converter keeps an overridden attribute where the parent assigned it (`self.config = config`
        # moves up into the inlined parent `__init__`): an unmatched line equal to an unclaimed one elsewhere in
        # the same body is that line, moved.
        by_text: dict[str, list[int]] = {}
        for index, text in enumerate(generated_texts):
            if index not in claimed:
                by_text.setdefault(text, []).append(index)
        for index, block in unmatched:
            line = modular_numbers[index]
            moved = by_text.get(modular_texts[index])
            if moved:
                self.result.lines[line] = (generated_numbers[moved.pop(0)],)
                continue
            if modular_texts[index] in generated_texts:
                # NOTE: a line written twice (an annotation repeated in a class body) is generated once
                self.result.lines[line] = (generated_numbers[generated_texts.index(modular_texts[index])],)
                continue
            if line in inlined:
                if block:
                    self.result.lines[line] = tuple(generated_numbers[position] for position in block)
                continue
            similar = self._most_similar(modular_texts[index], [generated_texts[position] for position in block])
            if similar is not None:
                self.result.lines[line] = (generated_numbers[block[similar]],)
            # NOTE: a similar line may be an edit as well as a rewrite by the converter: it stays stale.
            if line not in tolerated:
                self.result.stale.append(StaleLine(line, self.modular.lines[line - 1].strip(), where))

    @staticmethod
    def _most_similar(text: str, candidates: list[str]) -> int | None:
        best, best_ratio = None, SIMILAR_LINE_RATIO
        for index, candidate in enumerate(candidates):
            ratio = difflib.SequenceMatcher(None, text, candidate, autojunk=False).ratio()
            if ratio >= best_ratio:
                best, best_ratio = index, ratio
        return best

    def function(
        self,
        modular: ast.FunctionDef | ast.AsyncFunctionDef,
        generated: ast.FunctionDef | ast.AsyncFunctionDef,
        where: str,
    ) -> None:
        self.result.lines[modular.lineno] = (generated.lineno,)
        inlined, dropped = _expected_gone(modular, self.modular.code)
        tolerated = dropped | _docstring_lines(modular) | set(_header_lines(modular))
        body_start = modular.lineno + 1
        modular_lines = list(range(body_start, (modular.end_lineno or modular.lineno) + 1))
        generated_lines = list(range(generated.lineno + 1, (generated.end_lineno or generated.lineno) + 1))
        self.match(modular_lines, generated_lines, where, inlined, tolerated)

    def class_body(self, modular: ast.ClassDef, generated: ast.ClassDef) -> None:
        """The class-level statements (attributes, `pass`), methods apart."""

        def own_statements(node: ast.ClassDef) -> list[int]:
            lines: list[int] = []
            for statement in node.body:
                if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    lines.extend(range(statement.lineno, (statement.end_lineno or statement.lineno) + 1))
            return lines

        # NOTE: `pass`, `...` and `x = AttributeError()` (a removed attribute) have no twin by design
        tolerated = _docstring_lines(modular) | {
            line
            for statement in modular.body
            if isinstance(statement, ast.Pass)
            or _removes_member(statement)
            or (isinstance(statement, ast.Expr) and getattr(statement.value, "value", None) is Ellipsis)
            for line in _own_lines(statement)
        }
        self.match(own_statements(modular), own_statements(generated), modular.name, tolerated=tolerated)


def _methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {item.name: item for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)}


def _removes_method(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """`def x(self): raise AttributeError("Not needed")` (or NotImplementedError): how a modular class removes an
    inherited method; the converter leaves it out of the generated class."""
    body = [statement for statement in function.body if not isinstance(statement, ast.Expr)]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


_DEFINITION_LINE = re.compile(r"^(?:class|def)\s+(\w+)", re.MULTILINE)


def sibling_definitions(modular_path: Path) -> set[str]:
    """Classes and functions the other files of a modular file's folder define (`configuration_x.py` gets the
    modular file's config class, `image_processing_x.py` its processor and helpers): not missing from the modeling
    file."""
    names: set[str] = set()
    generated = generated_path(modular_path)
    for sibling in sorted(modular_path.parent.glob("*.py")):
        if sibling == modular_path or sibling == generated or twin_rule(sibling) is not None:
            continue
        try:
            names.update(_DEFINITION_LINE.findall(sibling.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return names


def map_modular(
    modular_text: str,
    generated_text: str,
    modular_path: str | Path,
    generated_file: str | Path | None = None,
    elsewhere: set[str] | frozenset[str] = frozenset(),
) -> ModularMap:
    """Map a modular file's lines onto its generated file's, from the two texts. `elsewhere`: class names other
    generated files of the folder define (a config class is generated into `configuration_x.py`, not missing).
    Raises SyntaxError when either text does not parse."""
    modular_path = Path(modular_path)
    generated_file = Path(generated_file) if generated_file is not None else generated_path(modular_path)
    modular = _parse(modular_text, str(modular_path))
    generated = _parse(generated_text, str(generated_file))
    result = ModularMap(modular=str(modular_path), generated=str(generated_file))
    mapper = _Mapper(modular, generated, _Normalizer(_renames(modular, modular_path)), result)
    for node in modular.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            twin = generated.functions.get(node.name)
            if twin is None:
                # NOTE: the converter copies a function only when generated code uses it
                used = len(re.findall(rf"\b{re.escape(node.name)}\b", modular_text)) > 1
                if node.name not in elsewhere and used:
                    result.missing.append(node.name)
                continue
            mapper.function(node, twin, node.name)
        elif isinstance(node, ast.ClassDef):
            twin_class = generated.classes.get(node.name)
            if twin_class is None:
                if node.name not in elsewhere:
                    result.missing.append(node.name)
                continue
            result.classes[node.name] = (node.lineno, twin_class.lineno)
            result.lines[node.lineno] = (twin_class.lineno,)
            mapper.class_body(node, twin_class)
            generated_methods = _methods(twin_class)
            modular_methods = _methods(node)
            for name, method in modular_methods.items():
                twin_method = generated_methods.get(name)
                if twin_method is None:
                    if not _removes_method(method):
                        result.missing.append(f"{node.name}.{name}")
                    continue
                mapper.function(method, twin_method, f"{node.name}.{name}")
            parent = next((_last_name(base) for base in node.bases if _last_name(base)), None)
            for name, twin_method in generated_methods.items():
                if name in modular_methods or parent is None:
                    continue
                result.inherited.append(
                    InheritedMethod(
                        class_name=node.name,
                        method=name,
                        parent=parent,
                        class_line=node.lineno,
                        generated_start=twin_method.lineno,
                        generated_end=twin_method.end_lineno or twin_method.lineno,
                    )
                )
    return result


def map_modular_file(modular_path: str | Path) -> ModularMap:
    """The map of a modular file onto its generated twin, both read from disk (see `twins.resolve_generated` for
    the checked twin). Raises OSError / SyntaxError / UnicodeDecodeError as reading and parsing do."""
    path = Path(modular_path)
    twin = generated_path(path)
    return map_modular(
        path.read_text(encoding="utf-8"),
        twin.read_text(encoding="utf-8"),
        path,
        twin,
        sibling_definitions(path),
    )
