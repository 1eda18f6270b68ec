"""`stats.summarize` against torch's own reductions (in float64) for the dtypes and the special values models produce.

Every test runs on three paths: the fused C kernel as this CPU builds it (AVX2 or AVX-512 where present), the
same kernel built with the baseline flags (what a CPU without those runs), and the NumPy/torch fallback (no
compiler, `MODELTRACE_NATIVE=0`). Sizes on both sides of the NumPy/torch split (`_NUMPY_MAX_ELEMENTS`) run the
checks through both fallback paths, with and without a `PendingStats` (whose reused buffers the torch path then
uses). Where this machine has no kernel by its own configuration, the kernel paths are skipped with that reason.

Mean and std are checked against float64 references within error bounds derived from how each path sums
(`_moment_bounds`), not tolerances tuned until green; min, max, abs-max and the positive count are exact on
every path.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeltrace.worker import native, stats
from modeltrace.worker.stats import PendingStats, summarize


SMALL = 7 * 64  # a tiny model's hidden states: the NumPy path
LARGE = stats._NUMPY_MAX_ELEMENTS + 1  # just past it: the torch path
SIZES = [pytest.param(SMALL, id="small"), pytest.param(LARGE, id="large")]
PENDING = [pytest.param(False, id="no-pending"), pytest.param(True, id="pending")]
KERNEL_PATHS = ("native", "baseline")


def _require_kernels(kernels: dict | None, what: str) -> dict:
    """The kernels, or a skip when the machine has none by its own configuration; a build that was tried and
    failed is a failure (CI has a compiler: a broken kernel must not pass as a skip)."""
    if kernels is not None:
        return kernels
    absent = native.absent_reason()
    if absent is not None:
        pytest.skip(f"the native statistics kernel is not available here: {absent}")
    pytest.fail(f"the {what} did not load: {native.load_error}")


@pytest.fixture(autouse=True, params=["native", "baseline", "torch"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs three times: the kernel as this CPU builds it, the kernel built with the baseline flags
    (no AVX2/FMA/AVX-512), and the NumPy/torch paths."""
    if request.param == "torch":
        monkeypatch.setattr(stats, "_native_kernels", {})
        monkeypatch.setattr(stats, "_strided_kernel", None)
    elif request.param == "baseline":
        kernels = _require_kernels(native.baseline_kernels(), "baseline-flags build of the statistics kernel")
        monkeypatch.setattr(stats, "_native_kernels", stats.kernel_table(kernels))
        monkeypatch.setattr(stats, "_strided_kernel", kernels["f32_strided"])
    else:
        _require_kernels(native.kernels(), "native statistics kernel")
    return request.param


# Error bounds (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §4.2): recursive summation of
# terms x_i errs by at most γ(k)·Σ|x_i|, k the longest chain of additions, γ(k) = k·u / (1 - k·u), u the unit
# roundoff; a product adds one more rounding.
FLOAT32_UNIT = 2.0**-24
FLOAT64_UNIT = 2.0**-53
KERNEL_BLOCK = 1024  # moments.c's BLOCK: float32 sums within a block, float64 across blocks
KERNEL_THREADS = 64  # moments.c's MAX_THREADS: per-thread partial results add this many more float64 terms


def _gamma(chain: float, unit: float) -> float:
    return chain * unit / (1 - chain * unit)


def _moment_bounds(values: torch.Tensor, float32_sums: bool) -> tuple[float, float]:
    """Bounds on |mean - exact| and |std - exact| for the values summarised.

    `float32_sums`: the kernel's float32 path: within a block of 1,024 values, at most 1,023 float32 additions
    in a chain (vector lanes only shorten chains, so the bound holds for every build) and one rounding per
    square; the block sums then meet in float64, n/1,024 plus up to 64 thread partials. Otherwise the sums are
    float64 over exactly widened values (the fallbacks, float64 and integer tensors, half precision widened
    first): n additions, and one rounding per square (none for float32 inputs, but bound it anyway).
    The mean is S1/n; the variance (S2 - S1·mean)/(n-1) moves by (ΔS2 + 2|mean|·ΔS1)/(n-1) to first order and
    the std by half the variance's relative change; 8 float64 roundings cover the final arithmetic and the
    float64 reference itself."""
    exact = values.detach().reshape(-1).double()
    count = exact.numel()
    total_error, square_error = _sum_bounds(exact, float32_sums)
    mean = exact.mean().item()
    std = exact.std().item() if count > 1 else 0.0
    mean_bound = total_error / count + 8 * FLOAT64_UNIT * abs(mean)
    variance_error = (square_error + 2 * abs(mean) * total_error) / max(count - 1, 1)
    std_bound = (variance_error / (2 * std * std) + 8 * FLOAT64_UNIT) * std if std > 0 else variance_error**0.5
    return mean_bound, std_bound


def _sum_bounds(values: torch.Tensor, float32_sums: bool) -> tuple[float, float]:
    """Bounds on the errors of the sum and the sum of squares of `values` (see `_moment_bounds`)."""
    exact = values.detach().reshape(-1).double()
    count = exact.numel()
    abs_sum, square_sum = exact.abs().sum().item(), torch.dot(exact, exact).item()
    if float32_sums:
        across = _gamma(count / KERNEL_BLOCK + KERNEL_THREADS, FLOAT64_UNIT)
        return (
            (_gamma(KERNEL_BLOCK - 1, FLOAT32_UNIT) + across) * abs_sum,
            (_gamma(KERNEL_BLOCK, FLOAT32_UNIT) + across) * square_sum,
        )
    return _gamma(count, FLOAT64_UNIT) * abs_sum, _gamma(count + 1, FLOAT64_UNIT) * square_sum


def _float32_sums(kernel: str, dtype: torch.dtype) -> bool:
    """Whether `kernel`'s path sums this dtype in float32 blocks (the kernel's float32 path, half precision
    widened to float32 first); everything else is summed in float64."""
    return kernel in KERNEL_PATHS and dtype in (torch.float32, torch.float16, torch.bfloat16)


def _summarize(tensor: torch.Tensor, with_pending: bool = False, key: str = "x"):
    pending = PendingStats() if with_pending else None
    summary = summarize(tensor, key, pending)
    if pending is not None:
        pending.resolve()
    return summary


def _expected(values: torch.Tensor) -> dict[str, float]:
    """Reference statistics of `values` computed by torch in float64."""
    exact = values.detach().reshape(-1).double()
    std, mean = torch.std_mean(exact)  # correction=1: the unbiased estimate
    return {
        "mean": mean.item(),
        "std": std.item(),
        "min": exact.min().item(),
        "max": exact.max().item(),
        "abs_max": exact.abs().max().item(),
        "positive_fraction": (exact > 0).double().mean().item(),
    }


def _assert_matches(summary, values: torch.Tensor, float32_sums: bool) -> None:
    """`summary` against `_expected(values)`: moments within `_moment_bounds`, the rest exact."""
    expected = _expected(values)
    mean_bound, std_bound = _moment_bounds(values, float32_sums)
    assert abs(summary.mean - expected["mean"]) <= mean_bound, (summary.mean, expected["mean"], mean_bound)
    assert abs(summary.std - expected["std"]) <= std_bound, (summary.std, expected["std"], std_bound)
    # min, max, abs_max and the positive count are exact on every path
    assert summary.min == expected["min"]
    assert summary.max == expected["max"]
    assert summary.abs_max == expected["abs_max"]
    assert summary.positive_fraction == pytest.approx(expected["positive_fraction"], rel=1e-12)
    assert (summary.nan_count, summary.inf_count) == (0, 0)


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("size", SIZES)
def test_float32_matches_torch(size: int, with_pending: bool, kernel: str) -> None:
    generator = torch.Generator().manual_seed(size)
    tensor = torch.randn(size, generator=generator) * 3 + 0.5
    tensor = tensor.reshape(1, size, 1)
    summary = _summarize(tensor, with_pending, key="hidden_states")
    assert (summary.key, summary.shape, summary.dtype, summary.device) == (
        "hidden_states",
        [1, size, 1],
        "float32",
        "cpu",
    )
    assert summary.tensor is None
    _assert_matches(summary, tensor, _float32_sums(kernel, tensor.dtype))
    # cross-check the reference itself against torch's float32 reductions
    assert summary.mean == pytest.approx(tensor.mean().item(), rel=1e-4)
    assert summary.std == pytest.approx(tensor.std().item(), rel=1e-4)
    assert summary.min == tensor.min().item() and summary.max == tensor.max().item()


@pytest.mark.parametrize("size", SIZES)
def test_non_contiguous_view(size: int, kernel: str) -> None:
    base = torch.randn(2, size, generator=torch.Generator().manual_seed(1))
    view = base.t()[::2]  # transposed and strided
    assert not view.is_contiguous()
    _assert_matches(_summarize(view), view, _float32_sums(kernel, view.dtype))


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype: torch.dtype, size: int, with_pending: bool, kernel: str) -> None:
    tensor = (torch.randn(size, generator=torch.Generator().manual_seed(2)) * 2 - 0.25).to(dtype)
    summary = _summarize(tensor, with_pending)
    assert summary.dtype == str(dtype).removeprefix("torch.")
    # statistics of the values the tensor holds (half precision is widened before any arithmetic)
    _assert_matches(summary, tensor, _float32_sums(kernel, tensor.dtype))


@pytest.mark.parametrize("size", SIZES)
def test_int64(size: int) -> None:
    tensor = torch.randint(-1000, 5000, (size,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    summary = _summarize(tensor)
    assert summary.dtype == "int64"
    # integer sums are exact in float64: the mean is the exact quotient
    assert summary.mean == tensor.sum().item() / size
    _assert_matches(summary, tensor, float32_sums=False)
    assert isinstance(summary.min, float) and summary.min == float(tensor.min().item())


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_other_integer_widths_and_large_values(dtype: torch.dtype) -> None:
    """int64 has its own kernel, the other widths are widened: min and max stay exact integers, also far past
    float32's 2**24 (ids of large vocabularies, hashed ids)."""
    info = torch.iinfo(dtype)
    values = torch.tensor([info.min, -3, 0, 7, info.max, 2**40 if dtype == torch.int64 else 5], dtype=dtype)
    values = values.clamp(info.min, info.max)
    summary = _summarize(values[[0, 4, 1, 2, 3, 5]])  # a fancy-indexed copy: contiguous, own memory
    exact = values.double()
    assert summary.min == exact.min().item() and summary.max == exact.max().item()
    assert summary.positive_fraction == (values > 0).double().mean().item()
    assert summary.mean == pytest.approx(exact.mean().item(), rel=1e-12)
    strided = _summarize(values[::2])
    assert strided.min == values[::2].double().min().item() and strided.max == values[::2].double().max().item()


@pytest.mark.parametrize("size", SIZES)
def test_bool(size: int) -> None:
    tensor = torch.rand(size, generator=torch.Generator().manual_seed(4)) > 0.3
    summary = _summarize(tensor)
    assert summary.dtype == "bool"
    fraction = tensor.sum().item() / size
    assert summary.mean == pytest.approx(fraction, rel=1e-12)
    assert summary.positive_fraction == pytest.approx(fraction, rel=1e-12)
    assert summary.std == pytest.approx(tensor.double().std().item(), rel=1e-12)
    assert (summary.min, summary.max, summary.abs_max) == (0.0, 1.0, 1.0)


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("size", SIZES)
def test_nan_and_inf_are_counted_and_excluded(size: int, with_pending: bool) -> None:
    tensor = torch.randn(size, generator=torch.Generator().manual_seed(5))
    tensor[3] = float("nan")
    tensor[10] = float("nan")
    tensor[20] = float("inf")
    tensor[21] = float("inf")
    tensor[22] = -float("inf")
    summary = _summarize(tensor, with_pending)
    assert (summary.nan_count, summary.inf_count) == (2, 3)
    finite = tensor[torch.isfinite(tensor)]
    expected = _expected(finite)
    assert summary.mean == pytest.approx(expected["mean"], rel=1e-9, abs=1e-12)
    assert summary.std == pytest.approx(expected["std"], rel=1e-9)
    assert (summary.min, summary.max) == (expected["min"], expected["max"])
    assert summary.abs_max == expected["abs_max"]
    assert math.isfinite(summary.mean) and math.isfinite(summary.std)
    # the fraction counts +inf as positive and is taken over every element, NaN included
    positives = (finite > 0).sum().item() + 2
    assert summary.positive_fraction == pytest.approx(positives / size, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_the_device_path_gives_the_cpu_paths_numbers(dtype: torch.dtype, kernel: str) -> None:
    """`PendingStats.add` is what a tensor off the CPU (CUDA, MPS) takes when it is not staged: its reductions
    run on the tensor's own device and are fetched in one batch at `resolve`. Driven here with CPU tensors, so
    that a machine without a GPU runs it: the same numbers as the CPU's own path, special values included, and
    no statistics where no value is finite."""
    tensor = torch.randn(SMALL, generator=torch.Generator().manual_seed(6)).mul(100).to(dtype)
    if dtype.is_floating_point:
        tensor[3], tensor[20], tensor[22] = float("nan"), float("inf"), -float("inf")
    for values in (tensor, torch.full((6,), float("nan"))):
        pending = PendingStats()
        summary = stats.TensorSummary("x", list(values.shape), str(values.dtype), "cpu")
        pending.add(summary, stats._statistics_input(values))
        pending.resolve()
        _assert_same_summary(summary, _summarize(values), values)


@pytest.mark.parametrize("without_float64", [False, True], ids=["float64", "no-float64"])
@pytest.mark.parametrize("out_of_memory", [None, "stage", "reduce"])
def test_staged_device_tensors_get_the_cpu_paths_numbers(
    kernel: str, monkeypatch: pytest.MonkeyPatch, without_float64: bool, out_of_memory: str | None
) -> None:
    """`PendingStats.add_device` stages float32 and half-precision tensors (a copy each, from a block's start)
    and reduces a stage at a time, block by block; driven with CPU tensors, small blocks and a small stage, so
    that tensors fill several stages and end mid-block, one is too large for any and takes `add`, and integers
    are never staged. Views, special values, all-NaN and single values
    included; every summary as the CPU's path makes it, in the order given. Also as on a device without float64
    (MPS: `_NO_FLOAT64`, the stage and `add` in float32), and where the device has no memory for a stage or for
    reducing it (the tensors then go one by one)."""
    monkeypatch.setattr(stats, "_BLOCK", 64)
    monkeypatch.setattr(stats, "_STAGE_ELEMENTS", 16 * 64)
    if without_float64:
        monkeypatch.setattr(stats, "_NO_FLOAT64", {"cpu": "as MPS, for this test"})

    def out_of_device_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("out of memory (the test's)")

    if out_of_memory == "stage":
        monkeypatch.setattr(stats._DeviceStage, "__init__", out_of_device_memory)
    elif out_of_memory == "reduce":
        monkeypatch.setattr(stats._DeviceStage, "reduce", out_of_device_memory)
    draw = torch.Generator().manual_seed(7)
    special = torch.randn(300, generator=draw)
    special[[3, 50]], special[7], special[9] = float("nan"), float("inf"), -float("inf")
    tensors = [
        torch.randn(7, 64, generator=draw),  # 448 elements
        torch.randn(64, 7, generator=draw).to(torch.bfloat16).t(),  # a transposed view
        special,
        torch.full((5,), float("nan"), dtype=torch.float16),
        torch.randn(1500, generator=draw),  # larger than a stage
        torch.tensor(2.5),
        torch.arange(-3, 40),  # int64: `add`
        torch.randn(600, generator=draw).mul(1e4).add(1e6),  # a large mean
    ]
    pending = PendingStats()
    summaries = []
    for index, tensor in enumerate(tensors):
        summary = stats.TensorSummary(f"t{index}", list(tensor.shape), str(tensor.dtype), "cpu")
        pending.add_device(summary, tensor)
        summaries.append(summary)
    if out_of_memory is None:
        assert pending._staged, "no stage was reduced before resolve: the stages are not being filled"
    pending.resolve()
    for tensor, summary in zip(tensors, summaries):
        _assert_same_summary(summary, _summarize(tensor), tensor, 1e-5 if without_float64 else 1e-9)
    assert not pending._staged and not pending._stages and not pending._rows


def _assert_same_summary(summary, expected, values: torch.Tensor, tolerance: float = 1e-9) -> None:
    """Counts, extremes and the positive fraction as the CPU's path gives them (`expected`), exactly; the moments
    against float64 over the finite values, which the device path sums exactly widened (the CPU's kernel sums
    float32 in float32 blocks, within `_moment_bounds` only)."""
    assert (summary.nan_count, summary.inf_count) == (expected.nan_count, expected.inf_count)
    assert (summary.min, summary.max, summary.abs_max) == (expected.min, expected.max, expected.abs_max)
    assert summary.positive_fraction == pytest.approx(expected.positive_fraction, rel=1e-12)
    finite = values.reshape(-1).double()
    finite = finite[torch.isfinite(finite)]
    if finite.numel() == 0:
        assert (summary.mean, summary.std) == (None, None)
        return
    assert summary.mean == pytest.approx(finite.mean().item(), rel=tolerance, abs=1e-12)
    if finite.numel() == 1:
        assert math.isnan(summary.std)
    else:
        assert summary.std == pytest.approx(finite.std().item(), rel=tolerance)


def test_all_nan_has_counts_and_no_statistics() -> None:
    summary = _summarize(torch.full((4, 5), float("nan")))
    assert (summary.nan_count, summary.inf_count) == (20, 0)
    assert (summary.mean, summary.std, summary.min, summary.max, summary.abs_max) == (None,) * 5
    assert summary.positive_fraction == 0.0


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("sequence", [7, 128])
def test_additive_attention_mask_does_not_overflow(sequence: int, with_pending: bool) -> None:
    minimum = torch.finfo(torch.float32).min
    mask = torch.full((sequence, sequence), minimum).triu(1).reshape(1, 1, sequence, sequence)
    summary = _summarize(mask, with_pending, key="attention_mask")
    assert (summary.nan_count, summary.inf_count) == (0, 0)
    assert math.isfinite(summary.mean) and math.isfinite(summary.std)
    masked = sequence * (sequence - 1) // 2
    count = sequence * sequence
    assert summary.mean == pytest.approx(minimum * masked / count, rel=1e-12)
    assert summary.std == pytest.approx(_expected(mask)["std"], rel=1e-12)
    assert (summary.min, summary.max, summary.abs_max) == (minimum, 0.0, -minimum)
    assert summary.positive_fraction == 0.0


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("location", "scale"),
    [
        pytest.param(1e4, 1e-3, id="variance-cancels-to-zero"),  # float32 sum-of-squares variance ≤ 0
        pytest.param(1e3, 1.0, id="variance-loses-digits"),  # positive, but a few percent off
    ],
)
def test_large_mean_small_variance_uses_exact_fallback(
    location: float, scale: float, size: int, with_pending: bool
) -> None:
    generator = torch.Generator().manual_seed(6)
    tensor = (location + torch.randn(size, generator=generator, dtype=torch.float64) * scale).float()
    expected = _expected(tensor)
    # the sum-of-squares formula over float32 sums has lost the variance's leading digits here
    total, squares = tensor.sum().item(), torch.dot(tensor, tensor).item()
    naive_variance = (squares - total * total / size) / (size - 1)
    assert naive_variance <= 0 or abs(naive_variance / expected["std"] ** 2 - 1) > 1e-3
    summary = _summarize(tensor, with_pending)
    assert summary.std == pytest.approx(expected["std"], rel=1e-9)
    assert summary.mean == pytest.approx(expected["mean"], rel=1e-12)
    assert (summary.min, summary.max) == (expected["min"], expected["max"])
    assert summary.positive_fraction == 1.0


def test_constant_tensor_has_zero_std() -> None:
    summary = _summarize(torch.full((3, 5), 2.5))
    assert (summary.mean, summary.std, summary.min, summary.max) == (2.5, 0.0, 2.5, 2.5)


def test_single_element_has_no_std() -> None:
    summary = _summarize(torch.tensor(-1.5))
    assert summary.shape == []
    assert summary.mean == -1.5 and math.isnan(summary.std)
    assert (summary.min, summary.max, summary.abs_max, summary.positive_fraction) == (-1.5, -1.5, 1.5, 0.0)


def test_subnormal_positives_count_as_positive() -> None:
    tensor = torch.zeros(LARGE)
    tensor[:5] = torch.finfo(torch.float32).tiny / 4  # subnormal
    tensor[5:9] = -1.0
    summary = _summarize(tensor, True)
    assert summary.positive_fraction == pytest.approx(5 / LARGE, rel=1e-12)


@pytest.mark.parametrize(
    "tensor",
    [
        pytest.param(torch.zeros(0, 4), id="empty"),
        pytest.param(torch.empty(3, 4, device="meta"), id="meta"),
        pytest.param(torch.empty(0, device="meta"), id="empty-meta"),
    ],
)
def test_empty_and_meta_have_no_statistics(tensor: torch.Tensor) -> None:
    summary = _summarize(tensor, key="k")
    assert summary.shape == list(tensor.shape)
    assert summary.device == str(tensor.device)
    assert summary.dtype == "float32"
    assert (summary.mean, summary.std, summary.min, summary.max, summary.abs_max) == (None,) * 5
    assert summary.positive_fraction is None
    assert (summary.nan_count, summary.inf_count) == (0, 0)


def test_requires_grad_and_inference_tensors(kernel: str) -> None:
    weight = torch.nn.Parameter(torch.randn(16, 16, generator=torch.Generator().manual_seed(7)))
    _assert_matches(_summarize(weight), weight, _float32_sums(kernel, weight.dtype))
    with torch.inference_mode():
        inference = torch.randn(LARGE, generator=torch.Generator().manual_seed(8))
    _assert_matches(_summarize(inference, True), inference, _float32_sums(kernel, inference.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, 3, 1023, 1024, 1025, 5000])
@pytest.mark.parametrize(
    "values",
    [
        pytest.param(lambda n: -torch.rand(n) - 0.5, id="all-negative"),
        pytest.param(lambda n: torch.rand(n) + 0.5, id="all-positive"),
        pytest.param(lambda n: torch.randn(n), id="mixed"),
        pytest.param(
            lambda n: torch.where(torch.rand(n) < 0.5, torch.tensor(-0.0), torch.tensor(0.0)), id="signed-zeros"
        ),
        pytest.param(lambda n: torch.relu(torch.randn(n)) * 1e-40, id="relu-subnormal"),
    ],
)
def test_signs_and_block_edges(values, size: int, dtype: torch.dtype, kernel: str) -> None:
    """Min and max come from the values' bit patterns in the native kernel, and sums in blocks of 1,024: signs,
    zeros of both signs, subnormals and sizes around the block edge are where that could go wrong."""
    torch.manual_seed(size)
    tensor = values(size).to(dtype)
    summary = _summarize(tensor)
    exact = tensor.double()
    assert summary.min == exact.min().item() and summary.max == exact.max().item()
    assert summary.abs_max == exact.abs().max().item()
    assert summary.positive_fraction == (exact > 0).double().mean().item()
    assert abs(summary.mean - exact.mean().item()) <= _moment_bounds(tensor, _float32_sums(kernel, dtype))[0]


def test_native_kernel_is_what_the_worker_uses(kernel: str) -> None:
    """CI machines have a C compiler and Python's headers: the fast path (the extension module) must load there,
    or the capture benchmark measures a fallback without anyone noticing."""
    if kernel != "native":
        pytest.skip("checks the kernel as this CPU builds it")
    assert stats.native.kernels() is not None, stats.native.load_error
    assert stats.native.form == "extension", stats.native.load_error


def test_ctypes_form_gives_the_same_numbers(kernel: str) -> None:
    """Where the extension cannot be built (no Python headers), the same kernels load through ctypes."""
    if kernel != "native":
        pytest.skip("checks the kernel as this CPU builds it")
    path = stats.native._build(shutil.which("cc") or "gcc", stats.native._BASE_FLAGS, None, None)
    kernels = stats.native._load_ctypes(path)
    values = torch.randn(50_000, generator=torch.Generator().manual_seed(3))
    for kind, tensor in (("f32", values), ("f64", values.double()), ("i64", (values * 100).long())):
        serial = kernels[kind](tensor.data_ptr(), tensor.numel())
        loaded = stats.native.kernels()[kind](tensor.data_ptr(), tensor.numel())
        # positives, min and max are exact; the sums' order depends on how many threads shared the array, each
        # within its bound of the exact sums
        assert serial[2:] == loaded[2:]
        for serial_sum, loaded_sum, bound in zip(serial[:2], loaded[:2], _sum_bounds(tensor, kind == "f32")):
            assert abs(serial_sum - loaded_sum) <= 2 * bound


@pytest.mark.parametrize(
    "make_view",
    [
        pytest.param(lambda x: x.transpose(1, 2), id="transpose"),
        pytest.param(lambda x: x.permute(2, 0, 1), id="permute"),
        pytest.param(lambda x: x[:, :, :3], id="slice"),
        pytest.param(lambda x: x[:, :1].expand(4, 5, 6), id="expand"),
        pytest.param(lambda x: x[::2], id="step"),
        pytest.param(lambda x: x.transpose(0, 2)[1:], id="transposed-slice"),
    ],
)
def test_views(make_view, kernel: str) -> None:
    """Dense views (permutations) are read in place, others copied first: either way their own elements."""
    torch.manual_seed(0)
    view = make_view(torch.randn(4, 5, 6))
    assert stats.is_dense(view) == _dense_by_copy(view)
    _assert_matches(_summarize(view), view, _float32_sums(kernel, view.dtype))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "make_view",
    [
        # rotate_half's halves of a medium model's query states: short runs grouped into blocks
        pytest.param(lambda x: x[..., :32], id="first-half"),
        pytest.param(lambda x: x[..., 32:], id="second-half"),
        # repeat_kv's expand before its reshape: a stride-0 dimension, read once and weighted
        pytest.param(lambda x: x[:, :, None].expand(2, 8, 3, 130, 64), id="expand"),
        pytest.param(lambda x: x[:, :, None, :, :7].expand(2, 8, 4, 130, 7), id="expand-slice"),
        pytest.param(lambda x: x.transpose(1, 2), id="transpose"),
        pytest.param(lambda x: x[..., ::2], id="step"),
        pytest.param(lambda x: x[0, 0, :, 5], id="column"),
        pytest.param(lambda x: x.reshape(130 * 16, 64)[:, :60].t(), id="long-runs"),
        pytest.param(lambda x: x.reshape(-1)[:1].expand(50_000), id="one-value"),
    ],
)
def test_strided_views_are_read_in_place(
    make_view, threads: int, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """Float32 views that are not contiguous (slices, steps, expands, transposes) are summarised by the strided
    kernel in place, with no copy: exact min, max and positive count and the same moments as the view's own
    elements, for every thread count (large views are split across torch's threads by runs)."""
    torch.manual_seed(0)
    view = make_view(torch.randn(2, 8, 130, 64) - 0.1)
    assert not view.is_contiguous()
    if stats._native_kernels:
        monkeypatch.setattr(stats, "_statistics_input", _no_copy)  # the general path would copy: not taken
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        summary = _summarize(view)
    finally:
        torch.set_num_threads(previous)
    assert summary.shape == list(view.shape)
    _assert_matches(summary, view, _float32_sums(kernel, view.dtype))


def _no_copy(tensor: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the view was copied instead of read in place")


def test_strided_kernel_overflow_nan_and_too_many_dimensions(kernel: str) -> None:
    """In a strided view a float32 overflow (an additive mask's minimum) is re-summed in float64 and a NaN is
    counted; a view of more dimensions than the kernel takes gets the same numbers from the general path."""
    mask = torch.full((1, 1, 64, 64), torch.finfo(torch.float32).min).triu(1)[..., :40]
    # every block holding the dtype's minimum overflows float32 and is re-summed in float64; the others hold
    # zeros only: the float64 bound holds on every path
    _assert_matches(_summarize(mask), mask, float32_sums=False)
    values = torch.randn(4, 64, 64)
    values[1, 3, 5] = float("nan")
    summary = _summarize(values[..., :16])
    assert (summary.nan_count, summary.inf_count) == (1, 0)
    finite = values[..., :16][~values[..., :16].isnan()]
    assert summary.min == finite.min().item() and summary.max == finite.max().item()
    deep = torch.randn([2] * 17 + [3])[..., :2]
    _assert_matches(_summarize(deep), deep, _float32_sums(kernel, deep.dtype))


def test_ctypes_strided_kernel_gives_the_same_numbers(kernel: str) -> None:
    """The ctypes form of the strided kernel (no Python headers) returns what the extension returns."""
    if kernel != "native":
        pytest.skip("checks the kernel as this CPU builds it")
    path = stats.native._build(shutil.which("cc") or "gcc", stats.native._BASE_FLAGS, None, None)
    strided = stats.native._load_ctypes(path)["f32_strided"]
    view = torch.randn(3, 40, 64)[:, :, 5:37]
    arguments = (view.data_ptr(), tuple(view.shape), view.stride())
    serial, loaded = strided(*arguments), stats.native.kernels()["f32_strided"](*arguments)
    # positives, min and max are exact; the float32 block sums' rounding depends on the build's vector width,
    # each within its bound of the exact sums
    assert serial[2:] == loaded[2:]
    for serial_sum, loaded_sum, bound in zip(serial[:2], loaded[:2], _sum_bounds(view, True)):
        assert abs(serial_sum - loaded_sum) <= 2 * bound
    too_deep = torch.randn([1] * 17 + [4])
    assert strided(too_deep.data_ptr(), tuple(too_deep.shape), too_deep.stride()) is None


def _dense_by_copy(view: torch.Tensor) -> bool:
    """Independent check of density: the view's elements, as addresses, are exactly one contiguous block."""
    offsets = torch.as_strided(torch.arange(10_000), view.shape, view.stride(), 0).reshape(-1)
    return bool(offsets.sort().values.eq(torch.arange(view.numel())).all())


def test_span_cache_reuses_a_view_only_while_nothing_changed() -> None:
    """A transpose of a summarised tensor gets its statistics with its own shape; after an in-place change
    (views share their base's version counter) it is summarised again; a sliced view never reuses."""
    from modeltrace.worker.capture import SummaryCache

    cache = SummaryCache()
    base = torch.randn(2, 3, 4)
    summary = _summarize(base)
    cache.put(base, summary)
    view = base.transpose(0, 2)
    reused = cache.get(view, "v")
    assert reused is not None and reused.shape == [4, 3, 2] and reused.mean == summary.mean and reused.key == "v"
    assert cache.get(base[:, :, :2], "s") is None
    base.mul_(2)
    assert cache.get(view, "v") is None


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("size", [32_767, 32_768, 100_003, 1 << 20])
def test_arrays_split_across_threads(size: int, threads: int, kernel: str) -> None:
    """Large float32 arrays are reduced by torch's OpenMP threads in runs of whole blocks: every thread count and
    split point gives the exact min, max and positive count and the same moments; a float32 overflow (an
    additive mask's minimum) in the last run still takes the float64 re-sum."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tensor = torch.randn(size, generator=torch.Generator().manual_seed(size)) - 0.1
        tensor[-5:] = torch.finfo(torch.float32).min
        tensor[size // 2] = 7.5
        summary = _summarize(tensor)
    finally:
        torch.set_num_threads(previous)
    _assert_matches(summary, tensor, _float32_sums(kernel, tensor.dtype))


def test_parallel_kernel_shares_torchs_openmp_runtime(kernel: str) -> None:
    """Where torch runs on OpenMP (the Linux wheels), the kernel joins torch's thread pool: it is built parallel
    and the process still maps one OpenMP runtime (a second libgomp would start a second pool of threads)."""
    if kernel != "native":
        pytest.skip("checks the kernel as this CPU builds it")
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info() or not Path("/proc/self/maps").exists():
        pytest.skip("torch does not run on OpenMP here")
    assert stats.native.kernels() is not None, stats.native.load_error
    assert stats.native.parallel
    maps = Path("/proc/self/maps").read_text()
    runtimes = {
        line.split(None, 5)[5] for line in maps.splitlines() if "libgomp" in line and len(line.split(None, 5)) == 6
    }
    assert len(runtimes) == 1, runtimes


def test_cpu_flags_the_compiler_rejects_fall_back_to_the_baseline_build(
    kernel: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler that does not know the CPU's vector flags (an old one and AVX-512) still gives the kernels,
    built with the baseline flags, and says why the better build failed."""
    if kernel != "native":
        pytest.skip("checks the kernel as this CPU builds it")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(stats.native, "_cpu_flags", lambda: ["-mno-such-flag-modeltrace"])
    for name, value in (
        ("_loaded", False),
        ("_kernels", None),
        ("load_error", None),
        ("form", None),
        ("parallel", False),
    ):
        monkeypatch.setattr(stats.native, name, value)
    kernels = stats.native.kernels()
    assert kernels is not None, stats.native.load_error
    assert "-mno-such-flag-modeltrace" in (stats.native.load_error or "")
    assert stats.native.form == "extension"
    values = torch.tensor([1.0, -2.0, 3.5])
    assert kernels["f32"](values.data_ptr(), 3) == (2.5, 17.25, 2.0, -2.0, 3.5)


def test_baseline_build_is_a_build_of_its_own(kernel: str) -> None:
    """The baseline path really runs another build where this CPU has vector flags (else the baseline tests would
    only repeat the native ones), and `MODELTRACE_NATIVE=baseline` gives users that build."""
    if kernel != "baseline":
        pytest.skip("checks the baseline build")
    baseline, selected = native.baseline_kernels(), native.kernels()
    if native._cpu_flags() and native.form == "extension":
        assert baseline["f32"].__self__.__file__ != selected["f32"].__self__.__file__
    script = (
        "from modeltrace.worker import native\n"
        "kernels = native.kernels()\n"
        "print(kernels is not None and kernels['f32'].__self__.__file__ == native.baseline_kernels()['f32'].__self__.__file__)"
    )
    environment = {**os.environ, "MODELTRACE_NATIVE": "baseline"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip() == "True", result.stderr


def test_prebuilt_kernel_serves_machines_without_a_compiler(kernel: str, tmp_path: Path) -> None:
    """The package carries the kernel compiled at install time (`modeltrace_moments`, baseline flags): with no C
    compiler on PATH the worker loads it, and it gives the compiled kernel's numbers."""
    if kernel != "native":
        pytest.skip("checks the kernel as this CPU builds it")
    prebuilt = native._prebuilt()
    if prebuilt is None:
        pytest.skip("this installation was built without the prebuilt kernel (no compiler at install time)")
    values = torch.randn(50_000, generator=torch.Generator().manual_seed(9)) - 0.2
    built = native.kernels()["f32"](values.data_ptr(), values.numel())
    packaged = prebuilt["f32"](values.data_ptr(), values.numel())
    assert packaged[2:] == built[2:]
    for packaged_sum, built_sum, bound in zip(packaged[:2], built[:2], _sum_bounds(values, True)):
        assert abs(packaged_sum - built_sum) <= 2 * bound
    script = (
        "from modeltrace.worker import native, stats\n"
        "import torch\n"
        "summary = stats.summarize(torch.arange(10.0), 'x')\n"
        "print(native.form, native.absent_reason(), summary.mean)"
    )
    environment = {key: value for key, value in os.environ.items() if key != "CC"}
    environment["PATH"] = str(tmp_path)  # no cc, gcc or clang
    environment["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.split() == ["prebuilt", "None", "4.5"], result.stderr
