"""Line-level capture: the tensors each line assigned, on the line the reader sees.

Checked on the example, on transformers' Llama and BERT files (shapes and statistics against tensors
computed directly), and on a toy module written to exercise multi-line statements, tuple unpacking,
comprehensions and early returns, whose expected lines are marked in its source. A second toy module,
written to a temporary file, checks the instrumented code itself: in-place calls, `x[...] = v`, `for` targets,
walrus, a decorated forward, closures, exceptions and tracebacks, a file edited after import (the fallback
tracer), and that every swapped `__code__` and the injected global are restored.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

from modeltrace.trace.lines import HintDetail, index_module_calls, line_label
from modeltrace.trace.records import Trace
from modeltrace.worker import lines as lines_module
from modeltrace.worker.building import build_from_file
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.lines import RECORDER_NAME, LineCapture, live_functions, modules_of_file
from modeltrace.worker.source_map import real_path

from conftest import EXAMPLE_MODELING_FILE, line_of


LLAMA_FILE = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"
BERT_FILE = Path(transformers.__file__).parent / "models" / "bert" / "modeling_bert.py"


def _run(file: Path) -> tuple[object, Trace]:
    built = build_from_file(file, None, None, seed=0)
    with torch.no_grad():
        plain = built.model(**built.kwargs)[0]
        with (
            ModuleCapture(built.model) as capture,
            LineCapture([str(file)], capture.summary_cache, capture.pending) as lines,
        ):
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
    assert (
        len(_records(trace, EXAMPLE_MODELING_FILE, "query_states = self.q_proj(hidden_states)", "query_states")) == 2
    )
    entries = index_module_calls(trace)[str(EXAMPLE_MODELING_FILE.resolve())]
    two_names = entries[line_of(EXAMPLE_MODELING_FILE, "query_states, key_states = apply_rotary_pos_emb(")]
    assert line_label(two_names) == "query_states: [1, 4, 7, 16] float32 ×2  key_states: [1, 2, 7, 16] float32 ×2"
    assert (
        line_label(entries[line_of(EXAMPLE_MODELING_FILE, "variance = hidden_states.pow(2)")], HintDetail.SHAPE)
        == "[1, 7, 1] ×5"
    )


def test_example_statistics_match_a_direct_computation() -> None:
    built, trace = _run(EXAMPLE_MODELING_FILE)
    model = built.model
    with torch.no_grad():
        embeddings = model.embed_tokens(built.kwargs["input_ids"])
        variance = embeddings.pow(2).mean(-1, keepdim=True)
        query = (
            model.layers[0]
            .self_attn.q_proj(model.layers[0].input_layernorm(embeddings))
            .view(1, 7, -1, 16)
            .transpose(1, 2)
        )
    first_variance = _records(trace, EXAMPLE_MODELING_FILE, "variance = hidden_states.pow(2)", "variance")[0].tensor
    assert first_variance.mean == pytest.approx(variance.double().mean().item(), rel=1e-5)
    assert first_variance.max == pytest.approx(variance.max().item(), rel=1e-6)
    first_query = _records(trace, EXAMPLE_MODELING_FILE, "query_states = self.q_proj(hidden_states)", "query_states")[
        0
    ].tensor
    assert first_query.std == pytest.approx(query.double().std().item(), rel=1e-4)
    assert first_query.min == pytest.approx(query.min().item(), abs=1e-6)


def test_full_tensors_are_kept_for_module_outputs_that_lines_summarised_first() -> None:
    """With full tensors (a reference is set) and line capture, a module's output that a `return` line of its
    forward summarised first is still stored, under the module record's name, and equals the output."""
    built = build_from_file(EXAMPLE_MODELING_FILE, None, None, seed=0)
    model = built.model
    outputs: dict[str, torch.Tensor] = {}
    handle = model.layers[0].mlp.register_forward_hook(
        lambda module, args, output: outputs.setdefault("mlp", output.clone())
    )
    try:
        with torch.no_grad(), ModuleCapture(model, full_tensors=True) as capture:
            with LineCapture([str(EXAMPLE_MODELING_FILE)], capture.summary_cache, capture.pending):
                model(**built.kwargs)
    finally:
        handle.remove()
    for record in capture.records:
        for summary in record.outputs:
            assert summary.tensor is not None or summary.not_stored is not None, (record.path, summary.key)
            assert summary.tensor in capture.tensors, (record.path, summary.key)
    mlp = next(record for record in capture.records if record.path == "layers.0.mlp")
    assert torch.equal(capture.tensors[mlp.outputs[0].tensor], outputs["mlp"])


def test_transformers_llama_and_bert_lines() -> None:
    _, llama = _run(LLAMA_FILE)
    query = _records(llama, LLAMA_FILE, "query_states = self.q_proj(hidden_states).view(hidden_shape)", "query_states")
    assert [record.tensor.shape for record in query] == [[1, 4, 7, 16]] * 2
    softmax = _records(llama, LLAMA_FILE, "attn_weights = nn.functional.softmax(attn_weights", "attn_weights")[
        0
    ].tensor
    assert softmax.shape == [1, 4, 7, 7] and softmax.mean == pytest.approx(1 / 7, rel=1e-5)
    parameters = [
        record for record in llama.lines if record.line == line_of(LLAMA_FILE, "def forward(self, x, position_ids):")
    ]
    assert {record.name for record in parameters} == {"x", "position_ids"}

    _, bert = _run(BERT_FILE)
    scores = _records(
        bert, BERT_FILE, "attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling", "attn_weights"
    )
    assert scores[0].tensor.shape == [1, 4, 7, 7]
    intermediate = _records(
        bert, BERT_FILE, "hidden_states = self.intermediate_act_fn(hidden_states)", "hidden_states"
    )
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
    assert lines_seen <= {
        _toy_line(marker)
        for marker in ("def", "comprehension", "unpacking", "multi-line", "early return", "doubled", "final return")
    }


# --- the instrumented code itself: a module written to a temporary file, its lines marked `# line: NAME` ---

TOY_SOURCE = '''\
"""A toy model for line capture."""

import torch
from torch import nn


def make_scaler(factor):
    def scale(x):  # line: scale def
        scaled = x * factor  # line: scaled
        return scaled  # line: scale return

    return scale


SCALE = make_scaler(3.0)
NEGATE = lambda x: -x  # noqa: E731 (lambdas are not instrumented, and need no fallback)


def explode(x, inside_return):
    y = x * 2  # line: before raise
    if inside_return:
        return y.view(7, 3)  # line: raise in return
    z = y.view(3, 7)  # line: raise
    return z


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.halve = make_scaler(0.5)  # a closure held only by the instance
        self.register_buffer("scratch", torch.zeros(2, 4))

    @torch.no_grad()
    def forward(self, hidden_states):  # line: def
        buffer = torch.zeros(2, 4)  # line: buffer
        buffer[0] = hidden_states[0]  # line: setitem
        buffer.add_(1.0)  # line: in-place
        clipped = buffer.clone()  # line: clone
        torch.clamp_(clipped, min=1.5)  # line: function in-place
        self.scratch.copy_(buffer)  # line: copy into an attribute
        for row in hidden_states.unbind(0):  # line: for
            total = row.sum()  # line: total
        if (projected := self.linear(hidden_states)) is not None:  # line: walrus
            scaled = SCALE(projected)  # line: closure
        doubled = make_scaler(2.0)(scaled)  # line: fresh closure
        if hidden_states is None and (never := hidden_states.sum()):  # line: unbound walrus
            return never
        halved = self.halve(doubled)  # line: instance closure
        return buffer + halved  # line: return
'''


def _import_toy(tmp_path: Path, source: str = TOY_SOURCE):
    name = f"modeltrace_lines_toy_{uuid.uuid4().hex}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy_module(tmp_path: Path):
    module = _import_toy(tmp_path)
    yield module
    sys.modules.pop(module.__name__, None)


def _marked(marker: str, source: str = TOY_SOURCE) -> int:
    for number, text in enumerate(source.splitlines(), 1):
        if text.endswith(f"# line: {marker}"):
            return number
    raise AssertionError(marker)


def _by_line(records: list) -> dict[int, dict[str, list]]:
    """line -> name -> the records of that name on that line, in order."""
    by_line: dict[int, dict[str, list]] = {}
    for record in records:
        by_line.setdefault(record.line, {}).setdefault(record.name, []).append(record)
    return by_line


def _shapes(by_line: dict[int, dict[str, list]], marker: str, source: str = TOY_SOURCE) -> dict[str, list]:
    on_line = by_line.get(_marked(marker, source), {})
    return {name: [record.tensor.shape for record in records] for name, records in on_line.items()}


def _assert_restored(module, originals: dict) -> None:
    for function, code in originals.items():
        assert function.__code__ is code, function
    assert RECORDER_NAME not in vars(module)


def test_instrumented_statement_forms(toy_module) -> None:
    torch.manual_seed(0)
    toy = toy_module.Toy().eval()
    inputs = torch.randn(2, 4)
    plain = toy(inputs)
    originals = {
        function: function.__code__
        for function in (toy_module.Toy.forward.__wrapped__, toy_module.make_scaler, toy_module.SCALE, toy.halve)
    }
    with LineCapture([toy_module.__file__]) as capture:
        assert sys.gettrace() is None, "no tracer when everything could be instrumented"
        assert not capture.fallback_codes
        # The decorated forward (torch.no_grad's functools.wraps wrapper), the closure made at import and the
        # one made by `__init__`, held only by the instance.
        assert set(originals) <= set(capture.instrumented_functions)
        assert vars(toy_module)[RECORDER_NAME] is not None
        captured = toy(inputs)
        made_during_the_capture = toy_module.make_scaler(4.0)
    assert torch.equal(plain, captured)
    _assert_restored(toy_module, originals)
    # A function that instrumented code made during the capture still runs after it, recording nothing.
    records = len(capture.records)
    assert torch.equal(made_during_the_capture(inputs), inputs * 4.0)
    assert len(capture.records) == records

    by_line = _by_line(capture.records)
    assert _shapes(by_line, "def") == {"hidden_states": [[2, 4]]}
    assert _shapes(by_line, "buffer") == {"buffer": [[2, 4]]}
    assert _shapes(by_line, "setitem") == {"buffer": [[2, 4]]}
    assert _shapes(by_line, "in-place") == {"buffer": [[2, 4]]}
    first_row_mean = inputs[0].double().mean().item()
    assert by_line[_marked("setitem")]["buffer"][0].tensor.mean == pytest.approx(first_row_mean / 2, rel=1e-5)
    assert by_line[_marked("in-place")]["buffer"][0].tensor.mean == pytest.approx(first_row_mean / 2 + 1, rel=1e-5)
    assert _shapes(by_line, "clone") == {"clipped": [[2, 4]]}
    assert _shapes(by_line, "function in-place") == {"clipped": [[2, 4]]}
    assert by_line[_marked("function in-place")]["clipped"][0].tensor.min == pytest.approx(1.5)
    assert _shapes(by_line, "copy into an attribute") == {}
    assert _shapes(by_line, "for") == {"row": [[4], [4]]}
    assert [record.call_index for record in by_line[_marked("for")]["row"]] == [0, 1]
    assert _shapes(by_line, "total") == {"total": [[], []]}
    assert _shapes(by_line, "walrus") == {"projected": [[2, 4]]}
    assert _shapes(by_line, "closure") == {"scaled": [[2, 4]]}
    assert _shapes(by_line, "fresh closure") == {"doubled": [[2, 4]]}
    assert _shapes(by_line, "instance closure") == {"halved": [[2, 4]]}
    assert _shapes(by_line, "return") == {"return": [[2, 4]]}
    assert _shapes(by_line, "unbound walrus") == {}
    # The closures made at import (factor 3), during the forward (2) and in `__init__` (0.5), all instrumented.
    assert _shapes(by_line, "scale def") == {"x": [[2, 4]] * 3}
    scaled = by_line[_marked("scaled")]["scaled"]
    projected_mean = by_line[_marked("walrus")]["projected"][0].tensor.mean
    assert [record.call_index for record in scaled] == [0, 1, 2]
    # factors 3, then 2 after 3, then 0.5 after 2
    expected_means = [3 * projected_mean, 6 * projected_mean, 3 * projected_mean]
    assert [record.tensor.mean for record in scaled] == pytest.approx(expected_means, rel=1e-5)
    assert _shapes(by_line, "scale return") == {"return": [[2, 4]] * 3}
    marked = {_marked(text.rsplit("# line: ", 1)[1]) for text in TOY_SOURCE.splitlines() if "# line: " in text}
    assert set(by_line) <= marked


@pytest.mark.parametrize("inside_return", [False, True])
def test_an_exception_propagates_unchanged_from_its_own_line(toy_module, inside_return: bool) -> None:
    inputs = torch.randn(2, 4)
    with pytest.raises(RuntimeError) as plain:
        toy_module.explode(inputs, inside_return)
    original = toy_module.explode.__code__
    with pytest.raises(RuntimeError) as captured, LineCapture([toy_module.__file__]) as capture:
        toy_module.explode(inputs, inside_return)
    assert str(captured.value) == str(plain.value)

    def toy_frames(info) -> list:
        return [
            (frame.name, frame.lineno, frame.end_lineno, frame.colno, frame.end_colno, frame.line)
            for frame in traceback.extract_tb(info.tb)
            if frame.filename == toy_module.__file__
        ]

    assert toy_frames(captured) == toy_frames(plain)
    assert toy_frames(captured)[-1][:2] == ("explode", _marked("raise in return" if inside_return else "raise"))
    assert _shapes(_by_line(capture.records), "before raise") == {"y": [[2, 4]]}
    _assert_restored(toy_module, {toy_module.explode: original})


def test_a_file_edited_after_import_keeps_its_code_and_lines(tmp_path: Path) -> None:
    module = _import_toy(tmp_path)
    try:
        path = Path(module.__file__)
        torch.manual_seed(0)
        toy = module.Toy().eval()
        inputs = torch.randn(2, 4)
        plain = toy(inputs)
        # Edited on disk: the nested `scale` now differs (so do `make_scaler`, which holds its code, and the
        # closure made at import); the lines are unchanged.
        edited = TOY_SOURCE.replace("scaled = x * factor", "scaled = x * factor * 10")
        path.write_text(edited)
        os.utime(path, ns=(time.time_ns() + 10**9,) * 2)
        with LineCapture([str(path)]) as capture:
            assert sys.gettrace() is not None, "the fallback tracer"
            fallback = {code.co_qualname for code in capture.fallback_codes}
            assert fallback == {"make_scaler", "make_scaler.<locals>.scale"}
            assert module.Toy.forward.__wrapped__ in capture.instrumented_functions
            captured = toy(inputs)
        assert sys.gettrace() is None
        assert torch.equal(plain, captured), "the running code is kept, not the edited file's"
        by_line = _by_line(capture.records)
        projected_mean = by_line[_marked("walrus")]["projected"][0].tensor.mean
        scaled = by_line[_marked("scaled")]["scaled"]
        expected_means = [3 * projected_mean, 6 * projected_mean, 3 * projected_mean]  # the code as imported
        assert [record.tensor.mean for record in scaled] == pytest.approx(expected_means, rel=1e-5)
        assert _shapes(by_line, "scale def") == {"x": [[2, 4]] * 3}
        assert _shapes(by_line, "scale return") == {"return": [[2, 4]] * 3}

        # Lines inserted above everything: nothing matches, every line is the one the running code reports.
        path.write_text("# one\n# two\n" + TOY_SOURCE)
        os.utime(path, ns=(time.time_ns() + 2 * 10**9,) * 2)
        with LineCapture([str(path)]) as capture:
            assert not capture.instrumented_functions
            captured = toy(inputs)
        assert torch.equal(plain, captured)
        by_line = _by_line(capture.records)
        for marker, names in {
            "buffer": {"buffer"},
            "setitem": {"buffer"},
            "in-place": {"buffer"},
            "clone": {"clipped"},
            "function in-place": {"clipped"},
            "copy into an attribute": set(),
            "for": {"row"},
            "total": {"total"},
            "walrus": {"projected"},
            "closure": {"scaled"},
            "fresh closure": {"doubled"},
            "instance closure": {"halved"},
            "return": {"return"},
            "scale def": {"x"},
            "scaled": {"scaled"},
            "scale return": {"return"},
        }.items():
            assert set(_shapes(by_line, marker)) == names, marker

        # No longer valid Python: everything falls back too.
        path.write_text(TOY_SOURCE + "\ndef broken(:\n")
        with LineCapture([str(path)]) as capture:
            assert not capture.instrumented_functions and capture.fallback_codes
            captured = toy(inputs)
        assert torch.equal(plain, captured)
        assert _shapes(_by_line(capture.records), "scaled") == {"scaled": [[2, 4]] * 3}
    finally:
        sys.modules.pop(module.__name__, None)


def test_only_the_entering_thread_records_and_records_are_bounded(toy_module, monkeypatch) -> None:
    inputs = torch.randn(2, 4)
    with LineCapture([toy_module.__file__]) as capture:
        worker = threading.Thread(target=toy_module.SCALE, args=(inputs,))
        worker.start()
        worker.join()
    assert capture.records == []
    monkeypatch.setattr(lines_module, "MAX_LINE_RECORDS", 3)
    with LineCapture([toy_module.__file__]) as capture:
        toy_module.Toy()(inputs)
    assert len(capture.records) == 3 and capture.truncated


def test_only_selected_files_are_recorded_and_everything_is_restored() -> None:
    def previous_tracer(frame, event, argument):  # a debugger or coverage tool already tracing
        return None

    built = build_from_file(EXAMPLE_MODELING_FILE, None, None, seed=0)
    path = real_path(str(EXAMPLE_MODELING_FILE))
    (module,) = modules_of_file(path)
    originals = {function: function.__code__ for function in live_functions(path, [module])}
    assert len(originals) > 10

    sys.settrace(previous_tracer)
    try:
        with LineCapture([str(EXAMPLE_MODELING_FILE)]) as capture:
            assert sys.gettrace() is previous_tracer
            assert set(capture.instrumented_functions) == set(originals) and not capture.fallback_codes
            assert all(function.__code__ is not code for function, code in originals.items())
            Toy()(torch.randn(1, 4))  # code of a file that is not selected
        assert sys.gettrace() is previous_tracer
        assert capture.records == []
        _assert_restored(module, originals)

        # A forward that raises (a token id past the vocabulary) restores everything too.
        with pytest.raises(IndexError), LineCapture([str(EXAMPLE_MODELING_FILE)]) as capture:
            built.model(input_ids=torch.tensor([[10**6]]))
        assert sys.gettrace() is previous_tracer
        _assert_restored(module, originals)
    finally:
        sys.settrace(None)
