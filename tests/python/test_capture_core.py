"""The capture's per-call path in C (`native/capture_core.c`) against the Python closure it stands in for: the
same model captured both ways must give the same trace, byte for byte, on real transformers models and on the
odd cases (a call that raises, views, integer and boolean tensors, inference tensors, a tensor changed in place,
line capture beside it)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from modeltrace.trace.records import Trace
from modeltrace.trace.storage import _pack
from modeltrace.worker import capture as capture_module
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.lines import LineCapture

CORE = capture_module._capture_core()
pytestmark = pytest.mark.skipif(CORE is None, reason="no extension module with the C call path here")


def _capture(model: nn.Module, run: Callable[[], object], python: bool, lines: list[str] | None = None) -> bytes:
    """The packed trace of one forward; `python` keeps the wrappers on their Python closures."""
    original = ModuleCapture._core_session
    if python:
        ModuleCapture._core_session = lambda self: None  # type: ignore[method-assign]
    try:
        with torch.no_grad(), ModuleCapture(model) as capture:
            served = capture._wrappers is not None and capture._wrappers.live[0][6] is not None
            if lines is None:
                run()
                line_records = []
            else:
                with LineCapture(lines, capture.summary_cache, capture.pending, capture.call_stack) as line_capture:
                    run()
                line_records = line_capture.records
    finally:
        ModuleCapture._core_session = original  # type: ignore[method-assign]
    assert served is not python, "the capture did not take the path asked for"
    return _pack(Trace(model={"class": type(model).__name__}, modules=capture.records, lines=line_records))


def _same_both_ways(model: nn.Module, run: Callable[[], object], lines: list[str] | None = None) -> None:
    model.eval()
    first = _capture(model, run, python=True, lines=lines)  # NOTE: the first capture makes the wrappers
    assert _capture(model, run, python=False, lines=lines) == first
    assert _capture(model, run, python=True, lines=lines) == first


def test_a_llama_gpt2_and_bert_trace_the_same_both_ways() -> None:
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_cache=False,
        )
    )
    ids = torch.randint(0, 128, (2, 9))
    _same_both_ways(llama, lambda: llama(ids))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=32))
    _same_both_ways(gpt2, lambda: gpt2(ids, use_cache=False))
    bert = BertModel(
        BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    )
    mask = torch.ones(2, 9, dtype=torch.long)
    _same_both_ways(bert, lambda: bert(ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)))


class _Odd(nn.Module):
    """Views, a transpose, integers, booleans, a constant tensor, an in-place change and one element."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.act = nn.ReLU()
        self.same = nn.Identity()

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        projected = self.proj(hidden)
        viewed = self.same(projected.view(-1, 6))  # a view of a summarised tensor: its summary is shared
        turned = self.same(projected.transpose(0, 1))  # not contiguous: summarised by the Python path
        self.same(ids)
        self.same(ids > 2)
        self.same(torch.ones(4))  # every value equal
        self.same(torch.tensor([3.0]))  # one element
        activated = self.act(projected)
        projected.add_(1.0)  # changed in place after it was summarised: summarised again
        again = self.same(projected)
        return viewed, turned, activated, again


def test_views_dtypes_and_in_place_changes_trace_the_same_both_ways() -> None:
    torch.manual_seed(0)
    model = _Odd()
    hidden, ids = torch.randn(3, 6), torch.arange(6)
    _same_both_ways(model, lambda: model(hidden, ids))
    with torch.inference_mode():  # NOTE: inference tensors have no version counter: never cached
        inference_hidden = torch.randn(3, 6)
    _same_both_ways(model, lambda: model(inference_hidden, ids))


class _Reversed(dict):
    """A mapping whose `items()` is its own: the walk must follow it, not the dict underneath."""

    def items(self):  # noqa: ANN201
        return list(super().items())[::-1]


class _Pair(NamedTuple):
    first: torch.Tensor
    second: object


class _Colour(enum.Enum):
    RED = 1


class _Takes(nn.Module):
    """Takes and returns whatever it is given: its arguments and output are walked as containers."""

    def forward(self, hidden: torch.Tensor, *rest: object, **named: object) -> object:
        return named.get("give_back", hidden)


class _Containers(nn.Module):
    """Arguments past the parameter names, keyword arguments holding nested dicts, lists, tuples, a named tuple,
    a dict subclass with its own `items()`, non-string keys, values with no tensors, more than a side's limit of
    tensors and nesting deeper than the walk follows; outputs as a ModelOutput, a tuple of dicts and None."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = _Takes()
        self.proj = nn.Linear(6, 6)

    def forward(self, hidden: torch.Tensor) -> object:
        projected = self.proj(hidden)
        deep: object = projected
        for _ in range(6):
            deep = [deep, {"side": hidden}]
        self.takes(
            hidden,
            projected,
            [hidden, (projected, None)],
            "text",
            mapping={"a": projected, 3: [hidden, {"b": projected.T}], _Colour.RED: hidden},
            pair=_Pair(projected, (hidden, 7)),
            reversed_=_Reversed(x=hidden, y=projected),
            plain=(1, 2.5, "s", torch.float32, torch.device("cpu"), None, True),
            deep=deep,
        )
        self.takes(hidden, many=[torch.full((2,), float(index)) for index in range(40)])
        self.takes(hidden, first=[projected] * 30, then={"more": [hidden] * 5})
        self.takes(hidden, give_back=BaseModelOutput(last_hidden_state=projected, hidden_states=(hidden, projected)))
        self.takes(hidden, give_back=({"k": projected}, [hidden, {"n": (projected,)}]))
        self.takes(hidden, give_back=None)
        return self.takes(hidden, give_back=_Pair(projected, {"z": hidden}))


def test_arguments_and_outputs_in_containers_trace_the_same_both_ways() -> None:
    torch.manual_seed(0)
    model = _Containers()
    hidden = torch.randn(3, 6)
    _same_both_ways(model, lambda: model(hidden))
    with torch.no_grad(), ModuleCapture(model) as capture:
        model(hidden)
    keys = [[summary.key for summary in record.inputs] for record in capture.records if record.path == "takes"]
    assert keys[0][:4] == ["hidden", "args.1", "args.2.0", "args.2.1.0"]
    assert "mapping.3.1.b" in keys[0] and "mapping._Colour.RED" in keys[0]
    assert keys[0].index("reversed_.y") < keys[0].index("reversed_.x")
    assert len(keys[1]) == 32 and keys[1][-1] == "many.30"  # the side's limit
    assert keys[2][-1] == "then.more.0" and len(keys[2]) == 32
    assert not any(key.count(".") > 4 for key in keys[0])  # nesting past the walk's depth is not followed
    outputs = [[summary.key for summary in record.outputs] for record in capture.records if record.path == "takes"]
    assert outputs[3] == ["last_hidden_state", "hidden_states.0", "hidden_states.1"]
    assert outputs[4] == ["0.k", "1.0", "1.1.n.0"] and outputs[5] == [] and outputs[6] == ["0", "1.z"]


class _BrokenItems(dict):
    def items(self):  # noqa: ANN201
        raise KeyError("items of a broken mapping")


def test_a_mapping_whose_items_raise_fails_the_call_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Takes().eval()
    hidden = torch.randn(2, 3)
    for python in (True, False):
        with monkeypatch.context() as patched:
            if python:
                patched.setattr(ModuleCapture, "_core_session", lambda self: None)
            with pytest.raises(KeyError, match="items of a broken mapping"):
                with torch.no_grad(), ModuleCapture(model) as capture:
                    assert (capture._wrappers.live[0][6] is None) is python
                    model(hidden, broken=_BrokenItems(x=hidden))
        assert not any("_call_impl" in module.__dict__ for module in model.modules())


class _Raising(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(hidden).view(2, 2, 2))  # the second Linear raises on the wrong width


def test_a_call_that_raises_is_recorded_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Raising().eval()
    hidden = torch.randn(2, 4)
    packed = []
    for python in (True, False, True):
        with monkeypatch.context() as patched:
            if python:
                patched.setattr(ModuleCapture, "_core_session", lambda self: None)
            with pytest.raises(RuntimeError, match="mat1 and mat2"):
                with torch.no_grad(), ModuleCapture(model) as capture:
                    assert (capture._wrappers.live[0][6] is None) is python
                    model(hidden)
        assert [record.outputs for record in capture.records][2] == []
        assert sorted(record.finish_order for record in capture.records) == [0, 1, 2]
        packed.append(_pack(Trace(model={"class": "_Raising"}, modules=capture.records)))
    assert packed[0] == packed[1] == packed[2]
    assert not any("_call_impl" in module.__dict__ for module in model.modules())


def test_line_capture_beside_the_c_path_traces_the_same(tmp_path: Path) -> None:
    source = tmp_path / "modeling_lines.py"
    source.write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.up = nn.Linear(4, 8)\n"
        "        self.down = nn.Linear(8, 4)\n\n"
        "    def forward(self, hidden):\n"
        "        wide = self.up(hidden)\n"
        "        wide = torch.relu(wide)\n"
        "        return self.down(wide)\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # noqa: S102 - the test's own file
    torch.manual_seed(0)
    model = namespace["Block"]()
    hidden = torch.randn(2, 4)
    _same_both_ways(model, lambda: model(hidden), lines=[str(source)])


def test_full_tensors_and_kept_calls_stay_on_the_python_path() -> None:
    model = _Raising()
    with torch.no_grad(), ModuleCapture(model) as capture:
        assert capture._wrappers.live[0][6] is not None
    for options in ({"full_tensors": True}, {"retain_calls_bytes": 1 << 20}):
        with torch.no_grad(), ModuleCapture(model, **options) as capture:
            assert capture._wrappers.live[0][6] is None
            model.first(torch.randn(2, 4))
        assert [record.path for record in capture.records] == ["first"]
        assert capture.tensors if "full_tensors" in options else capture.retained


def test_the_wrapper_is_kept_by_copies_and_leaves_nothing_behind() -> None:
    import copy

    model = _Raising()
    with ModuleCapture(model):
        wrapper = model.first.__dict__["_call_impl"]
        assert type(wrapper) is CORE.Wrapper
        assert copy.copy(wrapper) is wrapper and copy.deepcopy(wrapper) is wrapper
    assert "_call_impl" not in model.first.__dict__


def _tables_both_ways(trace: Trace) -> None:
    from modeltrace.trace import storage

    assert storage.native_table_rows is CORE.table_rows  # NOTE: set by worker/assemble.py on import
    python = storage._table_rows(trace.modules, trace.lines, storage._NONE)
    native = CORE.table_rows(trace.modules, trace.lines, storage._NONE)
    assert native == python


def test_the_tables_are_filled_the_same_in_c(tmp_path: Path) -> None:
    """`storage._table_rows` and its C twin give the same tables: summaries shared between records, locations,
    module rows with and without a device, line rows, and the rare fields (a device, NaN and Inf counts, a stored
    tensor, a reason not stored, a placement after its own row or a new one)."""
    import modeltrace.worker.assemble  # noqa: F401 - registers the C tables
    from modeltrace.trace.records import LineRecord, ModuleCall, SourceLocation, TensorSummary

    torch.manual_seed(0)
    model = _Odd().eval()
    with torch.no_grad(), ModuleCapture(model) as capture:
        model(torch.randn(3, 6), torch.arange(6))
    _tables_both_ways(Trace(model={"class": "_Odd"}, modules=capture.records))

    here = SourceLocation("/models/modeling_odd.py", 12, 4)
    plain = TensorSummary("", [2, 3], "float32", "cpu", 0.5, 1.0, -1.0, 2.0, 2.0, 0, 0, 0.5)
    rare = TensorSummary("x", [4], "float16", "cuda:0", None, None, None, None, None, 3, 1, None, "0/outputs/x")
    skipped = TensorSummary("y", [8], "float32", "cpu", 1.0, 0.0, 1.0, 1.0, 1.0, 0, 0, 1.0, None, "over the limit")
    placed = TensorSummary("z", [8], "float32", "cpu", 1.5, 2.0, 0.0, 3.0, 3.0, 0, 0, 1.0)
    placed.placement = {"kind": "replicate", "ranks": 2}
    both = TensorSummary("w", [8], "bfloat16", "cuda:1", 1.5, 2.0, 0.0, 3.0, 3.0, 2, 0, 1.0)
    both.placement = {"kind": "shard", "dim": 0, "local_shapes": [[4], [4]], "ranks": []}
    records = [
        ModuleCall(0, "", "Odd", here, None, 0, -1, 2, None, [plain, rare], [plain]),
        ModuleCall(1, "a", "Linear", here, here, 0, 0, 0, 14, [skipped, placed], [both, plain], "cuda:0"),
        ModuleCall(2, "b", "Linear", None, SourceLocation("/models/modeling_odd.py", 13), 1, 0, 1, 20, [], []),
    ]
    lines = [LineRecord("/models/modeling_odd.py", 12, "hidden", 0, plain, 1), LineRecord("/m.py", 3, "v", 1, both)]
    _tables_both_ways(Trace(model={"class": "Odd"}, modules=records, lines=lines))
