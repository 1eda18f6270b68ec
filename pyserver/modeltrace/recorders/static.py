"""Static analysis of `_can_record_outputs` (stdlib `ast` only, no torch: the language server imports this).

The names the rest of ModelTrace imports from here, re-exported from the steps that define them:
`reading.py` (the classes of one modeling file and how modules are wired into them), `declarations.py` (each
model's `_can_record_outputs` and output fields), `wiring.py` (the module tree under a base model),
`inference.py` (the entry each recordable key should have) and `checking.py` (the problems, and the
`analyze_*` entry points). Reading uses `ast` (fast); the edits that must keep the file's formatting are done
with libcst in `fixes.py`, which parses the file only when a fix is applied (`Analysis.module`).
"""

from __future__ import annotations

from modeltrace.recorders.checking import analyze_file, analyze_module, analyze_source
from modeltrace.recorders.declarations import read_can_record, resolve_can_record
from modeltrace.recorders.inference import ROUTER_NAMES, SELF_ATTENTION_NAMES, infer_recorder
from modeltrace.recorders.syntax import dotted
from modeltrace.recorders.types import (
    RECORDABLE_FIELDS,
    Analysis,
    CanRecord,
    ClassInfo,
    ModelUse,
    Problem,
    Recorder,
    Returns,
)
from modeltrace.recorders.wiring import CROSS_SEGMENT, Node, Wiring

__all__ = [
    "CROSS_SEGMENT",
    "RECORDABLE_FIELDS",
    "ROUTER_NAMES",
    "SELF_ATTENTION_NAMES",
    "Analysis",
    "CanRecord",
    "ClassInfo",
    "ModelUse",
    "Node",
    "Problem",
    "Recorder",
    "Returns",
    "Wiring",
    "analyze_file",
    "analyze_module",
    "analyze_source",
    "dotted",
    "infer_recorder",
    "read_can_record",
    "resolve_can_record",
]
