"""Reading what a file declares: each model's `_can_record_outputs` and the fields of the outputs it returns.

A `_can_record_outputs` is resolved the way Python would find it (own, inherited from a class of the file, or a
dict built from a parent's with `**Parent._can_record_outputs` or `|`); each entry is parsed into a `Recorder`.
The output fields come from the file's own output dataclasses and from transformers' `modeling_outputs.py`,
read as text (no import).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

from modeltrace.recorders.syntax import class_mro, dotted, int_value, is_none, short_name, string_value
from modeltrace.recorders.types import Analysis, CanRecord, ClassInfo, Recorder

# The positional parameters of `OutputRecorder(target_class, index, layer_name, class_name)`.
_OUTPUT_RECORDER_POSITIONAL = ("target", "index", "layer_name", "class_name")
# `OutputRecorder` keywords that do not change which modules are hooked nor what is kept.
_IGNORED_RECORDER_KEYWORDS = ("capture_initial_hidden_state", "num_hidden_layers_key")
_CAN_RECORD_SUFFIX = "._can_record_outputs"


@functools.lru_cache(maxsize=1)
def library_outputs() -> dict[str, list[str]]:
    """Fields of the output dataclasses of transformers' `modeling_outputs.py`, read as text (no import)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "modeling_outputs.py"
    try:
        module = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    classes: dict[str, tuple[list[str], list[str]]] = {}  # name -> (bases, own fields)
    for statement in module.body:
        if isinstance(statement, ast.ClassDef):
            fields = [
                dotted(member.target)
                for member in statement.body
                if isinstance(member, ast.AnnAssign) and dotted(member.target)
            ]
            classes[statement.name] = ([dotted(base) or "" for base in statement.bases], fields)

    def resolve(name: str, seen: frozenset[str] = frozenset()) -> list[str]:
        if name not in classes or name in seen:
            return []
        bases, fields = classes[name]
        result: list[str] = []
        for base in bases:
            result.extend(field for field in resolve(base, seen | {name}) if field not in result)
        result.extend(field for field in fields if field not in result)
        return result

    return {name: resolve(name) for name in classes}


def parse_recorder(node: ast.AST, line: int) -> Recorder | None:
    """One entry as written: a class-name string, a class, or `OutputRecorder(...)`; None if not literal."""
    string = string_value(node)
    if string is not None:
        return Recorder(None, class_name=string, line=line)
    name = dotted(node)
    if name:
        return Recorder(name, line=line)
    if isinstance(node, ast.Call) and short_name(dotted(node.func) or "") == "OutputRecorder":
        return _parse_output_recorder(node, line)
    return None


def _parse_output_recorder(node: ast.Call, line: int) -> Recorder | None:
    recorder = Recorder(None, line=line)
    arguments: list[tuple[str | None, ast.expr]] = [
        (_OUTPUT_RECORDER_POSITIONAL[position] if position < len(_OUTPUT_RECORDER_POSITIONAL) else None, argument)
        for position, argument in enumerate(node.args)
    ]
    arguments += [(keyword.arg, keyword.value) for keyword in node.keywords]
    for keyword, value in arguments:
        if keyword in ("target", "target_class"):
            if is_none(value):
                recorder.target = None
            else:
                recorder.target = dotted(value)
                if recorder.target is None:
                    return None
        elif keyword == "index":
            recorder.index = int_value(value)
            if recorder.index is None:
                return None
        elif keyword in ("layer_name", "class_name"):
            text = None if is_none(value) else string_value(value)
            if text is None and not is_none(value):
                return None
            setattr(recorder, keyword, text)
        elif keyword in _IGNORED_RECORDER_KEYWORDS:
            pass
        else:
            return None
    return recorder


def resolve_can_record(analysis: Analysis, name: str, seen: frozenset[str] = frozenset()) -> CanRecord | None:
    """The `_can_record_outputs` class `name` resolves to, following its bases inside the file."""
    classes = analysis.classes
    for owner in class_mro(classes, name):
        info = classes[owner]
        if info.can_record_node is None:
            continue
        return read_can_record(analysis, info, seen | {owner})
    return None


def read_can_record(analysis: Analysis, info: ClassInfo, seen: frozenset[str]) -> CanRecord:
    """The entries of the `_can_record_outputs` written in `info`'s body (`seen`: the owners being resolved)."""
    node = info.can_record_node
    result = CanRecord(info.name, info.can_record_line, {}, {}, False, node)
    if is_none(node):
        return result
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left = _dict_from_expression(analysis, node.left, seen)
        right = _dict_from_expression(analysis, node.right, seen)
        if left is None or right is None or left.unresolved or right.unresolved:
            result.unresolved = f"{info.name}._can_record_outputs is built dynamically"
            return result
        result.entries = {**left.entries, **right.entries}
        return result
    if not isinstance(node, ast.Dict):
        result.unresolved = f"{info.name}._can_record_outputs is built dynamically"
        return result
    result.is_literal = True
    for key_node, value_node in zip(node.keys, node.values):
        if key_node is None:
            _read_unpacked_parent(analysis, info, value_node, seen, result)
        else:
            _read_literal_entry(info, key_node, value_node, result)
    return result


def _read_unpacked_parent(
    analysis: Analysis, info: ClassInfo, value_node: ast.expr, seen: frozenset[str], result: CanRecord
) -> None:
    """`**Parent._can_record_outputs` inside the dict: the parent's entries, and a dict a fix no longer edits."""
    parent = _dict_from_expression(analysis, value_node, seen)
    if parent is None or parent.unresolved:
        result.unresolved = f"{info.name}._can_record_outputs unpacks something the analysis cannot resolve"
        return
    result.entries.update(parent.entries)
    result.is_literal = False


def _read_literal_entry(info: ClassInfo, key_node: ast.expr, value_node: ast.expr, result: CanRecord) -> None:
    """`"key": Recorder` or `"key": [Recorder, ...]`."""
    key = string_value(key_node)
    if key is None:
        result.unresolved = f"{info.name}._can_record_outputs has a key that is not a string literal"
        return
    values = value_node.elts if isinstance(value_node, (ast.List, ast.Tuple)) else [value_node]
    recorders: list[Recorder] = []
    for value in values:
        recorder = parse_recorder(value, info.can_record_line)
        if recorder is None:
            result.unresolved = f"{info.name}._can_record_outputs[{key!r}] is built dynamically"
            return
        recorders.append(recorder)
    result.entries[key] = recorders
    result.entry_lines[key] = key_node.lineno


def _dict_from_expression(analysis: Analysis, node: ast.AST, seen: frozenset[str]) -> CanRecord | None:
    """`Parent._can_record_outputs` or a dict literal, as an operand of `|` or `**`; None if neither."""
    name = dotted(node)
    if name and name.endswith(_CAN_RECORD_SUFFIX):
        owner = short_name(name[: -len(_CAN_RECORD_SUFFIX)])
        if owner in analysis.classes and owner not in seen:
            return resolve_can_record(analysis, owner, seen)
        return None
    if isinstance(node, ast.Dict):
        anonymous = ClassInfo("<dict>", [], 0, None)
        anonymous.can_record_node = node
        return read_can_record(analysis, anonymous, seen)
    return None


def output_fields(analysis: Analysis, info: ClassInfo) -> list[str] | None:
    """The fields of the outputs `info.forward` returns; None when none of its output classes is known."""
    library = library_outputs()
    fields: list[str] = []
    found = False
    for name in info.output_classes:
        short = short_name(name)
        alias = analysis.tables.get(short, [])
        if short not in analysis.classes and len(alias) == 1:
            short = short_name(alias[0])  # `WavLMBaseModelOutput = Wav2Vec2BaseModelOutput`
        if short in analysis.classes:
            found = True
            for owner in reversed(class_mro(analysis.classes, short)):
                fields.extend(field for field in analysis.classes[owner].dataclass_fields if field not in fields)
            for base in analysis.classes[short].bases:
                fields.extend(field for field in library.get(short_name(base), []) if field not in fields)
        elif short in library:
            found = True
            fields.extend(field for field in library[short] if field not in fields)
    return fields if found else None
