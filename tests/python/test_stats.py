"""`stats.summarize` against torch's own reductions (in float64) for the dtypes and the special values models produce.

Sizes on both sides of the NumPy/torch split (`_NUMPY_MAX_ELEMENTS`) run every check through both paths, with
and without a `PendingStats` (whose reused comparison buffer the torch path then uses).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from modeltrace.worker import stats
from modeltrace.worker.stats import PendingStats, summarize


SMALL = 7 * 64  # a tiny model's hidden states: the NumPy path
LARGE = stats._NUMPY_MAX_ELEMENTS + 1  # just past it: the torch path
SIZES = [pytest.param(SMALL, id="small"), pytest.param(LARGE, id="large")]
PENDING = [pytest.param(False, id="no-pending"), pytest.param(True, id="pending")]


@pytest.fixture(autouse=True, params=["native", "torch"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs twice: with the fused C kernel (`worker/native`) and with the NumPy/torch paths."""
    if request.param == "torch":
        monkeypatch.setattr(stats, "_native_kernels", {})
    elif not stats._native_kernels:
        pytest.fail(f"the native statistics kernel did not load: {stats.native.load_error}")
    return request.param


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


def _assert_matches(summary, expected: dict[str, float], rel: float) -> None:
    scale = max(abs(expected["mean"]), expected["std"], 1e-30)
    assert summary.mean == pytest.approx(expected["mean"], rel=rel, abs=rel * scale)
    assert summary.std == pytest.approx(expected["std"], rel=rel)
    # min, max, abs_max and the positive count are exact on every path
    assert summary.min == expected["min"]
    assert summary.max == expected["max"]
    assert summary.abs_max == expected["abs_max"]
    assert summary.positive_fraction == pytest.approx(expected["positive_fraction"], rel=1e-12)
    assert (summary.nan_count, summary.inf_count) == (0, 0)


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("size", SIZES)
def test_float32_matches_torch(size: int, with_pending: bool) -> None:
    generator = torch.Generator().manual_seed(size)
    tensor = torch.randn(size, generator=generator) * 3 + 0.5
    tensor = tensor.reshape(1, size, 1)
    summary = _summarize(tensor, with_pending, key="hidden_states")
    assert (summary.key, summary.shape, summary.dtype, summary.device) == ("hidden_states", [1, size, 1], "float32", "cpu")
    assert summary.tensor is None
    _assert_matches(summary, _expected(tensor), rel=1e-5)
    # cross-check the reference itself against torch's float32 reductions
    assert summary.mean == pytest.approx(tensor.mean().item(), rel=1e-4)
    assert summary.std == pytest.approx(tensor.std().item(), rel=1e-4)
    assert summary.min == tensor.min().item() and summary.max == tensor.max().item()


@pytest.mark.parametrize("size", SIZES)
def test_non_contiguous_view(size: int) -> None:
    base = torch.randn(2, size, generator=torch.Generator().manual_seed(1))
    view = base.t()[::2]  # transposed and strided
    assert not view.is_contiguous()
    _assert_matches(_summarize(view), _expected(view), rel=1e-5)


@pytest.mark.parametrize("with_pending", PENDING)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype: torch.dtype, size: int, with_pending: bool) -> None:
    tensor = (torch.randn(size, generator=torch.Generator().manual_seed(2)) * 2 - 0.25).to(dtype)
    summary = _summarize(tensor, with_pending)
    assert summary.dtype == str(dtype).removeprefix("torch.")
    # statistics of the values the tensor holds (half precision is widened before any arithmetic)
    _assert_matches(summary, _expected(tensor), rel=1e-5 if dtype != torch.float64 else 1e-12)


@pytest.mark.parametrize("size", SIZES)
def test_int64(size: int) -> None:
    tensor = torch.randint(-1000, 5000, (size,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    summary = _summarize(tensor)
    assert summary.dtype == "int64"
    expected = _expected(tensor)
    # integer sums are exact in float64: the mean is the exact quotient
    assert summary.mean == tensor.sum().item() / size
    _assert_matches(summary, expected, rel=1e-12)
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
def test_large_mean_small_variance_uses_exact_fallback(location: float, scale: float, size: int, with_pending: bool) -> None:
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


def test_requires_grad_and_inference_tensors() -> None:
    weight = torch.nn.Parameter(torch.randn(16, 16, generator=torch.Generator().manual_seed(7)))
    _assert_matches(_summarize(weight), _expected(weight), rel=1e-5)
    with torch.inference_mode():
        inference = torch.randn(LARGE, generator=torch.Generator().manual_seed(8))
    _assert_matches(_summarize(inference, True), _expected(inference), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, 3, 1023, 1024, 1025, 5000])
@pytest.mark.parametrize(
    "values",
    [
        pytest.param(lambda n: -torch.rand(n) - 0.5, id="all-negative"),
        pytest.param(lambda n: torch.rand(n) + 0.5, id="all-positive"),
        pytest.param(lambda n: torch.randn(n), id="mixed"),
        pytest.param(lambda n: torch.where(torch.rand(n) < 0.5, torch.tensor(-0.0), torch.tensor(0.0)), id="signed-zeros"),
        pytest.param(lambda n: torch.relu(torch.randn(n)) * 1e-40, id="relu-subnormal"),
    ],
)
def test_signs_and_block_edges(values, size: int, dtype: torch.dtype) -> None:
    """Min and max come from the values' bit patterns in the native kernel, and sums in blocks of 1,024: signs,
    zeros of both signs, subnormals and sizes around the block edge are where that could go wrong."""
    torch.manual_seed(size)
    tensor = values(size).to(dtype)
    summary = _summarize(tensor)
    exact = tensor.double()
    assert summary.min == exact.min().item() and summary.max == exact.max().item()
    assert summary.abs_max == exact.abs().max().item()
    assert summary.positive_fraction == (exact > 0).double().mean().item()
    assert summary.mean == pytest.approx(exact.mean().item(), rel=1e-5, abs=1e-45)


def test_native_kernel_is_what_the_worker_uses() -> None:
    """CI machines have a C compiler and Python's headers: the fast path (the extension module) must load there,
    or the capture benchmark measures a fallback without anyone noticing."""
    assert stats.native.kernels() is not None, stats.native.load_error
    assert stats.native.form == "extension", stats.native.load_error


def test_ctypes_form_gives_the_same_numbers() -> None:
    """Where the extension cannot be built (no Python headers), the same kernels load through ctypes."""
    path = stats.native._build(shutil.which("cc") or "gcc", stats.native._BASE_FLAGS, None, None)
    kernels = stats.native._load_ctypes(path)
    values = torch.randn(50_000, generator=torch.Generator().manual_seed(3))
    for kind, tensor in (("f32", values), ("f64", values.double()), ("i64", (values * 100).long())):
        serial = kernels[kind](tensor.data_ptr(), tensor.numel())
        loaded = stats.native.kernels()[kind](tensor.data_ptr(), tensor.numel())
        # positives, min and max are exact; the sums' order depends on how many threads shared the array
        assert serial[2:] == loaded[2:]
        assert serial[:2] == pytest.approx(loaded[:2], rel=1e-6)


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
def test_views(make_view) -> None:
    """Dense views (permutations) are read in place, others copied first: either way their own elements."""
    torch.manual_seed(0)
    view = make_view(torch.randn(4, 5, 6))
    assert stats.is_dense(view) == _dense_by_copy(view)
    _assert_matches(_summarize(view), _expected(view), rel=1e-6)


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
def test_strided_views_are_read_in_place(make_view, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
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
    _assert_matches(summary, _expected(view), rel=1e-6)


def _no_copy(tensor: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the view was copied instead of read in place")


def test_strided_kernel_overflow_nan_and_too_many_dimensions() -> None:
    """In a strided view a float32 overflow (an additive mask's minimum) is re-summed in float64 and a NaN is
    counted; a view of more dimensions than the kernel takes gets the same numbers from the general path."""
    mask = torch.full((1, 1, 64, 64), torch.finfo(torch.float32).min).triu(1)[..., :40]
    _assert_matches(_summarize(mask), _expected(mask), rel=1e-9)
    values = torch.randn(4, 64, 64)
    values[1, 3, 5] = float("nan")
    summary = _summarize(values[..., :16])
    assert (summary.nan_count, summary.inf_count) == (1, 0)
    finite = values[..., :16][~values[..., :16].isnan()]
    assert summary.min == finite.min().item() and summary.max == finite.max().item()
    deep = torch.randn([2] * 17 + [3])[..., :2]
    _assert_matches(_summarize(deep), _expected(deep), rel=1e-6)


def test_ctypes_strided_kernel_gives_the_same_numbers() -> None:
    """The ctypes form of the strided kernel (no Python headers) returns what the extension returns."""
    if not stats._native_kernels:
        pytest.skip("checks the native kernels")
    path = stats.native._build(shutil.which("cc") or "gcc", stats.native._BASE_FLAGS, None, None)
    strided = stats.native._load_ctypes(path)["f32_strided"]
    view = torch.randn(3, 40, 64)[:, :, 5:37]
    arguments = (view.data_ptr(), tuple(view.shape), view.stride())
    serial, loaded = strided(*arguments), stats.native.kernels()["f32_strided"](*arguments)
    # positives, min and max are exact; the float32 block sums' rounding depends on the build's vector width
    assert serial[2:] == loaded[2:]
    assert serial[:2] == pytest.approx(loaded[:2], rel=1e-6)
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
def test_arrays_split_across_threads(size: int, threads: int) -> None:
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
    _assert_matches(summary, _expected(tensor), rel=1e-6)


def test_parallel_kernel_shares_torchs_openmp_runtime() -> None:
    """Where torch runs on OpenMP (the Linux wheels), the kernel joins torch's thread pool: it is built parallel
    and the process still maps one OpenMP runtime (a second libgomp would start a second pool of threads)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info() or not Path("/proc/self/maps").exists():
        pytest.skip("torch does not run on OpenMP here")
    assert stats.native.kernels() is not None, stats.native.load_error
    assert stats.native.parallel
    maps = Path("/proc/self/maps").read_text()
    runtimes = {line.split(None, 5)[5] for line in maps.splitlines() if "libgomp" in line and len(line.split(None, 5)) == 6}
    assert len(runtimes) == 1, runtimes


def test_cpu_flags_the_compiler_rejects_fall_back_to_the_baseline_build(
    kernel: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler that does not know the CPU's vector flags (an old one and AVX-512) still gives the kernels,
    built with the baseline flags, and says why the better build failed."""
    if kernel != "native":
        pytest.skip("checks the native build")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(stats.native, "_cpu_flags", lambda: ["-mno-such-flag-modeltrace"])
    for name, value in (("_loaded", False), ("_kernels", None), ("load_error", None), ("form", None), ("parallel", False)):
        monkeypatch.setattr(stats.native, name, value)
    kernels = stats.native.kernels()
    assert kernels is not None, stats.native.load_error
    assert "-mno-such-flag-modeltrace" in (stats.native.load_error or "")
    assert stats.native.form == "extension"
    values = torch.tensor([1.0, -2.0, 3.5])
    assert kernels["f32"](values.data_ptr(), 3) == (2.5, 17.25, 2.0, -2.0, 3.5)
