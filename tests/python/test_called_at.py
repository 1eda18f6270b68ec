"""`called_at` and `defined_at` on plain PyTorch code: loops, helpers, repeated calls, Sequential, multi-line calls.

Each expected line is marked in the model source below with a `# call: PATH` comment, so the test reads like
the code it checks.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from modeltrace.worker.capture import ModuleCapture


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden_states)  # call: blocks.N.proj


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.shared = nn.Linear(8, 8)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.out = nn.Linear(8, 4)

    def _helper(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.shared(hidden_states)  # call: shared (helper)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            hidden_states = block(hidden_states)  # call: blocks.N
        hidden_states = self._helper(hidden_states)
        hidden_states = self.shared(hidden_states)  # call: shared (direct)
        hidden_states = self.head(hidden_states)  # call: head
        return self.out(  # call: out
            hidden_states
        )


def _marked_line(marker: str) -> int:
    source, start = inspect.getsourcelines(inspect.getmodule(Toy))
    for offset, text in enumerate(source):
        if text.rstrip().endswith(f"# call: {marker}"):
            return start + offset if start else offset + 1
    raise AssertionError(f"marker {marker!r} not in the test source")


def _capture() -> list:
    torch.manual_seed(0)
    model = Toy().eval()
    with torch.no_grad(), ModuleCapture(model) as capture:
        model(torch.randn(2, 8))
    return capture.records


def test_every_call_maps_to_the_line_that_made_it() -> None:
    by_path: dict[str, list] = {}
    for record in _capture():
        by_path.setdefault(record.path, []).append(record)
    this_file = inspect.getsourcefile(Toy)

    for index in range(3):
        (layer,) = by_path[f"blocks.{index}"]
        assert layer.called_at.line == _marked_line("blocks.N")
        (projection,) = by_path[f"blocks.{index}.proj"]
        assert projection.called_at.line == _marked_line("blocks.N.proj")
        assert projection.defined_at.line == inspect.getsourcelines(nn.Linear)[1]

    first_shared, second_shared = by_path["shared"]
    assert (first_shared.call_index, second_shared.call_index) == (0, 1)
    assert first_shared.called_at.line == _marked_line("shared (helper)")
    assert second_shared.called_at.line == _marked_line("shared (direct)")

    # Sequential's loop lives inside torch: its children map to the line that called the Sequential.
    for path in ("head", "head.0", "head.1"):
        (record,) = by_path[path]
        assert record.called_at.line == _marked_line("head"), path

    (out,) = by_path["out"]
    assert out.called_at.line == _marked_line("out")  # the first line of a multi-line call
    assert {record.called_at.file for record in _capture() if record.called_at} == {this_file}
    assert by_path["blocks.0"][0].defined_at.line == inspect.getsourcelines(Block)[1]


def test_root_call_comes_from_outside_the_model_and_tree_links_are_consistent() -> None:
    records = _capture()
    root = records[0]
    assert root.path == "" and root.parent == -1
    assert all(records[record.parent].index == record.parent for record in records[1:])
    # finish order: children finish before their parents, the root last.
    assert root.finish_order == len(records) - 1
    for record in records[1:]:
        assert record.finish_order < records[record.parent].finish_order


def test_capture_does_not_change_results_and_removes_its_hooks() -> None:
    torch.manual_seed(0)
    model = Toy().eval()
    inputs = torch.randn(2, 8)
    with torch.no_grad():
        plain = model(inputs)
        with ModuleCapture(model, full_tensors=True) as capture:
            captured = model(inputs)
        after = model(inputs)
    assert torch.equal(plain, captured) and torch.equal(plain, after)
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in model.modules())
    out = next(record for record in capture.records if record.path == "out")
    assert torch.equal(capture.tensors[out.outputs[0].tensor], captured)
