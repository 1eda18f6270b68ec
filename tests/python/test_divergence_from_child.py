"""The divergence's range narrows when its first differing value comes out of a child that has no counterpart
(`diff/evidence.py`): the cause is in that child or in the forward from the line that calls it to the call that
receives the value, not before (Gemma's embedder returns the embedding unscaled; the scale is missing after it)."""

from __future__ import annotations

from pathlib import Path

from modeltrace.diff.evidence import _from_child
from modeltrace.diff.lines import LineDivergence
from modeltrace.diff.result import Divergence, ModuleResult
from modeltrace.trace.records import ModuleCall, SourceRange

SOURCE = """class Embedder:
    def forward(self, x):
        weight = self.weight
        output = embedding(x, weight)
        return output


class Model:
    def forward(self, ids):
        positions = ids.arange()
        hidden = self.embedder(ids)
        normalizer = 8.0
        # hidden = hidden * normalizer
        return self.model(hidden)
"""


def _divergence(file: Path, line: LineDivergence) -> Divergence:
    call = ModuleCall(0, "", "Model", None, None, 0, -1)
    divergence = Divergence(ModuleResult(call, call), inputs_match=True)
    divergence.lines = SourceRange(str(file), 9, 14)
    divergence.line = line
    return divergence


def test_a_value_out_of_a_child_without_counterpart_narrows_the_range_to_its_call_and_after(tmp_path: Path) -> None:
    file = tmp_path / "model.py"
    file.write_text(SOURCE)
    found = LineDivergence(str(file), 4, "output", 1.0, "differs", called_from=(str(file), 11), module_call=1)
    assert _from_child(_divergence(file, found)) == SourceRange(str(file), 11, 14)


def test_the_range_stays_for_a_helper_of_the_own_call_or_a_child_whose_parameters_differ(tmp_path: Path) -> None:
    file = tmp_path / "model.py"
    file.write_text(SOURCE)
    helper = LineDivergence(str(file), 4, "output", 1.0, "differs", called_from=(str(file), 11), module_call=0)
    assert _from_child(_divergence(file, helper)) == SourceRange(str(file), 9, 14)
    parameters = LineDivergence(str(file), 2, "x", 1.0, "differs", called_from=(str(file), 11), module_call=1)
    assert _from_child(_divergence(file, parameters)) == SourceRange(str(file), 9, 14)
