"""Line-level capture: the tensors each line assigned, on the line the reader sees.

Checked on the example, on transformers' Llama and BERT files (shapes and statistics against tensors
computed directly), and on a toy module written to exercise multi-line statements, tuple unpacking,
comprehensions and early returns, whose expected lines are marked in its source.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

from modeltrace.trace.lines import HintDetail, index_module_calls, line_label
from modeltrace.trace.records import Trace
from modeltrace.worker.build import build_from_file
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.lines import LineCapture

from conftest import EXAMPLE_MODELING_FILE, line_of


LLAMA_FILE = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"
BERT_FILE = Path(transformers.__file__).parent / "models" / "bert" / "modeling_bert.py"


def _run(file: Path) -> tuple[object, Trace]:
    built = build_from_file(file, None, None, seed=0)
    with torch.no_grad():
        plain = built.model(**built.kwargs)[0]
        with ModuleCapture(built.model) as capture, LineCapture([str(file)], capture.summary_cache, capture.pending) as lines:
            captured = built.model(**built.kwargs)[0]
    assert torch.equal(plain, captured), "line capture changed the result"
    return built, Trace(model={}, modules=capture.records, lines=lines.records)


def _records(trace: Trace, file: Path, snippet: str, name: str, occurrence: int = 0) -> list:
    line = line_of(file, snippet, occurrence)
    found = [record for record in trace.lines if record.line == line and record.name == name]
    assert found, f"nothing recorded for {name!r} on line {line} ({snippet!r})"
    return found


def test_example_lines_show_the_assigned_shapes() -> None:
    _, trace = _run(EXAMPLE_MODELING_FILE)
    expected = {
        ("query_states = self.q_proj(hidden_states)", "query_states"): [1, 4, 7, 16],
        ("key_states = self.k_proj(hidden_states)", "key_states"): [1, 2, 7, 16],
        ("cos, sin = position_embeddings", "cos"): [1, 7, 16],
        ("cos, sin = position_embeddings", "sin"): [1, 7, 16],
        ("variance = hidden_states.pow(2)", "variance"): [1, 7, 1],
        ("attn_weights = torch.matmul(query, key_states.transpose(2, 3))", "attn_weights"): [1, 4, 7, 7],
        ("x1 = x[..., : x.shape[-1] // 2]", "x1"): [1, 4, 7, 8],
    }
    for (snippet, name), shape in expected.items():
        records = _records(trace, EXAMPLE_MODELING_FILE, snippet, name)
        assert records[0].tensor.shape == shape, (snippet, name)
        assert records[0].tensor.dtype == "float32"
    # A line that runs once per layer aggregates into one entry with a count.
    assert len(_records(trace, EXAMPLE_MODELING_FILE, "query_states = self.q_proj(hidden_states)", "query_states")) == 2
    entries = index_module_calls(trace)[str(EXAMPLE_MODELING_FILE.resolve())]
    two_names = entries[line_of(EXAMPLE_MODELING_FILE, "query_states, key_states = apply_rotary_pos_emb(")]
    assert line_label(two_names) == "query_states: [1, 4, 7, 16] float32 ×2  key_states: [1, 2, 7, 16] float32 ×2"
    assert line_label(entries[line_of(EXAMPLE_MODELING_FILE, "variance = hidden_states.pow(2)")], HintDetail.SHAPE) == "[1, 7, 1] ×5"


def test_example_statistics_match_a_direct_computation() -> None:
    built, trace = _run(EXAMPLE_MODELING_FILE)
    model = built.model
    with torch.no_grad():
        embeddings = model.embed_tokens(built.kwargs["input_ids"])
        variance = embeddings.pow(2).mean(-1, keepdim=True)
        query = model.layers[0].self_attn.q_proj(model.layers[0].input_layernorm(embeddings)).view(1, 7, -1, 16).transpose(1, 2)
    first_variance = _records(trace, EXAMPLE_MODELING_FILE, "variance = hidden_states.pow(2)", "variance")[0].tensor
    assert first_variance.mean == pytest.approx(variance.double().mean().item(), rel=1e-5)
    assert first_variance.max == pytest.approx(variance.max().item(), rel=1e-6)
    first_query = _records(trace, EXAMPLE_MODELING_FILE, "query_states = self.q_proj(hidden_states)", "query_states")[0].tensor
    assert first_query.std == pytest.approx(query.double().std().item(), rel=1e-4)
    assert first_query.min == pytest.approx(query.min().item(), abs=1e-6)


def test_transformers_llama_and_bert_lines() -> None:
    _, llama = _run(LLAMA_FILE)
    query = _records(llama, LLAMA_FILE, "query_states = self.q_proj(hidden_states).view(hidden_shape)", "query_states")
    assert [record.tensor.shape for record in query] == [[1, 4, 7, 16]] * 2
    softmax = _records(llama, LLAMA_FILE, "attn_weights = nn.functional.softmax(attn_weights", "attn_weights")[0].tensor
    assert softmax.shape == [1, 4, 7, 7] and softmax.mean == pytest.approx(1 / 7, rel=1e-5)
    parameters = [record for record in llama.lines if record.line == line_of(LLAMA_FILE, "def forward(self, x, position_ids):")]
    assert {record.name for record in parameters} == {"x", "position_ids"}

    _, bert = _run(BERT_FILE)
    scores = _records(bert, BERT_FILE, "attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling", "attn_weights")
    assert scores[0].tensor.shape == [1, 4, 7, 7]
    intermediate = _records(bert, BERT_FILE, "hidden_states = self.intermediate_act_fn(hidden_states)", "hidden_states")
    assert intermediate[0].tensor.shape == [1, 7, 128]
    assert intermediate[0].tensor.positive_fraction is not None


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.projections = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, hidden_states: torch.Tensor, stop_early: bool = False) -> torch.Tensor:  # line: def
        projected = [projection(hidden_states) for projection in self.projections]  # line: comprehension
        first, second, third = projected  # line: unpacking
        combined = torch.cat(  # line: multi-line
            [first, second, third],
            dim=-1,
        )
        if stop_early:
            return combined[..., :2]  # line: early return
        doubled = combined * 2  # line: doubled
        return doubled  # line: final return


def _toy_line(marker: str) -> int:
    source, start = inspect.getsourcelines(Toy)
    for offset, text in enumerate(source):
        if text.rstrip().endswith(f"# line: {marker}"):
            return start + offset
    raise AssertionError(marker)


@pytest.mark.parametrize("stop_early", [False, True])
def test_statement_forms_attribute_to_the_right_line(stop_early: bool) -> None:
    torch.manual_seed(0)
    toy = Toy().eval()
    inputs = torch.randn(2, 4)
    with torch.no_grad():
        plain = toy(inputs, stop_early)
        with LineCapture([__file__]) as capture:
            captured = toy(inputs, stop_early)
    assert torch.equal(plain, captured)
    by_line: dict[int, dict[str, list[int]]] = {}
    for record in capture.records:
        by_line.setdefault(record.line, {})[record.name] = record.tensor.shape

    assert by_line[_toy_line("def")] == {"hidden_states": [2, 4]}
    assert by_line[_toy_line("comprehension")] == {f"projected.{index}": [2, 4] for index in range(3)}
    assert by_line[_toy_line("unpacking")] == {"first": [2, 4], "second": [2, 4], "third": [2, 4]}
    assert by_line[_toy_line("multi-line")] == {"combined": [2, 12]}
    if stop_early:
        assert by_line[_toy_line("early return")] == {"return": [2, 2]}
        assert _toy_line("doubled") not in by_line
    else:
        assert by_line[_toy_line("doubled")] == {"doubled": [2, 12]}
        assert by_line[_toy_line("final return")] == {"return": [2, 12]}
    lines_seen = set(by_line)
    assert lines_seen <= {_toy_line(marker) for marker in ("def", "comprehension", "unpacking", "multi-line", "early return", "doubled", "final return")}


def test_only_selected_files_are_recorded_and_the_tracer_is_restored() -> None:
    def previous_tracer(frame, event, argument):  # a debugger or coverage tool already tracing
        return None

    import sys

    sys.settrace(previous_tracer)
    try:
        with LineCapture([str(EXAMPLE_MODELING_FILE)]) as capture:
            Toy()(torch.randn(1, 4))
        assert sys.gettrace() is previous_tracer
    finally:
        sys.settrace(None)
    assert capture.records == []
