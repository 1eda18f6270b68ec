"""Checking each `_can_record_outputs` of a file against its module tree, and the entry points of the analysis.

For every model whose `forward` uses `@capture_outputs`: a missing declaration, an entry naming a class the file
neither defines nor imports, a `layer_name` matching no module, one attention class recorded for both self- and
cross-attention without a layer name, and a recordable output with no entry. Each problem carries the entry its
fix writes (inferred by `inference.py`); `fixes.py` writes it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TYPE_CHECKING

from modeltrace.recorders.declarations import output_fields, resolve_can_record
from modeltrace.recorders.inference import infer_recorder
from modeltrace.recorders.reading import read_module
from modeltrace.recorders.syntax import class_mro, short_name
from modeltrace.recorders.types import RECORDABLE_FIELDS, Analysis, CanRecord, ModelUse, Problem, Recorder
from modeltrace.recorders.wiring import Wiring, is_cross

if TYPE_CHECKING:
    import libcst

# A `forward` parameter holding states to attend to: cross-attention runs only on these.
_CROSS_INPUT = re.compile(r"encoder|cross|key_value|memory|context|condition", re.I)


# ------------------------------------------------------------------------------------------------- entry points


def analyze_source(source: str, path: str | None = None) -> Analysis:
    """Read and check one modeling file's text; never raises (what stops the analysis is a note)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return Analysis(path, {}, set(), [], [], [f"not analysed: syntax error at line {error.lineno}"])
    except Exception as error:  # noqa: BLE001 - never crash on odd input
        return Analysis(path, {}, set(), [], [], [f"not analysed: {type(error).__name__}: {error}"])
    classes, imported, tables = read_module(tree)
    analysis = Analysis(path, classes, imported, [], [], [], source, tables)
    try:
        check_analysis(analysis)
    except Exception as error:  # noqa: BLE001
        analysis.notes.append(f"analysis gave up: {type(error).__name__}: {error}")
    return analysis


def analyze_module(module: libcst.Module, source: str | None = None, path: str | None = None) -> Analysis:
    """Analyse a libcst module (kept on the result, so that fixes do not parse it again)."""
    analysis = analyze_source(module.code if source is None else source, path)
    if analysis.source is not None:
        analysis._module = module
    return analysis


def analyze_file(path: str | Path) -> Analysis:
    path = Path(path)
    return analyze_source(path.read_text(encoding="utf-8"), str(path))


# ------------------------------------------------------------------------------------------------------- checks


def check_analysis(analysis: Analysis) -> None:
    """Find the models that capture outputs, then check each `_can_record_outputs` they resolve to."""
    users_by_owner = _collect_uses(analysis)
    for use in analysis.uses:
        if use.can_record is None:
            _check_missing_declaration(analysis, use)
    for users in users_by_owner.values():
        can_record = resolve_can_record(analysis, users[0])
        if can_record is None or can_record.unresolved:
            continue
        _check_entries(analysis, can_record, users)


def _collect_uses(analysis: Analysis) -> dict[str, list[str]]:
    """Add a `ModelUse` per `@capture_outputs` model; return the models using each declaration, by owner."""
    users_by_owner: dict[str, list[str]] = {}
    for info in analysis.classes.values():
        if not info.capture_outputs:
            continue
        can_record = resolve_can_record(analysis, info.name)
        use = ModelUse(info.name, info.capture_line, can_record, output_fields(analysis, info))
        analysis.uses.append(use)
        if can_record is not None:
            users_by_owner.setdefault(can_record.owner, []).append(info.name)
            if can_record.unresolved:
                analysis.notes.append(f"line {can_record.line}: {can_record.unresolved}; not checked")
    return users_by_owner


def _check_missing_declaration(analysis: Analysis, use: ModelUse) -> None:
    """A model with no `_can_record_outputs` at all: the problem carries every entry the fix would write."""
    classes = analysis.classes
    info = classes[use.cls]
    pretrained = next(
        (owner for owner in class_mro(classes, use.cls) if owner != use.cls and "PreTrainedModel" in owner), None
    )
    if any(
        short_name(base) not in classes
        for base in info.bases
        if base and base != "nn.Module" and "PreTrainedModel" not in base
    ):
        analysis.notes.append(f"line {use.line}: {use.cls} inherits from a class of another file; not checked")
        return
    owner = pretrained or use.cls
    keys = recordable_keys(analysis, use)
    if not keys:
        return  # every recordable output is given explicitly: nothing for hooks to record
    problem = Problem(
        "no-recorders",
        f"{use.cls}.forward uses @capture_outputs but {owner} has no _can_record_outputs",
        use.line,
        owner=owner,
    )
    recorders: dict[str, Recorder] = {}
    for key in keys:
        recorder = infer_recorder(analysis, [use.cls], key, {}, set(keys))
        if recorder:
            recorders[key] = recorder
    problem.extra["entries"] = recorders
    if not recorders:
        problem.owner = None
    analysis.problems.append(problem)


def weights_evidence(analysis: Analysis, users: list[str], key: str, recorder: Recorder) -> str:
    """For an attention key: "weights" when the target returns something at the index, "none" when it
    returns a literal None there, "output only" when it never returns a tuple."""
    if "attentions" not in key or recorder.alternatives or recorder.target not in analysis.classes:
        return "weights"
    wiring = Wiring(analysis, users)
    returns = wiring.returns(recorder.target)
    if not returns:
        return "weights"
    if all(shape.kind in ("value", "output") for shape in returns):
        return "output only"
    index = recorder.effective_index(key)
    if all(
        shape.kind == "tuple" and -len(shape.names) <= index < len(shape.names) and shape.names[index] == "None"
        for shape in returns
    ):
        return "none"
    return "weights"


def explicit_fields(analysis: Analysis, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The output fields `name.forward` gives a value of its own (the hooks' value then is not needed): given
    explicitly, or passed on from a submodule that records or gives them itself."""
    classes = analysis.classes
    info = classes[name]
    explicit = set(info.output_explicit)
    attributes: dict[str, list[str]] = {}
    for owner in reversed(class_mro(classes, name)):
        attributes.update(classes[owner].attributes)
    passed = dict(info.output_passed)
    if "*" in passed:
        for key in RECORDABLE_FIELDS:
            passed.setdefault(key, []).extend(passed["*"])
        del passed["*"]
    for key, sources in passed.items():
        for attribute in sources:
            for module_class in attributes.get(attribute, []):
                module_class = short_name(module_class)
                if module_class not in classes or module_class in seen:
                    explicit.add(key)  # a module of another file: assume it fills it
                    continue
                if any(classes[owner].capture_outputs for owner in class_mro(classes, module_class)) or key in (
                    explicit_fields(analysis, module_class, seen | {name})
                ):
                    explicit.add(key)
    return explicit


def recordable_keys(analysis: Analysis, use: ModelUse) -> list[str]:
    """The recordable output fields of `use` its hooks must fill. Cross-attention only runs on encoder states
    (or other states to attend to), so `cross_attentions` counts only for a forward that takes them."""
    keys = keys_to_record(use, explicit_fields(analysis, use.cls))
    classes = analysis.classes
    params = next(
        (classes[owner].forward_params for owner in class_mro(classes, use.cls) if classes[owner].has_forward), []
    )
    if "cross_attentions" in keys and not any(_CROSS_INPUT.search(param) for param in params):
        keys.remove("cross_attentions")
    return keys


def keys_to_record(use: ModelUse, explicit: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The recordable fields of the model's outputs that it does not give explicitly."""
    if use.output_fields is None:
        return []
    return [key for key in RECORDABLE_FIELDS if key in use.output_fields and key not in explicit]


# ------------------------------------------------------------------------------------------ one declaration


def _check_entries(analysis: Analysis, can_record: CanRecord, users: list[str]) -> None:
    """Check one resolved `_can_record_outputs` used by the models `users`."""
    uses = [use for use in analysis.uses if use.cls in users]
    keys = {key for use in uses for key in recordable_keys(analysis, use)}
    _check_unknown_classes(analysis, can_record)
    _check_layer_names(analysis, can_record, users, uses, keys)
    # self- and cross-attention sharing a class with no layer_name (only when both keys are recorded)
    if "cross_attentions" in keys and "attentions" in keys:
        _check_shared_attention_classes(analysis, can_record, users, keys)
    _check_missing_entries(analysis, can_record, users, uses, keys)


def _fixable_owner(analysis: Analysis, can_record: CanRecord) -> str | None:
    """The class whose dict a fix edits: the owner, when its `_can_record_outputs` is a dict literal."""
    writable = isinstance(analysis.classes[can_record.owner].can_record_node, ast.Dict)
    return can_record.owner if writable else None


def _check_unknown_classes(analysis: Analysis, can_record: CanRecord) -> None:
    known = set(analysis.classes) | analysis.imported
    for key, recorders in can_record.entries.items():
        for recorder in recorders:
            if recorder.target and recorder.target.split(".")[0] not in known:
                analysis.problems.append(
                    Problem(
                        "unknown-class",
                        f"_can_record_outputs[{key!r}]: {recorder.target} is neither defined nor imported in "
                        "this file",
                        can_record.line,
                        key,
                    )
                )


def _check_layer_names(
    analysis: Analysis, can_record: CanRecord, users: list[str], uses: list[ModelUse], keys: set[str]
) -> None:
    """A `layer_name` whose parts are not attribute names of the file matches no module."""
    classes = analysis.classes
    line = can_record.line
    attribute_names = {attribute for info in classes.values() for attribute in info.assigned}
    dynamic = any(info.dynamic_attributes or "*" in info.assigned for info in classes.values())
    fields = (
        None
        if any(use.output_fields is None for use in uses)
        else {field for use in uses for field in use.output_fields}
    )
    for key, recorders in can_record.entries.items():
        if fields is not None and key not in fields:
            analysis.notes.append(
                f"line {line}: _can_record_outputs[{key!r}]: no output of {', '.join(users)} has this field; "
                "entry not checked"
            )
            continue
        for recorder in recorders:
            if recorder.layer_name is None:
                continue
            parts = [part for part in recorder.layer_name.strip(".").split(".") if part and not part.isdigit()]
            if (
                parts
                and attribute_names
                and not all(part in attribute_names for part in parts)
                and not ("*" in attribute_names and dynamic)
            ):
                replacement = infer_recorder(analysis, users, key, can_record.entries, keys)
                analysis.problems.append(
                    Problem(
                        "unknown-layer-name",
                        f"_can_record_outputs[{key!r}]: layer_name {recorder.layer_name!r} matches no module of "
                        "this file",
                        line,
                        key,
                        _fixable_owner(analysis, can_record) if replacement else None,
                        replacement,
                        replace=True,
                    )
                )


def _check_shared_attention_classes(
    analysis: Analysis, can_record: CanRecord, users: list[str], keys: set[str]
) -> None:
    """One attention class recorded for both self- and cross-attention without a layer name."""
    wiring = Wiring(analysis, users)
    chains = wiring.attention_chains([layer for layer in wiring.layers() if layer not in users])
    self_classes = {chain.innermost for chain in chains if not is_cross(chain.relative_path, chain.innermost)}
    cross_classes = {chain.innermost for chain in chains if is_cross(chain.relative_path, chain.innermost)}
    shared = self_classes & cross_classes
    for key in ("attentions", "cross_attentions"):
        for recorder in can_record.entries.get(key, []):
            short = short_name(recorder.target or "")
            if short not in shared or recorder.layer_name is not None:
                continue
            replacement = infer_recorder(analysis, users, key, can_record.entries, keys)
            if replacement is None or short_name(replacement.target or "") == short and replacement.layer_name is None:
                continue
            analysis.problems.append(
                Problem(
                    "shared-attention-class",
                    f"_can_record_outputs[{key!r}]: {short} is used for both self- and cross-attention; without "
                    f"layer_name both land in {key!r}",
                    can_record.line,
                    key,
                    _fixable_owner(analysis, can_record),
                    replacement,
                    replace=True,
                )
            )


def _check_missing_entries(
    analysis: Analysis, can_record: CanRecord, users: list[str], uses: list[ModelUse], keys: set[str]
) -> None:
    """Output fields with no recorder, reported once per key, when the tree shows what should record them."""
    line = can_record.line
    missing_reported: set[str] = set()
    for use in uses:
        for key in recordable_keys(analysis, use):
            if key in can_record.entries or key in missing_reported:
                continue
            recorder = infer_recorder(analysis, users, key, can_record.entries, keys)
            if recorder is None:
                continue  # no evidence the model has such a module: no alarm
            missing_reported.add(key)
            evidence = weights_evidence(analysis, users, key, recorder)
            if evidence == "none":
                analysis.notes.append(
                    f"line {line}: {key!r} has no recorder, but {recorder.target} returns None where attention "
                    "weights would be; nothing to record"
                )
                continue
            analysis.problems.append(_missing_recorder_problem(analysis, can_record, use, key, recorder, evidence))


def _missing_recorder_problem(
    analysis: Analysis, can_record: CanRecord, use: ModelUse, key: str, recorder: Recorder, evidence: str
) -> Problem:
    problem = Problem(
        "missing-recorder",
        f"{use.cls} returns {key!r} but {can_record.owner}._can_record_outputs has no recorder for it "
        f"(expected {recorder.source(key)})",
        can_record.line,
        key,
        _fixable_owner(analysis, can_record),
        recorder,
    )
    if evidence == "output only":
        problem.severity = "hint"
        problem.message = (
            f"{use.cls} returns {key!r} and {can_record.owner}._can_record_outputs has no recorder for it; "
            f"{recorder.target} returns its output only (no attention weights), which transformers' files "
            f"often record anyway: {recorder.source(key)}"
        )
    return problem
