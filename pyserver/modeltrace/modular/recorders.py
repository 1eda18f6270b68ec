"""`_can_record_outputs` checks on a modular file: the generated twin is what transformers runs, so it is checked,
and each problem is put on the modular line it comes from.

A declaration written in the modular file maps onto its generated line (`mapping`): the problem sits there. One
the modular class inherits from the parent model (or a class the modular file leaves to the converter) has no
modular line: the problem sits on the modular class, else on the first line, naming the generated line. Quick
fixes edit the modular file, never the generated one (`modular.fixes`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from modeltrace.modular.mapping import ModularMap, map_modular, sibling_definitions
from modeltrace.modular.twins import generated_path
from modeltrace.recorders import analyze_source
from modeltrace.recorders.static import Analysis, Problem


def _moved(problem: Problem, mapping: ModularMap, reverse: dict[int, list[int]], generated_name: str) -> Problem:
    lines = reverse.get(problem.line)
    where = f"{generated_name}:{problem.line}"
    if lines:
        message = f"{problem.message} (in {where}); fix it here, then regenerate {generated_name}"
        line = lines[0]
    else:
        owner_line = mapping.classes.get(problem.owner or "", (None, None))[0]
        line = owner_line or 1
        message = (
            f"{problem.message} (in {where}, which the modular file does not write: "
            + (
                f"{problem.owner} inherits it from its parent"
                if owner_line
                else f"the converter writes {problem.owner or 'that class'} from the parent model"
            )
            + f"); declare `_can_record_outputs` in {problem.owner or 'the class'} here, then regenerate {generated_name}"
        )
    # NOTE: no fix of its own (`fix_json` None: it would edit the generated file, which the converter overwrites);
    # the generated problem it came from is kept for the fixes that edit the modular file (`modular.fixes`)
    return dataclasses.replace(problem, line=line, message=message, recorder=None, extra={"generated": problem})


def analyze_modular(modular_source: str, modular_path: str | Path, mapping: ModularMap | None = None) -> Analysis:
    """The recorder analysis of a modular file: its generated twin's, with the problems on modular lines (`mapping`:
    the map of this source, when the caller has it). A note instead when the twin is missing or either file does not
    parse."""
    path = Path(modular_path)
    twin = generated_path(path)
    try:
        generated_source = twin.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return Analysis(
            str(path), {}, set(), [], [], [f"not analysed: its generated twin {twin} cannot be read ({error})"]
        )
    analysis = analyze_source(generated_source, str(twin))
    if mapping is None:
        try:
            mapping = map_modular(modular_source, generated_source, path, twin, sibling_definitions(path))
        except SyntaxError as error:
            return Analysis(str(path), {}, set(), [], [], [f"not analysed: syntax error at line {error.lineno}"])
    reverse = mapping.modular_lines()
    problems = [_moved(problem, mapping, reverse, twin.name) for problem in analysis.problems]
    return Analysis(
        str(path),
        analysis.classes,
        analysis.imported,
        analysis.uses,
        problems,
        [*analysis.notes, f"checked as its generated twin {twin.name}"],
        modular_source,
        analysis.tables,
    )
