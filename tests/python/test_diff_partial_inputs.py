"""Issue 30 at unit scale: additive masks written two ways compare equal, a model moved to a dtype keeps its
complex buffers complex, and a divergence's unpaired input is traced back to the `__init__` statement that built
it (the end-to-end verdicts are in test_port_verdicts.py, on Meta's Llama, Mistral and gemma_pytorch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from modeltrace.diff.arrays import measure_arrays
from modeltrace.diff.unpaired import _Origin, _init_assignment
from modeltrace.worker.building.built import BuiltModel
from modeltrace.worker.moving import move_built
from torch import nn


def _causal(masked: float) -> np.ndarray:
    return np.triu(np.full((4, 4), masked, dtype=np.float32), 1)


def test_masks_written_with_minus_infinity_and_the_dtype_minimum_are_the_same_mask() -> None:
    minimum = float(np.finfo(np.float32).min)
    assert measure_arrays(_causal(minimum), _causal(-np.inf), 1e-3, 0.0).close
    assert measure_arrays(_causal(minimum), _causal(-2.3819763e38), 1e-3, 0.0).close
    # one position more masked (a mask one diagonal off) is a different mask
    shifted = np.triu(np.full((4, 4), -np.inf, dtype=np.float32), 2)
    assert not measure_arrays(_causal(minimum), shifted, 1e-3, 0.0).close


class _Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)
        angles = torch.arange(6, dtype=torch.float32).reshape(3, 2)
        self.register_buffer("table", torch.polar(torch.ones_like(angles), angles))


def test_moving_a_model_to_a_dtype_keeps_complex_buffers_complex() -> None:
    built = BuiltModel(model=_Rotary(), args=(torch.ones(1, 2),))
    table = built.model.table.clone()
    move_built(built, "cpu", "float64")
    assert built.model.table.dtype == torch.complex64 and torch.equal(built.model.table, table)
    assert built.model.proj.weight.dtype == torch.float64 and built.args[0].dtype == torch.float64


class _CountedMoves(_Rotary):
    """Counts torch's walks over it (`.to` and the dtype cast both go through `_apply`)."""

    walks = 0

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - torch's signature
        type(self).walks += 1
        return super()._apply(fn, recurse)


def test_a_model_already_on_the_device_in_the_dtype_is_left_as_it_is_and_its_inputs_still_move() -> None:
    built = BuiltModel(model=_CountedMoves(), args=(torch.ones(1, 2, dtype=torch.float64),))
    move_built(built, "cpu", "float32")
    # no walk over a model that is where it should be, and the example input cast all the same
    assert _CountedMoves.walks == 0 and built.args[0].dtype == torch.float32
    move_built(built, "cpu", "bfloat16")
    assert built.model.proj.weight.dtype == torch.bfloat16 and built.model.table.dtype == torch.complex64


SOURCE = """import torch


class Transformer:
    def __init__(self, dim, base):
        self.dim = dim
        theta = base * 2
        self.freqs_cis = table(
            dim, theta
        )

    def forward(self, tokens):
        freqs_cis = self.freqs_cis[: tokens.shape[1]]
        return freqs_cis
"""


def test_an_unpaired_input_read_from_an_init_attribute_names_the_statements_that_built_it(tmp_path: Path) -> None:
    file = tmp_path / "model.py"
    file.write_text(SOURCE)
    attribute, assigned = _init_assignment(_Origin(str(file), 13, "freqs_cis"))
    assert attribute == "freqs_cis"
    assert assigned is not None and (assigned.line, assigned.end_line) == (7, 10)  # `theta = ...` to the call's end
