"""The records the static `_can_record_outputs` analysis reads, infers and reports (stdlib only, no torch).

Reading (`reading.py`, `declarations.py`) fills `ClassInfo` and `CanRecord`; checking (`checking.py`) produces
the `Analysis` with its `ModelUse`s and `Problem`s, whose fix is a `Recorder`; `fixes.py` writes it with libcst.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import libcst

# The output fields that transformers fills from `_can_record_outputs` hooks, in the order they are checked.
RECORDABLE_FIELDS = ("hidden_states", "attentions", "cross_attentions", "router_logits")


def default_index(key: str) -> int:
    """The element an `OutputRecorder` keeps when it names none: 0 for hidden states keys, 1 otherwise."""
    return 0 if "hidden_states" in key else 1


@dataclass
class Recorder:
    """One entry of `_can_record_outputs` (a class, a class-name string, or an `OutputRecorder(...)`)."""

    target: str | None  # dotted name of the target class as written
    index: int | None = None  # None: the default (0 for hidden states keys, 1 otherwise)
    layer_name: str | None = None
    class_name: str | None = None
    line: int = 0
    alternatives: list[str] | None = None  # several classes: written as a list

    def effective_index(self, key: str) -> int:
        if self.index is not None:
            return self.index
        return default_index(key)

    def normalized(self, key: str) -> tuple[str | None, int, str | None, str | None]:
        layer = self.layer_name.strip(".") if self.layer_name is not None else None
        return (self.target, self.effective_index(key), layer, self.class_name)

    def source(self, key: str) -> str:
        """The simplest form that is right: the bare class, else `OutputRecorder(...)`."""
        if self.alternatives:
            return "[" + ", ".join(self.alternatives) + "]"
        key_default = default_index(key)
        if self.index in (None, key_default) and self.layer_name is None and self.class_name is None:
            return self.target or ""
        parts = [self.target or "None"]
        if self.index is not None and self.index != key_default:
            parts.append(f"index={self.index}")
        elif self.index is not None and self.layer_name is not None:
            parts.append(f"index={self.index}")
        if self.layer_name is not None:
            parts.append(f'layer_name="{self.layer_name}"')
        return f"OutputRecorder({', '.join(parts)})"


@dataclass
class CanRecord:
    """A resolved `_can_record_outputs`: where it is written and its entries per key."""

    owner: str  # class whose body writes it
    line: int
    entries: dict[str, list[Recorder]]
    entry_lines: dict[str, int]
    is_literal: bool  # a dict literal written in `owner` that a fix can edit
    node: ast.expr | None = None
    unresolved: str | None = None  # why analysis gave up on (part of) it


@dataclass
class Returns:
    """What one `return` of a `forward` gives: kind is "tuple" (fixed length), "var" (a tuple built by
    concatenation, length known only at run time), "output" (a ModelOutput instance) or "value"."""

    kind: str
    names: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)  # "var": names appended last

    @property
    def is_tuple(self) -> bool:
        """A tuple of fixed or run-time length: an `OutputRecorder` keeps one element of it."""
        return self.kind in ("tuple", "var")


@dataclass
class ClassInfo:
    """What the file says about one class it defines: its bases, the modules it holds, its `forward`."""

    name: str
    bases: list[str]
    line: int
    node: ast.ClassDef | None
    attributes: dict[str, list[str]] = field(default_factory=dict)  # attr -> classes instantiated
    list_attributes: set[str] = field(default_factory=set)  # attrs holding a ModuleList/Sequential of modules
    dynamic_attributes: set[str] = field(default_factory=set)  # attrs assigned a call of a local name
    assigned: set[str] = field(default_factory=set)  # every `self.NAME = ...` in its methods
    has_forward: bool = False
    returns: list[Returns] = field(default_factory=list)
    capture_outputs: bool = False
    capture_line: int = 0
    output_classes: list[str] = field(default_factory=list)
    output_explicit: set[str] = field(default_factory=set)  # fields given explicitly in `return Output(...)`
    # fields passed on from what a submodule returned (`hidden_states=encoder_outputs.hidden_states`): the
    # attributes holding that submodule
    output_passed: dict[str, list[str]] = field(default_factory=dict)
    forward_params: list[str] = field(default_factory=list)
    init_params: list[str] = field(default_factory=list)
    param_attributes: dict[str, str] = field(default_factory=dict)  # `self.block = block`: parameter -> attribute
    can_record_node: ast.expr | None = None
    can_record_line: int = 0
    dataclass_fields: list[str] = field(default_factory=list)


@dataclass
class Problem:
    """One finding about a `_can_record_outputs`, with the entry its fix writes."""

    code: str
    message: str
    line: int
    key: str | None = None
    owner: str | None = None
    recorder: Recorder | None = None  # the entry a fix writes for `key`
    replace: bool = False  # the fix replaces the key's entry instead of adding it
    extra: dict[str, Any] = field(default_factory=dict)
    # "warning": the entry is wrong or missing; "hint": the file does not show it is wrong (an attention class
    # returning no weights, so that all a recorder could keep is its output), the fix writes what
    # transformers' own files usually write
    severity: str = "warning"

    def fix_json(self) -> dict[str, Any] | None:
        if self.code == "no-recorders" and self.owner and self.extra.get("entries"):
            entries: dict[str, Recorder] = self.extra["entries"]
            return {
                "class": self.owner,
                "entries": {key: recorder.source(key) for key, recorder in entries.items()},
                "replace": False,
            }
        if self.recorder is None or self.owner is None:
            return None
        return {
            "class": self.owner,
            "key": self.key,
            "entry": self.recorder.source(self.key or ""),
            "replace": self.replace,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "line": self.line,
            "severity": self.severity,
            "fix": self.fix_json(),
        }


@dataclass
class ModelUse:
    """A class whose forward is decorated with `@capture_outputs` and what it records."""

    cls: str
    line: int
    can_record: CanRecord | None
    output_fields: list[str] | None


@dataclass
class Analysis:
    """Everything the analysis of one file found: its classes, the models that capture outputs, the problems."""

    path: str | None
    classes: dict[str, ClassInfo]
    imported: set[str]
    uses: list[ModelUse]
    problems: list[Problem]
    notes: list[str]
    source: str | None = None  # None: not parsed (syntax error)
    tables: dict[str, list[str]] = field(default_factory=dict)
    _module: libcst.Module | None = None

    @property
    def module(self) -> libcst.Module | None:
        """The libcst module of the source (parsed on first use: only edits need it), None if unparsable."""
        if self.source is None:
            return None
        if self._module is None:
            import libcst as cst

            try:
                self._module = cst.parse_module(self.source)
            except Exception:  # noqa: BLE001 - ast accepted it; libcst may lag behind the grammar
                self.source = None
                return None
        return self._module
