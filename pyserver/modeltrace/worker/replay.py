"""Replay, in the worker: re-run suspect candidate modules on the reference's inputs during a normal forward.

The diff (`diff/replay.py`, no torch) sends a request naming the candidate's build (file / recipe / class /
seed / dtype / device, from its trace header), a safetensors file of reference input tensors already paired
with the candidate's input keys, and the suspect module calls (path, call index). Here the candidate model is
built as its trace was, a forward pre-hook goes on each suspect module, and the forward runs as usual. At a
suspect's call the hook runs the module once more, on its live arguments with the paired tensors replaced by
the reference's (reshaped to the live tensor's shape, cast to its dtype and device), records that output, and
returns nothing: the forward itself continues unchanged, until the last suspect has returned (the rest of the
forward is then skipped: it has nothing left to give). Cache objects among the arguments are copied for the
extra call, so that it cannot advance them.

Every target gets an answer: the keys of its replayed outputs, or why it could not be replayed (no such module,
never called, a tensor that does not fit, the module raising). Besides the replayed output, the statistics of
the module's live output are returned so that the diff can check that the rebuilt candidate is the traced one.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from modeltrace.errors import ModelTraceError
from modeltrace.worker.build import build_from_request
from modeltrace.worker.capture import forward_parameter_names, iter_tensor_leaves


OUTPUTS_FILE = "replay_outputs.safetensors"


class _AllReplayed(Exception):
    """Raised by the last target's post-hook: the rest of the forward has nothing left to give."""


def _named_arguments(module: torch.nn.Module, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """The call's arguments under the names capture records them by (positional ones by parameter name)."""
    names = forward_parameter_names(module)
    named: list[tuple[str, Any]] = list(zip(names, args))
    if len(args) > len(names):
        named.extend((f"args.{position}", args[position]) for position in range(len(names), len(args)))
    named.extend(kwargs.items())
    return named


def _replace(value: Any, parts: list[str], tensor: torch.Tensor, key: str) -> Any:
    """`value` with the tensor at `parts` (a key path inside tuples, lists and dicts) replaced."""
    if not parts:
        if not isinstance(value, torch.Tensor):
            raise ModelTraceError(f"input {key!r} is not a tensor in this call")
        if tensor.shape != value.shape:
            if tensor.numel() != value.numel():
                raise ModelTraceError(f"the reference's tensor for input {key!r} has shape {list(tensor.shape)}, "
                                      f"which does not fit the candidate's {list(value.shape)}")
            tensor = tensor.reshape(value.shape)
        return tensor.to(device=value.device, dtype=value.dtype)
    head, rest = parts[0], parts[1:]
    if isinstance(value, dict):
        if head not in value:
            raise ModelTraceError(f"input {key!r}: no item {head!r} in this call")
        copied = copy.copy(value)
        copied[head] = _replace(value[head], rest, tensor, key)
        return copied
    if isinstance(value, (tuple, list)):
        position = int(head) if head.isdigit() else -1
        if not 0 <= position < len(value):
            raise ModelTraceError(f"input {key!r}: no item {head} in this call")
        items = list(value)
        items[position] = _replace(items[position], rest, tensor, key)
        return type(value)(items) if isinstance(value, list) or type(value) is tuple else type(value)(*items)
    raise ModelTraceError(f"input {key!r} is not reachable in this call")


def substitute(module: torch.nn.Module, args: tuple, kwargs: dict,
               replacements: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
    """The call's arguments with the tensors at the given input keys replaced (see `_replace`)."""
    named = _named_arguments(module, args, kwargs)
    values = dict(named)
    for key, tensor in replacements.items():
        top = next((name for name, _ in named if key == name or key.startswith(name + ".")), None)
        if top is None:
            raise ModelTraceError(f"input {key!r} is not an argument of this call")
        rest = key[len(top) + 1 :].split(".") if key != top else []
        values[top] = _replace(values[top], rest, tensor, key)
    for name, value in values.items():  # NOTE: the extra call must not advance a cache the forward uses
        if type(value).__name__.endswith("Cache"):
            values[name] = copy.deepcopy(value)
    positional = len(args)
    new_args = tuple(values[name] for name, _ in named[:positional])
    new_kwargs = {name: values[name] for name, _ in named[positional:]}
    return new_args, new_kwargs


def _statistics(output: Any) -> dict[str, list[float]]:
    found = {}
    for key, tensor in iter_tensor_leaves(output):
        if tensor.is_floating_point() and tensor.numel():
            values = tensor.detach().to(torch.float64)
            found[key] = [float(values.mean()), float(values.std()) if values.numel() > 1 else 0.0]
    return found


def run_replay_job(request: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Build the candidate, run its forward with the replay hooks, write the replayed outputs."""
    from modeltrace.worker.job import _move

    started = time.perf_counter()
    replay = request["replay"]
    progress("rebuilding the candidate for the replay")
    built = build_from_request(request)
    if built.shape_only:
        raise ModelTraceError("a shape-only trace cannot be replayed")
    _move(built, request.get("device") or "cpu", request.get("dtype") or "float32")
    built_seconds = time.perf_counter() - started
    reference_inputs = load_file(replay["inputs_file"]) if replay.get("inputs_file") else {}
    modules = dict(built.model.named_modules())
    answers: dict[str, dict[str, Any]] = {}
    outputs: dict[str, torch.Tensor] = {}
    targets: dict[str, dict[int, dict[str, Any]]] = {}
    for target in replay["targets"]:
        answers[target["name"]] = {"ran": False, "error": None, "keys": [], "live": {}, "replay_seconds": None,
                                   "live_seconds": None}
        if target["path"] not in modules:
            answers[target["name"]]["error"] = f"the rebuilt candidate has no module {target['path']!r}"
            continue
        targets.setdefault(target["path"], {})[int(target["call_index"])] = target
    handles = []
    replaying = [False]
    remaining = [sum(len(wanted) for wanted in targets.values())]

    def make_hooks(path: str, wanted: dict[int, dict[str, Any]]):
        calls = [0]
        pending: list[tuple[dict[str, Any] | None, float]] = []

        def before(module: torch.nn.Module, args: tuple, kwargs: dict):
            if replaying[0]:
                return None
            index = calls[0]
            calls[0] += 1
            target = wanted.get(index)
            if target is None:
                pending.append((None, 0.0))
                return None
            answer = answers[target["name"]]
            try:
                replacements = {key: reference_inputs[name] for key, name in target["inputs"].items()}
                new_args, new_kwargs = substitute(module, args, kwargs, replacements)
                replaying[0] = True
                try:
                    started = time.perf_counter()
                    output = module(*new_args, **new_kwargs)
                    answer["replay_seconds"] = time.perf_counter() - started
                finally:
                    replaying[0] = False
                for key, tensor in iter_tensor_leaves(output):
                    outputs[f"{target['name']}/{key}"] = tensor.detach().to("cpu", copy=True).contiguous()
                    answer["keys"].append(key)
                answer["ran"] = True
            except Exception as error:  # noqa: BLE001 - any failure of the module: the diff falls back
                answer["error"] = f"{type(error).__name__}: {error}"
            pending.append((target, time.perf_counter()))
            return None

        def after(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any):
            if replaying[0] or not pending:
                return None
            target, started = pending.pop()
            if target is not None:
                answers[target["name"]]["live_seconds"] = time.perf_counter() - started
                answers[target["name"]]["live"] = _statistics(output)
                remaining[0] -= 1
                if remaining[0] == 0:
                    # NOTE: every suspect has run: the rest of the forward would only cost time
                    raise _AllReplayed
            return None

        return before, after

    for path, wanted in targets.items():
        before, after = make_hooks(path, wanted)
        module = modules[path]
        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    progress(f"running {built.model_class}.forward with {len(replay['targets'])} modules replayed")
    forward_error = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(built.forward_context())
            built.model(*built.args, **built.kwargs)
    except _AllReplayed:
        pass
    except Exception as error:  # noqa: BLE001 - reported; what was replayed before it still counts
        forward_error = f"{type(error).__name__}: {error}"
    finally:
        for handle in handles:
            handle.remove()
    for path, wanted in targets.items():
        for target in wanted.values():
            answer = answers[target["name"]]
            if not answer["ran"] and answer["error"] is None:
                answer["error"] = (f"the rebuilt candidate's forward raised before calling it ({forward_error})"
                                   if forward_error else f"{path} was not called {target['call_index'] + 1} times")
    out = Path(replay["out"])
    out.mkdir(parents=True, exist_ok=True)
    save_file(outputs, str(out / OUTPUTS_FILE))
    return {
        "type": "result",
        "replay": answers,
        "build_seconds": built_seconds,
        "outputs": str(out / OUTPUTS_FILE),
        "forward_error": forward_error,
        "model_class": built.model_class,
        "seconds": time.perf_counter() - started,
    }
