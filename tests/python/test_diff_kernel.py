"""The diff's compiled comparison kernel (`diff/native`) against numpy's path of `measure_arrays`: the same
verdict, maxima and limit, and the same scale-aware measures up to summation order, on arrays that exercise
every branch (zeros in the reference, identical arrays, several blocks, scaled tolerances, NaN and Inf, which
the kernel hands back to numpy). Every test runs with the kernel as this CPU builds it, with the baseline
build (no AVX2/FMA/AVX-512: what any other CPU runs), and without a kernel."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from modeltrace.diff import arrays, native
from modeltrace.diff.arrays import measure_arrays


def _require(found: native.Kernels | None, what: str) -> native.Kernels:
    """The kernels; a skip only where the machine has no C compiler, a failed build is a failure."""
    if found is not None:
        return found
    if shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None:
        pytest.skip("no C compiler here: the diff measures with numpy")
    pytest.fail(f"the {what} did not load: {native.load_error}")


@dataclass
class KernelUnderTest:
    calls: int = 0


@pytest.fixture(params=["native", "baseline"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> KernelUnderTest:
    """The kernel under test, installed as the one `measure_arrays` uses, and counting its calls."""
    found = _require(native.kernels() if request.param == "native" else native.baseline_kernels(), request.param)
    under_test = KernelUnderTest()

    def counted(measure: native.Measure) -> native.Measure:
        def wrapper(reference: np.ndarray, candidate: np.ndarray, rtol: float) -> tuple[float, ...]:
            under_test.calls += 1
            return measure(reference, candidate, rtol)

        return wrapper

    chosen = {dtype: counted(measure) for dtype, measure in found.items()}
    monkeypatch.setattr(native, "kernels", lambda: chosen)
    return under_test


def _numpy(monkeypatch: pytest.MonkeyPatch, *arguments, **options) -> arrays.ArrayComparison:
    with monkeypatch.context() as patch:
        patch.setattr(native, "kernels", lambda: None)
        return measure_arrays(*arguments, **options)


def _pairs(dtype: type) -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    base = rng.standard_normal(65_536).astype(dtype)
    zeros = base.copy()
    zeros[::3] = 0  # |d| / |x| over x != 0 only
    large = rng.standard_normal(3 * arrays._BLOCK + 17).astype(dtype)  # several of numpy's blocks
    logits = (rng.standard_normal(4096) * 1e3).astype(dtype)
    return [
        ("small noise", base, base + (rng.standard_normal(base.size) * 1e-4).astype(dtype)),
        ("large difference", base, base * dtype(1.5)),
        ("identical", base, base.copy()),
        ("zeros in the reference", zeros, zeros + dtype(1e-3)),
        ("several blocks", large, large + (rng.standard_normal(large.size) * 1e-3).astype(dtype)),
        ("logit scale", logits, logits + dtype(0.5)),
        ("one element", base[:1], base[:1] + dtype(2e-3)),
        ("all zero", np.zeros(100, dtype), np.zeros(100, dtype)),
        ("opposite", base, -base),
    ]


CASES = [
    pytest.param(dtype, index, id=f"{np.dtype(dtype).name}-{index}")
    for dtype in (np.float32, np.float64)
    for index in range(9)
]
OPTIONS = [
    pytest.param({"atol": 1e-3, "rtol": 0.0}, id="atol"),
    pytest.param({"atol": 1e-3, "rtol": 1e-3}, id="atol+rtol"),
    pytest.param({"atol": 1e-5, "rtol": 1e-5, "slack_abs": 1e-4, "slack_rel": 1e-4}, id="slack"),
    pytest.param({"atol": 1e-3, "rtol": 0.0, "scaled_atol": True}, id="scaled"),
]


@pytest.mark.parametrize(("dtype", "index"), CASES)
@pytest.mark.parametrize("options", OPTIONS)
def test_kernel_measures_as_numpy(
    kernels: KernelUnderTest, monkeypatch: pytest.MonkeyPatch, dtype: type, index: int, options: dict
) -> None:
    name, reference, candidate = _pairs(dtype)[index]
    expected = _numpy(monkeypatch, reference, candidate, **options)
    before = kernels.calls
    found = measure_arrays(reference, candidate, **options)
    assert kernels.calls == before + 1, f"{name}: the kernel was not used"
    assert found.close == expected.close, name
    assert found.max_abs == expected.max_abs, name
    assert found.max_rel == pytest.approx(expected.max_rel, rel=1e-6), name
    assert found.limit == expected.limit, name
    assert found.reason is None and expected.reason is None
    # summation order (and the kernel's double accumulation of float32 squares) changes the last digits only
    assert found.rel_err == pytest.approx(expected.rel_err, rel=1e-4, abs=1e-7), name
    assert found.cosine == pytest.approx(expected.cosine, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda a, b: b.__setitem__(5, np.nan), id="nan-in-candidate"),
        pytest.param(lambda a, b: (a.__setitem__(9, np.inf), b.__setitem__(9, np.inf)), id="inf-both"),
        pytest.param(lambda a, b: (a.__setitem__(9, np.nan), b.__setitem__(9, np.nan)), id="nan-both"),
        pytest.param(lambda a, b: b.__setitem__(11, -np.inf), id="inf-in-candidate"),
    ],
)
def test_non_finite_values_are_measured_by_numpy(
    kernels: KernelUnderTest, monkeypatch: pytest.MonkeyPatch, change
) -> None:  # noqa: ANN001
    reference = np.linspace(-1, 1, 4096, dtype=np.float32)
    candidate = reference + np.float32(1e-5)
    change(reference, candidate)
    expected = _numpy(monkeypatch, reference, candidate, 1e-3, 0.0)
    found = measure_arrays(reference, candidate, 1e-3, 0.0)
    assert (found.close, found.reason, found.max_abs) == (expected.close, expected.reason, expected.max_abs)
    assert math.isfinite(found.rel_err)


def test_other_dtypes_and_layouts_take_numpys_path(kernels: KernelUnderTest) -> None:
    reference = np.arange(4096, dtype=np.float32).reshape(64, 64) / 4096
    cases = [
        (reference, reference.astype(np.float64)),  # dtypes that differ
        (reference.astype(np.float16), reference.astype(np.float16)),  # no half-precision kernel
        (reference.T, reference.T + np.float32(1e-5)),  # reshape(-1) of a transposed view copies: still contiguous
        (np.zeros(0, np.float32), np.zeros(0, np.float32)),
    ]
    before = kernels.calls
    for a, b in cases:
        found = measure_arrays(a, b, 1e-3, 0.0)
        assert found.close
    assert kernels.calls == before + 1  # only the transposed float32 pair


def test_the_diff_kernel_loads_without_torch() -> None:
    """The language server runs the diff and never imports torch: neither may the kernel's build and load."""
    script = (
        "import sys, numpy as np\n"
        "from modeltrace.diff import native\n"
        "from modeltrace.diff.arrays import measure_arrays\n"
        "a = np.ones(1000, np.float32)\n"
        "print(native.kernels() is not None, measure_arrays(a, a * 2, 1e-3, 0.0).close, 'torch' in sys.modules)\n"
    )
    output = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout.split()
    if shutil.which("cc") is not None:
        assert output[0] == "True", native.load_error
    assert output[1:] == ["False", "False"]


def test_native_setting_zero_turns_the_kernel_off() -> None:
    script = "from modeltrace.diff import native\nprint(native.kernels())\n"
    environment = {**__import__("os").environ, "MODELTRACE_NATIVE": "0"}
    output = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, env=environment
    )
    assert output.stdout.strip() == "None"
