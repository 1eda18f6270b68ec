"""Tensor-parallel traces: `modeltrace trace --nproc N` runs the model on N ranks with transformers' own tensor
parallelism (`from_pretrained(tp_plan="auto")`, DTensor weights; gloo on CPU, NCCL on CUDA), captures every rank
and writes one trace.

Launch (`run_parallel_trace`, in the CLI's process, no torch): N processes of this module, with the environment
torchrun gives (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), each in a session of its own so
that the whole group is ended together: when a rank fails (its error, as the worker's error frame, in a file),
dies (a signal) or the group outlives `--timeout`, every rank's process group is killed and one message names the
rank. The same rank job runs under torchrun (`torchrun --nproc-per-node 2 -m modeltrace.worker.parallel
REQUEST.json`): it reads only that environment and the request file.

Rank job (`run_rank`): build from the checkpoint with `tp_plan="auto"`, run the forward under `ModuleCapture`, and
send the records (and the full tensors within the limits) to rank 0 (`gather_object`). Rank 0 merges them
(`merge_ranks`): each tensor is described as the whole logical tensor, with the shape of the whole taken from a
shape-only run of the same class and inputs on the meta device (`build_from_file(shape_only=True)`: no weights, no
compute). A tensor whose local shape on some rank differs from that shape is a shard along the dimension that
differs: statistics are combined exactly from the shards (counts, means and stds pooled, extrema of extrema), full
tensors concatenated, and each rank's local shape and statistics kept in the summary's `placement` (the hover shows
them; the diff names the rank whose shard differs, `diff/ranks.py`). A tensor every rank holds whole should be the
same on every rank; one that is not is reported in the header's `parallel.rank_divergences`, naming the rank. The
weights (DTensors) are gathered whole one at a time (`full_tensor`) for the builds' fingerprints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from modeltrace.errors import ModelTraceError
from modeltrace.worker.messages import TraceRequest, TraceResult, WorkerError, WorkerProtocolError


# NOTE: seconds a rank gets after SIGTERM before SIGKILL, when the group is ended.
_TERMINATE_GRACE = 3.0
# NOTE: replicated tensors are "the same on every rank" when these statistics agree this closely (all-reduce gives
# every rank the same bits; anything computed after it from the same values too).
_REPLICA_RTOL = 1e-6
_STATISTICS = ("mean", "std", "min", "max")


# --- launch (no torch) ----------------------------------------------------------------------------------------


def run_parallel_trace(request: TraceRequest, nproc: int) -> TraceResult:
    """Run the rank jobs for `request` on `nproc` ranks and return rank 0's result (`trace`, `seconds`); raises
    `ModelTraceError` naming the rank when one fails, dies or the group runs past `request.timeout`."""
    if not request.checkpoint:
        raise ModelTraceError(
            "--nproc loads the model with tensor parallelism (tp_plan='auto') from a checkpoint: give the local "
            "folder saved with save_pretrained (--checkpoint DIR)"
        )
    started = time.monotonic()
    if not request.out:
        raise ModelTraceError(f"the trace request for {request.file} names no trace folder to write (out)")
    timeout = request.timeout
    out = Path(request.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.ranks-", dir=out.parent))
    processes: list[subprocess.Popen] = []
    try:
        # NOTE: the rank jobs find their staging folder as the request file's folder
        request_file = staging / "request.json"
        request_file.write_text(json.dumps(request.to_frame()), encoding="utf-8")
        port = _free_port()
        for rank in range(nproc):
            environment = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
            log = open(staging / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed by the child's exit
            try:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "modeltrace.worker.parallel", str(request_file)],
                        env=environment,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # NOTE: its own process group: ended with everything it started
                    )
                )
            finally:
                log.close()
        _wait_for_group(processes, staging, started + timeout, timeout)
        result_file = staging / "result.json"
        if not result_file.is_file():
            raise ModelTraceError(f"rank 0 ended without writing the trace (see {staging / 'rank0.log'})")
        result = TraceResult.from_frame(json.loads(result_file.read_text(encoding="utf-8")))
        return dataclasses.replace(result, seconds=time.monotonic() - started)
    except BaseException:
        _end_group(processes)
        _remove_partial_trace(out, processes)
        raise
    finally:
        _end_group(processes)
        import shutil

        if not os.environ.get("MODELTRACE_KEEP_RANKS"):
            shutil.rmtree(staging, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_group(processes: list[subprocess.Popen], staging: Path, deadline: float, timeout: float) -> None:
    """Until every rank exited 0; the first failure (error file, exit code or signal) or the deadline raises."""
    while True:
        codes = [process.poll() for process in processes]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            # NOTE: ranks hitting the same error (a bad checkpoint) end within moments of each other: a short wait
            # lets the lowest of them be the one named
            time.sleep(0.5)
            failed = [rank for rank, process in enumerate(processes) if process.poll() not in (None, 0)]
            # NOTE: a rank whose peer died fails in a collective a moment later: the cause is, among the ranks
            # seen ending, one that ended abruptly (a signal, or no error of its own), else one with an error of
            # its own, else one whose collective failed
            rank = min(failed, key=lambda candidate: (_failure_rank(staging, candidate), candidate))
            _end_group(processes)
            raise ModelTraceError(_failure_message(rank, processes[rank].returncode, staging, len(processes)))
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            waiting = [rank for rank, code in enumerate(codes) if code is None]
            _end_group(processes)
            raise ModelTraceError(
                f"the {len(processes)} ranks ran past --timeout {timeout:g} s (rank{'s' if len(waiting) > 1 else ''} "
                f"{', '.join(map(str, waiting))} had not finished: hung, or waiting for a rank that did); every "
                "rank's process was ended and no trace was written"
            )
        time.sleep(0.05)


def _failure_rank(staging: Path, rank: int) -> int:
    """0: the rank ended abruptly (no error file); 1: an error of its own; 2: a collective failing (a peer gone)."""
    error = _rank_error(staging, rank)
    if error is None:
        return 0
    message = error.message
    collective = error.kind.startswith("Dist") or any(
        sign in message for sign in ("Connection closed by peer", "Connection reset by peer", "gloo", "NCCL")
    )
    return 2 if collective else 1


def _rank_error(staging: Path, rank: int) -> WorkerError | None:
    """The error a rank wrote (its `WorkerError` frame), or None when it wrote none (or not one that reads)."""
    try:
        return WorkerError.from_frame(json.loads((staging / f"rank{rank}.error.json").read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, WorkerProtocolError):
        return None


def _failure_message(rank: int, code: int | None, staging: Path, nproc: int) -> str:
    error_file = staging / f"rank{rank}.error.json"
    ended = f"every rank's process of the {nproc} was ended and no trace was written"
    if error_file.is_file():
        error = _rank_error(staging, rank)
        if error is None:
            return f"rank {rank} failed (its error file {error_file} does not read); {ended}"
        where = f" ({error.file}:{error.line})" if error.file and error.line else ""
        kind = "" if error.cause == "input" else f"{error.kind}: "
        return f"rank {rank} failed{where}: {kind}{error.message}; {ended}"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} died ({name}); {ended}"
    tail = _log_tail(staging / f"rank{rank}.log")
    return f"rank {rank} exited with code {code}{f' ({tail})' if tail else ''}; {ended}"


def _log_tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def _end_group(processes: list[subprocess.Popen]) -> None:
    """SIGTERM every rank's process group still running, then SIGKILL what is left after the grace period."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_GRACE
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
    for process in processes:  # NOTE: whatever a rank started and left behind (its own group) goes too
        if process.returncode is not None:
            _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, which: signal.Signals) -> None:
    try:
        os.killpg(process.pid, which)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_partial_trace(out: Path, processes: list[subprocess.Popen]) -> None:
    """The temporary folder rank 0 was writing when it was ended (`write_trace` renames only a complete one)."""
    if not processes:
        return
    import shutil

    for leftover in out.parent.glob(f".{out.name}.tmp-{processes[0].pid}-*"):
        shutil.rmtree(leftover, ignore_errors=True)


# --- rank job (torch) ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """The rank job: `python -m modeltrace.worker.parallel REQUEST.json` with torchrun's environment."""
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1:
        print(
            "usage: python -m modeltrace.worker.parallel REQUEST.json (with RANK, WORLD_SIZE, MASTER_ADDR, "
            "MASTER_PORT set, as torchrun sets them)",
            file=sys.stderr,
        )
        return 2
    rank = int(os.environ.get("RANK", "0"))
    staging = Path(arguments[0]).parent
    request: TraceRequest | None = None
    try:
        request = TraceRequest.from_frame(json.loads(Path(arguments[0]).read_text(encoding="utf-8")))
        result = run_rank(request, rank)
    except BaseException as error:  # noqa: BLE001 - every failure becomes the rank's error file
        from modeltrace.worker.job import describe_failure

        failure = describe_failure(error, request)
        (staging / f"rank{rank}.error.json").write_text(json.dumps(failure.to_frame()), encoding="utf-8")
        if os.environ.get("MODELTRACE_DEBUG"):
            print(failure.traceback or "", file=sys.stderr)
        return 1
    if rank == 0 and result is not None:
        (staging / "result.json").write_text(json.dumps(result.to_frame()), encoding="utf-8")
    return 0


def run_rank(request: TraceRequest, rank: int) -> TraceResult | None:
    """One rank's part of a tensor-parallel trace; rank 0 also merges and writes it (returns the result)."""
    import contextlib
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from modeltrace.worker.building import build_from_request
    from modeltrace.worker.builds import ConstructionRecorder
    from modeltrace.worker.capture import ModuleCapture
    from modeltrace.worker.job import JobFailed, limit_bytes

    started = time.perf_counter()
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = request.device
    on_cuda = device.startswith("cuda")
    if on_cuda:
        torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=request.timeout)
    dist.init_process_group("nccl" if on_cuda else "gloo", rank=rank, world_size=world, timeout=timeout)
    built = None
    try:
        with ConstructionRecorder() as constructions:
            built = build_from_request(dataclasses.replace(request, tp_plan="auto"))
        if on_cuda:
            target = torch.device("cuda", local_rank)
            built.args = tuple(value.to(target) if isinstance(value, torch.Tensor) else value for value in built.args)
            built.kwargs = {
                name: value.to(target) if isinstance(value, torch.Tensor) else value
                for name, value in built.kwargs.items()
            }
        built_at = time.perf_counter()
        max_tensor_bytes = limit_bytes("max-tensor-mb", request.max_tensor_mb)
        max_trace_bytes = limit_bytes("max-trace-mb", request.max_trace_mb)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(built.forward_context())
            capture = stack.enter_context(
                ModuleCapture(
                    built.model,
                    full_tensors=request.full_tensors,
                    max_tensor_bytes=max_tensor_bytes,
                    max_trace_bytes=max_trace_bytes,
                )
            )
            built.model(*built.args, **built.kwargs)
        finished_at = time.perf_counter()
        builds = _record_whole_builds(built.model, constructions, rank, capture if capture.full_tensors else None)
        payload = {"records": capture.records, "tensors": capture.tensors, "skipped": capture.skipped}
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        if rank != 0:
            return None
        return _write_merged(
            request,
            built,
            capture,
            builds,
            gathered,
            world,
            {"build": built_at - started, "forward": finished_at - built_at},
        )
    except Exception as error:
        # NOTE: a failure after the build names the class that ran (`describe_failure`)
        if built is None:
            raise JobFailed(error, "build") from error
        raise JobFailed(error, "forward", built.model_class, built.notes.get("unverified")) from error
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _record_whole_builds(model: Any, constructions: Any, rank: int, capture: Any) -> list:
    """The builds' fingerprints of the whole weights: each DTensor parameter gathered (`full_tensor`, a
    collective every rank joins, in the same order) and put in place of the shard on rank 0 while it records."""
    import torch
    from torch.distributed.tensor import DTensor

    from modeltrace.worker.builds import record_builds

    swapped: list[tuple[Any, str, Any]] = []
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in list(module._parameters.items()):
                if parameter is not None and isinstance(parameter.data, DTensor):
                    whole = parameter.data.full_tensor()
                    if rank == 0:
                        swapped.append((module, name, parameter))
                        module._parameters[name] = torch.nn.Parameter(whole, requires_grad=False)
    try:
        if rank != 0:
            return []
        return record_builds(model, constructions, capture._keep_unless_meta if capture is not None else None)
    finally:
        for module, name, parameter in swapped:
            module._parameters[name] = parameter


def _logical_records(request: TraceRequest) -> list | None:
    """The records of the same class on the same inputs, shape-only on the meta device: the whole tensors' shapes.
    None when that run fails (the merge then reads shards from the ranks' shapes alone)."""
    import contextlib

    import torch

    from modeltrace.worker.building import build_from_file
    from modeltrace.worker.capture import ModuleCapture

    try:
        built = build_from_file(
            Path(request.file),
            request.model,
            Path(str(request.checkpoint)) / "config.json",
            request.seed,
            request.attention,
            shape_only=True,
            dtype=request.dtype,
        )
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(built.forward_context())
            capture = stack.enter_context(ModuleCapture(built.model))
            built.model(*built.args, **built.kwargs)
        return capture.records
    except Exception:  # noqa: BLE001 - a fallback, said in the header
        return None


def _write_merged(
    request: TraceRequest,
    built: Any,
    capture: Any,
    builds: list,
    gathered: list,
    world: int,
    seconds: dict[str, float],
) -> TraceResult:
    from modeltrace.worker.assemble import assemble_trace, write_captured
    from modeltrace.worker.job import _input_summaries, _jsonable_notes, trace_options
    from modeltrace.worker.source_map import real_path

    logical = _logical_records(request)
    merged = merge_ranks(
        [part["records"] for part in gathered],
        logical,
        [part["tensors"] for part in gathered] if capture.full_tensors else None,
        capture.max_tensor_bytes,
        capture.max_trace_bytes,
    )
    capture.records = merged.records
    capture.tensors = {
        **{name: tensor for name, tensor in capture.tensors.items() if name.startswith("parameters/")},
        **merged.tensors,
    }
    capture.skipped = merged.skipped
    plan = (
        getattr(built.model, "_tp_plan", None)
        or getattr(getattr(built.model, "config", None), "base_model_tp_plan", None)
        or {}
    )
    trace = assemble_trace(
        {
            "class": built.model_class,
            "file": real_path(request.file),
            "recipe": None,
            "config": built.config,
            "inputs": [summary.to_json() for summary in _input_summaries(built)],
            "options": trace_options(request, built, nproc=world),
            "parallel": {
                "nproc": world,
                "backend": "nccl" if request.device.startswith("cuda") else "gloo",
                "tp_plan": {str(key): str(value) for key, value in dict(plan).items()},
                "logical_shapes": "meta run" if logical is not None else "from the ranks' shapes",
                "sharded_tensors": merged.sharded,
                "rank_divergences": merged.divergences,
            },
            "build": _jsonable_notes(built.notes),
            "seconds": {**seconds, "builds": 0.0},
        },
        capture,
        None,
        builds,
    )
    destination = write_captured(trace, capture, Path(str(request.out)))
    # NOTE: its `seconds` are the whole group's, set by the launcher; the rank divergences are in the header
    return TraceResult(trace=str(destination), model_class=built.model_class, modules=len(trace.modules), seconds=0.0)


# --- merge (summaries: no torch unless full tensors are concatenated) --------------------------------------------


class MergedRanks:
    """What `merge_ranks` makes: one record list describing whole tensors, the concatenated full tensors, and the
    replicated tensors that differ between ranks."""

    def __init__(self) -> None:
        self.records: list = []
        self.tensors: dict[str, Any] = {}
        self.divergences: list[dict[str, Any]] = []
        self.sharded = 0
        self.skipped = 0
        self.stored_bytes = 0


def merge_ranks(
    per_rank: list[list],
    logical: list | None,
    per_rank_tensors: list[dict[str, Any]] | None = None,
    max_tensor_bytes: int | None = None,
    max_trace_bytes: int | None = None,
) -> MergedRanks:
    """One record list from the ranks' (see the module docstring). The ranks ran the same module calls; a rank
    that did not is refused, naming the first call where it went another way."""
    from modeltrace.trace.records import ModuleCall

    merged = MergedRanks()
    base = per_rank[0]
    for rank, records in enumerate(per_rank[1:], start=1):
        for index in range(max(len(base), len(records))):
            ours = base[index].path if index < len(base) else "(nothing)"
            theirs = records[index].path if index < len(records) else "(nothing)"
            if ours != theirs:
                raise ModelTraceError(
                    f"rank {rank} ran another sequence of module calls than rank 0: call #{index} is {theirs!r} on "
                    f"rank {rank}, {ours!r} on rank 0"
                )
    if logical is not None and [record.path for record in logical] != [record.path for record in base]:
        logical = None  # NOTE: the meta run went another way (value-dependent control flow): shapes from ranks
    cache: dict[tuple[int, ...], Any] = {}
    for index, record in enumerate(base):
        sides = {}
        for side in ("inputs", "outputs"):
            summaries = []
            for position, summary in enumerate(getattr(record, side)):
                parts = [getattr(records[index], side)[position] for records in per_rank]
                whole = _logical_summary(logical, index, side, position, summary.key)
                key = tuple(id(part) for part in parts)
                combined = cache.get(key)
                if combined is None:
                    combined = cache[key] = _merge_summary(
                        parts, whole, merged, record, side, per_rank_tensors, max_tensor_bytes, max_trace_bytes
                    )
                summaries.append(combined)
            sides[side] = summaries
        merged.records.append(
            ModuleCall(
                record.index,
                record.path,
                record.class_name,
                record.defined_at,
                record.called_at,
                record.call_index,
                record.parent,
                record.finish_order,
                record.call_site,
                sides["inputs"],
                sides["outputs"],
                record.device,
            )
        )
    return merged


def _logical_summary(logical: list | None, index: int, side: str, position: int, key: str) -> Any:
    if logical is None:
        return None
    summaries = getattr(logical[index], side)
    if position < len(summaries) and summaries[position].key == key:
        return summaries[position]
    return None


def _merge_summary(
    parts: list,
    whole: Any,
    merged: MergedRanks,
    record: Any,
    side: str,
    per_rank_tensors: list[dict[str, Any]] | None,
    max_tensor_bytes: int | None,
    max_trace_bytes: int | None,
) -> Any:
    from modeltrace.trace.records import TensorSummary

    shapes = [list(part.shape) for part in parts]
    dim = _shard_dim(shapes, list(whole.shape) if whole is not None else None)
    first = parts[0]
    if dim is None:
        reference_rank, differing = _replica_groups(parts)
        for rank in differing:
            merged.divergences.append(_rank_divergence(record, side, parts, rank, reference_rank))
        chosen = parts[reference_rank]
        summary = TensorSummary(
            chosen.key,
            list(chosen.shape),
            chosen.dtype,
            chosen.device,
            chosen.mean,
            chosen.std,
            chosen.min,
            chosen.max,
            chosen.abs_max,
            chosen.nan_count,
            chosen.inf_count,
            chosen.positive_fraction,
            None,
            chosen.not_stored,
            {"kind": "replicate", "ranks": len(parts)},
        )
        if per_rank_tensors is not None and chosen.tensor is not None:
            _store(
                summary,
                chosen.tensor,
                [per_rank_tensors[reference_rank].get(chosen.tensor)],
                None,
                merged,
                max_tensor_bytes,
                max_trace_bytes,
            )
        return summary
    merged.sharded += 1
    full_shape = list(shapes[0])
    full_shape[dim] = sum(shape[dim] for shape in shapes)
    summary = TensorSummary(first.key, full_shape, first.dtype, first.device)
    _pool_statistics(summary, parts)
    summary.placement = {
        "kind": "shard",
        "dim": dim,
        "local_shapes": shapes,
        "ranks": [{name: getattr(part, name) for name in _STATISTICS} for part in parts],
    }
    if per_rank_tensors is not None and all(part.tensor is not None for part in parts):
        _store(
            summary,
            first.tensor,
            [tensors.get(part.tensor) for tensors, part in zip(per_rank_tensors, parts)],
            dim,
            merged,
            max_tensor_bytes,
            max_trace_bytes,
        )
    elif any(part.not_stored for part in parts):
        summary.not_stored = next(part.not_stored for part in parts if part.not_stored)
    return summary


def _shard_dim(shapes: list[list[int]], whole: list[int] | None) -> int | None:
    """The dimension the ranks' local shapes split, or None for a tensor every rank holds whole."""
    if whole is not None and len(whole) == len(shapes[0]) and all(len(shape) == len(whole) for shape in shapes):
        differing = [dim for dim in range(len(whole)) if any(shape[dim] != whole[dim] for shape in shapes)]
        if len(differing) == 1 and sum(shape[differing[0]] for shape in shapes) == whole[differing[0]]:
            return differing[0]
        if not differing:
            return None
    # NOTE: without the meta run's shape: shards of unequal width show themselves; equal ones look replicated
    # (and, holding different values, are then reported as rank divergences)
    if any(len(shape) != len(shapes[0]) for shape in shapes):
        return None
    differing = [dim for dim in range(len(shapes[0])) if len({shape[dim] for shape in shapes}) > 1]
    return differing[0] if len(differing) == 1 else None


def _same_values(left: Any, right: Any) -> bool:
    if left.shape != right.shape or left.nan_count != right.nan_count or left.inf_count != right.inf_count:
        return False
    for name in _STATISTICS:
        a, b = getattr(left, name), getattr(right, name)
        if a is None or b is None:
            if a is not b:
                return False
            continue
        if math.isnan(a) or math.isnan(b):
            if not (math.isnan(a) and math.isnan(b)):
                return False
            continue
        if abs(a - b) > _REPLICA_RTOL * max(abs(a), abs(b), abs(left.std or 0.0), 1e-30):
            return False
    return True


def _replica_groups(parts: list) -> tuple[int, list[int]]:
    """The rank holding the value most ranks hold (rank 0's, on a tie) and the ranks that hold another."""
    groups: list[list[int]] = []
    for rank, part in enumerate(parts):
        for group in groups:
            if _same_values(parts[group[0]], part):
                group.append(rank)
                break
        else:
            groups.append([rank])
    largest = max(groups, key=lambda group: (len(group), -group[0]))
    return largest[0], [rank for rank in range(len(parts)) if rank not in largest]


def _rank_divergence(record: Any, side: str, parts: list, rank: int, reference_rank: int) -> dict[str, Any]:
    key = parts[rank].key
    where = f"{record.path or '(model)'} {side[:-1]}{f' {key}' if key else ''}"
    ours, theirs = parts[rank], parts[reference_rank]
    return {
        "index": record.index,
        "path": record.path,
        "side": side,
        "key": key,
        "rank": rank,
        "reference_rank": reference_rank,
        "message": (
            f"{where}: rank {rank} holds other values than rank {reference_rank} (mean {_number(ours.mean)} "
            f"vs {_number(theirs.mean)}, std {_number(ours.std)} vs {_number(theirs.std)}), though every "
            "rank should hold the same tensor"
        ),
    }


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.6g}"


def _pool_statistics(summary: Any, parts: list) -> None:
    """The statistics of the concatenation, exactly from the parts' (counts, means, stds, extrema, counts)."""
    from modeltrace.diff.auto_align import pooled_moments

    counts = [math.prod(part.shape) for part in parts]
    total = sum(counts)
    summary.nan_count = sum(part.nan_count for part in parts)
    summary.inf_count = sum(part.inf_count for part in parts)
    if total == 0 or any(part.mean is None for part in parts if math.prod(part.shape)):
        return
    present = [(count, part) for count, part in zip(counts, parts) if count]
    finite = [count - part.nan_count - part.inf_count for count, part in present]
    moments = [
        (max(count, 1), part.mean, 0.0 if part.std is None or math.isnan(part.std) else part.std)
        for count, (_, part) in zip(finite, present)
    ]
    summary.mean, summary.std = pooled_moments(moments)
    summary.min = min(part.min for _, part in present)
    summary.max = max(part.max for _, part in present)
    summary.abs_max = max(part.abs_max for _, part in present)
    if all(part.positive_fraction is not None for _, part in present):
        summary.positive_fraction = sum(count * part.positive_fraction for count, part in present) / total


def _store(
    summary: Any,
    name: str,
    pieces: list[Any],
    dim: int | None,
    merged: MergedRanks,
    max_tensor_bytes: int | None,
    max_trace_bytes: int | None,
) -> None:
    """The whole tensor (the shards concatenated along `dim`, or the one replica), within the size limits."""
    if any(piece is None for piece in pieces):
        return
    size = sum(piece.numel() * piece.element_size() for piece in pieces)
    if max_tensor_bytes is not None and size > max_tensor_bytes:
        summary.not_stored = f"{size:,} bytes is over the {max_tensor_bytes:,}-byte limit per tensor"
    elif max_trace_bytes is not None and merged.stored_bytes + size > max_trace_bytes:
        summary.not_stored = f"the trace's tensors reached the {max_trace_bytes:,}-byte limit per trace"
    else:
        import torch

        merged.tensors[name] = pieces[0] if dim is None else torch.cat(pieces, dim=dim).contiguous()
        merged.stored_bytes += size
        summary.tensor = name
        return
    merged.skipped += 1


if __name__ == "__main__":
    sys.exit(main())
