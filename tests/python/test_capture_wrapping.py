"""How module capture attaches to a model: a `_call_impl` of its own on each module while active, and nothing
left behind afterwards, whatever happened in between."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modeltrace.worker import capture as capture_module
from modeltrace.worker.capture import ModuleCapture, named_modules


@pytest.fixture(autouse=True, params=["c", "python"])
def _entry_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: entering and leaving in C (`native/capture_core.c`, where the extension module is built),
    and in Python, as a build without it does."""
    if request.param == "python":
        monkeypatch.setattr(capture_module, "_capture_core", lambda: None)
    elif capture_module._capture_core() is None:
        pytest.skip("no extension module with the C capture path here")


class Failing(nn.Module):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad shape in Failing")


class Model(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = Failing() if fail else nn.Linear(4, 4)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(hidden_states))


def _wrapped(model: nn.Module) -> list[str]:
    return [path for path, module in model.named_modules() if "_call_impl" in module.__dict__]


def test_wrapping_is_removed_and_results_are_unchanged() -> None:
    torch.manual_seed(0)
    model = Model().eval()
    inputs = torch.randn(2, 4)
    plain = model(inputs)
    with ModuleCapture(model) as capture:
        assert _wrapped(model) == ["", "first", "second"]
        captured = model(inputs)
    assert _wrapped(model) == []
    assert torch.equal(plain, captured)
    assert [record.path for record in capture.records] == ["", "first", "second"]
    assert [record.parent for record in capture.records] == [-1, 0, 0]
    assert [record.finish_order for record in capture.records] == [2, 0, 1]
    assert capture.records[2].outputs[0].shape == [2, 4]


def test_a_call_that_raises_keeps_its_record_and_the_model_is_restored() -> None:
    model = Model(fail=True)
    with pytest.raises(ValueError, match="bad shape in Failing"):
        with ModuleCapture(model) as capture:
            model(torch.randn(2, 4))
    assert _wrapped(model) == []
    failing = capture.records[2]
    assert (failing.path, failing.outputs, failing.inputs[0].shape) == ("second", [], [2, 4])
    assert sorted(record.finish_order for record in capture.records) == [0, 1, 2]


def test_modules_outside_the_model_and_hooks_of_the_model() -> None:
    """Only the model's modules are recorded; the model's own hooks still run (inputs are recorded as passed,
    outputs as its forward hooks left them)."""
    model = Model()
    outsider = nn.Linear(4, 4)
    model.first.register_forward_hook(lambda module, args, output: output * 0)
    with ModuleCapture(model) as capture:
        outsider(torch.randn(1, 4))
        model(torch.randn(1, 4))
    assert [record.path for record in capture.records] == ["", "first", "second"]
    assert capture.records[1].outputs[0].max == 0.0


def test_a_second_capture_of_the_same_model_leaves_the_calls_to_the_first() -> None:
    model = Model()
    with ModuleCapture(model) as outer:
        with ModuleCapture(model) as inner:
            model(torch.randn(1, 4))
        assert _wrapped(model) == ["", "first", "second"]
    assert _wrapped(model) == []
    assert len(outer.records) == 3 and inner.records == []
    # the inner capture, which wrapped nothing, left the outer one's wrappers recording for it
    with ModuleCapture(model) as again:
        model(torch.randn(1, 4))
    assert len(again.records) == 3 and len(outer.records) == 3


class Scaled(nn.Module):
    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return values * 2


def test_later_captures_reuse_the_wrappers_and_follow_changes_to_the_model() -> None:
    """A model captured again gets the wrappers its first capture made (counts and records are each capture's
    own); a module replaced, moved or given another `forward` since gets a new one."""
    model = Model()
    with ModuleCapture(model):
        first_wrappers = {path: module.__dict__["_call_impl"] for path, module in model.named_modules()}
        model(torch.randn(1, 4))
    with ModuleCapture(model) as again:
        assert {path: module.__dict__["_call_impl"] for path, module in model.named_modules()} == first_wrappers
        model(torch.randn(1, 4))
        model(torch.randn(1, 4))
    assert [(record.path, record.call_index) for record in again.records] == [
        ("", 0),
        ("first", 0),
        ("second", 0),
        ("", 1),
        ("first", 1),
        ("second", 1),
    ]

    model.second = Scaled()  # replaced: its class and its own forward's parameter name
    model.first.forward = lambda renamed: renamed + 1  # an instance-level forward with another parameter name
    with ModuleCapture(model) as changed:
        assert model.first.__dict__["_call_impl"] is not first_wrappers["first"]
        assert model.__dict__["_call_impl"] is first_wrappers[""]
        model(torch.randn(1, 4))
    records = {record.path: record for record in changed.records}
    assert records["second"].class_name == "Scaled" and records["second"].inputs[0].key == "values"
    assert records["first"].inputs[0].key == "renamed"

    container = nn.Sequential(model.first, model.second)  # the same modules under other paths, in another model
    with ModuleCapture(container) as moved:
        container(torch.randn(1, 4))
    assert [record.path for record in moved.records] == ["", "0", "1"]


def test_the_reused_wrappers_do_not_keep_a_model_alive() -> None:
    import gc
    import weakref

    model = Model()
    with ModuleCapture(model):
        model(torch.randn(1, 4))
    reference = weakref.ref(model)
    del model
    gc.collect()
    assert reference() is None


class _Shared(nn.Module):
    """One module under two names, an empty slot, nested containers."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.again = self.first
        self.empty = None
        self.blocks = nn.Sequential(nn.ModuleDict({"a": nn.ReLU(), "b": nn.Sequential(nn.Identity())}), self.first)


class _OwnWalk(nn.Module):
    """A module that walks its children its own way: the walk must follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = nn.Linear(2, 2)
        self.hidden = nn.Linear(2, 2)

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):  # noqa: ANN001, ANN201
        yield prefix, self
        yield (f"{prefix}.seen" if prefix else "seen"), self.seen


def test_the_modules_are_walked_as_torch_walks_them() -> None:
    shared = _Shared()
    core = capture_module._capture_core()
    if core is not None:  # NOTE: walked in C, not handed back to Python
        assert core.named_modules(shared, nn.Module.named_modules) == list(shared.named_modules())
        assert core.named_modules(_OwnWalk(), nn.Module.named_modules) is None
    shared.register_module("own", _OwnWalk())
    for model in (shared, shared.blocks, _OwnWalk(), nn.Linear(2, 2)):
        assert named_modules(model) == list(model.named_modules())
    assert [path for path, _ in named_modules(shared)][:3] == ["", "first", "blocks"]
    assert "own.hidden" not in [path for path, _ in named_modules(shared)]


def test_a_capture_is_freed_when_its_last_reference_goes_without_the_cyclic_collector() -> None:
    """No reference cycle through the capture (a bound method of it kept on it was one): its records, and with full
    tensors the tensors it kept, go when the caller drops it, not at some later collection."""
    import gc
    import weakref

    model = Model().eval()
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for full_tensors in (False, True):
            with ModuleCapture(model, full_tensors=full_tensors) as capture:
                model(torch.randn(2, 4))
            assert len(capture.records) == 3
            assert bool(capture.tensors) == full_tensors
            gone = weakref.ref(capture)
            kept = [weakref.ref(tensor) for tensor in capture.tensors.values()]
            del capture
            assert gone() is None
            assert all(tensor() is None for tensor in kept)
    finally:
        if was_enabled:
            gc.enable()


def test_forgotten_wrappers_are_made_again_by_the_next_capture() -> None:
    """`forget_wrappers` (a worker's job, which captures its model once) drops the model's cached wrappers; a later
    capture of the same model still records every call."""
    model = Model().eval()
    with ModuleCapture(model):
        model(torch.randn(2, 4))
    assert model in capture_module._ModelWrappers._of_model
    capture_module.forget_wrappers(model)
    assert model not in capture_module._ModelWrappers._of_model
    with ModuleCapture(model) as capture:
        model(torch.randn(2, 4))
    assert [record.path for record in capture.records] == ["", "first", "second"]
    assert _wrapped(model) == []
