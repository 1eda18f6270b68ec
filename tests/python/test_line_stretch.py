"""The drill-down's stretch narrowed to the statements the first differing line depends on (`diff/stretch.py`).

Two small transposed-convolution upsamplers written in two files (the reference's way and a port's, as EnCodec
and transformers write theirs), captured with `modeltrace.capture(lines=True, full_tensors=True)`: the port trims
the padding on both sides where the reference trims it on the right. The trim is computed in Python numbers that
no line record holds, so the first differing line is the slice that uses them; its stretch starts at the
condition choosing the trim, not after the convolution (a norm that did not run, and comments, lie in between).
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import torch

from modeltrace import capture
from modeltrace.diff import close_result, diff_paths
from modeltrace.diff.stretch import narrowed_since
from modeltrace.trace.records import LineRecord
from modeltrace.worker.stats import summarize

REFERENCE_SOURCE = """
import torch
from torch import nn


class Upsample(nn.Module):
    def __init__(self):
        super().__init__()
        self.convtr = nn.ConvTranspose1d(2, 2, 4, 2)

    def forward(self, x):
        y = self.convtr(x)
        padding_total = 4 - 2
        padding_right = padding_total
        padding_left = padding_total - padding_right
        end = y.shape[-1] - padding_right
        return y[..., padding_left:end]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = Upsample()
        self.out = nn.Conv1d(2, 2, 1)

    def forward(self, x):
        return self.out(self.up(x))
"""

PORT_SOURCE = """
import torch
from torch import nn


class Upsample(nn.Module):
    def __init__(self, centred):
        super().__init__()
        self.convtr = nn.ConvTranspose1d(2, 2, 4, 2)
        self.norm = nn.GroupNorm(1, 2)
        self.use_norm = False
        self.centred = centred

    def forward(self, hidden_states):
        padding_total = self.convtr.kernel_size[0] - self.convtr.stride[0]
        hidden_states = self.convtr(hidden_states)

        if self.use_norm:
            hidden_states = self.norm(hidden_states)

        # only the fixed padding is trimmed here: the extra padding
        # is removed at the very end
        if not self.centred:
            padding_right = padding_total
        else:
            padding_right = padding_total // 2

        padding_left = padding_total - padding_right
        end = hidden_states.shape[-1] - padding_right
        hidden_states = hidden_states[..., padding_left:end]
        return hidden_states


class Model(nn.Module):
    def __init__(self, centred):
        super().__init__()
        self.up = Upsample(centred)
        self.out = nn.Conv1d(2, 2, 1)

    def forward(self, x):
        return self.out(self.up(x))
"""


def _module(path: Path, source: str, name: str):
    path.write_text(textwrap.dedent(source).lstrip())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _line(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_the_stretch_starts_at_the_condition_choosing_the_trim(tmp_path: Path) -> None:
    reference_file, port_file = tmp_path / "reference_trim.py", tmp_path / "port_trim.py"
    reference_module = _module(reference_file, REFERENCE_SOURCE, "reference_trim")
    port_module = _module(port_file, PORT_SOURCE, "port_trim")
    torch.manual_seed(0)
    reference = reference_module.Model().eval()
    inputs = torch.randn(1, 2, 16)
    traces = {}
    for name, centred in (("clean", False), ("centred", True)):
        port = port_module.Model(centred).eval()
        port.load_state_dict({key: value for key, value in reference.state_dict().items()}, strict=False)
        with torch.no_grad():
            port.up.convtr.load_state_dict(reference.up.convtr.state_dict())
        with capture(port, tmp_path / f"{name}.mtrace", lines=True, full_tensors=True), torch.no_grad():
            port(inputs)
        traces[name] = tmp_path / f"{name}.mtrace"
    with capture(reference, tmp_path / "reference.mtrace", lines=True, full_tensors=True), torch.no_grad():
        reference(inputs)

    clean = diff_paths(tmp_path / "reference.mtrace", traces["clean"])
    try:
        assert clean.first_divergence is None
    finally:
        close_result(clean)
    result = diff_paths(tmp_path / "reference.mtrace", traces["centred"])
    try:
        divergence = result.first_divergence
        assert divergence is not None and divergence.module.candidate.path == "up"
        line = divergence.line
        assert line is not None and Path(line.file) == port_file.resolve()
        assert line.line == _line(port_file, "hidden_states = hidden_states[..., padding_left:end]")
        # NOTE: after the convolution's line (the last right value) come a norm that did not run and comments:
        # the trim's values are decided from the condition on
        assert line.since == _line(port_file, "if not self.centred:")
    finally:
        close_result(result)


def test_a_bare_call_in_the_stretch_may_change_a_name_in_place(tmp_path: Path) -> None:
    """`y.mul_(scale)` changes `y` without assigning it (the capture records `y` there): it belongs to the stretch
    of a line reading `y`, with the line assigning `scale`; a line reading only `z` leaves both out."""
    port = tmp_path / "port.py"
    port.write_text(
        "def forward(x):\n"
        "    y = x * 2\n"
        "    scale = 3\n"
        "    offset = 1\n"
        "    y.mul_(scale)\n"
        "    z = x + offset\n"
        "    return y + z\n"
    )
    x = torch.randn(4)
    body = [
        LineRecord(str(port), 1, "x", 0, summarize(x, ""), module_call=0),
        LineRecord(str(port), 2, "y", 0, summarize(x * 2, ""), module_call=0),
        LineRecord(str(port), 5, "y", 0, summarize(x * 6, ""), module_call=0),
        LineRecord(str(port), 6, "z", 0, summarize(x + 1, ""), module_call=0),
        LineRecord(str(port), 7, "return", 0, summarize(x * 6 + x + 1, ""), module_call=0),
    ]
    assert narrowed_since(str(port), 7, 3, (1, 7), body, 4) == 3
    # `z` reads the parameter `x` (settled) and `offset`, assigned on line 4
    assert narrowed_since(str(port), 6, 3, (1, 7), body, 3) == 4
    # a source that cannot be read leaves the stretch as it was
    assert narrowed_since(str(tmp_path / "gone.py"), 6, 3, (1, 7), body, 3) == 3
