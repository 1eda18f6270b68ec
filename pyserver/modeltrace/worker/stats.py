"""Summaries of tensors: shape, dtype, device, mean, std, min, max, abs-max, NaN/Inf counts, positive fraction.

Cost matters: this runs on every input and output of every module. `torch.std_mean` costs ~16× a sum, a dot
product and `aminmax` together on CPU, so the common path computes those three (plus a positive count) and
derives mean and std from them. Sums that overflow float32 (additive attention masks filled with the dtype's
minimum) and catastrophic cancellation fall back to float64; NaN/Inf are counted only when a sum shows them,
and the other statistics then describe the finite values. Off the CPU, the numbers of a whole forward pass are
fetched in one batch instead of one `.item()` per number (`PendingStats`).
"""

from __future__ import annotations

import math

import torch

from modeltrace.trace.records import TensorSummary


# NOTE: mean² / variance above this ratio loses digits in the sum-of-squares formula; recompute exactly.
_CANCELLATION_RATIO = 1e4


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _statistics_input(tensor: torch.Tensor) -> torch.Tensor:
    """A flat floating view of `tensor` suited to reductions (float32 for half precision and integers)."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype in (torch.float32, torch.float64):
        return flat
    if flat.is_complex():
        return flat.abs()
    if flat.dtype.is_floating_point:
        return flat.float()
    return flat.double()


def summarize(tensor: torch.Tensor, key: str, pending: PendingStats | None = None) -> TensorSummary:
    """Summarise one tensor; off-CPU tensors are queued on `pending` and filled in by `pending.resolve()`."""
    summary = TensorSummary(
        key=key,
        shape=list(tensor.shape),
        dtype=dtype_name(tensor.dtype),
        device=str(tensor.device),
    )
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return summary
    flat = _statistics_input(tensor)
    if flat.device.type != "cpu" and pending is not None:
        pending.add(summary, flat)
        return summary
    _fill_on_cpu(summary, flat)
    return summary


def _fill_on_cpu(summary: TensorSummary, flat: torch.Tensor) -> None:
    count = flat.numel()
    total = flat.sum().item()
    squares = torch.dot(flat, flat).item()
    minimum, maximum = (value.item() for value in torch.aminmax(flat))
    positives = torch.relu(flat).sign_().sum().item()
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
        finite = flat[torch.isfinite(flat)].double()
        std, exact_mean = torch.std_mean(finite)
        summary.mean, summary.std = exact_mean.item(), std.item()
        return
    summary.mean, summary.std = mean, math.sqrt(variance)


class PendingStats:
    """Statistics of device tensors, computed on their device and fetched together after the forward pass."""

    def __init__(self) -> None:
        self._summaries: list[TensorSummary] = []
        self._rows: list[torch.Tensor] = []

    def add(self, summary: TensorSummary, flat: torch.Tensor) -> None:
        finite_mask = torch.isfinite(flat)
        finite = torch.where(finite_mask, flat, torch.zeros((), dtype=flat.dtype, device=flat.device)).double()
        nan_count = torch.isnan(flat).sum()
        inf_count = flat.numel() - finite_mask.sum() - nan_count
        big = torch.finfo(torch.float64).max
        minimum = torch.where(finite_mask, flat.double(), torch.full((), big, device=flat.device)).min()
        maximum = torch.where(finite_mask, flat.double(), torch.full((), -big, device=flat.device)).max()
        row = torch.stack(
            [
                finite.sum(),
                torch.dot(finite, finite),
                minimum,
                maximum,
                (flat > 0).sum().double(),
                nan_count.double(),
                inf_count.double(),
                finite_mask.sum().double(),
            ]
        )
        self._summaries.append(summary)
        self._rows.append(row)

    def resolve(self) -> None:
        if not self._rows:
            return
        # NOTE: one device-to-host copy for the whole forward pass instead of one sync per number.
        rows = torch.stack([row.to(self._rows[0].device) for row in self._rows]).cpu().tolist()
        for summary, (total, squares, minimum, maximum, positives, nans, infs, count) in zip(self._summaries, rows):
            summary.nan_count, summary.inf_count = int(nans), int(infs)
            summary.positive_fraction = positives / (count + nans + infs)
            if count == 0:
                continue
            mean = total / count
            variance = (squares - total * mean) / (count - 1) if count > 1 else float("nan")
            summary.mean, summary.std = mean, math.sqrt(variance) if variance >= 0 else float("nan")
            summary.min, summary.max = minimum, maximum
            summary.abs_max = max(abs(minimum), abs(maximum))
        self._summaries.clear()
        self._rows.clear()
