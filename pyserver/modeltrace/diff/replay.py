"""Replay on the reference's inputs: judge each suspect candidate module on its own, not on accumulated error.

After the plain comparison, the first `limit` candidate module calls (in the order calls finished) whose
outputs differ are the suspects. With full tensors in the reference, each suspect's paired input tensors (the
tensor-level pairing of `pairing`) are taken from the reference, written to a safetensors file, and the worker
(`worker/replay.py`, in the candidate's environment) rebuilds the candidate from its trace header, runs its
forward, and at each suspect's call runs the module once more on those inputs with its own other arguments.
Where the worker still holds the candidate from its trace (the editor's case: the diff follows the trace), it
calls the suspects again directly on their kept arguments instead.
The replay does not wait for the whole comparison: `diff_traces(watch=...)` names the suspects as soon as the
calls finishing before them are compared (`compare.SuspectWatch`, full tensors on both sides), and `ReplayRun`
sends them to the worker in a thread while the rest is compared (the kept model's direct calls then use every
core but the diff's). Its answer is used only if the finished diff names the same suspects; otherwise those
are replayed after it, so the start changes the time, never the verdict.
Each replayed output is compared with the reference's output for that call by the same rule as the diff
(`verdict.compare_pair_arrays`): a match clears the module (its outputs differ only through its inputs), a
difference makes it a divergence on its own (`compare.decide`).

Nothing here changes a trace (the files live in a temporary folder) and nothing raises: a reference without
full tensors, a candidate trace that cannot be rebuilt (shape-only, no file, a source changed since it was
traced), tensors that do not fit, a module that raises, a rebuilt candidate whose live outputs are not those of
its trace: the module (or the whole replay) falls back to the plain comparison and the report says why.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modeltrace.diff.compare import decide
from modeltrace.diff.pairing import OVERLAP, LeafPair, _padded, pair_leaves
from modeltrace.diff.result import MATCH, MISMATCH, NOT_COMPARED, DiffResult, ModuleResult, ReplayResult
from modeltrace.diff.verdict import compare_pair_arrays
from modeltrace.errors import ModelTraceError, TraceFailed
from modeltrace.trace.tensors import DTYPE_CODES, LoadedTrace, SafetensorsFile, write_safetensors
from modeltrace.worker.messages import (
    DEFAULT_ATTENTION,
    DEFAULT_DTYPE,
    ReplayAnswer,
    ReplayedModule,
    ReplaySpec,
    ReplayTarget,
    TraceRequest,
)


DEFAULT_REPLAY_LIMIT = 8
# `diff_paths(replay=WHEN_POSSIBLE)`: replay where the reference holds full tensors, and say nothing otherwise
# (the editor's default: most references are traced with statistics only)
WHEN_POSSIBLE = "when-possible"
REPLAY_TIMEOUT_SECONDS = 300.0
# NOTE: the rebuilt candidate must be the traced one: its live outputs' mean and std may differ from the trace's
# by thread-scheduling rounding only.
_LIVE_TOLERANCE = 1e-3

_NUMPY_CODES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


def replay_unavailable(result: DiffResult) -> str | None:
    """Why the diff's candidate cannot be replayed on its reference's inputs, or None."""
    return _unavailable(result.reference, result.candidate)


def _unavailable(reference: LoadedTrace, candidate: LoadedTrace) -> str | None:
    if reference.tensors is None:
        return "the reference has no full tensors (trace it with --full-tensors)"
    header = candidate.trace.model
    if candidate.kind != "modeltrace":
        return "the candidate is a transformers debugger output, not a ModelTrace trace that can be rebuilt"
    options = header.get("options") or {}
    if options.get("shape_only"):
        return "the candidate is a shape-only trace"
    source = header.get("recipe") or header.get("file")
    if not source or not Path(source).is_file():
        return f"the candidate's source {source or '(none recorded)'} is not there to rebuild it from"
    hashes = header.get("source_hashes") or {}
    for file in {header.get("file"), header.get("recipe")} - {None}:
        recorded = hashes.get(file)
        if recorded and _sha256(file) != recorded:
            return f"{file} changed since the candidate was traced: trace it again"
    return None


def _sha256(file: str) -> str | None:
    from modeltrace.trace.source_files import source_sha256

    return source_sha256(file)


def _pairs(pairing_for: Any, refs: list, cands: list) -> list[LeafPair]:
    return (pairing_for or pair_leaves(refs, cands)).pairs


def suspects(result: DiffResult, limit: int) -> list[ModuleResult]:
    """The first `limit` aligned module calls, in the order they finished, whose outputs differ."""
    found = []
    for module in result.finish_ordered():
        if module.reference is not None and module.outputs == MISMATCH and module.candidate.outputs:
            found.append(module)
            if len(found) >= limit:
                break
    return found


def _input_tensors(
    store: Any, module: ModuleResult
) -> tuple[dict[str, tuple[str, list[int], bytes]], list[str], str | None]:
    """({candidate input key: (dtype code, shape, bytes)} of the reference's paired inputs (from `store`, its
    tensors), keys replaced, why the module cannot be replayed or None)."""
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    replaced = []
    pairs = _pairs(module.input_pairing, module.reference.inputs, module.candidate.inputs)
    if module.candidate.inputs and not pairs:
        return {}, [], "none of its inputs pairs with a reference input"
    for pair in pairs:
        ref, cand = pair.reference, pair.candidate
        if pair.relation == "different":
            return (
                {},
                [],
                f"the reference's input {ref.key!r} {ref.shape} does not fit its input {cand.key!r} {cand.shape}",
            )
        if ref.tensor is None or ref.tensor not in store:
            return (
                {},
                [],
                f"the reference's input {ref.key!r} was not stored in full ({ref.not_stored or 'statistics only'})",
            )
        if pair.relation == OVERLAP:
            array = store.get(ref.tensor)
            rank = max(len(ref.shape), len(cand.shape))
            padded_ref, padded_cand = _padded(ref.shape, rank), _padded(cand.shape, rank)
            dimension = pair.dimension or 0
            if padded_cand[dimension] > padded_ref[dimension]:
                continue  # the candidate computes more positions: it keeps its own input here
            index = tuple(
                slice(-padded_cand[dimension], None) if axis == dimension else slice(None) for axis in range(rank)
            )
            array = np.ascontiguousarray(array.reshape(padded_ref)[index])
            tensors[cand.key] = (_NUMPY_CODES[str(array.dtype)], list(cand.shape), array.tobytes())
        else:
            raw = store.raw(ref.tensor)
            if raw is None:
                array = np.ascontiguousarray(store.get(ref.tensor))
                raw = (
                    _NUMPY_CODES.get(str(array.dtype)) or DTYPE_CODES[str(array.dtype)],
                    array.shape,
                    array.tobytes(),
                )
            code, _, data = raw
            tensors[cand.key] = (code, list(cand.shape), bytes(data))
        replaced.append(cand.key if cand.key == ref.key else f"{cand.key} (from {ref.key or 'output'})")
    if module.candidate.inputs and not tensors:
        return {}, [], "none of its inputs could be taken from the reference"
    return tensors, replaced, None


def build_request(candidate: LoadedTrace, timeout: float, replay: ReplaySpec) -> TraceRequest:
    """The worker request that rebuilds the candidate as its trace header says it was built, to replay `replay`."""
    header = candidate.trace.model
    options = header.get("options") or {}
    return TraceRequest(
        file=str(header.get("file")),
        model=header.get("class"),
        recipe=header.get("recipe"),
        checkpoint=options.get("checkpoint"),
        seed=int(options.get("seed", 0) or 0),
        dtype=options.get("dtype") or DEFAULT_DTYPE,
        device=options.get("device") or "cpu",
        attention=options.get("attention") or DEFAULT_ATTENTION,
        timeout=timeout,
        replay=replay,
    )


def run_replay(
    result: DiffResult, client: Any = None, limit: int = DEFAULT_REPLAY_LIMIT, timeout: float = REPLAY_TIMEOUT_SECONDS
) -> None:
    """Replay the suspects of `result` (see the module docstring) and decide again; never raises for bad
    input, says why in `result.notes` and in each module's `replay` instead. `client`: a `WorkerClient` to use
    (the language server's); None starts one for this replay. (`ReplayRun` starts it during the diff.)"""
    ReplayRun(result.reference, result.candidate, client, limit, timeout).finish(result)


class ReplayRun:
    """One replay of a diff's suspects, started as soon as the comparison has named them.

    `diff_traces(..., watch=run.watch)` calls `start` from inside the comparison with the first `limit` calls (in
    finishing order) whose outputs differ; their inputs are taken from the reference and the worker is asked in
    a thread, while the rest of the two traces is compared. `finish(result)` then waits for the answer, judges it
    and decides again. Where the comparison could not name them early (statistics only), or named others than
    the finished diff (`suspects`), `finish` replays the diff's own suspects as before: the verdict never
    depends on the early start, only its time does. Always call `finish` (or `abandon` when the diff raised)."""

    def __init__(
        self,
        reference: LoadedTrace,
        candidate: LoadedTrace,
        client: Any = None,
        limit: int = DEFAULT_REPLAY_LIMIT,
        timeout: float = REPLAY_TIMEOUT_SECONDS,
    ) -> None:
        self.reference, self.candidate = reference, candidate
        self.client, self.limit, self.timeout = client, limit, timeout
        self.unavailable = _unavailable(reference, candidate)
        self._early: _Prepared | None = None
        self._pending: concurrent.futures.Future | None = None

    @property
    def watch(self) -> tuple[int, Any] | None:
        """`diff_traces`'s `watch` argument: None when the replay cannot run (the diff runs as it would)."""
        return None if self.unavailable is not None else (self.limit, self.start)

    def start(self, chosen: list[ModuleResult]) -> None:
        """Take the reference's inputs of `chosen` and ask the worker, in a thread; returns at once."""
        if self._early is not None:
            return
        try:
            prepared = _prepare(self.reference, self.candidate, chosen, self.timeout, early=True)
        except Exception:  # noqa: BLE001 - `finish` replays the usual way and reports what goes wrong there
            return
        self._early = prepared
        if prepared.request is None:
            return
        try:
            executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="modeltrace-replay")
            self._pending = executor.submit(_ask_worker, prepared.request, self.client)
            executor.shutdown(wait=False)
        except Exception:  # noqa: BLE001 - no thread to start: `finish` replays the usual way
            self.abandon()

    def finish(self, result: DiffResult) -> None:
        """Judge the suspects on their replay and decide again (see `run_replay`)."""
        if self.unavailable is not None:
            self.abandon()
            result.notes.append(f"replay not used: {self.unavailable}")
            return
        chosen = suspects(result, self.limit)
        early = self._early
        if early is not None and [id(module) for module in early.chosen] != [id(module) for module in chosen]:
            self.abandon()  # named early, but not the finished diff's suspects: replay those instead
            early = None
        if not chosen:
            self.abandon()
            return
        prepared = early
        try:
            if early is not None:
                answer = self._pending.result() if self._pending is not None else None
            else:
                prepared = _prepare(self.reference, self.candidate, chosen, self.timeout)
                answer = _ask_worker(prepared.request, self.client) if prepared.request is not None else None
            if answer is not None:
                _collect(result, prepared, answer)
                result.replay_timing["started_during_diff"] = early is not None
        except Exception as error:  # noqa: BLE001 - whatever goes wrong, the plain verdict stands, with the reason
            result.notes.append(f"replay not used: {error}")
            for module in chosen:
                module.replay = ReplayResult(NOT_COMPARED, f"the replay failed: {error}")
        finally:
            if prepared is not None and prepared is not early:
                prepared.folder.cleanup()
            self._close()
        result.replayed = any(module.replay is not None and module.replay.status != NOT_COMPARED for module in chosen)
        decide(result)

    def abandon(self) -> None:
        """Forget an early start: wait for the worker's answer (the worker is not left mid-request), drop it."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending])
        if self._early is not None:
            for module in self._early.chosen:
                module.replay = None
        self._close()

    def _close(self) -> None:
        early, self._early, self._pending = self._early, None, None
        if early is not None:
            early.folder.cleanup()


@dataclass
class _Prepared:
    """A replay request ready for the worker: the suspects, their names in it, the folder of its files."""

    chosen: list[ModuleResult]
    names: dict[str, ModuleResult]
    folder: tempfile.TemporaryDirectory
    request: TraceRequest | None


def _prepare(
    reference: LoadedTrace, candidate: LoadedTrace, chosen: list[ModuleResult], timeout: float, early: bool = False
) -> _Prepared:
    """The reference's inputs of each suspect, written for the worker, and the request (None: none can run;
    each module's `replay` says why)."""
    folder = tempfile.TemporaryDirectory(prefix="modeltrace-replay-")
    inputs: dict[str, tuple[str, list[int], bytes]] = {}
    targets = []
    names: dict[str, ModuleResult] = {}
    for number, module in enumerate(chosen):
        tensors, replaced, why = _input_tensors(reference.tensors, module)
        if why is not None:
            module.replay = ReplayResult(NOT_COMPARED, why)
            continue
        name = f"m{number}"
        names[name] = module
        module.replay = ReplayResult(NOT_COMPARED, "not replayed", replaced=replaced)
        targets.append(
            ReplayTarget(
                name=name,
                path=module.candidate.path,
                call_index=module.candidate.call_index,
                inputs={key: f"{name}/{key}" for key in tensors},
                expect=_kept_input_statistics(module, set(tensors)),
            )
        )
        inputs.update({f"{name}/{key}": value for key, value in tensors.items()})
    if not targets:
        return _Prepared(chosen, names, folder, None)
    inputs_file = Path(folder.name) / "replay_inputs.safetensors"
    write_safetensors(inputs_file, inputs)
    replay = ReplaySpec(
        inputs_file=str(inputs_file),
        targets=tuple(targets),
        out=str(Path(folder.name) / "out"),
        candidate_trace=str(candidate.path),
        threads=_threads_beside_the_diff() if early else None,
    )
    return _Prepared(chosen, names, folder, build_request(candidate, timeout, replay))


def _threads_beside_the_diff() -> int:
    """torch's threads for calls replayed while the diff still runs: every core but the diff's."""
    return max(1, (os.cpu_count() or 1) - 1)


def _collect(result: DiffResult, prepared: _Prepared, answer: ReplayAnswer) -> None:
    """Judge each replayed module's outputs against the reference's."""
    names = prepared.names
    result.replay_timing = {"seconds": answer.seconds, "build_seconds": answer.build_seconds, "kept": answer.kept}
    result.replay_timing["modules"] = {
        names[name].candidate.path: (reply.replay_seconds, reply.live_seconds)
        for name, reply in answer.replay.items()
        if name in names
    }
    result.replay_timing["direct"] = [
        names[name].candidate.path for name, reply in answer.replay.items() if name in names and reply.direct
    ]
    with SafetensorsFile(answer.outputs) as outputs:
        problem = _rebuilt_differs(answer.replay, names)
        for name, module in names.items():
            reply = answer.replay.get(name) or ReplayedModule()
            if problem is not None:
                module.replay = ReplayResult(NOT_COMPARED, problem, replaced=module.replay.replaced)
            elif reply.error or not reply.ran:
                module.replay = ReplayResult(
                    NOT_COMPARED,
                    f"the module could not be replayed: {reply.error or 'not run'}",
                    replaced=module.replay.replaced,
                )
            else:
                module.replay = _judge(result, module, name, outputs, module.replay.replaced)
    if problem is not None:
        result.notes.append(f"replay not used: {problem}")


def _kept_input_statistics(module: ModuleResult, replaced: set[str]) -> dict[str, tuple[float, ...]]:
    """{input key: [mean, std]} of the candidate's own floating inputs that the replay keeps: a worker that
    still holds the call's arguments checks them against these before calling the module on them again."""
    return {
        summary.key: (summary.mean, summary.std)
        for summary in module.candidate.inputs
        if summary.key not in replaced
        and summary.mean is not None
        and summary.std is not None
        and "float" in summary.dtype
        and math.isfinite(summary.mean)
        and math.isfinite(summary.std)
    }


def _ask_worker(request: TraceRequest, client: Any) -> ReplayAnswer:
    from modeltrace.worker.client import WorkerClient

    own = client is None
    worker = WorkerClient() if own else client
    try:
        return worker.replay(request)
    except TraceFailed as error:
        raise ModelTraceError(f"the candidate could not be rebuilt and run for the replay: {error}") from None
    finally:
        if own:
            worker.close()


def _rebuilt_differs(replies: dict[str, ReplayedModule], names: dict[str, ModuleResult]) -> str | None:
    """Why the rebuilt candidate is not the traced one (its live outputs differ from the trace's), or None."""
    for name, module in names.items():
        live = replies[name].live if name in replies else {}
        for summary in module.candidate.outputs:
            values = live.get(summary.key)
            if values is None or summary.mean is None or summary.std is None:
                continue
            mean, std = values
            scale = math.sqrt(summary.mean**2 + summary.std**2) + 1e-6
            if abs(mean - summary.mean) > _LIVE_TOLERANCE * scale or abs(std - summary.std) > _LIVE_TOLERANCE * scale:
                return (
                    f"the rebuilt candidate does not reproduce its trace ({module.candidate.path or '(root)'} "
                    f"output {summary.key or '(tensor)'}: mean {mean:.6g} vs {summary.mean:.6g} in the trace): "
                    "the replay needs the same build, seed and inputs"
                )
    return None


def _judge(
    result: DiffResult, module: ModuleResult, name: str, outputs: SafetensorsFile, replaced: list[str]
) -> ReplayResult:
    """The replayed outputs of one module against the reference's outputs of that call."""
    store = result.reference.tensors
    pairs = _pairs(module.output_pairing, module.reference.outputs, module.candidate.outputs)
    leaves = []
    for pair in pairs:
        stored = f"{name}/{pair.candidate.key}"
        if pair.relation == "different" or pair.reference.tensor is None or stored not in outputs:
            continue
        a = store.get(pair.reference.tensor)
        b = outputs.array(stored)
        if a is None or b is None:
            continue
        leaves.append(compare_pair_arrays(a, b, pair, result.options, {}, store.precision(pair.reference.tensor)))
    if not leaves:
        return ReplayResult(NOT_COMPARED, "no replayed output pairs with a stored reference output", replaced=replaced)
    bad = [leaf for leaf in leaves if leaf.status == MISMATCH]
    worst = max(leaves, key=lambda leaf: leaf.rel_err if leaf.rel_err is not None else -1.0)
    return ReplayResult(
        MISMATCH if bad else MATCH,
        (bad[0].reason if bad else None),
        max(leaf.max_abs_diff or 0.0 for leaf in leaves),
        worst.rel_err,
        min((leaf.cosine for leaf in leaves if leaf.cosine is not None), default=None),
        replaced,
    )
