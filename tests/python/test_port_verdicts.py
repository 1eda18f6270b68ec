"""Port verdicts between independently written implementations (issue 15).

For each pair of tests/python/ports/ (a transformers reference, an independently written port with the
reference's weights copied in): the clean port agrees with its reference in plain torch, and `modeltrace diff`
calls it a match; each injected porting bug changes the port's output, and the diff's first divergence names
the module owning the bug and a line range, line or construction line holding it (the truth check of
tests/python/ports/harness.py).

Verdicts the diff does not give yet are listed in `KNOWN_WRONG` with what it says today: they run as strict
xfails, so a verdict that becomes right fails the run until its row is removed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from modeltrace.worker.client import WorkerClient
from ports.corpus import BUGS, PAIRS, Pair, bugs_of
from ports.harness import Case, PortHarness, all_cases, build_recipe, prepare_port

# What the diff says today where its verdict is wrong (case id -> reason); remove a row when it becomes right.
KNOWN_WRONG: dict[str, str] = {}

MIN_BUG_KINDS_PER_PAIR = 5
# NOTE: float32 ports of float32 references: the same operations in another order agree to ~1e-6.
CLEAN_PORT_ATOL = 1e-5
# a bug must move the port's outputs by more than this to be a bug a diff can be asked to find
OBSERVABLE_DIFFERENCE = 1e-4


def _outputs_gpt2(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("logits of the last position", reference.logits[:, -1:], port)]


def _outputs_llama(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("logits", reference.logits, port)]


def _outputs_bert(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("last hidden state", reference.last_hidden_state, port[0]), ("pooled", reference.pooler_output, port[1])]


COMPARABLE_OUTPUTS: dict[str, Callable[[Any, Any], list[tuple[str, torch.Tensor, torch.Tensor]]]] = {
    "gpt2": _outputs_gpt2,
    "llama": _outputs_llama,
    "bert": _outputs_bert,
}


def _port_outputs(port: Any) -> list[torch.Tensor]:
    return [port] if isinstance(port, torch.Tensor) else [item for item in port if isinstance(item, torch.Tensor)]


@pytest.fixture(scope="session")
def port_harness(worker: WorkerClient, tmp_path_factory: pytest.TempPathFactory) -> PortHarness:
    return PortHarness(worker, tmp_path_factory.mktemp("port-verdicts"), lines=True)


def _verdict_param(case: Case) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[case.id])] if case.id in KNOWN_WRONG else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.name)
def test_clean_port_agrees_with_its_reference(pair: Pair) -> None:
    reference = build_recipe(pair.path / "recipe_reference.py")
    port = build_recipe(pair.path / "recipe_port.py")
    compared = COMPARABLE_OUTPUTS[pair.name](reference.run(), port.run())
    assert compared
    for name, expected, actual in compared:
        assert expected.shape == actual.shape, name
        difference = (expected - actual).abs().max().item()
        assert difference < CLEAN_PORT_ATOL, f"{pair.name}: {name} differs by {difference:.3g}"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.name)
def test_each_pair_has_enough_bug_kinds(pair: Pair) -> None:
    kinds = {bug.kind for bug in bugs_of(pair.name)}
    assert len(kinds) >= MIN_BUG_KINDS_PER_PAIR, f"{pair.name}: only {sorted(kinds)}"


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: f"{bug.pair}-{bug.name}")
def test_bug_is_observable_and_owned_by_its_module(bug: Any, tmp_path: Path) -> None:
    """The corpus's own truth: the patch changes the port's outputs, and the truth line belongs to the module
    named (inside its class's forward, or, for converter bugs, the `self.NAME = ...` line of its parent's
    `__init__` that builds it)."""
    pair = next(pair for pair in PAIRS if pair.name == bug.pair)
    clean = build_recipe(pair.path / "recipe_port.py")
    port = prepare_port(Case(pair, bug), tmp_path)
    broken = build_recipe(port.recipe)
    differences = [
        (expected - actual).abs().max().item() if expected.shape == actual.shape else float("inf")
        for expected, actual in zip(_port_outputs(clean.run()), _port_outputs(broken.run()), strict=True)
    ]
    assert max(differences) > OBSERVABLE_DIFFERENCE, f"{bug.name}: the port's outputs move by {max(differences):.3g}"

    modules = dict(broken.model.named_modules())
    assert bug.module in modules, f"{bug.name}: the port has no module {bug.module!r}"
    line = port.truth_line
    assert line is not None
    assert _in_forward(modules[bug.module], line, port.port_file) or _builds(modules, bug.module, line), (
        f"{bug.name}: line {line} is neither in {bug.module}'s forward nor the line of its parent's __init__ "
        "that builds it"
    )
    if bug.truth_at is not None:  # converter bugs are judged at the module's construction
        assert _builds(modules, bug.module, line)


def _in_forward(module: torch.nn.Module, line: int, file: Path) -> bool:
    forward = type(module).forward
    if Path(inspect.getsourcefile(forward) or "").resolve() != file.resolve():
        return False
    source, first = inspect.getsourcelines(forward)
    return first <= line < first + len(source)


def _builds(modules: dict[str, torch.nn.Module], path: str, line: int) -> bool:
    parent_path, _, attribute = path.rpartition(".")
    source, first = inspect.getsourcelines(type(modules[parent_path]).__init__)
    return first <= line < first + len(source) and f"self.{attribute} = " in source[line - first]


@pytest.mark.parametrize("case", [_verdict_param(case) for case in all_cases()])
def test_port_verdict(port_harness: PortHarness, case: Case) -> None:
    judged = port_harness.judge(case)
    assert judged.right, f"{case.id}: truth {judged.truth()}, diff says {judged.verdict.located()}: {judged.why}"


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in all_cases()])
def test_port_verdict_aligned_automatically(port_harness: PortHarness, case: Case) -> None:
    """The same verdicts without the pairs' hand-written `--map` rules: the diff aligns each port with its
    reference by evidence alone (issue 16), and localises every bug as well."""
    judged = port_harness.judge(case, maps=False)
    assert judged.right, f"{case.id}: truth {judged.truth()}, diff says {judged.verdict.located()}: {judged.why}"
