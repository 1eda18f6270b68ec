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
    INHERITED,
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


def _record(
    index: int,
    path: str,
    parent: int,
    finish: int,
    line: int | None = None,
    outputs: list[TensorSummary] | None = None,
    inputs: list[TensorSummary] | None = None,
) -> ModuleCall:
    record = ModuleCall(
        index,
        path,
        "M",
        SourceLocation("/model.py", 1),
        SourceLocation("/model.py", line) if line else None,
        0,
        parent,
        finish,
    )
    record.inputs = inputs or []
    record.outputs = outputs or []
    return record


def _summary(
    key: str = "", mean: float = 0.0, dtype: str = "float32", tensor: str | None = None, shape: list[int] | None = None
) -> TensorSummary:
    return TensorSummary(key, shape or [2, 3], dtype, mean=mean, std=1.0, min=mean - 2, max=mean + 2, tensor=tensor)


def _loaded(records: list[ModuleCall], kind: str = "modeltrace") -> LoadedTrace:
    return LoadedTrace(Trace(model={"class": "M"}, modules=records), None, Path("x"), kind)


def _chain(means: list[float], prefix: str = "") -> list[ModuleCall]:
    """Root calling `prefix`layers.0 … layers.N-1 in sequence, each feeding the next."""
    records = [_record(0, "", -1, len(means), outputs=[_summary(mean=means[-1])])]
    previous = 0.0
    for position, mean in enumerate(means):
        records.append(
            _record(
                position + 1,
                f"{prefix}layers.{position}",
                0,
                position,
                line=10 + position,
                inputs=[_summary("hidden_states", previous)],
                outputs=[_summary(mean=mean)],
            )
        )
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
    # layers.2 differs only because its inputs already do: its line says the difference is inherited
    assert statuses[("/model.py", 12)] == INHERITED
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
        child = _record(
            1,
            "proj",
            0,
            0,
            outputs=[TensorSummary("", [2, 32], dtype, mean=0.0, std=1.0, min=-4.0, max=4.0, tensor="0/outputs/")],
        )
        record.finish_order = 1
        return write_trace(
            Trace(model={"class": "M"}, modules=[record, child]),
            tmp_path / name,
            lambda folder: save_file({"0/outputs/": tensor}, str(folder / TENSORS_FILE)),
        )

    one_ulp = values.to(torch.bfloat16) + (values.to(torch.bfloat16).abs() * 2**-7).to(torch.bfloat16)
    with load_reference(trace("a", values.to(torch.bfloat16))) as a, load_reference(trace("b", one_ulp)) as b:
        assert diff_traces(a, b).match  # bfloat16: rtol 1.6e-2 by default
        assert not diff_traces(a, b, DiffOptions(rtol=0.0)).match
    with load_reference(trace("c", values)) as c, load_reference(trace("d", one_ulp.float())) as d:
        assert not diff_traces(c, d).match  # the same numbers in float32: rtol 0


# ------------------------------------------------------------------ tensor pairing, shapes, scale, coverage


def _full_trace(tmp_path: Path, name: str, records: list[ModuleCall], tensors: dict[str, torch.Tensor]) -> Path:
    return write_trace(
        Trace(model={"class": "M"}, modules=records),
        tmp_path / name,
        lambda folder: save_file(tensors, str(folder / TENSORS_FILE)),
    )


def _leaf(key: str, tensor: torch.Tensor, name: str | None = None) -> TensorSummary:
    values = tensor.double()
    return TensorSummary(
        key,
        list(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
        mean=float(values.mean()),
        std=float(values.std()) if tensor.numel() > 1 else 0.0,
        min=float(values.min()),
        max=float(values.max()),
        tensor=name,
    )


def test_extra_inputs_and_outputs_neither_block_nor_decide() -> None:
    """transformers' attention takes hidden states, a mask and position ids and returns (output, weights); the
    port's takes x and returns one tensor: the hidden states are compared, the rest is left out with why, and
    the attention (inputs match, outputs differ) is the first divergence."""
    hidden, mask, ids = (
        _summary("hidden_states", 0.0, shape=[1, 7, 64]),
        _summary("attention_mask", -1e9, shape=[1, 1, 7, 7]),
        None,
    )
    ids = TensorSummary("position_ids", [1, 7], "int64", mean=3.0, std=2.0, min=0.0, max=6.0)
    weights = _summary("1", 0.14, shape=[1, 4, 7, 7])
    reference = [
        _record(0, "", -1, 1, outputs=[_summary(mean=1.0, shape=[1, 7, 64])]),
        _record(
            1,
            "attn",
            0,
            0,
            line=10,
            inputs=[hidden, mask, ids],
            outputs=[_summary("0", 1.0, shape=[1, 7, 64]), weights],
        ),
    ]
    candidate = [
        _record(0, "", -1, 1, outputs=[_summary(mean=1.5, shape=[1, 7, 64])]),
        _record(
            1,
            "attn",
            0,
            0,
            line=10,
            inputs=[_summary("x", 0.0, shape=[1, 7, 64])],
            outputs=[_summary("", 1.5, shape=[1, 7, 64])],
        ),
    ]
    result = diff_traces(_loaded(reference), _loaded(candidate))
    attention = result.modules[1]
    assert attention.inputs == MATCH and attention.outputs == MISMATCH
    assert result.first_divergence.module is attention and result.first_divergence.inputs_match
    compared = to_json(result)["modules"][1]["compared"]
    assert compared["inputs"] == [
        {"reference": "hidden_states", "candidate": "x", "how": "same shape", "relation": "same"}
    ]
    assert [(leaf["side"], leaf["in"], leaf["key"]) for leaf in compared["left_out"]] == [
        ("inputs", "reference", "attention_mask"),
        ("inputs", "reference", "position_ids"),
        ("outputs", "reference", "1"),
    ]
    assert all(leaf["reason"] for leaf in compared["left_out"])


def test_pairing_prefers_close_statistics_over_position() -> None:
    """cos and sin of one shape: each pairs with its own kind, whatever order the two sides pass them in."""
    cos = TensorSummary("position_embeddings.0", [1, 7, 16], "float32", mean=0.8, std=0.3, min=-1, max=1)
    sin = TensorSummary("position_embeddings.1", [1, 7, 16], "float32", mean=0.1, std=0.5, min=-1, max=1)
    hidden = _summary("hidden_states", 0.0, shape=[1, 7, 64])
    cand = [
        _summary("x", 0.0, shape=[1, 7, 64]),
        TensorSummary("sin", [1, 7, 16], "float32", mean=0.1, std=0.5, min=-1, max=1),
        TensorSummary("cos", [1, 7, 16], "float32", mean=0.8, std=0.3, min=-1, max=1),
    ]
    from modeltrace.diff.pairing import pair_leaves

    pairing = pair_leaves([hidden, cos, sin], cand)
    assert {(pair.reference.key, pair.candidate.key) for pair in pairing.pairs} == {
        ("hidden_states", "x"),
        ("position_embeddings.0", "cos"),
        ("position_embeddings.1", "sin"),
    }
    assert not pairing.left_out


def test_broadcast_equivalent_shapes_compare_as_equal_and_real_differences_stay(tmp_path: Path) -> None:
    values = torch.randn(7, 64)
    reference = [_record(0, "", -1, 0, outputs=[_leaf("", values.unsqueeze(0), "r")])]
    same = [_record(0, "", -1, 0, outputs=[_leaf("", values, "c")])]
    with (
        load_reference(_full_trace(tmp_path, "r", reference, {"r": values.unsqueeze(0)})) as ref,
        load_reference(_full_trace(tmp_path, "c", same, {"c": values.clone()})) as cand,
    ):
        result = diff_traces(ref, cand)
        assert result.match and result.modules[0].check == "full"
        assert to_json(result)["modules"][0]["compared"]["outputs"][0]["relation"] == "broadcast"
    # statistics only: the same numbers have the same statistics
    assert diff_traces(_loaded(reference), _loaded(same)).match
    narrower = [_record(0, "", -1, 0, outputs=[_leaf("", values[:, :32].unsqueeze(0))])]
    result = diff_traces(_loaded(reference), _loaded(narrower))
    assert not result.match and "shape [1, 7, 64] vs [1, 7, 32]" in result.modules[0].reason


def test_a_last_position_head_is_compared_on_the_positions_both_hold(tmp_path: Path) -> None:
    logits = torch.randn(1, 7, 50)
    reference = [_record(0, "", -1, 0, outputs=[_leaf("logits", logits, "r")])]
    last = [_record(0, "", -1, 0, outputs=[_leaf("", logits[:, -1:].clone(), "c")])]
    wrong = [_record(0, "", -1, 0, outputs=[_leaf("", logits[:, :1].clone(), "c")])]
    with load_reference(_full_trace(tmp_path, "r", reference, {"r": logits})) as ref:
        with load_reference(_full_trace(tmp_path, "last", last, {"c": logits[:, -1:].clone()})) as cand:
            result = diff_traces(ref, cand)
            assert result.match and result.modules[0].check == "full"
            how = to_json(result)["modules"][0]["compared"]["outputs"][0]["how"]
            assert how.startswith("overlap: the last 1 of 7 positions of dimension 1")
        with load_reference(_full_trace(tmp_path, "first", wrong, {"c": logits[:, :1].clone()})) as cand:
            assert not diff_traces(ref, cand).match  # the first position is not the last one
    # statistics of a subset of positions prove nothing either way: not compared, not a mismatch
    result = diff_traces(_loaded(reference), _loaded(last))
    assert result.modules[0].status == NOT_COMPARED


def _one_output(tmp_path: Path, name: str, tensor: torch.Tensor) -> Path:
    record = _record(0, "", -1, 0, outputs=[_leaf("", tensor, "t")])
    return _full_trace(tmp_path, name, [record], {"t": tensor})


def test_relative_error_flags_small_values_and_forgives_large_ones(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    small = torch.randn(4, 64, 64, generator=generator) * 0.02
    # up to 3e-4 off on values of std 0.02: under atol 1e-3, ~1% relative error
    shifted = small + 3e-4 * (2 * torch.rand(small.shape, generator=generator) - 1)
    with (
        load_reference(_one_output(tmp_path, "a", small)) as a,
        load_reference(_one_output(tmp_path, "b", shifted)) as b,
    ):
        result = diff_traces(a, b)
        module = result.modules[0]
        assert not result.match and module.max_abs_diff < 1e-3 and module.rel_err > 5e-3
        assert "relative error" in module.reason
        assert 0.99 < module.cosine < 1.0
        assert diff_traces(a, b, DiffOptions(rel_tol=0.1)).match  # the relative bound is the user's to set
    # statistics only: a 1% scale error (max abs diff under 1e-3) moves the std past rel_tol·rms; independent
    # noise of the same size does not move the statistics (the weaker check cannot see it)
    scaled = small * 1.01
    assert float((scaled - small).abs().max()) < 1e-3
    statistics = [_record(0, "", -1, 0, outputs=[_leaf("", small)])]
    assert not diff_traces(_loaded(statistics), _loaded([_record(0, "", -1, 0, outputs=[_leaf("", scaled)])])).match
    assert diff_traces(_loaded(statistics), _loaded([_record(0, "", -1, 0, outputs=[_leaf("", shifted)])])).match
    # logits of magnitude 1e3 in bfloat16, 0.5 apart: within bfloat16's rounding at that scale
    logits = (torch.randn(1, 7, 256, generator=generator) * 1e3).to(torch.bfloat16)
    moved = (logits.float() + 0.5 * torch.sign(torch.randn(logits.shape, generator=generator))).to(torch.bfloat16)
    with (
        load_reference(_one_output(tmp_path, "c", logits)) as c,
        load_reference(_one_output(tmp_path, "d", moved)) as d,
    ):
        assert diff_traces(c, d).match
    # float32 logits of magnitude 1e3 with float32 rounding noise: atol is per unit of scale by default
    wide = torch.randn(1, 7, 256, generator=generator).double() * 1e3
    noisy = wide * (1 + 1e-6 * torch.randn(wide.shape, generator=generator, dtype=torch.float64))
    with (
        load_reference(_one_output(tmp_path, "e", wide.float())) as e,
        load_reference(_one_output(tmp_path, "f", noisy.float())) as f,
    ):
        assert diff_traces(e, f).match
        assert not diff_traces(e, f, DiffOptions(atol=1e-4)).match  # a given atol is absolute


def test_maps_apply_after_the_prefix_and_unused_maps_are_reported() -> None:
    """A `…ForCausalLM` reference (`model.` prefix) against a port with its own names: a map written against
    the stripped names aligns; one that matches nothing, or aligns nothing, is a warning."""
    reference = _chain([0.0, 1.0, 2.0], prefix="model.")
    reference.insert(1, _record(len(reference), "model", 0, 99, outputs=[_summary(mean=2.0)]))
    reference.append(_record(len(reference), "model.embed_tokens", 1, 98, outputs=[_summary(mean=0.5)]))
    candidate = _chain([0.0, 1.0, 2.0])
    candidate.append(_record(len(candidate), "tok_emb", 0, 97, outputs=[_summary(mean=0.5)]))
    options = DiffOptions(
        maps=tuple(parse_maps([r"^embed_tokens$=>tok_emb", r"^nowhere\.(\d+)=>x.\1", r"^layers\.2$=>blocks.2"]))
    )
    result = diff_traces(_loaded(reference), _loaded(candidate), options)
    assert result.alignment.prefix == "model."
    embedding = next(module for module in result.modules if module.candidate.path == "tok_emb")
    assert embedding.reference.path == "model.embed_tokens" and embedding.aligned_by == "map"
    warnings = [note for note in result.notes if note.startswith("warning: --map")]
    assert len(warnings) == 2
    assert "nowhere" in warnings[0] and "matches no module path" in warnings[0]
    assert "layers" in warnings[1] and "aligns no module call" in warnings[1]
    assert to_json(result)["notes"][-2:] == warnings


def test_a_verdict_on_too_little_aligned_is_not_a_match() -> None:
    reference = _chain([float(number) for number in range(24)])
    candidate = _chain([float(number) for number in range(24)])
    for record in candidate[3:]:
        record.path = record.path.replace("layers.", "blocks.")
    # names only: 2 of 24 calls align (by evidence, all would: see test_maps_and_prefixes_align_renamed_modules)
    result = diff_traces(_loaded(reference), _loaded(candidate), DiffOptions(automatic=False))
    assert result.match and result.verdict == "not_comparable"
    assert "only 2 of 24 module calls aligned" in result.not_comparable
    document = to_json(result)
    assert document["match"] is False and document["verdict"] == "not_comparable"
    from modeltrace.diff import render_text

    assert "NOT COMPARABLE: only 2 of 24" in render_text(result)


def test_replay_without_full_tensors_falls_back_and_says_why() -> None:
    from modeltrace.diff import run_replay

    result = diff_traces(_loaded(_chain([0.0, 1.0, 2.0])), _loaded(_chain([0.0, 1.5, 2.5])))
    before = result.first_divergence.module.candidate.path
    run_replay(result)
    assert result.first_divergence.module.candidate.path == before == "layers.1"
    assert not result.replayed
    assert any(note.startswith("replay not used: the reference has no full tensors") for note in result.notes)


def _inline_change_chain(scale_between: float) -> list[ModuleCall]:
    """Root (its outputs not recorded) calling layers.0 … layers.2; between layers.0 and layers.1 the root's own
    code shifts the hidden states by `scale_between` (no module covers it)."""
    records = _chain([1.0, 2.0, 3.0])
    records[0].outputs = []
    records[2].inputs = [_summary("hidden_states", 1.0 + scale_between)]
    records[2].outputs = [_summary(mean=2.0 + scale_between)]
    records[3].inputs = [_summary("hidden_states", 2.0 + scale_between)]
    records[3].outputs = [_summary(mean=3.0 + scale_between)]
    return records


def test_differences_whose_start_no_module_shows_are_not_comparable(tmp_path: Path) -> None:
    """Every differing module already receives differing inputs (the change is in code no compared module
    covers): no module is the first divergence; the verdict is "not_comparable" (exit 2) and says where comparison
    stopped being possible and why, never DIVERGENCE on a module whose inputs differ."""
    result = diff_traces(_loaded(_inline_change_chain(0.0)), _loaded(_inline_change_chain(0.5)))
    assert not result.match and result.first_divergence is None
    assert result.verdict == "not_comparable"
    reason = result.not_comparable
    assert "comparison stops at layers.1 (called at /model.py:11): its inputs already differ" in reason
    assert "after layers.0, which still matches" in reason
    document = to_json(result)
    assert document["verdict"] == "not_comparable" and document["match"] is False
    assert document["first_divergence"] is None and document["not_comparable"] == reason
    from modeltrace.diff import render_text

    text = render_text(result)
    assert "NOT COMPARABLE: comparison stops at layers.1" in text and "DIVERGENCE" not in text
    from modeltrace.trace.html import diff_html

    assert "NOT COMPARABLE" in diff_html(document) and "comparison stops at layers.1" in diff_html(document)
    # the CLI's contract: exit 2 with the reason on stderr
    paths = []
    for name, shift in (("reference", 0.0), ("candidate", 0.5)):
        paths.append(write_trace(Trace(model={"class": "M"}, modules=_inline_change_chain(shift)), tmp_path / name))
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", *map(str, paths)], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "not comparable: comparison stops at layers.1" in completed.stderr


def test_differing_model_inputs_are_not_comparable() -> None:
    """The fallback's other case: the model's own inputs differ, so every module's inputs may: the reason names
    the root and what to do."""
    reference, candidate = _chain([0.0, 1.0]), _chain([0.5, 1.5])
    for records, mean in ((reference, 0.0), (candidate, 0.3)):
        records[0].inputs = [_summary("input_ids", mean)]
        records[0].outputs = []
        records[1].inputs = [_summary("hidden_states", mean)]
    result = diff_traces(_loaded(reference), _loaded(candidate))
    assert result.verdict == "not_comparable" and result.first_divergence is None
    assert "the model's inputs differ: comparison stops at the root" in result.not_comparable


def test_a_module_with_matching_inputs_is_still_the_first_divergence() -> None:
    """The not-comparable verdict only where no module qualifies: a change inside layers.1 stays a divergence."""
    reference, candidate = _chain([1.0, 2.0, 3.0]), _chain([1.0, 2.5, 3.5])
    reference[0].outputs, candidate[0].outputs = [], []
    result = diff_traces(_loaded(reference), _loaded(candidate))
    assert result.verdict == "divergence" and result.not_comparable is None
    assert result.first_divergence.module.candidate.path == "layers.1"
