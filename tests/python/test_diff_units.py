"""The diff's parts on small synthetic inputs: printed tensors both ways, the NumPy safetensors reader, array
comparison (NaN, Inf, tolerances, half precision), alignment (maps, prefixes, pruned layers), line statuses."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from modeltrace.diff import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    DiffOptions,
    compare_arrays,
    diff_traces,
    line_statuses,
    load_reference,
    parse_maps,
    plot_data,
    to_json,
)
from modeltrace.errors import ModelTraceError, TraceFormatError
from modeltrace.trace.hf_debugger import format_tensor_repr, parse_scalar, parse_tensor_repr
from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import TENSORS_FILE, write_trace
from modeltrace.trace.tensors import LoadedTrace, SafetensorsFile


# ------------------------------------------------------------------------------------------ printed tensors


@pytest.fixture
def sci_printing():
    torch.set_printoptions(sci_mode=True, linewidth=120)
    yield
    torch.set_printoptions(profile="default", sci_mode=None)


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 17), (40, 40), (2, 3, 200), (1200,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_tensors_print_as_torch_prints_them_and_read_back(shape, dtype, sci_printing) -> None:
    torch.manual_seed(0)
    tensor = (torch.randn(shape) * 3).to(dtype) if dtype != torch.bool else torch.randn(shape) > 0
    name = str(dtype).removeprefix("torch.")
    values = tensor.float().numpy() if dtype == torch.bfloat16 else tensor.numpy()
    assert format_tensor_repr(values, name) == repr(tensor).splitlines()
    parsed = parse_tensor_repr(repr(tensor).splitlines(), list(shape), name)
    if tensor.numel() > 1000:
        assert parsed is None  # printed with "...": only the statistics are usable
        return
    array, absolute, relative = parsed
    expected = tensor.double().numpy() if dtype.is_floating_point else tensor.numpy()
    if dtype.is_floating_point:
        assert relative == pytest.approx(5e-5) and absolute == 0
        np.testing.assert_allclose(array, expected, rtol=5e-5 + 1e-7, atol=0)
    else:
        np.testing.assert_array_equal(array, expected)


def test_printed_statistics_carry_their_rounding() -> None:
    assert parse_scalar("tensor(-4.1929e-02, device='cuda:0')") == (-4.1929e-02, 0.0, 5e-5)
    assert parse_scalar("tensor(1.)") == (1.0, 0.0, 0.0)
    assert parse_scalar("tensor(0.1235)")[1:] == (5e-5, 0.0)
    value, _, _ = parse_scalar("tensor(nan)")
    assert value != value
    assert parse_scalar("tensor(-inf)")[0] == float("-inf")
    assert parse_scalar("garbage")[0] is None


# ----------------------------------------------------------------------------------------------- safetensors


def test_reader_widens_bfloat16_exactly_and_keeps_other_dtypes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tensors = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f16": torch.randn(4).half(),
        "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 4),
    }
    save_file(tensors, str(tmp_path / "t.safetensors"))
    with SafetensorsFile(tmp_path / "t.safetensors") as reader:
        np.testing.assert_array_equal(reader.array("bf16"), tensors["bf16"].float().numpy())
        assert reader.array("f16").dtype == np.float16
        np.testing.assert_array_equal(reader.array("i64"), tensors["i64"].numpy())
        np.testing.assert_array_equal(reader.array("bool"), [True, False])
        assert reader.array("empty").shape == (0, 4)
        assert reader.tensors["bf16"].dtype_name == "bfloat16"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:-4], "truncated safetensors file"),
        (lambda data: data[:5], "truncated safetensors file"),
        (lambda data: struct.pack("<Q", 1 << 40) + data[8:], "corrupt or truncated safetensors file"),
        (lambda data: data[:8] + b"X" + data[9:], "corrupt safetensors header"),
    ],
    ids=["cut-data", "cut-header", "huge-header", "bad-json"],
)
def test_reader_refuses_damaged_files(damage, message: str, tmp_path: Path) -> None:
    save_file({"x": torch.randn(8, 8)}, str(tmp_path / "t.safetensors"))
    path = tmp_path / "t.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(TraceFormatError, match=message) as caught:
        SafetensorsFile(path)
    assert str(path) in str(caught.value)


# ------------------------------------------------------------------------------------------- compare_arrays


def test_compare_arrays_tolerances_nan_and_inf() -> None:
    a = np.array([1.0, 2.0, 0.0, np.nan, np.inf], dtype=np.float32)
    close, max_abs, max_rel, reason = compare_arrays(a, a.copy(), 1e-3, 0.0)
    assert close and max_abs == 0 and reason is None
    b = a.copy()
    b[1] += 0.01
    close, max_abs, max_rel, _ = compare_arrays(a, b, 1e-3, 0.0)
    assert not close and max_abs == pytest.approx(0.01, rel=1e-4) and max_rel == pytest.approx(0.005, rel=1e-3)
    assert compare_arrays(a, b, 1e-3, 0.01)[0]  # 0.01 <= 1e-3 + 0.01 * 2
    moved = a.copy()
    moved[[2, 3]] = moved[[3, 2]]
    assert compare_arrays(a, moved, 1e-3, 0.0)[3] == "NaN at different positions"
    signs = a.copy()
    signs[4] = -np.inf
    assert compare_arrays(a, signs, 1e-3, 0.0)[3] == "Inf at different positions"
    zero_reference = compare_arrays(np.zeros(4, np.float32), np.full(4, 0.5, np.float32), 1e-3, 0.0)
    assert not zero_reference[0] and zero_reference[1] == 0.5 and zero_reference[2] == 0.0


def test_compare_arrays_handles_large_tensors_in_blocks() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(300_000).astype(np.float32)
    b = a.copy()
    b[250_123] += 0.5
    close, max_abs, _, _ = compare_arrays(a, b, 1e-3, 0.0)
    assert not close and max_abs == pytest.approx(0.5, rel=1e-5)


# ------------------------------------------------------------------------------------- synthetic traces


def _record(index: int, path: str, parent: int, finish: int, line: int | None = None,
            outputs: list[TensorSummary] | None = None, inputs: list[TensorSummary] | None = None) -> ModuleCall:
    record = ModuleCall(index, path, "M", SourceLocation("/model.py", 1),
                        SourceLocation("/model.py", line) if line else None, 0, parent, finish)
    record.inputs = inputs or []
    record.outputs = outputs or []
    return record


def _summary(key: str = "", mean: float = 0.0, dtype: str = "float32", tensor: str | None = None,
             shape: list[int] | None = None) -> TensorSummary:
    return TensorSummary(key, shape or [2, 3], dtype, mean=mean, std=1.0, min=mean - 2, max=mean + 2, tensor=tensor)


def _loaded(records: list[ModuleCall], kind: str = "modeltrace") -> LoadedTrace:
    return LoadedTrace(Trace(model={"class": "M"}, modules=records), None, Path("x"), kind)


def _chain(means: list[float], prefix: str = "") -> list[ModuleCall]:
    """Root calling `prefix`layers.0 … layers.N-1 in sequence, each feeding the next."""
    records = [_record(0, "", -1, len(means), outputs=[_summary(mean=means[-1])])]
    previous = 0.0
    for position, mean in enumerate(means):
        records.append(_record(position + 1, f"{prefix}layers.{position}", 0, position, line=10 + position,
                               inputs=[_summary("hidden_states", previous)], outputs=[_summary(mean=mean)]))
        previous = mean
    return records


def test_statistics_find_the_first_divergence_and_line_statuses() -> None:
    reference = _loaded(_chain([0.0, 1.0, 2.0, 3.0]))
    candidate = _loaded(_chain([0.0, 1.5, 2.5, 3.5]))
    result = diff_traces(reference, candidate)
    assert not result.match
    assert result.first_divergence.module.candidate.path == "layers.1"
    assert result.first_divergence.module.check == "statistics"
    statuses = line_statuses(result)
    assert statuses[("/model.py", 10)] == MATCH
    assert statuses[("/model.py", 11)] == DIVERGENCE
    assert statuses[("/model.py", 12)] == MISMATCH
    plot = plot_data(result)
    assert [point["status"] for point in plot["points"]][:3] == [MATCH, DIVERGENCE, MISMATCH]
    assert plot["first_divergence"] == 1
    assert [layer["layer"] for layer in plot["layers"]] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    document = json.loads(json.dumps(to_json(result), allow_nan=False))
    assert document["first_divergence"]["max_rel_diff"] is None  # statistics give no relative difference
    assert document["first_divergence"]["max_abs_diff"] == pytest.approx(0.5)


def test_worst_status_of_a_line_wins() -> None:
    reference = _chain([0.0, 1.0, 2.0])
    candidate = _chain([0.0, 1.0, 2.5])
    for records in (reference, candidate):
        for record in records[1:]:
            record.called_at = SourceLocation("/model.py", 20)  # a loop: every layer called on one line
    result = diff_traces(_loaded(reference), _loaded(candidate))
    assert line_statuses(result) == {("/model.py", 20): DIVERGENCE}


def test_maps_and_prefixes_align_renamed_modules() -> None:
    reference = _loaded(_chain([0.0, 1.0], prefix="transformer.h_"))
    for record in reference.trace.modules[1:]:
        record.path = record.path.replace("h_layers.", "h.")
    candidate = _loaded(_chain([0.0, 1.0]))
    with pytest.raises(ModelTraceError, match="nothing aligns"):
        diff_traces(reference, candidate, DiffOptions(automatic=False))
    # names left aside, the evidence (order, signatures, values, layer index) aligns them
    automatic = diff_traces(reference, candidate)
    assert automatic.match and {module.aligned_by for module in automatic.modules} == {"auto"}
    options = DiffOptions(maps=tuple(parse_maps([r"^transformer\.h\.(\d+)=>layers.\1"])))
    assert diff_traces(reference, candidate, options).match
    # A `...ForCausalLM` reference against its base model: the common `model.` prefix is found on its own.
    wrapped = _chain([0.0, 1.0], prefix="model.")
    wrapped.insert(1, _record(len(wrapped), "model", 0, 99, outputs=[_summary(mean=1.0)]))
    result = diff_traces(_loaded(wrapped), candidate)
    assert result.match and result.alignment.prefix == "model."
    assert result.modules[0].reference.path == "model"


def test_layers_missing_from_a_pruned_debugger_reference_are_not_unaligned() -> None:
    full = _chain([0.0, 1.0, 2.0, 3.0])
    pruned = [record for record in _chain([0.0, 1.0, 2.0, 3.0]) if record.path not in ("layers.1", "layers.2")]
    result = diff_traces(_loaded(pruned, "hf-debugger"), _loaded(full))
    assert result.match
    pruned_paths = {result.candidate.trace.modules[index].path for index in result.alignment.pruned}
    assert pruned_paths == {"layers.1", "layers.2"}
    assert not result.alignment.unaligned_candidate
    reasons = {module.candidate.path: module.reason for module in result.modules if module.status == NOT_COMPARED}
    assert "pruned" in reasons["layers.1"]


def test_half_precision_tolerance_follows_the_dtype(tmp_path: Path) -> None:
    values = torch.linspace(-4, 4, 64).reshape(2, 32)

    def trace(name: str, tensor: torch.Tensor) -> Path:
        dtype = str(tensor.dtype).removeprefix("torch.")
        summary = TensorSummary("", [2, 32], dtype, mean=0.0, std=1.0, min=-4.0, max=4.0, tensor="0/outputs/")
        record = _record(0, "", -1, 0, outputs=[summary])
        child = _record(1, "proj", 0, 0, outputs=[TensorSummary("", [2, 32], dtype, mean=0.0, std=1.0, min=-4.0,
                                                                 max=4.0, tensor="0/outputs/")])
        record.finish_order = 1
        return write_trace(Trace(model={"class": "M"}, modules=[record, child]), tmp_path / name,
                           lambda folder: save_file({"0/outputs/": tensor}, str(folder / TENSORS_FILE)))

    one_ulp = values.to(torch.bfloat16) + (values.to(torch.bfloat16).abs() * 2**-7).to(torch.bfloat16)
    with load_reference(trace("a", values.to(torch.bfloat16))) as a, load_reference(trace("b", one_ulp)) as b:
        assert diff_traces(a, b).match  # bfloat16: rtol 1.6e-2 by default
        assert not diff_traces(a, b, DiffOptions(rtol=0.0)).match
    with load_reference(trace("c", values)) as c, load_reference(trace("d", one_ulp.float())) as d:
        assert not diff_traces(c, d).match  # the same numbers in float32: rtol 0
