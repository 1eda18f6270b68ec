"""Module-level capture: forward pre/post hooks on every submodule, one `ModuleCall` record per call.

The technique of transformers' `utils/output_capturing.py` and `model_addition_debugger_context`, with three
differences that make it cheap enough to leave on: statistics instead of reprs (`stats`), each tensor object
summarised once per forward pass (the RMSNorm output that feeds q, k and v projections is one summary), and
source lines resolved from the live stack (`source_map`). Hooks only read: the model's result is bitwise
identical with and without capture.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from modeltrace.trace.records import ModuleCall, TensorSummary
from modeltrace.worker import source_map
from modeltrace.worker.stats import PendingStats, summarize


# NOTE: bounds on what one call records, so that a module returning a huge nested structure cannot blow up
# the trace: the first leaves in traversal order are kept.
MAX_LEAVES_PER_SIDE = 32
MAX_NESTING = 4


def iter_tensor_leaves(value: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(key, tensor)` for tensors inside tuples, lists, dicts and ModelOutputs, in order."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif depth >= MAX_NESTING:
        return
    elif isinstance(value, dict):  # includes transformers' ModelOutput (an OrderedDict)
        for name, item in value.items():
            yield from iter_tensor_leaves(item, f"{prefix}.{name}" if prefix else str(name), depth + 1)
    elif isinstance(value, (tuple, list)):
        for position, item in enumerate(value):
            yield from iter_tensor_leaves(item, f"{prefix}.{position}" if prefix else str(position), depth + 1)


class _SummaryCache:
    """Reuse the summary of a tensor object seen earlier in this pass, unless it was modified in place since."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, int, TensorSummary]] = {}

    def get(self, tensor: torch.Tensor, key: str) -> TensorSummary | None:
        entry = self._entries.get(id(tensor))
        if entry is None or entry[0]() is not tensor or entry[1] != _version(tensor):
            return None
        return dataclasses.replace(entry[2], key=key)

    def put(self, tensor: torch.Tensor, summary: TensorSummary) -> None:
        version = _version(tensor)
        if version >= 0:
            self._entries[id(tensor)] = (weakref.ref(tensor), version, summary)

    def clear(self) -> None:
        self._entries.clear()


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors track no version: never cache them
        return -1


class ModuleCapture:
    """Context manager that records every module call of `model` while active.

    With `full_tensors`, a CPU copy of every captured tensor is kept in `tensors` under the name stored in
    its summary's `tensor` field (`"{record index}/outputs/{key}"`), for the safetensors file of the trace.
    """

    def __init__(self, model: nn.Module, full_tensors: bool = False) -> None:
        self.model = model
        self.full_tensors = full_tensors
        self.records: list[ModuleCall] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self._stack: list[int] = []
        self._call_counts: dict[str, int] = {}
        self._finished = 0
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._cache = _SummaryCache()
        self._pending = PendingStats()
        self._parameter_names: dict[type, list[str]] = {}

    def __enter__(self) -> ModuleCapture:
        try:
            for path, module in self.model.named_modules():
                self._handles.append(
                    module.register_forward_pre_hook(self._make_pre_hook(path), with_kwargs=True, prepend=True)
                )
                self._handles.append(module.register_forward_hook(self._make_post_hook(path), always_call=True))
        except BaseException:
            self._remove_hooks()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._remove_hooks()
        self._pending.resolve()
        self._cache.clear()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _make_pre_hook(self, path: str):
        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._on_call(path, module, args, kwargs)

        return pre_hook

    def _make_post_hook(self, path: str):
        def post_hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._on_return(output)

        return post_hook

    def _on_call(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # depth 3: pre_hook <- _on_call's caller chain starts at torch's _call_impl
        called_at, call_site = source_map.caller_location(start_depth=3)
        index = len(self.records)
        call_index = self._call_counts.get(path, 0)
        self._call_counts[path] = call_index + 1
        record = ModuleCall(
            index=index,
            path=path,
            class_name=type(module).__name__,
            defined_at=source_map.defined_at(type(module)),
            called_at=called_at,
            call_index=call_index,
            parent=self._stack[-1] if self._stack else -1,
            call_site=call_site,
        )
        names = self._forward_parameter_names(module)
        inputs = [(names[position] if position < len(names) else f"args.{position}", value)
                  for position, value in enumerate(args)]
        inputs.extend(kwargs.items())
        record.inputs = self._summarize_all(inputs, index, "inputs")
        self.records.append(record)
        self._stack.append(index)

    def _on_return(self, output: Any) -> None:
        if not self._stack:
            return
        record = self.records[self._stack.pop()]
        record.finish_order = self._finished
        self._finished += 1
        record.outputs = self._summarize_all([("", output)], record.index, "outputs")

    def _summarize_all(self, named_values: list[tuple[str, Any]], index: int, side: str) -> list[TensorSummary]:
        summaries: list[TensorSummary] = []
        for name, value in named_values:
            for key, tensor in iter_tensor_leaves(value, name):
                if len(summaries) >= MAX_LEAVES_PER_SIDE:
                    return summaries
                summary = self._cache.get(tensor, key)
                if summary is None:
                    summary = summarize(tensor, key, self._pending)
                    if self.full_tensors and tensor.device.type != "meta":
                        summary.tensor = f"{index}/{side}/{key}"
                        self.tensors[summary.tensor] = tensor.detach().to("cpu", copy=True).contiguous()
                    self._cache.put(tensor, summary)
                summaries.append(summary)
        return summaries

    def _forward_parameter_names(self, module: nn.Module) -> list[str]:
        """Positional parameter names of `module.forward`, to key positional inputs by name."""
        module_class = type(module)
        names = self._parameter_names.get(module_class)
        if names is None:
            try:
                parameters = inspect.signature(module.forward).parameters.values()
                names = [
                    parameter.name
                    for parameter in parameters
                    if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
                ]
            except (TypeError, ValueError):
                names = []
            self._parameter_names[module_class] = names
        return names
