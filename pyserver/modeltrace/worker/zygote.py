"""The worker process: imports torch and transformers once, then forks one child per trace.

Importing torch + transformers costs seconds; forking a process that already has them costs milliseconds,
and each child starts with none of the user's modules imported, so every trace sees the files as they are
on disk now. The child runs the trace and streams frames back through a pipe; this process relays them,
enforces the timeout, kills the child on `cancel`, and turns a child that died without answering (segfault,
`os._exit`, the OOM killer) into a structured error. NOTE: nothing here may run a torch operation before
forking: an initialised OpenMP thread pool does not survive `fork`.

One child may outlive its answer: a trace asked to `keep_for_replay` stays alive holding its model, and a
replay of that trace (the diff that follows it in the editor) is handed to it instead of a fresh child. Any
other request, `shutdown`, or its own idle time (`KEEP_FOR_REPLAY_SECONDS`) ends it.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modeltrace.worker.messages import (
    ANSWER_TYPES,
    REQUESTS,
    Cancel,
    Ping,
    Pong,
    Progress,
    Ready,
    Shutdown,
    Started,
    TraceRequest,
    TraceResult,
    WorkerError,
    WorkerProtocolError,
    decode_frame,
)
from modeltrace.worker.protocol import KEEP_FOR_REPLAY_SECONDS, ProtocolError, read_frame, write_frame


# NOTE: at most this many source files of a trace are read ahead for the next one (`Zygote._warm`), each at most
# this large (a file of generated code is left to the child that needs it: the zygote answers nothing meanwhile)
WARM_FILES = 64
WARM_MAX_BYTES = 1 << 20

# What nearly every transformers modeling file imports: loaded once here instead of in every child.
PRELOADED_MODULES = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "transformers.modeling_outputs",
    "transformers.processing_utils",
    "transformers.utils.output_capturing",
    "safetensors.torch",
    "modeltrace.worker.job",
)


def _preload() -> None:
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    from modeltrace.worker.build_identity import note_loaded_code
    from modeltrace.worker.tensor_stream import in_place_plan

    # NOTE: torch's in-place functions and their wrappers, listed once here, not in every child (~7 ms)
    in_place_plan()

    # NOTE: the children run this code as it is now, whatever its files hold when they build
    note_loaded_code()


def _remove_abandoned(request: TraceRequest, child: int) -> None:
    """Delete the temporary trace folder a killed child left (its full tensors were streaming into it), once the
    child has exited (waited for without reaping it: `_run` reaps it)."""
    if not request.out:
        return
    try:
        os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass
    from modeltrace.trace.storage import remove_abandoned

    remove_abandoned(request.out, child)


def _death_message(status: int) -> WorkerError:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        if number == signal.SIGSEGV:
            message = "the model code crashed the worker process (segmentation fault)"
        elif number == signal.SIGKILL:
            message = (
                "the worker process was killed (SIGKILL: out of memory, or killed from outside); for a large "
                "model pass --shape-only, --config with a smaller config.json, or --recipe"
            )
        else:
            message = f"the worker process died from signal {name}"
        return WorkerError(kind="WorkerCrashed", cause="crash", message=message, signal=name)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return WorkerError(
        kind="WorkerExited",
        cause="exit",
        message=f"the model code ended the worker process with exit code {code} (os._exit or sys.exit) "
        "before the trace finished",
        exit_code=code,
    )


@dataclass
class _KeptChild:
    """A trace child left alive after answering (`keep_for_replay`), for replays of the trace it wrote."""

    pid: int
    replies: int  # read end of the child's frames
    requests: int  # write end of the pipe the child reads its replay requests from
    trace: str  # the trace folder it wrote, resolved


class Zygote:
    def __init__(self, frames_in: int, frames_out: int) -> None:
        self.frames_in = frames_in
        self.frames_out = frames_out
        self.kept: _KeptChild | None = None

    def serve(self) -> None:
        write_frame(self.frames_out, Ready(pid=os.getpid()).to_frame())
        try:
            while True:
                frame = read_frame(self.frames_in)
                if frame is None:
                    return
                try:
                    message = decode_frame(frame, REQUESTS)
                except WorkerProtocolError as error:
                    # NOTE: answered, not fatal: a client of another version learns what this worker expects
                    self._send_error(WorkerError(kind="WorkerProtocolError", cause="protocol", message=str(error)))
                    continue
                if isinstance(message, Shutdown):
                    return
                if isinstance(message, TraceRequest):
                    if self._kept_serves(message):
                        client_alive = self._run_on_kept(message)
                    else:
                        # NOTE: any other request ends the kept child: a new trace must see the files as they are
                        self._drop_kept()
                        client_alive = self._run(message)
                    if not client_alive:
                        return
                elif isinstance(message, Ping):
                    write_frame(self.frames_out, Pong().to_frame())
        finally:
            self._drop_kept()

    def _run(self, request: TraceRequest) -> bool:
        """Run one trace in a child; False when the client went away (time to exit)."""
        keep = request.keep_for_replay
        read_end, write_end = os.pipe()
        requests_read, requests_write = os.pipe() if keep else (-1, -1)
        child = os.fork()
        if child == 0:
            os.close(read_end)
            if keep:
                os.close(requests_write)
            self._child(request, write_end, requests_read if keep else None)
        os.close(write_end)
        if keep:
            os.close(requests_read)
        write_frame(self.frames_out, Started(pid=child).to_frame())
        timeout = request.timeout
        outcome, final, client_alive = self._relay(
            child, read_end, timeout, on_kill=lambda: _remove_abandoned(request, child)
        )
        if final is not None and final.get("type") == TraceResult.TYPE:
            self._warm(final.get("source_files") or ())
        if keep and final is not None and final.get("type") == TraceResult.TYPE and final.get("kept_for_replay"):
            self.kept = _KeptChild(child, read_end, requests_write, os.path.realpath(str(final["trace"])))
            return client_alive
        if keep:
            os.close(requests_write)
        try:
            if outcome == "answered":
                self._wait_for_exit(child, read_end)
        finally:
            os.close(read_end)
            _, status = os.waitpid(child, 0)
        if outcome == "died":
            _remove_abandoned(request, child)
            if client_alive:
                self._send_error(_death_message(status))
        return client_alive

    def _warm(self, files: Any) -> None:
        """Work out ahead, in this process, what the next trace of the same model would work out from its source
        files, so that every child forked from now on inherits it: each file's parse (where its classes and
        `__init__`s are: `source_map.index_file`) and its hash (`assemble.source_hash`). A forked child starts
        with neither: a tiny Llama's trace spent ~35 ms there on a 3 ms forward. Both are checked against the
        file when a child uses them (linecache's size and time; the hash's), so a file edited since is read again
        there. Never runs a torch operation; stops when the next request arrives (it waits for nothing here)."""
        from modeltrace.worker.assemble import source_hash
        from modeltrace.worker.source_map import forget_files_except, index_file

        files = (
            [file for file in files if isinstance(file, str)][:WARM_FILES] if isinstance(files, (list, tuple)) else []
        )
        forget_files_except(set(files))
        for file in files:
            if select.select([self.frames_in], [], [], 0)[0]:
                return
            try:
                if os.path.getsize(file) > WARM_MAX_BYTES:
                    continue
            except OSError:
                continue
            index_file(file)
            source_hash(file)

    def _relay(
        self, child: int, read_end: int, timeout: float, on_kill: Callable[[], None] | None = None
    ) -> tuple[str, dict[str, Any] | None, bool]:
        """Relay a child's frames to the client until it answers (`result` or `error`), while serving `cancel`
        and `shutdown` and enforcing `timeout`. Returns the outcome (`answered`, `killed`: stopped here, the
        client told why; `died`: the pipe closed without an answer), the answer, and whether the client is
        still there. `on_kill` runs once a child stopped here has exited, before the client is told (a trace's
        temporary folder is removed there)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill(child)
                if on_kill is not None:
                    on_kill()
                self._send_error(
                    WorkerError(
                        kind="TimeoutError",
                        cause="timeout",
                        message=(
                            f"the trace ran past its {timeout:g} s timeout and was stopped; raise --timeout "
                            "(modelTrace.timeout), or pass --config with a smaller config.json or --recipe"
                        ),
                    )
                )
                return "killed", None, True
            readable, _, _ = select.select([read_end, self.frames_in], [], [], remaining)
            if self.frames_in in readable:
                message = read_frame(self.frames_in)
                if message is None or message["type"] in (Cancel.TYPE, Shutdown.TYPE):
                    self._kill(child)
                    if on_kill is not None:
                        on_kill()
                    if message is None or message["type"] == Shutdown.TYPE:
                        return "killed", None, False
                    self._send_error(
                        WorkerError(kind="Cancelled", cause="cancelled", message="the trace was cancelled")
                    )
                    return "killed", None, True
            if read_end in readable:
                try:
                    frame = read_frame(read_end)
                except ProtocolError as error:
                    frame = WorkerError(
                        kind="WorkerCrashed",
                        cause="crash",
                        message=f"the worker process broke off its reply ({error})",
                    ).to_frame()
                if frame is None:
                    return "died", None, True
                write_frame(self.frames_out, frame)
                if frame["type"] in ANSWER_TYPES:
                    # NOTE: stop reading the client here: its next request may arrive before the
                    # child has exited, and must wait for `serve` rather than be taken for this run.
                    return "answered", frame, True

    def _kept_serves(self, request: TraceRequest) -> bool:
        """Whether `request` is a replay of the kept child's trace, and that child is still alive."""
        kept = self.kept
        if kept is None or request.replay is None or not request.replay.candidate_trace:
            return False
        if os.path.realpath(request.replay.candidate_trace) != kept.trace:
            return False
        pid, _ = os.waitpid(kept.pid, os.WNOHANG)
        if pid:  # it ended (its idle time ran out): reaped here
            self._close_kept()
            return False
        return True

    def _run_on_kept(self, request: TraceRequest) -> bool:
        """Hand a replay to the kept child; one that died meanwhile is replaced by a fresh child."""
        kept = self.kept
        assert kept is not None
        try:
            write_frame(kept.requests, request.to_frame())
        except OSError:
            self._drop_kept()
            return self._run(request)
        write_frame(self.frames_out, Started(pid=kept.pid).to_frame())
        outcome, _, client_alive = self._relay(kept.pid, kept.replies, request.timeout)
        if outcome == "died":
            self._drop_kept()
            return self._run(request) if client_alive else False
        if outcome == "killed":
            self._drop_kept()
        return client_alive

    def _drop_kept(self) -> None:
        """End the kept child, if any, and reap it."""
        kept = self.kept
        if kept is None:
            return
        self._kill(kept.pid)
        try:
            os.waitpid(kept.pid, 0)
        except ChildProcessError:
            pass
        self._close_kept()

    def _close_kept(self) -> None:
        kept, self.kept = self.kept, None
        if kept is not None:
            for descriptor in (kept.replies, kept.requests):
                try:
                    os.close(descriptor)
                except OSError:
                    pass

    def _wait_for_exit(self, child: int, read_end: int, grace_seconds: float = 5.0) -> None:
        """Drain the child's pipe until it closes; a child that lingers after answering is killed."""
        deadline = time.monotonic() + grace_seconds
        while True:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([read_end], [], [], max(remaining, 0))
            if not readable:
                self._kill(child)
                return
            if not os.read(read_end, 65536):
                return

    def _send_error(self, error: WorkerError) -> None:
        write_frame(self.frames_out, error.to_frame())

    @staticmethod
    def _kill(child: int) -> None:
        # The child leads its own process group: this also stops anything the model code started.
        for target in (lambda: os.killpg(child, signal.SIGKILL), lambda: os.kill(child, signal.SIGKILL)):
            try:
                target()
                return
            except (ProcessLookupError, PermissionError):
                continue

    def _child(self, request: TraceRequest, write_end: int, requests: int | None) -> None:
        os.setpgid(0, 0)
        os.close(self.frames_in)
        os.close(self.frames_out)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from modeltrace.worker.job import describe_failure, flush_standard_streams, run_trace_job

        exit_code = 0
        try:
            result = run_trace_job(request, lambda text: write_frame(write_end, Progress(message=text).to_frame()))
            write_frame(write_end, result.to_frame())
            if isinstance(result, TraceResult):
                from modeltrace.trace.storage import flush_written, sync_trace

                sync_trace(result.trace)  # after answering: the user does not wait for the disk
                flush_written()  # a parameter store file written for this trace (`worker/parameter_store.py`)
            if requests is not None and isinstance(result, TraceResult) and result.kept_for_replay:
                _serve_replays(requests, write_end)
        except BaseException as error:  # noqa: BLE001 - every failure becomes an error frame
            try:
                write_frame(write_end, describe_failure(error, request).to_frame())
            except BaseException:  # noqa: BLE001
                exit_code = 3
        finally:
            flush_standard_streams()
            os._exit(exit_code)


def _serve_replays(requests: int, write_end: int) -> None:
    """In a kept child: answer replay requests on the model of its trace until told to stop or left unused."""
    from modeltrace.worker.job import describe_failure, flush_standard_streams
    from modeltrace.worker.replay import kept_candidate, run_replay_job

    def progress(text: str) -> None:
        write_frame(write_end, Progress(message=text).to_frame())

    while True:
        readable, _, _ = select.select([requests], [], [], KEEP_FOR_REPLAY_SECONDS)
        if not readable:
            return
        # NOTE: the zygote decoded this request before handing it over: it is a replay of the kept trace
        frame = read_frame(requests)
        if frame is None:
            return
        request = TraceRequest.from_frame(frame)
        try:
            write_frame(write_end, run_replay_job(request, progress, kept_candidate(request)).to_frame())
        except Exception as error:  # noqa: BLE001 - every failure becomes an error frame
            write_frame(write_end, describe_failure(error, request).to_frame())
        flush_standard_streams()


def main() -> None:
    # Frames travel on the original stdout; fd 1 becomes stderr so that prints in model code cannot
    # corrupt the stream.
    frames_out = os.dup(1)
    os.dup2(2, 1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _preload()
    except BaseException as error:  # noqa: BLE001
        write_frame(
            frames_out,
            WorkerError(
                kind=type(error).__name__,
                cause="import",
                message=f"the worker cannot import torch/transformers: {error}",
                detail=str(error),
            ).to_frame(),
        )
        sys.exit(2)
    Zygote(0, frames_out).serve()
