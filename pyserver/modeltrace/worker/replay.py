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

The editor's diff follows the trace it judges: its trace request asks to keep the model (`keep_for_replay`), the
zygote leaves that child alive, and the replay runs there (`KeptCandidate`): no rebuild, and a target whose call's
arguments were kept by the capture is simply called again on them, without a forward (its kept arguments are
first checked against the trace's statistics, in case something changed them in place since).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building import BuiltModel, build_from_request
from modeltrace.worker.capture import forward_parameter_names, iter_tensor_leaves
from modeltrace.worker.messages import ReplayAnswer, ReplayedModule, ReplayTarget, TraceRequest
from modeltrace.worker.moving import move_built


OUTPUTS_FILE = "replay_outputs.safetensors"
# NOTE: a kept argument is the same tensor the trace summarised: its mean and std differ from the trace's only if
# something changed it in place since (then the call is replayed by a forward instead).
_KEPT_TOLERANCE = 1e-4


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
                raise ModelTraceError(
                    f"the reference's tensor for input {key!r} has shape {list(tensor.shape)}, "
                    f"which does not fit the candidate's {list(value.shape)}"
                )
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


def substitute(
    module: torch.nn.Module, args: tuple, kwargs: dict, replacements: dict[str, torch.Tensor]
) -> tuple[tuple, dict]:
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


@dataclass
class KeptCandidate:
    """A traced candidate kept alive in its worker child for the diff's replay (`keep_for_replay`): the model as
    it ran, the arguments of its calls (those within the budget, `ModuleCapture.retained`) and the trace it
    wrote, stamped so that a trace written over it since is not taken for this one."""

    built: BuiltModel
    calls: dict[tuple[str, int], tuple[tuple, dict]]
    trace: Path
    stamp: tuple[int, int] | None

    def serves(self, trace: str | None) -> bool:
        """Whether a replay of the candidate trace `trace` can use this model."""
        return trace is not None and Path(trace).resolve() == self.trace and _stamp(self.trace) == self.stamp


_kept: KeptCandidate | None = None


def _stamp(folder: Path) -> tuple[int, int] | None:
    try:
        status = folder.stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


def keep_candidate(built: BuiltModel, calls: dict[tuple[str, int], tuple[tuple, dict]], trace: Path) -> None:
    """Remember the model a trace just ran (see `KeptCandidate`), for this process's later replays."""
    global _kept
    folder = Path(trace).resolve()
    _kept = KeptCandidate(built, calls, folder, _stamp(folder))


def kept_candidate(request: TraceRequest) -> KeptCandidate | None:
    """The kept candidate when it is the one the replay request names, else None."""
    trace = request.replay.candidate_trace if request.replay is not None else None
    return _kept if _kept is not None and _kept.serves(trace) else None


def _kept_arguments_unchanged(
    module: torch.nn.Module, call: tuple[tuple, dict], expected: dict[str, list[float]]
) -> bool:
    """Whether the kept arguments of a call still hold what the trace recorded for them (mean and std of each
    floating input the replay keeps): a tensor changed in place after the call fails this."""
    args, kwargs = call
    found: dict[str, torch.Tensor] = {}
    for name, value in _named_arguments(module, args, kwargs):
        found.update(iter_tensor_leaves(value, name))
    for key, (mean, std) in expected.items():
        tensor = found.get(key)
        if tensor is None:
            return False
        values = tensor.detach().to(torch.float64)
        live_mean, live_std = float(values.mean()), float(values.std()) if values.numel() > 1 else 0.0
        scale = (mean**2 + std**2) ** 0.5 + 1e-6
        if abs(live_mean - mean) > _KEPT_TOLERANCE * scale or abs(live_std - std) > _KEPT_TOLERANCE * scale:
            return False
    return True


def _replay_call(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    target: ReplayTarget,
    reference_inputs: dict[str, torch.Tensor],
    answer: dict[str, Any],
    outputs: dict[str, torch.Tensor],
) -> None:
    """Run one module on its call's arguments with the paired tensors replaced by the reference's; the output
    goes into `outputs`, the outcome into `answer` (a module that raises is an answer, not an error)."""
    try:
        replacements = {key: reference_inputs[name] for key, name in target.inputs.items()}
        new_args, new_kwargs = substitute(module, args, kwargs, replacements)
        started = time.perf_counter()
        output = module(*new_args, **new_kwargs)
        answer["replay_seconds"] = time.perf_counter() - started
        for key, tensor in iter_tensor_leaves(output):
            outputs[f"{target.name}/{key}"] = tensor.detach().to("cpu", copy=True).contiguous()
            answer["keys"].append(key)
        answer["ran"] = True
    except Exception as error:  # noqa: BLE001 - any failure of the module: the diff falls back
        answer["error"] = f"{type(error).__name__}: {error}"


def run_replay_job(request: TraceRequest, progress: Any, kept: KeptCandidate | None = None) -> ReplayAnswer:
    """Replay the request's targets and write their outputs. With `kept` (the model of the candidate's own
    trace, still alive), a target whose call's arguments were kept is called directly, and the rest by a
    forward of the kept model; without it, the candidate is rebuilt first."""
    started = time.perf_counter()
    replay = request.replay
    if replay is None:
        raise ModelTraceError(f"the request for {request.file} is not a replay (it names no targets)")
    if kept is not None:
        progress("replaying on the model kept from its trace")
        built = kept.built
    else:
        progress("rebuilding the candidate for the replay")
        built = build_from_request(request)
        if built.shape_only:
            raise ModelTraceError("a shape-only trace cannot be replayed")
        move_built(built, request.device, request.dtype)
    built_seconds = time.perf_counter() - started
    reference_inputs = load_file(replay.inputs_file) if replay.inputs_file else {}
    modules = dict(built.model.named_modules())
    answers: dict[str, dict[str, Any]] = {}
    outputs: dict[str, torch.Tensor] = {}
    targets: dict[str, dict[int, ReplayTarget]] = {}
    direct: list[tuple[ReplayTarget, tuple[tuple, dict]]] = []
    for target in replay.targets:
        answers[target.name] = {
            "ran": False,
            "error": None,
            "keys": [],
            "live": {},
            "replay_seconds": None,
            "live_seconds": None,
            "direct": False,
        }
        if target.path not in modules:
            answers[target.name]["error"] = f"the rebuilt candidate has no module {target.path!r}"
            continue
        call = kept.calls.get((target.path, target.call_index)) if kept is not None else None
        if call is not None and _kept_arguments_unchanged(modules[target.path], call, target.expect):
            direct.append((target, call))
        else:
            targets.setdefault(target.path, {})[target.call_index] = target
    if direct:
        progress(f"calling {len(direct)} modules again on the reference's inputs")
        # NOTE: these calls run while the diff compares the rest (`ReplaySpec.threads`); a rebuild takes longer
        # than the diff, so it and its forward keep all of torch's threads
        with torch.no_grad(), built.forward_context(), _torch_threads(replay.threads):
            for target, (args, kwargs) in direct:
                answer = answers[target.name]
                answer["direct"] = True
                _replay_call(modules[target.path], args, kwargs, target, reference_inputs, answer, outputs)
    forward_error = (
        _replay_by_forward(built, targets, answers, reference_inputs, outputs, progress) if targets else None
    )
    for path, wanted in targets.items():
        for target in wanted.values():
            answer = answers[target.name]
            if not answer["ran"] and answer["error"] is None:
                answer["error"] = (
                    f"the rebuilt candidate's forward raised before calling it ({forward_error})"
                    if forward_error
                    else f"{path} was not called {target.call_index + 1} times"
                )
    out = Path(replay.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(outputs, str(out / OUTPUTS_FILE))
    return ReplayAnswer(
        replay={
            name: ReplayedModule(
                **{
                    **answer,
                    "keys": tuple(answer["keys"]),
                    "live": {key: tuple(values) for key, values in answer["live"].items()},
                }
            )
            for name, answer in answers.items()
        },
        build_seconds=built_seconds,
        kept=kept is not None,
        outputs=str(out / OUTPUTS_FILE),
        forward_error=forward_error,
        model_class=built.model_class,
        seconds=time.perf_counter() - started,
    )


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` (None: unchanged) for the block."""
    previous = torch.get_num_threads()
    if threads is not None and threads != previous:
        torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def _replay_by_forward(
    built: BuiltModel,
    targets: dict[str, dict[int, ReplayTarget]],
    answers: dict[str, dict[str, Any]],
    reference_inputs: dict[str, torch.Tensor],
    outputs: dict[str, torch.Tensor],
    progress: Any,
) -> str | None:
    """Run the model's forward with a pre-hook on each target module that replays the target's call (see the
    module docstring); returns why the forward raised, or None."""
    modules = dict(built.model.named_modules())
    handles = []
    replaying = [False]
    remaining = [sum(len(wanted) for wanted in targets.values())]

    def make_hooks(path: str, wanted: dict[int, ReplayTarget]):  # noqa: ANN202
        calls = [0]
        pending: list[tuple[ReplayTarget | None, float]] = []

        def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            if replaying[0]:
                return None
            index = calls[0]
            calls[0] += 1
            target = wanted.get(index)
            if target is None:
                pending.append((None, 0.0))
                return None
            replaying[0] = True
            try:
                _replay_call(module, args, kwargs, target, reference_inputs, answers[target.name], outputs)
            finally:
                replaying[0] = False
            pending.append((target, time.perf_counter()))
            return None

        def after(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if replaying[0] or not pending:
                return None
            target, started = pending.pop()
            if target is not None:
                answers[target.name]["live_seconds"] = time.perf_counter() - started
                answers[target.name]["live"] = _statistics(output)
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
    progress(f"running {built.model_class}.forward with {sum(map(len, targets.values()))} modules replayed")
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(built.forward_context())
            built.model(*built.args, **built.kwargs)
    except _AllReplayed:
        pass
    except Exception as error:  # noqa: BLE001 - reported; what was replayed before it still counts
        return f"{type(error).__name__}: {error}"
    finally:
        for handle in handles:
            handle.remove()
    return None
