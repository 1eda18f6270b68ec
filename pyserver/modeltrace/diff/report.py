"""What a diff shows: the JSON of the CLI contract, the readable report, per-line statuses, the plot's series.

`to_json` follows DESIGN.md (`{"match", "first_divergence", "modules"}`, plus alignment details);
`render_text` is the terminal report; `line_marks` / `line_statuses` give each (file, line) of the candidate that
called a module the most telling status of its calls and what decides it, for gutters (a difference a call only
inherits through its inputs is `inherited`, quieter than one that starts there); `plot_data` gives the max abs
difference of every module in the order the calls finished, and per numbered layer, for the plot of error per layer.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from modeltrace.diff.align import Alignment
from modeltrace.diff.pairing import Pairing
from modeltrace.diff.result import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    DiffResult,
    Divergence,
    ModuleResult,
    ReplayResult,
)
from modeltrace.diff.settings import ParameterDifference, SettingDifference
from modeltrace.diff.tolerances import DEFAULT_ATOL, DEFAULT_REL_TOL, DEFAULT_RTOL, scale_measures
from modeltrace.trace.records import SourceLocation, SourceRange, TensorSummary


STATUS_RANK = {NOT_COMPARED: 0, MATCH: 1, MISMATCH: 2, DIVERGENCE: 3}
# A line status only (gutters, `modelTrace/lineStatus`): the call's outputs differ, but only because its inputs
# already did (or its replay on the reference's inputs matches): the difference starts earlier, not on this line.
INHERITED = "inherited"
# NOTE: a line is decided by what it says about its own code: a divergence, then a call that differs on its own,
# then a match (the code gave the reference's values on the reference's inputs, in some call), then an inherited
# difference. So the lines that run before the bug stay green in the layer that holds it, and the difference is
# seen to start at the bug's line: the first red or orange mark in the order the lines run.
LINE_RANK = {NOT_COMPARED: 0, INHERITED: 1, MATCH: 2, MISMATCH: 3, DIVERGENCE: 4}


def _number(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _location(location: SourceLocation | None) -> dict[str, Any] | None:
    return location.to_json() if location is not None else None


def _describe(loaded) -> dict[str, Any]:
    model = loaded.trace.model
    return {
        "path": str(loaded.path),
        "kind": loaded.kind,
        "class": model.get("class"),
        "modules": len(loaded.trace.modules),
        "full_tensors": loaded.tensors is not None,
    }


def module_json(module: ModuleResult) -> dict[str, Any]:
    record = module.candidate
    data: dict[str, Any] = {
        "path": record.path,
        "call_index": record.call_index,
        "class": record.class_name,
        "status": module.status,
        "check": module.check,
        "max_abs_diff": _number(module.max_abs_diff),
        "max_rel_diff": _number(module.max_rel_diff),
        "inputs": module.inputs,
        "outputs": module.outputs,
        "called_at": _location(record.called_at),
        "defined_at": _location(record.defined_at),
        "finish_order": record.finish_order,
    }
    if module.reason:
        data["reason"] = module.reason
    if module.boundary:
        data["boundary"] = True
    if module.atol is not None:
        data["atol"], data["rtol"] = module.atol, module.rtol
    if module.rel_tol is not None:
        data["rel_tol"] = module.rel_tol
    if module.rel_err is not None:
        data["rel_err"] = _number(module.rel_err)
        data["cosine"] = _number(module.cosine)
    if module.reference is not None:
        data["compared"] = compared_json(module)
    if module.replay is not None:
        data["replay"] = replay_json(module.replay)
    for name in ("settings", "parameters"):
        values = getattr(module, name)
        if values:
            data[name] = [_jsonable(value) for value in values]
    if module.reference is not None and module.reference.path != record.path:
        data["reference_path"] = module.reference.path
    pair = module.pair
    if pair is not None:
        data["alignment"] = {
            "how": module.aligned_by,
            "confidence": pair.confidence,
            "evidence": pair.evidence,
            "fused": pair.fused,
            **({"mapping_line": pair.line} if pair.line else {}),
            **({"overlap": pair.overlap} if getattr(pair, "overlap", None) else {}),
        }
    if module.status in (MISMATCH, DIVERGENCE):
        data["differing"] = [
            {
                "side": side,
                "key": leaf.key,
                "check": leaf.check,
                "reason": leaf.reason,
                "max_abs_diff": _number(leaf.max_abs_diff),
            }
            for side, leaves in (("inputs", module.input_leaves), ("outputs", module.output_leaves))
            for leaf in leaves
            if leaf.status == MISMATCH
        ][:16]
    return data


def _jsonable(value: Any) -> Any:
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    return value


def _side_pairs(
    pairing: Pairing | None, refs: list[TensorSummary], cands: list[TensorSummary]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if pairing is None:
        return [
            {"reference": ref.key, "candidate": cand.key, "how": "same shape"} for ref, cand in zip(refs, cands)
        ], []
    pairs = [
        {
            "reference": pair.reference.key,
            "candidate": pair.candidate.key,
            "how": pair.describe(),
            "relation": pair.relation,
        }
        for pair in pairing.pairs
    ]
    # NOTE: a rotary table against its cosines and sines (`diff/rotary_tables.py`): one tensor against two
    pairs += [
        {
            "reference": table.complex_key if table.owner == "reference" else f"{table.cos_key} + {table.sin_key}",
            "candidate": table.complex_key if table.owner == "candidate" else f"{table.cos_key} + {table.sin_key}",
            "how": table.describe(),
            "relation": "rotary",
        }
        for table in pairing.tables
    ]
    left = [
        {"in": leaf.owner, "key": leaf.key, "shape": leaf.shape, "reason": leaf.reason} for leaf in pairing.left_out
    ]
    return pairs, left


def compared_json(module: ModuleResult) -> dict[str, Any]:
    """Which tensors of each side were compared with which, and which were left out and why."""
    reference, candidate = module.reference, module.candidate
    inputs, left_inputs = _side_pairs(module.input_pairing, reference.inputs, candidate.inputs)
    if reference.outputs and candidate.outputs:
        outputs, left_outputs = _side_pairs(module.output_pairing, reference.outputs, candidate.outputs)
    else:
        outputs, left_outputs = [], []
    left_out = [{"side": "inputs", **leaf} for leaf in left_inputs] + [
        {"side": "outputs", **leaf} for leaf in left_outputs
    ]
    return {"inputs": inputs, "outputs": outputs, "left_out": left_out}


def replay_json(replay: ReplayResult | None) -> dict[str, Any] | None:
    if replay is None:
        return None
    return {
        "status": replay.status,
        "reason": replay.reason,
        "max_abs_diff": _number(replay.max_abs_diff),
        "rel_err": _number(replay.rel_err),
        "cosine": _number(replay.cosine),
        "replaced": replay.replaced,
    }


def _range(lines: SourceRange | None) -> dict[str, Any] | None:
    return lines.to_json() if lines is not None else None


def _brief(module: ModuleResult | None) -> dict[str, Any] | None:
    if module is None:
        return None
    return {
        "path": module.candidate.path,
        "call_index": module.candidate.call_index,
        "called_at": _location(module.candidate.called_at),
    }


BOUNDARY_NOTE = (
    "its outputs differ but the next compared tensors match again: the other side does this part of the work "
    "outside the module (in its caller, or in the next module); a boundary difference, not a divergence"
)


def boundary_json(module: ModuleResult) -> dict[str, Any]:
    """One boundary difference (`divergence.find_divergence`), with both sides' call lines."""
    reference = module.reference
    return {
        "path": module.candidate.path,
        "reference_path": reference.path if reference is not None else None,
        "class": module.candidate.class_name,
        "called_at": _location(module.candidate.called_at),
        "reference_called_at": _location(reference.called_at) if reference is not None else None,
        "max_abs_diff": _number(module.max_abs_diff),
        "rel_err": _number(module.rel_err),
        "cosine": _number(module.cosine),
        "scale": _number(boundary_scale(module)),
        "absorbed_by": _brief(module.absorbed_by),
        "note": BOUNDARY_NOTE,
    }


def boundary_scale(module: ModuleResult) -> float | None:
    """For a boundary difference that is a constant factor (one output, cosine 1 to 1e-6): the reference's output
    over the candidate's (the ratio of their standard deviations), else None."""
    reference = module.reference
    if reference is None or len(reference.outputs) != 1 or len(module.candidate.outputs) != 1:
        return None
    if module.cosine is None or module.cosine < 1 - 1e-6:
        return None
    ref_std, cand_std = reference.outputs[0].std, module.candidate.outputs[0].std
    if not ref_std or not cand_std:
        return None
    return ref_std / cand_std


def divergence_json(divergence: Divergence | None) -> dict[str, Any] | None:
    if divergence is None:
        return None
    module = divergence.module
    record = module.candidate
    return {
        "path": record.path,
        "called_at": _location(record.called_at),
        "defined_at": _location(record.defined_at),
        "max_abs_diff": _number(module.max_abs_diff),
        "max_rel_diff": _number(module.max_rel_diff),
        "call_index": record.call_index,
        "class": record.class_name,
        "check": module.check,
        "inputs_match": divergence.inputs_match,
        "inferred": divergence.inferred,
        "reason": module.reason,
        "after": _brief(divergence.last_matching_child),
        "before": _brief(divergence.first_differing_child),
        "lines": _range(divergence.lines),
        "line": _jsonable(divergence.line) if divergence.line is not None else None,
        "built_at": _location(divergence.built_at),
        "settings": [_jsonable(value) for value in divergence.settings],
        "parameters": [_jsonable(value) for value in divergence.parameters],
        # NOTE: "inputs_match" rests on the paired inputs; these were compared with nothing (issue 30, item 9)
        "unpaired_inputs": [unpaired.to_json() for unpaired in divergence.unpaired_inputs],
        "rel_err": _number(module.rel_err),
        "cosine": _number(module.cosine),
        "by_replay": divergence.by_replay,
        "replay": replay_json(module.replay),
        "compared": compared_json(module) if module.reference is not None else None,
        # NOTE: a module without counterpart (`diff/unaligned.py`): the aligned call the search moved in from
        "compared_in": divergence.compared_in.candidate.path if divergence.compared_in is not None else None,
    }


def to_json(result: DiffResult) -> dict[str, Any]:
    """The `diff --format json` document."""
    alignment = result.alignment
    cand_records = result.candidate.trace.modules
    ref_records = result.reference.trace.modules
    counts: dict[str, int] = {}
    for module in result.modules:
        counts[module.status] = counts.get(module.status, 0) + 1
    document = {
        # NOTE: a diff with too little aligned is not a match (`verdict` "not_comparable", exit 2)
        "match": result.match and not result.not_comparable,
        "verdict": result.verdict,
        "not_comparable": result.not_comparable,
        "replayed": result.replayed,
        "first_divergence": divergence_json(result.first_divergence),
        # NOTE: differences the next compared tensors no longer show: never the first divergence
        "boundary_differences": [boundary_json(module) for module in result.boundary_differences],
        "modules": [module_json(module) for module in result.modules],
        "reference": _describe(result.reference),
        "candidate": _describe(result.candidate),
        "tolerance": {
            "atol": DEFAULT_ATOL if result.options.atol is None else result.options.atol,
            "rtol": DEFAULT_RTOL if result.options.rtol is None else result.options.rtol,
            # rtol left to its default follows half precision (float16 1e-3, bfloat16 1.6e-2)
            "dtype_aware": result.options.rtol is None,
            # ‖a-b‖/‖ref‖ allowed: the given value, or per dtype
            "rel_tol": result.options.rel_tol if result.options.rel_tol is not None else DEFAULT_REL_TOL,
            "atol_scaled": result.options.atol is None,
        },
        "counts": counts,
        "aligned": alignment.aligned_count,
        "unaligned": {
            "reference": [_label(ref_records[index]) for index in alignment.unaligned_reference],
            "candidate": [_label(cand_records[index]) for index in alignment.unaligned_candidate],
        },
        "pruned": [_label(cand_records[index]) for index in sorted(alignment.pruned)],
        "mapping": None
        if alignment.mapping is None
        else {
            "source": alignment.mapping.source,
            "pairs": len(alignment.mapping.pairs),
            "fused": sum(1 for pair in alignment.mapping.pairs if pair.fused),
            "threshold": alignment.mapping.threshold,
        },
        "notes": result.notes,
        # NOTE: tensor-parallel traces only (`diff/ranks.py`): rank divergences and the rank of a diverging shard
        **({"ranks": result.ranks} if result.ranks else {}),
    }
    _add_steps_and_gradients(result, document)
    return document


def _add_steps_and_gradients(result: DiffResult, document: dict[str, Any]) -> None:
    """Generation traces: `generation` and a `step` per module (and on the first divergence); backward traces:
    `gradients` (`diff/steps.py`, `diff/gradients.py`). Absent otherwise: the document of a forward diff is as it was."""
    step_of = result.candidate.trace.step_of
    if result.steps is not None:
        document["generation"] = result.steps.to_json()
        for module, entry in zip(result.modules, document["modules"]):
            entry["step"] = step_of(module.candidate.index)
        if document["first_divergence"] is not None and result.first_divergence is not None:
            document["first_divergence"]["step"] = step_of(result.first_divergence.module.candidate.index)
    if result.gradients is not None:
        document["gradients"] = result.gradients.to_json()


def steps_and_gradients_text(result: DiffResult) -> list[str]:
    """The lines the text report adds for generation and backward traces."""
    lines: list[str] = []
    steps = result.steps
    if steps is not None:
        lines.append(
            f"steps      {steps.compared_steps} compared (reference {steps.reference_steps}, candidate "
            f"{steps.candidate_steps}; step 0 is the prefill)"
        )
        if steps.first_diverging_step is None:
            lines.append("           every compared step agrees")
        else:
            lines.append(
                f"FIRST DIVERGING STEP: {steps.first_diverging_step}"
                + (
                    " (the prefill)"
                    if steps.first_diverging_step == 0
                    else " (a decode step; the prefill matches)"
                    if steps.first_diverging_step > 0
                    else ""
                )
            )
        token = steps.first_differing_token
        if token is not None:
            lines.append(
                f"           first differing generated token: #{token['position']} (row {token['row']}, "
                f"chosen at step {token['step']}): {token['reference']} in the reference, "
                f"{token['candidate']} in the candidate"
            )
        elif result.reference.trace.generation is not None and result.candidate.trace.generation is not None:
            lines.append("           the generated tokens are the same")
        cache = steps.first_differing_cache
        if cache is not None:
            lines.append(
                f"           first differing cache entry: step {cache['step']}, layer {cache['layer']} "
                f"({cache['kind']}-attention {cache['tensor']}, shapes {cache['reference_shape']} / "
                f"{cache['candidate_shape']})"
            )
    gradients = result.gradients
    if gradients is not None:
        divergence = gradients.first_divergence
        forward_agrees = result.first_divergence is None and not any(
            module.status == MISMATCH for module in result.modules
        )
        if divergence is None:
            lines.append("gradients  every compared gradient agrees (loss, module calls, parameters)")
        elif forward_agrees:
            lines.append("forward    every compared module's outputs agree: the difference is in the backward pass")
        if divergence is not None and divergence.kind == "loss":
            lines.append(f"FIRST GRADIENT DIVERGENCE: the loss: {divergence.reason}")
            if divergence.result is not None:
                lines.append(
                    f"  computed in {divergence.result.record.class_name}.forward, defined at "
                    f"{_where(divergence.result.record.defined_at)}"
                )
        elif divergence is not None:
            record = divergence.result.record
            title = (
                "FIRST GRADIENT DIVERGENCE"
                if divergence.outputs_match
                else "GRADIENT DIVERGENCE (output gradients already differ)"
            )
            lines.append(f"{title}: {record.path or '(root)'} ({record.class_name}), in backward order")
            lines.append(f"  called at   {_where(record.called_at)}")
            lines.append(f"  {divergence.reason}")
    if lines:
        lines.append("")
    return lines


def _label(record) -> str:
    return record.path if record.call_index == 0 else f"{record.path}#{record.call_index}"


@dataclass(frozen=True, slots=True)
class LineMark:
    """What a gutter mark says about one source line of the candidate: the most telling `status` of the calls
    made there (divergence > mismatch > match > inherited > not_compared, see `line_status`), and `message`, its
    hover: the call that decides it (the layer) and how the line's other calls compare."""

    status: str
    message: str


def _call_name(module: ModuleResult) -> str:
    record = module.candidate
    return (record.path or "(root)") + (f"#{record.call_index}" if record.call_index else "")


def line_status(module: ModuleResult) -> str:
    """The status one call gives its line: a mismatch whose difference comes only from its inputs (inputs
    already differ and no replay shows it differing on its own, or a replay on the reference's inputs that
    matches) is `INHERITED`; every other status is the module's own."""
    if module.status != MISMATCH:
        return module.status
    replay = module.replay
    if replay is not None and replay.status == MATCH:
        return INHERITED
    if module.inputs == MISMATCH and not (replay is not None and replay.status == MISMATCH):
        return INHERITED
    return MISMATCH


def _mark_message(decider: ModuleResult, calls: list[ModuleResult]) -> str:
    name, difference = _call_name(decider), _format_number(decider.max_abs_diff)
    status = line_status(decider)
    if status == DIVERGENCE:
        text = (
            f"First divergence from the reference: {name} ({decider.candidate.class_name}), max abs diff {difference}"
        )
        text += "; its inputs match, its outputs differ" if decider.inputs != MISMATCH else ""
    elif status == MISMATCH:
        text = f"Differs from the reference: {name}, max abs diff {difference}"
        text += "; its inputs match, so the difference arises inside it" if decider.inputs == MATCH else ""
    elif status == INHERITED:
        text = f"Differs only through its inputs: {name}, max abs diff {difference}"
        text += (
            " (a replay on the reference's inputs matches)"
            if decider.replay is not None and decider.replay.status == MATCH
            else " (its inputs already differ: the difference comes from earlier)"
        )
    elif status == MATCH:
        text = f"Matches the reference: {name}, max abs diff {difference}"
    else:
        text = f"Not compared with the reference: {name}" + (f" ({decider.reason})" if decider.reason else "")
    others = [module for module in calls if module is not decider]
    if others:
        counts: dict[str, list[str]] = {}
        for module in others:
            counts.setdefault(line_status(module), []).append(_call_name(module))
        text += "; other calls on this line: " + ", ".join(
            f"{len(names)} {status.replace('_', ' ')} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
            for status, names in sorted(counts.items(), key=lambda item: -LINE_RANK[item[0]])
        )
    return text


def line_marks(result: DiffResult) -> dict[tuple[str, int], LineMark]:
    """Per (file, 1-based line) of the candidate: the gutter mark of the line, decided by the call that says most
    about where the difference starts (`line_status`: a difference inherited through the inputs does not make a
    line orange, so lines that run before the bug keep the status of the calls that precede it).

    When the diff drilled down to a line inside the diverging module (`first_divergence.line`, from line
    records), that line is marked as the divergence too: it is the edited line, not only the call site; a
    setting its `__init__` computes differently marks the line that assigns it, a setting passed in or a
    parameter built differently the parent's line that built the module."""
    by_line: dict[tuple[str, int], list[ModuleResult]] = {}
    for module in result.modules:
        location = module.candidate.called_at
        if location is not None:
            by_line.setdefault((location.file, location.line), []).append(module)
    marks: dict[tuple[str, int], LineMark] = {}
    for key, calls in by_line.items():
        # NOTE: max keeps the first of equal ranks: calls are in call order, so layer 0 decides before layer 1.
        decider = max(calls, key=lambda module: LINE_RANK[line_status(module)])
        marks[key] = LineMark(line_status(decider), _mark_message(decider, calls))
    # NOTE: the divergence's first differing line, and the line that built it differently, are where the bug is
    divergence = result.first_divergence
    drilled = divergence.line if divergence is not None else None
    if drilled is not None:
        what = f"`{drilled.name}`" if drilled.name else "the value assigned here"
        marks[(drilled.file, int(drilled.line))] = LineMark(
            DIVERGENCE,
            f"First line that differs inside {_call_name(divergence.module)}: {what}, max abs diff "
            f"{_format_number(drilled.max_abs_diff)}" + (f" ({drilled.reason})" if drilled.reason else ""),
        )
        if drilled.called_from is not None:  # the forward's call into the helper where the values first differ
            marks[drilled.called_from] = LineMark(
                DIVERGENCE,
                f"The first difference inside {_call_name(divergence.module)} comes from this call: {what} differs "
                f"at {_short(drilled.file)}:{drilled.line}, max abs diff {_format_number(drilled.max_abs_diff)}",
            )
    if divergence is None:
        return marks
    # NOTE: a setting its `__init__` computes (`self.scaling = ...`) is wrong on that line; one passed in by the
    # parent, and the parameters, on the parent's line that built the module.
    for setting in divergence.settings:
        if setting.assigned_at is not None:
            marks[(setting.assigned_at.file, setting.assigned_at.line)] = LineMark(
                DIVERGENCE,
                f"{_call_name(divergence.module)} was built differently: {_setting(setting)}, assigned here",
            )
    passed = [setting for setting in divergence.settings if setting.assigned_at is None]
    if divergence.built_at is not None and (passed or divergence.parameters):
        built = "; ".join(
            [*(_setting(item) for item in passed), *(_parameter(item) for item in divergence.parameters)][:3]
        )
        marks[(divergence.built_at.file, divergence.built_at.line)] = LineMark(
            DIVERGENCE, f"{_call_name(divergence.module)} was built differently here: {built}"
        )
    return marks


def line_statuses(result: DiffResult) -> dict[tuple[str, int], str]:
    """Per (file, line) of the candidate where modules are called: the most telling status of the calls made
    there (divergence > mismatch > match > inherited > not_compared); see `line_marks` for the message of each."""
    return {key: mark.status for key, mark in line_marks(result).items()}


def line_statuses_for_file(result: DiffResult, file: str) -> dict[int, str]:
    return {line: status for (path, line), status in line_statuses(result).items() if path == file}


_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def plot_data(result: DiffResult) -> dict[str, Any]:
    """Series for the plot of error per module and per layer, in the order module calls finished.

    `points`: one per compared candidate module call ({"x", "path", "call_index", "max_abs_diff", "status",
    "check", "called_at"}); `layers`: the largest difference inside each numbered block (`layers.3`), in order;
    `atol`: the tolerance line; `first_divergence`: the x of the first divergence or None."""
    points = []
    layers: dict[str, dict[str, Any]] = {}
    divergence_x = None
    for module in result.finish_ordered():
        record = module.candidate
        if module.reference is None:
            continue
        x = len(points)
        if module.status == DIVERGENCE:
            divergence_x = x
        points.append(
            {
                "x": x,
                "path": record.path,
                "call_index": record.call_index,
                "max_abs_diff": _number(module.max_abs_diff),
                "status": module.status,
                "check": module.check,
                "called_at": _location(record.called_at),
            }
        )
        match = _LAYER.match(record.path)
        if match and module.max_abs_diff is not None:
            layer = layers.setdefault(match.group(1), {"layer": match.group(1), "max_abs_diff": 0.0, "status": MATCH})
            layer["max_abs_diff"] = max(layer["max_abs_diff"], _number(module.max_abs_diff) or 0.0)
            if STATUS_RANK[module.status] > STATUS_RANK[layer["status"]]:
                layer["status"] = module.status
    atol = result.options.atol
    return {
        "points": points,
        "layers": list(layers.values()),
        "atol": atol if atol is not None else 1e-3,
        "first_divergence": divergence_x,
    }


# ------------------------------------------------------------------------------------------------- text


def _short(file: str | None) -> str:
    if not file:
        return "?"
    try:
        relative = os.path.relpath(file)
    except ValueError:
        return file
    return relative if not relative.startswith("..") else file


def _where(location: SourceLocation | None) -> str:
    return f"{_short(location.file)}:{location.line}" if location is not None else "-"


def _format_number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"


def _kind(loaded) -> str:
    what = "ModelTrace trace" if loaded.kind == "modeltrace" else "transformers debugger output"
    tensors = "full tensors" if loaded.tensors is not None else "statistics only"
    return f"{what} of {loaded.trace.model.get('class') or '?'}, {len(loaded.trace.modules)} module calls, {tensors}"


def _mapping_source(alignment: Alignment) -> str:
    """How a mapping aligned the traces, for the report's header."""
    mapping = alignment.mapping
    fused = sum(1 for pair in mapping.pairs if pair.fused)
    lowest = min((pair.confidence for pair in mapping.pairs), default=1.0)
    counts = f"{len(mapping.pairs)} module pairs" + (f", {fused} fused (compared concatenated)" if fused else "")
    if mapping.source == "automatic":
        return (
            f"evidence, not names (no shared module paths): {counts}, confidence ≥ {lowest:.2f}; "
            "`modeltrace align` writes the mapping to read or fix, `--mapping FILE` uses it"
        )
    return f"the mapping file {mapping.source}: {counts}"


def render_text(result: DiffResult, verbose: bool = True) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"reference  {_short(str(result.reference.path))}  ({_kind(result.reference)})")
    add(f"candidate  {_short(str(result.candidate.path))}  ({_kind(result.candidate)})")
    options = result.options
    atol = "1e-3" if options.atol is None else f"{options.atol:g}"
    rtol = "0 (dtype-aware for half precision)" if options.rtol is None else f"{options.rtol:g}"
    alignment = result.alignment
    rel_tol = (
        "per dtype (float32 1e-4, float16 2e-3, bfloat16 2e-2)" if options.rel_tol is None else f"{options.rel_tol:g}"
    )
    add(
        f"aligned    {alignment.aligned_count} of {len(result.modules)} candidate module calls; "
        f"atol {atol}{' per unit of scale' if options.atol is None else ''}, rtol {rtol}, "
        f"relative error (‖a-b‖/‖ref‖) {rel_tol}"
    )
    if alignment.mapping is not None:
        add(f"aligned by {_mapping_source(alignment)}")
    if result.replayed:
        replayed = [module for module in result.modules if module.replay is not None]
        add(f"replay     {len(replayed)} suspect module calls re-run on the reference's inputs")
    for note in result.notes:
        add(f"note       {note}")
    for finding in result.ranks:
        add(f"{'RANK' if finding['kind'] == 'rank_divergence' else 'rank'}       {finding['message']}")
    for module in result.boundary_differences:
        sides = f"candidate {_where(module.candidate.called_at)}"
        if module.reference is not None:
            sides += f", reference {module.reference.path or '(root)'} at {_where(module.reference.called_at)}"
        scale = f", cosine {module.cosine:.6f}" if module.cosine is not None else ""
        factor = boundary_scale(module)
        scale += f", the reference's output is ×{factor:.6g} the candidate's" if factor is not None else ""
        after = module.absorbed_by
        where = (
            f"; {after.candidate.path or '(root)'} ({_where(after.candidate.called_at)}) receives matching inputs again"
            if after is not None
            else ""
        )
        add(
            f"boundary   {module.candidate.path or '(root)'}: max abs diff {_format_number(module.max_abs_diff)}"
            f"{scale} ({sides}){where}: {BOUNDARY_NOTE}"
        )
    root = next((module for module in result.modules if not module.candidate.path and module.reference), None)
    if root is not None and root.inputs == MISMATCH:
        add("note       the model's inputs differ: trace both with the same inputs (and seed) to compare them")
    add("")
    lines.extend(steps_and_gradients_text(result))
    divergence = result.first_divergence
    if result.not_comparable and divergence is None:
        add(f"NOT COMPARABLE: {result.not_comparable}")
    elif result.match:
        checks = [module.check for module in result.modules if module.status == MATCH]
        weaker = [
            f"{checks.count(name)} on {what}"
            for name, what in (("statistics", "statistics only, a weaker check"), ("shape", "shapes and dtypes only"))
            if checks.count(name)
        ]
        add("MATCH: every compared module agrees within tolerance" + (f" ({'; '.join(weaker)})." if weaker else "."))
    elif divergence is None and result.ranks:
        add(
            "RANK DIVERGENCE: ranks of a tensor-parallel trace disagree where they should hold the same tensor "
            "(see RANK above)"
        )
    elif divergence is not None:
        module = divergence.module
        record = module.candidate
        title = "FIRST DIVERGENCE" if divergence.inputs_match else "DIVERGENCE (inputs already differ)"
        label = record.path or "(root)"
        call = f", call {record.call_index}" if record.call_index else ""
        step = result.candidate.trace.step_of(record.index)
        call += f", step {step}" if step is not None else ""
        add(f"{title}: {label} ({record.class_name or '?'}{call})")
        add(f"  called at   {_where(record.called_at)}")
        add(f"  defined at  {_where(record.defined_at)}")
        if divergence.inferred:
            add(
                "  inputs match; its outputs are not in the reference, but a module it calls receives differing inputs"
            )
        else:
            inputs = "inputs match" if divergence.inputs_match else "inputs differ"
            check = {
                "full": "full tensors",
                "statistics": "statistics only, a weaker check",
                "shape": "shapes only",
            }.get(module.check or "", "")
            scale = scale_measures(module.rel_err, module.cosine, _format_number)
            add(
                f"  {inputs}, outputs differ: max abs diff {_format_number(module.max_abs_diff)}, "
                f"max rel diff {_format_number(module.max_rel_diff)}{scale}" + (f" ({check})" if check else "")
            )
            if module.reason:
                add(f"  {module.reason}")
        replay = module.replay
        if replay is not None:
            add("  " + _replay_text(replay))
        for text in _compared_text(module):
            add("  " + text)
        for unpaired in divergence.unpaired_inputs:
            add(f"  partial     inputs: {unpaired.text()} has no counterpart in the reference")
        if divergence.lines is not None:
            span = divergence.lines
            add(f"  look at     {_short(span.file)} lines {span.start}-{span.end}")
        after, before = divergence.last_matching_child, divergence.first_differing_child
        if after is not None or before is not None:
            parts = []
            if after is not None:
                parts.append(f"after {after.candidate.path} (line {_line(after)}) still matches")
            if before is not None:
                parts.append(f"{before.candidate.path} (line {_line(before)}) already receives differing inputs")
            where = _between(after, before)
            add("  inside it: " + "; ".join(parts) + (f": look at {where}" if where else ""))
    lines.extend(evidence_text(result))
    unaligned_ref = [result.reference.trace.modules[index] for index in alignment.unaligned_reference]
    unaligned_cand = [result.candidate.trace.modules[index] for index in alignment.unaligned_candidate]
    if unaligned_ref:
        add(f"not aligned in the reference ({len(unaligned_ref)}): " + _listing(unaligned_ref))
    if unaligned_cand:
        add(f"not aligned in the candidate ({len(unaligned_cand)}): " + _listing(unaligned_cand))
    if alignment.pruned:
        add(f"pruned from the reference ({len(alignment.pruned)} module calls, do_prune_layers)")
    if verbose:
        add("")
        add(f"  {'status':<11} {'check':<10} {'max abs':>9}  {'module':<44} called at")
        for module in result.finish_ordered():
            if module.reference is None:
                continue
            record = module.candidate
            label = (record.path or "(root)") + (f" #{record.call_index}" if record.call_index else "")
            status = module.status.upper() if module.status == DIVERGENCE else module.status
            add(
                f"  {status:<11} {module.check or '-':<10} {_format_number(module.max_abs_diff):>9}  "
                f"{label:<44} {_where(record.called_at)}"
            )
    counts: dict[str, int] = {}
    for module in result.modules:
        counts[module.status] = counts.get(module.status, 0) + 1
    add("")
    add(
        ", ".join(
            f"{counts.get(status, 0)} {status.replace('_', ' ')}"
            for status in (MATCH, DIVERGENCE, MISMATCH, NOT_COMPARED)
        )
    )
    return "\n".join(lines) + "\n"


def evidence_text(result: DiffResult, limit: int = 6) -> list[str]:
    """Report lines for the divergence's evidence (its first differing line, what differs in how it was built)
    and for the other modules built differently."""
    lines: list[str] = []
    divergence = result.first_divergence
    if divergence is not None:
        line = divergence.line
        if line is not None:
            lines.append(f"  first differing line  {_short(line.file)}:{line.line}: {line.reason}")
        built = f", built at {_where(divergence.built_at)}" if divergence.built_at is not None else ""
        for difference in divergence.settings:
            where = f", assigned at {_where(difference.assigned_at)}" if difference.assigned_at is not None else built
            lines.append(f"  {difference.path or '(root)'}: {_setting(difference)}{where}")
        for difference in divergence.parameters:
            lines.append(f"  {difference.path or '(root)'}: {_parameter(difference)}{built}")
    shown = {divergence.module.candidate.path} if divergence is not None else set()
    others: dict[str, ModuleResult] = {}
    for module in result.modules:
        path = module.candidate.path
        if (module.settings or module.parameters) and path not in shown:
            others.setdefault(path, module)
    if others:
        lines.append(f"built differently ({len(others)} modules):")
        for path, module in list(others.items())[:limit]:
            what = [_setting(item) for item in module.settings] + [_parameter(item) for item in module.parameters]
            built_at = next((build.built_at for build in result.candidate.trace.builds if build.path == path), None)
            where = f", built at {_where(built_at)}" if built_at is not None else ""
            lines.append(f"  {path or '(root)'}: {'; '.join(what[:3])}{where}")
        if len(others) > limit:
            lines.append(f"  … (+{len(others) - limit})")
    return lines


def _setting(difference: SettingDifference) -> str:
    note = f" ({difference.note})" if difference.note else ""
    return f"{difference.name} {difference.reference!r} (reference) vs {difference.candidate!r} (candidate){note}"


def _parameter(difference: ParameterDifference) -> str:
    value = f", max abs diff {_format_number(difference.max_abs_diff)}" if difference.max_abs_diff is not None else ""
    note = f" ({difference.note})" if difference.note else ""
    return f"{difference.name} {difference.status}{value}{note}"


def _replay_text(replay: ReplayResult) -> str:
    if replay.status == MATCH:
        return (
            "replayed on the reference's inputs: its output matches the reference's "
            f"(relative error {_format_number(replay.rel_err)})"
        )
    if replay.status == MISMATCH:
        return (
            "replayed on the reference's inputs: its output still differs (max abs diff "
            f"{_format_number(replay.max_abs_diff)}, relative error {_format_number(replay.rel_err)}): the "
            "difference arises in this module"
        )
    return f"replay not used: {replay.reason}"


def _compared_text(module: ModuleResult) -> list[str]:
    """What was compared with what, for the report's first divergence (only when not one-to-one)."""
    if module.reference is None or (module.input_pairing is None and module.output_pairing is None):
        return []
    data = compared_json(module)
    lines = []
    for side in ("inputs", "outputs"):
        pairs = data[side]
        if pairs:
            described = ", ".join(
                (pair["candidate"] or "(tensor)")
                + ("" if pair["reference"] == pair["candidate"] else f" ~ {pair['reference'] or '(tensor)'}")
                + ("" if pair["how"] == "same shape" else f" ({pair['how']})")
                for pair in pairs
            )
            lines.append(f"compared {side}: {described}")
    for leaf in data["left_out"][:8]:
        lines.append(
            f"left out: {leaf['in']} {leaf['side'][:-1]} {leaf['key'] or '(tensor)'} {leaf['shape']}: {leaf['reason']}"
        )
    return lines


def _line(module: ModuleResult) -> str:
    location = module.candidate.called_at
    return str(location.line) if location is not None else "?"


def _between(after: ModuleResult | None, before: ModuleResult | None) -> str | None:
    first = after.candidate.called_at if after is not None else None
    last = before.candidate.called_at if before is not None else None
    if first is not None and last is not None and first.file == last.file:
        return f"{_short(first.file)} lines {first.line}-{last.line}"
    if first is not None:
        return f"{_short(first.file)} after line {first.line}"
    if last is not None:
        return f"{_short(last.file)} before line {last.line}"
    return None


def _listing(records, limit: int = 6) -> str:
    labels = [_label(record) or "(root)" for record in records[:limit]]
    more = f", … (+{len(records) - limit})" if len(records) > limit else ""
    return ", ".join(labels) + more
