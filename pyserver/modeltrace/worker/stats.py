"""Summaries of tensors: shape, dtype, device, mean, std, min, max, abs-max, NaN/Inf counts, positive fraction.

Cost matters: this runs on every input and output of every module. `torch.std_mean` costs ~16× a sum, a dot
product and `aminmax` together on CPU, so the common path computes those three (plus a positive count) and
derives mean and std from them. Sums that overflow float32 (additive attention masks filled with the dtype's
minimum) and catastrophic cancellation fall back to float64; NaN/Inf are counted only when a sum shows them,
and the other statistics then describe the finite values. Off the CPU, the numbers of a whole forward pass are
fetched in one batch instead of one `.item()` per number (`PendingStats`).

On the CPU two paths compute the same statistics. Small tensors (all of a tiny model's) are copied as float64
NumPy arrays and reduced in batches at `PendingStats.resolve` (`np.add.reduceat` and friends over the
concatenation): a handful of NumPy calls for a whole forward pass instead of ~6 torch ops of ~3-5 µs each per
tensor. Large ones use torch's multi-threaded kernels: sum and dot over float64 copies made a chunk at a time (so
the moments are as exact as the native kernel's, whatever BLAS and the CPU's vector width do with float32
sums), `aminmax`, and a positive count as
`clamp(x, 0, 1, out=buffer).ceil_().sum()` into a buffer reused across the pass, which measured inside a medium
Llama's forward at ~40% of `relu(x).sign_().sum()` (whose fresh output page-faults) and ~65% of
`torch.gt(x, 0, out=buffer).sum()`; `(x > 0).sum()`, with its bool kernel, costs ~3× more still. Sums that are
not finite, and variances that cancel, go through the same float64 fallbacks on both paths.

Both are the fallback when the fused C kernel of `worker/native` is available (a C compiler on the machine):
float32 and float64 CPU tensors then get sum, sum of squares, positive count, min and max in one pass over
memory (large arrays on torch's threads), called as an extension module in ~0.1 µs plus ~0.16 ns per element
per thread (a medium Llama's hidden states: ~10 µs instead of ~130 µs for the torch ops), computed at once.
A contiguous float32 tensor, the common case, goes from kernel to summary in one step at the top of
`summarize`. Half precision is widened to float32 first, int64 has a kernel of its own, and other integers and
booleans are widened to float64. Non-finite sums and cancelling variances take the same fallbacks as the
other paths.

Tensors without ordinary storage (sparse layouts, nested and quantized tensors: `without_storage`) have no memory
to read as one block: they are summarised through a dense copy of their values where one can be made (a sparse
tensor up to `_MAX_DENSIFIED_ELEMENTS` elements, a quantized one dequantized, a nested one's components laid end
to end), and by shape and dtype alone otherwise, with a note in `not_stored` saying which. A tensor subclass whose
reductions fail is summarised by shape and dtype with a note too: a trace never stops on a tensor it cannot read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from modeltrace.trace.records import TensorSummary
from modeltrace.worker import native


# NOTE: mean² / variance above this ratio loses digits in the sum-of-squares formula; recompute exactly.
_CANCELLATION_RATIO = 1e4
# NOTE: tensors up to this many elements take the batched NumPy path; past it torch's kernels (two threads,
# no float64 copy) are faster. NumPy's `dot` is never used: past ~10,000 elements OpenBLAS runs it on its own
# thread pool, whose spinning threads then fight torch's for the cores (measured: torch ops 50× slower).
_NUMPY_MAX_ELEMENTS = 8192
# NOTE: a batch is reduced once it holds this many elements (8 MiB of float64 copies).
_BATCH_MAX_ELEMENTS = 1 << 20
# NOTE: float32 sums of 0.0/1.0 are exact below 2**24 terms; the positive count of larger tensors is summed in
# chunks of this size (which also bounds the reused comparison buffer to 16 MiB).
_COUNT_CHUNK = 1 << 22

_dtype_names: dict[torch.dtype, str] = {}
_device_names: dict[torch.device, str] = {}
# NOTE: dtypes NumPy reads directly; bfloat16 is widened by torch first. Everything becomes a float64 copy,
# which is exact for every float and for integers below 2**53 (torch's path also reduces integers as float64).
_NUMPY_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
    }
)


def dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


def _device_name(device: torch.device) -> str:
    name = _device_names.get(device)
    if name is None:
        name = _device_names[device] = str(device)
    return name


def _statistics_input(tensor: torch.Tensor, wide: torch.dtype = torch.float64) -> torch.Tensor:
    """A flat floating view of `tensor` suited to reductions: float32 for half precision, `wide` for integers."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype in (torch.float32, torch.float64):
        return flat
    if flat.is_complex():
        return flat.abs()
    if flat.dtype.is_floating_point:
        return flat.float()
    return flat.to(wide)


# NOTE: device types without float64 arithmetic, with the reason: their statistics are summed in float32 on the
# device (per block of `_BLOCK` values, centred; the blocks meet in float64 on the CPU). Not run on hardware here.
_NO_FLOAT64 = {"mps": "Metal has no float64: torch refuses to make a float64 MPS tensor"}


def _wide_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type in _NO_FLOAT64 else torch.float64


# NOTE: quantized dtypes: their memory holds integers and a scale, not the values
_QUANTIZED_DTYPES = frozenset(
    dtype
    for dtype in (getattr(torch, name, None) for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4"))
    if dtype is not None
)
# NOTE: a sparse tensor's statistics are those of its dense form (what a dense implementation holds); past this
# many elements the dense copy costs too much memory, and only its shape and dtype are kept
_MAX_DENSIFIED_ELEMENTS = 1 << 24


def is_plain(tensor: torch.Tensor) -> bool:
    """A plain tensor or parameter, not a subclass (DTensor, a fake or functional tensor, a wrapper): only a plain
    one's memory is read directly or copied by ModelTrace; a subclass goes through its own operations."""
    return type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter


def without_storage(tensor: torch.Tensor) -> str | None:
    """What kind of tensor `tensor` is when it has no ordinary strided storage to read ("sparse_coo",
    "sparse_csr", …, "nested", "quantized"), None for an ordinary one (meta tensors are ordinary: shape only)."""
    if tensor.is_nested:
        return "nested"
    layout = tensor.layout
    if layout is not torch.strided:
        return str(layout).removeprefix("torch.")
    if tensor.dtype in _QUANTIZED_DTYPES:
        return "quantized"
    return None


def _dense_values(tensor: torch.Tensor, kind: str) -> tuple[torch.Tensor | None, str]:
    """The values of a tensor without ordinary storage as an ordinary tensor, or None, and how they were read."""
    if kind == "quantized":
        return tensor.dequantize(), "statistics of its dequantized values"
    if kind == "nested":
        parts = [part.reshape(-1) for part in tensor.unbind()]
        return (torch.cat(parts) if parts else None), "statistics of its components' elements together"
    if tensor.numel() > _MAX_DENSIFIED_ELEMENTS:
        return None, f"over {_MAX_DENSIFIED_ELEMENTS} elements: shape and dtype only"
    return tensor.to_dense(), "statistics of its dense form"


def _shape_of(tensor: torch.Tensor) -> list[int]:
    try:
        return list(tensor.shape)
    except RuntimeError:  # a nested tensor has no one shape: the number of its components
        return [tensor.size(0)]


def summarize_without_storage(
    tensor: torch.Tensor, key: str, kind: str, pending: PendingStats | None = None
) -> TensorSummary:
    """The summary of a tensor without ordinary storage (`without_storage` says `kind`): its own shape and dtype,
    the statistics of its values read densely where that is possible, and `not_stored` saying so."""
    dtype = tensor.dtype
    name = _dtype_names.get(dtype) or dtype_name(dtype)
    shape = _shape_of(tensor)
    try:
        values, how = _dense_values(tensor.detach(), kind)
    except (RuntimeError, TypeError, ValueError) as error:  # an operation this layout lacks
        values, how = None, f"its values could not be read ({error})"
    if values is not None and values.layout is torch.strided and not values.is_nested:
        summary = summarize(values, key, pending)
        summary.shape, summary.dtype = shape, name
    else:
        summary = TensorSummary(key, shape, name, _device_name(tensor.device))
    summary.not_stored = f"a {kind} tensor has no ordinary storage: {how}; not stored in full"
    return summary


def summarize(tensor: torch.Tensor, key: str, pending: PendingStats | None = None) -> TensorSummary:
    """Summarise one tensor. With `pending`, small CPU tensors and off-CPU tensors get their statistics at
    `pending.resolve()` (the summary is returned at once and filled in then); without, right away. A tensor
    without ordinary storage goes to `summarize_without_storage`."""
    kind = without_storage(tensor)
    if kind is not None:
        return summarize_without_storage(tensor, key, kind, pending)
    # NOTE: `is_plain`, inlined: this runs per tensor per call
    if (type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter) and tensor.is_cpu:
        return summarize_plain_cpu(
            tensor, key, tensor.dtype, tensor.data_ptr(), tensor.numel(), tensor.is_contiguous(), pending
        )
    dtype = tensor.dtype
    name = _dtype_names.get(dtype) or dtype_name(dtype)
    if tensor.is_cpu:  # NOTE: `tensor.device.type` costs ~10× this; this function runs per tensor per call
        # a tensor subclass (fake, functional, distributed): torch's and NumPy's paths, never raw memory
        summary = TensorSummary(key, list(tensor.shape), name, "cpu")
        try:
            _fill_cpu(summary, tensor, tensor.numel(), pending)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
            # NOTE: a subclass whose reductions fail (its __torch_dispatch__ lacks them): shape and dtype only
            summary = TensorSummary(key, list(tensor.shape), name, "cpu")
            summary.not_stored = f"a {type(tensor).__name__} tensor whose values could not be read ({error})"
        return summary
    summary = TensorSummary(key, list(tensor.shape), name, _device_name(tensor.device))
    if tensor.is_meta or tensor.numel() == 0:
        return summary
    if pending is not None:
        pending.add_device(summary, tensor.detach())
        return summary
    flat = _statistics_input(tensor, _wide_dtype(tensor.device))
    if tensor.device.type in _NO_FLOAT64:
        flat = flat.cpu()  # NOTE: `_fill_on_cpu` widens to float64, which such a device cannot
    _fill_on_cpu(summary, flat)
    return summary


def summarize_plain_cpu(
    tensor: torch.Tensor,
    key: str,
    dtype: torch.dtype,
    address: int,
    count: int,
    contiguous: bool,
    pending: PendingStats | None = None,
) -> TensorSummary:
    """`summarize` for a CPU tensor of type `torch.Tensor` or `nn.Parameter` whose dtype, `data_ptr()`,
    `numel()` and `is_contiguous()` the caller has read already (the summary cache needs them too): each of
    those is a call into torch's bindings, and inside a forward pass, with the caches cold, they cost more than
    the statistics of a small tensor."""
    name = _dtype_names.get(dtype) or dtype_name(dtype)
    kernel = _native_kernels.get(dtype)
    if kernel is not None and count > 1 and not tensor.is_neg():
        # NOTE: the common case (a float32 activation) in one step: kernel, moments, one constructor call. It
        # runs for every new tensor of every module call and line; anything unusual (overflow, NaN,
        # cancellation, one element) leaves it for the general path below, which recomputes. A float32 view (a
        # slice such as rotate_half's `x[..., :d]`, a transpose, an `expand`) is read in place by the strided
        # kernel: a copy of a medium activation costs more than its statistics.
        if contiguous:
            moments = kernel(address, count)
        elif dtype is torch.float32:
            moments = _strided_kernel(address, tensor.shape, tensor.stride())
        else:
            moments = None
        if moments is not None:
            summary = summary_from_moments(key, list(tensor.shape), name, count, moments)
            if summary is not None:
                return summary
    summary = TensorSummary(key, list(tensor.shape), name, "cpu")
    if count == 0:
        return summary
    if _native_kernels and (dtype in _native_kernels or dtype in _WIDEN_FOR_NATIVE) and not tensor.is_neg():
        _fill_native(summary, tensor, count)
        return summary
    _fill_cpu(summary, tensor, count, pending)
    return summary


def summary_from_moments(
    key: str, shape: list[int], dtype_name: str, count: int, moments: tuple[float, float, float, float, float]
) -> TensorSummary | None:
    """The summary of `count` (> 1) CPU values from the native kernel's moments (sum, sum of squares, positives,
    min, max), or None where they cannot give it exactly (a non-finite sum, a variance that cancels): the caller
    then summarises the tensor by the general path, which recomputes."""
    total, squares, positives, minimum, maximum = moments
    if minimum == maximum and math.isfinite(total) and math.isfinite(squares):
        # NOTE: every value equal (a norm's weight of ones, a zero bias): exact as `_fill_native` makes it
        abs_max = -minimum if -minimum > maximum else maximum
        return TensorSummary(
            key,
            shape,
            dtype_name,
            "cpu",
            float(minimum) + 0.0,
            0.0,
            minimum,
            maximum,
            abs_max,
            0,
            0,
            positives / count,
        )
    mean = total / count
    variance = (squares - total * mean) / (count - 1)
    if not (0 < variance < math.inf and mean * mean <= _CANCELLATION_RATIO * variance):
        return None
    return TensorSummary(
        key,
        shape,
        dtype_name,
        "cpu",
        mean,
        math.sqrt(variance),
        minimum,
        maximum,
        -minimum if -minimum > maximum else maximum,
        0,
        0,
        positives / count,
    )


def _fill_cpu(summary: TensorSummary, tensor: torch.Tensor, count: int, pending: PendingStats | None) -> None:
    """Statistics without the native kernel: batched NumPy for small tensors, torch's reductions for the rest."""
    if count == 0:
        return
    if count <= _NUMPY_MAX_ELEMENTS:
        array = _float64_copy(tensor)
        if array is not None:
            if pending is not None:
                pending.add_small(summary, array)
            else:
                _fill_batch([summary], [array])
            return
    _fill_on_cpu(summary, _statistics_input(tensor), pending._buffer if pending is not None else None)


def is_dense(tensor: torch.Tensor) -> bool:
    """Whether the elements of `tensor` fill a contiguous block of memory without overlap, in any order (a
    transpose or permutation of a contiguous tensor; not an expanded or sliced view)."""
    expected = 1
    for stride, size in sorted(zip(tensor.stride(), tensor.shape)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def kernel_table(kernels: dict[str, native.Kernel] | None) -> dict[torch.dtype, native.Kernel]:
    """The kernels by dtype; empty without the native library (the torch and NumPy paths then)."""
    if kernels is None:
        return {}
    return {torch.float32: kernels["f32"], torch.float64: kernels["f64"], torch.int64: kernels["i64"]}


_native_kernels = kernel_table(native.kernels())
_strided_kernel = native.kernels()["f32_strided"] if _native_kernels else None
# NOTE: dtypes without a kernel of their own are widened first: half precision to float32 (exact), the other
# integers and booleans (masks) to float64 (exact below 2**53, as on the other paths).
_WIDEN_FOR_NATIVE: dict[torch.dtype, torch.dtype] = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    **{dtype: torch.float64 for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)},
}


def _fill_native(summary: TensorSummary, tensor: torch.Tensor, count: int) -> None:
    """Statistics from the fused kernel, with the torch fallbacks for non-finite sums and cancelling variances."""
    wide = _WIDEN_FOR_NATIVE.get(tensor.dtype)
    if wide is not None:
        tensor = tensor.detach().to(wide)
    elif not (tensor.is_contiguous() or is_dense(tensor)):
        tensor = tensor.contiguous()
    # NOTE: a dense tensor (contiguous, or a permutation of a contiguous one: `x.transpose(1, 2)`, `q * cos` of
    # such a view) holds exactly its elements in the `count` slots from its first one, in some order, and no
    # statistic here depends on the order: the kernel reads that memory as it is, with no copy.
    total, squares, positives, minimum, maximum = _native_kernels[tensor.dtype](tensor.data_ptr(), count)
    if not (math.isfinite(total) and math.isfinite(squares)):
        _fill_on_cpu(summary, _statistics_input(tensor))
        return
    if minimum == maximum and count > 1:
        # NOTE: every element equal (a norm's weight of ones, a zero bias): mean and std are exact without the
        # float64 recomputation that the zero variance would otherwise send it to (several torch calls per weight)
        summary.mean, summary.std = float(minimum) + 0.0, 0.0  # + 0.0: no negative zero
    else:
        _set_moments(summary, tensor, count, total, squares)
    summary.min, summary.max = minimum, maximum
    summary.abs_max = max(abs(minimum), abs(maximum))
    summary.positive_fraction = positives / count


def _float64_copy(tensor: torch.Tensor) -> np.ndarray | None:
    """A flat float64 NumPy copy of a small CPU tensor (a snapshot: later in-place writes do not reach it)."""
    if tensor.dtype not in _NUMPY_DTYPES and tensor.dtype != torch.bfloat16:
        return None
    if type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter:
        return None  # tensor subclasses (fake, functional, distributed) keep torch's path
    if tensor.requires_grad:
        tensor = tensor.detach()
    try:
        if tensor.dtype == torch.bfloat16:
            return tensor.to(torch.float64).numpy().ravel()
        return tensor.numpy().astype(np.float64).ravel()  # astype copies: ravel is a view of the copy
    except (RuntimeError, TypeError, ValueError):  # sparse tensors, unusual views
        return None


def _fill_batch(summaries: list[TensorSummary], arrays: list[np.ndarray]) -> None:
    """Statistics of many small float64 arrays at once: segment reductions over their concatenation."""
    sizes = [array.size for array in arrays]
    with np.errstate(all="ignore"):  # NaN/Inf and float64 overflow show in the sums and take the fallback
        if len(arrays) == 1:
            data = arrays[0]
            totals, squares = [float(np.add.reduce(data))], [float(np.add.reduce(np.multiply(data, data)))]
            minima, maxima = [float(np.minimum.reduce(data))], [float(np.maximum.reduce(data))]
            positives = [int(np.count_nonzero(np.greater(data, 0)))]
        else:
            data = np.concatenate(arrays)
            offsets = np.zeros(len(sizes), dtype=np.int64)
            np.cumsum(sizes[:-1], out=offsets[1:])
            totals = np.add.reduceat(data, offsets).tolist()
            squares = np.add.reduceat(np.multiply(data, data), offsets).tolist()
            minima = np.minimum.reduceat(data, offsets).tolist()
            maxima = np.maximum.reduceat(data, offsets).tolist()
            positives = np.add.reduceat(np.greater(data, 0), offsets).tolist()
    for summary, array, count, total, square, minimum, maximum, positive in zip(
        summaries, arrays, sizes, totals, squares, minima, maxima, positives
    ):
        if not (math.isfinite(total) and math.isfinite(square)):
            _fill_on_cpu(summary, torch.from_numpy(array))
            continue
        mean = total / count
        variance = (square - total * mean) / (count - 1) if count > 1 else 1.0
        if variance <= 0 or mean * mean > _CANCELLATION_RATIO * variance or not math.isfinite(variance):
            _set_moments(summary, torch.from_numpy(array), count, total, square)  # the exact fallback
        else:
            summary.mean, summary.std = mean, math.sqrt(variance) if count > 1 else float("nan")
        summary.min, summary.max = minimum, maximum
        summary.abs_max = max(abs(minimum), abs(maximum))
        summary.positive_fraction = positive / count


class _ComparisonBuffer:
    """Float buffers reused across a pass and grown on demand up to `_COUNT_CHUNK`: the positive count's in the
    tensor's dtype, the float64 copies that the sums are taken over."""

    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    def get(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < size:
            buffer = self._buffers[dtype] = torch.empty(size, dtype=dtype)
        return buffer[:size]


def _positive_count(flat: torch.Tensor, buffer: _ComparisonBuffer | None) -> float:
    """How many elements are > 0: `clamp(x, 0, 1)` then `ceil_` maps positives to exactly 1.0 (subnormals
    included) and everything else to ±0.0, written into a reused buffer, then summed (exact below 2**24)."""
    count = flat.numel()
    if count <= _COUNT_CHUNK:
        out = buffer.get(count, flat.dtype) if buffer is not None else torch.empty_like(flat)
        return torch.clamp(flat, 0, 1, out=out).ceil_().sum().item()
    total = 0.0
    for start in range(0, count, _COUNT_CHUNK):
        chunk = flat[start : start + _COUNT_CHUNK]
        out = buffer.get(chunk.numel(), flat.dtype) if buffer is not None else torch.empty_like(chunk)
        total += torch.clamp(chunk, 0, 1, out=out).ceil_().sum().item()
    return total


def _wide_sums(flat: torch.Tensor, buffer: _ComparisonBuffer | None) -> tuple[float, float]:
    """The sum and sum of squares of `flat`, accumulated in float64 (as the native kernel's sums across blocks).

    NOTE: float32 `torch.dot` is BLAS's sdot, whose lanes add long runs in float32: on a 66,560-element view its
    sum of squares measured 5.8e-6 off (the std 3e-6), and how far depends on the CPU's vector width. A float64
    copy makes every product exact and the float64 sums' error ~n·2⁻⁵³: the copy is made a chunk at a time, into
    the pass's reused buffer, so it costs bounded memory."""
    if flat.dtype == torch.float64:
        return flat.sum().item(), torch.dot(flat, flat).item()
    total = squares = 0.0
    for start in range(0, flat.numel(), _COUNT_CHUNK):
        chunk = flat[start : start + _COUNT_CHUNK]
        wide = (
            buffer.get(chunk.numel(), torch.float64)
            if buffer is not None
            else torch.empty(chunk.numel(), dtype=torch.float64, device=chunk.device)
        )
        wide.copy_(chunk)
        total += wide.sum().item()
        squares += torch.dot(wide, wide).item()
    return total, squares


def _fill_on_cpu(summary: TensorSummary, flat: torch.Tensor, buffer: _ComparisonBuffer | None = None) -> None:
    count = flat.numel()
    total, squares = _wide_sums(flat, buffer)
    minimum, maximum = (value.item() for value in torch.aminmax(flat))
    if not (math.isfinite(total) and math.isfinite(squares)):
        finite_mask = torch.isfinite(flat)
        nan_count = int(torch.isnan(flat).sum().item())
        non_finite = count - int(finite_mask.sum().item())
        summary.nan_count, summary.inf_count = nan_count, non_finite - nan_count
        finite = flat[finite_mask].double() if non_finite else flat.double()
        positives = int((finite > 0).sum().item()) + int(torch.isposinf(flat).sum().item())
        count = finite.numel()
        if count == 0:
            summary.positive_fraction = positives / flat.numel()
            return
        total = finite.sum().item()
        squares = torch.dot(finite, finite).item()
        minimum, maximum = (value.item() for value in torch.aminmax(finite))
        positives_total = flat.numel()
    else:
        positives = _positive_count(flat, buffer)
        positives_total = count
    _set_moments(summary, flat, count, total, squares)
    summary.min, summary.max = minimum, maximum
    summary.abs_max = max(abs(minimum), abs(maximum))
    summary.positive_fraction = positives / positives_total


def _set_moments(summary: TensorSummary, flat: torch.Tensor, count: int, total: float, squares: float) -> None:
    mean = total / count
    if count < 2:
        summary.mean, summary.std = mean, float("nan")
        return
    variance = (squares - total * mean) / (count - 1)
    if variance <= 0 or mean * mean > _CANCELLATION_RATIO * variance or not math.isfinite(variance):
        flat = flat.detach()
        finite = flat[torch.isfinite(flat)].double()
        std, exact_mean = torch.std_mean(finite)
        summary.mean, summary.std = exact_mean.item(), std.item()
        return
    summary.mean, summary.std = mean, math.sqrt(variance)


class PendingStats:
    """Statistics of device tensors, computed on their device and fetched together after the forward pass.

    Also holds the batch of small CPU tensors (float64 copies) reduced together at `resolve`, and the comparison
    buffer that the large CPU tensors of one capture reuse (released by `resolve`).
    """

    def __init__(self) -> None:
        self._summaries: list[TensorSummary] = []
        self._rows: list[torch.Tensor] = []
        self._stages: dict[torch.device, _DeviceStage] = {}
        self._staged: list[_ReducedStage] = []
        self._unstaged: set[torch.device] = set()
        self._buffer = _ComparisonBuffer()
        self._small_summaries: list[TensorSummary] = []
        self._small_arrays: list[np.ndarray] = []
        self._small_elements = 0

    def add_small(self, summary: TensorSummary, array: np.ndarray) -> None:
        self._small_summaries.append(summary)
        self._small_arrays.append(array)
        self._small_elements += array.size
        if self._small_elements >= _BATCH_MAX_ELEMENTS:
            self._resolve_small()

    def _resolve_small(self) -> None:
        if self._small_arrays:
            _fill_batch(self._small_summaries, self._small_arrays)
        self._small_summaries, self._small_arrays, self._small_elements = [], [], 0

    def add_device(self, summary: TensorSummary, tensor: torch.Tensor) -> None:
        """A tensor off the CPU: plain float32 and half-precision tensors up to `_STAGE_ELEMENTS` are copied (and
        widened) into their device's stage, reduced a stage at a time (`_DeviceStage`); the rest take `add`'s
        reductions of their own, as every tensor of a device that had no memory left for a stage does."""
        count = tensor.numel()
        device = tensor.device
        # NOTE: a subclass (DTensor, a tensor wrapper) is reduced by its own operations, not copied into a stage
        if (
            not is_plain(tensor)
            or tensor.dtype not in _STAGED_DTYPES
            or count > _STAGE_ELEMENTS
            or device in self._unstaged
        ):
            self.add(summary, _statistics_input(tensor, _wide_dtype(device)))
            return
        stage = self._stages.get(device)
        if stage is None or not stage.has_room(count):
            if stage is not None:
                self._reduce(self._stages.pop(device))
            try:
                stage = self._stages[device] = _DeviceStage(device)
            except torch.OutOfMemoryError:
                # NOTE: a model that fills its device leaves no room for a stage: this capture reduces that
                # device's tensors one by one, as it did before stages (more launches, no memory of its own)
                self._unstaged.add(device)
                self.add(summary, _statistics_input(tensor, _wide_dtype(device)))
                return
        stage.append(summary, tensor)

    def _reduce(self, stage: _DeviceStage) -> None:
        try:
            self._staged.append(stage.reduce())
        except torch.OutOfMemoryError:
            # NOTE: no memory for the stage's temporaries: its tensors one by one, read from the stage
            for summary, start, length in stage.tensors():
                self.add(summary, stage.buffer[start : start + length])

    def add(self, summary: TensorSummary, flat: torch.Tensor) -> None:
        wide = _wide_dtype(flat.device)
        finite_mask = torch.isfinite(flat)
        finite = torch.where(finite_mask, flat, torch.zeros((), dtype=flat.dtype, device=flat.device)).to(wide)
        nan_count = torch.isnan(flat).sum()
        inf_count = flat.numel() - finite_mask.sum() - nan_count
        # NOTE: the fill is the wide dtype's largest value, given as a scalar to a tensor of that dtype (a 0-d
        # tensor of float64's made without a dtype is float32, and torch refuses the conversion)
        big = torch.finfo(wide).max
        as_wide = flat.to(wide)
        minimum = as_wide.masked_fill(~finite_mask, big).amin()
        maximum = as_wide.masked_fill(~finite_mask, -big).amax()
        count, total = finite_mask.sum().to(wide), finite.sum()
        # NOTE: squared deviations from the mean, not raw squares: a mean far from zero then costs the variance
        # no precision (float32 sums on a device without float64)
        centred = finite.sub(total / count.clamp(min=1)).masked_fill_(~finite_mask, 0.0)
        row = torch.stack(
            [
                total,
                torch.dot(centred, centred),
                minimum,
                maximum,
                (flat > 0).sum().to(wide),
                nan_count.to(wide),
                inf_count.to(wide),
                count,
            ]
        )
        self._summaries.append(summary)
        self._rows.append(row)

    def resolve(self) -> None:
        self._resolve_small()
        self._buffer = _ComparisonBuffer()
        for stage in self._stages.values():
            if stage.summaries:
                self._reduce(stage)
        self._stages.clear()
        if not self._rows and not self._staged:
            return
        # NOTE: one device-to-host copy for the whole forward pass instead of one sync per number (one per
        # device where a model is spread over several).
        fetched: dict[torch.device, list[torch.Tensor]] = {}
        for stage in self._staged:
            fetched.setdefault(stage.partials.device, []).append(stage.partials)
        if self._rows:
            fetched.setdefault(self._rows[0].device, []).append(
                torch.stack([row.to(self._rows[0].device) for row in self._rows])
            )
        # NOTE: the stages' [blocks, 7] partials and `add`'s [tensors, 8] rows, flattened into one copy per device
        on_host = {
            device: torch.cat([part.reshape(-1) for part in parts]).cpu().numpy().astype(np.float64, copy=False)
            for device, parts in fetched.items()
        }
        taken = dict.fromkeys(on_host, 0)  # elements of each device's array read so far, in the order cat put them
        summaries: list[TensorSummary] = []
        rows: list[list[float]] = []  # total, sum of squared deviations, min, max, positives, NaNs, Infs, count
        for stage in self._staged:
            device, start = stage.partials.device, taken[stage.partials.device]
            taken[device] = start + stage.partials.numel()
            summaries.extend(stage.summaries)
            rows.extend(stage.rows(on_host[device][start : taken[device]].reshape(-1, 7)))
        if self._rows:
            device = self._rows[0].device
            summaries.extend(self._summaries)
            rows.extend(on_host[device][taken[device] :].reshape(-1, 8).tolist())
        for summary, (total, deviations, minimum, maximum, positives, nans, infs, count) in zip(summaries, rows):
            summary.nan_count, summary.inf_count = int(nans), int(infs)
            summary.positive_fraction = positives / (count + nans + infs)
            if count == 0:
                continue
            mean = total / count
            variance = deviations / (count - 1) if count > 1 else float("nan")
            summary.mean, summary.std = mean, math.sqrt(variance) if variance >= 0 else float("nan")
            summary.min, summary.max = minimum, maximum
            summary.abs_max = max(abs(minimum), abs(maximum))
        self._summaries.clear()
        self._rows.clear()
        self._staged.clear()


# NOTE: the device path's stage. A forward on a GPU is bound by kernel launches (a medium Llama's 7-13 ms on an
# H200); `add`'s reductions are ~14 launches per tensor, which made statistics cost 8× the forward there. A
# staged tensor costs one launch (a copy that also widens it), and a stage is reduced in ~25 launches, whatever
# number of tensors it holds: each tensor starts on a block of `_BLOCK` elements, the stage is reduced block by
# block on the device (`torch.segment_reduce` reduces each segment on one GPU thread: 40× the forward at 1B),
# and the blocks of each tensor meet on the CPU at `resolve`, in float64: each block gives its sum, count and the
# sum of its values' squared deviations from its own mean, combined as Chan, Golub and LeVeque's pairwise
# update does (a mean far from zero costs the variance no precision). The stage starts as NaN, so a tensor's
# last block is padded with values that only the NaN count sees, and that padding is taken off it. float32 and
# half precision widen to float64 exactly: min, max and the counts are exact, and the block sums are float64
# (float32 on a device without it: `_NO_FLOAT64`). A stage holds `_STAGE_ELEMENTS` (64 MB of float64); reducing
# it takes ~19 bytes per element more, briefly; without that memory the stage's tensors go one by one.
_STAGED_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16))
_BLOCK = 4096
_STAGE_ELEMENTS = 2048 * _BLOCK


class _DeviceStage:
    """Copies of one device's tensors in one buffer, each from a block's start; `reduce` makes each block's
    partial statistics."""

    def __init__(self, device: torch.device) -> None:
        self.buffer = torch.full((_STAGE_ELEMENTS,), math.nan, dtype=_wide_dtype(device), device=device)
        self.used = 0  # a whole number of blocks
        self.first_blocks: list[int] = []
        self.lengths: list[int] = []
        self.summaries: list[TensorSummary] = []

    def has_room(self, count: int) -> bool:
        return self.used + _span(count) <= _STAGE_ELEMENTS

    def append(self, summary: TensorSummary, tensor: torch.Tensor) -> None:
        count = tensor.numel()
        # NOTE: copied now: the model may change the tensor in place after its call returns
        self.buffer[self.used : self.used + count].view(tensor.shape).copy_(tensor)
        self.first_blocks.append(self.used // _BLOCK)
        self.lengths.append(count)
        self.summaries.append(summary)
        self.used += _span(count)

    def tensors(self) -> list[tuple[TensorSummary, int, int]]:
        """Each staged tensor's summary, first element and length in the buffer."""
        return [
            (summary, first * _BLOCK, length)
            for summary, first, length in zip(self.summaries, self.first_blocks, self.lengths)
        ]

    def reduce(self) -> _ReducedStage:
        """Each block's sum, count and squared deviations from its mean, min and max of its finite values, and its
        positive and NaN counts, [blocks, 7] on the device; nothing waits for them."""
        blocks = self.buffer[: self.used].view(-1, _BLOCK)
        finite = torch.isfinite(blocks)
        not_finite = finite.logical_not()
        count = finite.sum(1).to(blocks.dtype)
        work = blocks.masked_fill(not_finite, 0.0)
        total = work.sum(1)
        block_mean = (total / count.clamp(min=1)).unsqueeze(1)
        deviations = work.sub_(block_mean).masked_fill_(not_finite, 0.0).square_().sum(1)
        del work
        minimum = torch.where(finite, blocks, math.inf).amin(1)
        maximum = torch.where(finite, blocks, -math.inf).amax(1)
        positives, nans = blocks.gt(0).sum(1).to(blocks.dtype), torch.isnan(blocks).sum(1).to(blocks.dtype)
        partials = torch.stack([total, deviations, minimum, maximum, positives, nans, count], 1)
        return _ReducedStage(self.summaries, partials, self.first_blocks, self.lengths)


def _span(count: int) -> int:
    """The elements a tensor of `count` takes in a stage: whole blocks."""
    return -(-count // _BLOCK) * _BLOCK


@dataclass
class _ReducedStage:
    summaries: list[TensorSummary]
    partials: torch.Tensor  # [blocks, 7] on the device until `resolve` fetches it
    first_blocks: list[int]
    lengths: list[int]

    def rows(self, partials: np.ndarray) -> list[list[float]]:
        """Each tensor's row (`resolve`'s layout) from its blocks' partials, fetched as float64."""
        starts = np.asarray(self.first_blocks)
        lengths = np.asarray(self.lengths, dtype=np.float64)
        block_total, block_deviations, block_count = partials[:, 0], partials[:, 1], partials[:, 6]
        total, positives, nans, count = (np.add.reduceat(partials[:, column], starts) for column in (0, 4, 5, 6))
        minimum = np.minimum.reduceat(partials[:, 2], starts)
        maximum = np.maximum.reduceat(partials[:, 3], starts)
        nans = nans - (np.diff(np.append(starts, len(partials))) * _BLOCK - lengths)  # the padding's NaNs
        # NOTE: the blocks' deviations about the tensor's mean: each block's own, plus its count times the square
        # of its mean's distance from the tensor's (Chan, Golub and LeVeque)
        owner = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(partials))))
        mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        block_mean = np.divide(block_total, block_count, out=np.zeros_like(block_total), where=block_count > 0)
        spread = block_deviations + block_count * (block_mean - mean[owner]) ** 2
        deviations = np.add.reduceat(spread, starts)
        infs = lengths - count - nans
        return np.stack([total, deviations, minimum, maximum, positives, nans, infs, count], 1).tolist()
