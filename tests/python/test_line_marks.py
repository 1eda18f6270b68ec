"""Gutter marks of a diff (`diff.report.line_marks`): each line marked by the call that says most about where the
difference starts (a difference only inherited through the inputs is `inherited`, not orange), with the call and
layer that decide it, and the line the diff drilled down to (`Divergence.line`) marked as the divergence.

The example port (a real porting bug in its attention) is traced with full tensors and diffed against the
committed reference trace of the original.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, line_of
from modeltrace.diff import DIVERGENCE, MATCH, MISMATCH, close_result, diff_paths
from modeltrace.diff.result import DiffResult
from modeltrace.diff.lines import LineDivergence
from modeltrace.diff.report import INHERITED, LineMark, line_marks, line_statuses


PORT = REPO_ROOT / "examples" / "tiny_llama_port" / "modeling_tiny_llama_port.py"
REFERENCE = REPO_ROOT / "examples" / "reference" / "tiny_llama.mtrace"


@pytest.fixture(scope="module")
def port_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("port") / "port.mtrace"
    subprocess.run(
        [sys.executable, "-m", "modeltrace", "trace", str(PORT), "--full-tensors", "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def test_each_line_is_marked_by_where_the_difference_starts_and_says_which_call(port_trace: Path) -> None:
    result = diff_paths(REFERENCE, port_trace)
    try:
        marks = line_marks(result)
        assert {key: mark.status for key, mark in marks.items()} == line_statuses(result)
        file = str(PORT.resolve())
        attention = marks[(file, line_of(PORT, "hidden_states, _ = self.self_attn("))]
        assert attention.status == DIVERGENCE
        assert attention.message.startswith(
            "First divergence from the reference: layers.0.self_attn (TinyLlamaPortAttention), max abs diff 0.0107"
        )
        # Layer 0's q_proj matches: the line's code is right (green); layer 1's differs only because its inputs
        # already do (inherited), which the message says too.
        query = marks[(file, line_of(PORT, "query_states = self.q_proj("))]
        assert query.status == MATCH
        assert query.message.startswith("Matches the reference: layers.0.self_attn.q_proj")
        assert query.message.endswith("other calls on this line: 1 inherited (layers.1.self_attn.q_proj)")
        # A line whose every call only inherits the difference says so, with the first of them.
        output = marks[(file, line_of(PORT, "attn_output = self.o_proj(attn_output)"))]
        assert output.status == INHERITED
        assert output.message.startswith("Differs only through its inputs: layers.0.self_attn.o_proj")
        assert "its inputs already differ" in output.message
        assert marks[(file, line_of(PORT, "inputs_embeds = self.embed_tokens(input_ids)"))].status == MATCH
        # The lines of the decoder layer that run before the attention are green: layer 0 matches there, layer 1
        # only inherits layer 0's difference; the lines after it, which only carry the difference on, are inherited.
        assert marks[(file, line_of(PORT, "hidden_states = self.input_layernorm("))].status == MATCH
        assert marks[(file, line_of(PORT, "hidden_states = self.post_attention_layernorm("))].status == INHERITED
        assert marks[(file, line_of(PORT, "hidden_states = self.norm("))].status == INHERITED
        # The decoder layer's call: layer 0's inputs match and its outputs differ, so the difference arises in
        # it (orange), and the message says so; layer 1 is named as inherited.
        layer = marks[(file, line_of(PORT, "hidden_states = decoder_layer("))]
        assert layer.status == MISMATCH
        assert layer.message.startswith("Differs from the reference: layers.0, max abs diff")
        assert "the difference arises inside it" in layer.message
        assert layer.message.endswith("other calls on this line: 1 inherited (layers.1)")
        # Only the decoder layer's call (which holds the bug) is orange in the whole file.
        assert [key for key, mark in marks.items() if mark.status == MISMATCH] == [
            (file, line_of(PORT, "hidden_states = decoder_layer("))
        ]
    finally:
        close_result(result)


def test_the_line_the_diff_drilled_down_to_gets_the_divergence_mark(port_trace: Path) -> None:
    result = diff_paths(REFERENCE, port_trace)
    try:
        file = str(PORT.resolve())
        edited = line_of(PORT, "attn_output, attn_weights = attention_interface(")
        assert marks_at(result, file, edited) is None
        # NOTE: the drill-down set by hand to the edited line: the mark follows it
        result.first_divergence.line = LineDivergence(file, edited, "attn_output", 0.0107, "values differ")
        mark = marks_at(result, file, edited)
        assert mark is not None and mark.status == DIVERGENCE
        assert mark.message == (
            "First line that differs inside layers.0.self_attn: `attn_output`, max abs diff 0.0107 (values differ)"
        )
        # The call site keeps its own mark.
        assert marks_at(result, file, line_of(PORT, "hidden_states, _ = self.self_attn(")).status == DIVERGENCE
    finally:
        close_result(result)


def marks_at(result: DiffResult, file: str, line: int) -> LineMark | None:
    return line_marks(result).get((file, line))
