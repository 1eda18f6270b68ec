"""Start and drive the worker process from the CLI or the language server (no torch on this side).

`WorkerClient.trace()` sends one `TraceRequest` and blocks until the worker answers with its `TraceResult`
(`replay()`: a replay request, its `ReplayAnswer`); `cancel()` may be called from another thread. The worker
stays warm between traces. Whatever happens to it (a crash, a hang, a kill from outside, a frame that is not a
message) ends as a `TraceFailed` carrying a `WorkerError` whose `cause` says why, and the next trace starts a
fresh worker.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from modeltrace.errors import TraceFailed
from modeltrace.worker.messages import (
    REPLIES,
    Cancel,
    Message,
    Progress,
    Ready,
    ReplayAnswer,
    Shutdown,
    Started,
    TraceRequest,
    TraceResult,
    WorkerError,
    decode_frame,
)
from modeltrace.worker.protocol import ProtocolError, encode_frame, read_frame


# NOTE: importing torch + transformers on a loaded 2-core machine can take well over ten seconds.
STARTUP_TIMEOUT_SECONDS = 180.0
# What a trace's progress says while it waits for the worker to start.
STARTING_MESSAGE = "starting the trace worker (importing torch and transformers)"
# Grace beyond the trace's own timeout (enforced inside the worker) before the whole worker is killed.
HARD_TIMEOUT_GRACE_SECONDS = 30.0


class WorkerClient:
    """One worker process, started on first use and restarted after it dies."""

    def __init__(
        self,
        python: str = sys.executable,
        environment: dict[str, str] | None = None,
        on_log: Callable[[str], None] | None = None,
    ) -> None:
        self.python = python
        self.environment = environment
        self.on_log = on_log
        self._process: subprocess.Popen | None = None
        # NOTE: held while the worker starts, so that a trace asked for during a start begun ahead of it (the
        # editor starts the worker when a model file opens) waits for that start's `ready` instead of reading it
        self._start_lock = threading.Lock()
        self._ready = False
        self._write_lock = threading.Lock()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=200)
        self._child_pid: int | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def ready(self) -> bool:
        """Started, with torch imported, and not stopped since."""
        return self._ready and self.running

    def start(self) -> None:
        """Start the worker and wait until it has torch imported (from any thread: a second caller waits for the
        first one's start)."""
        with self._start_lock:
            if not self.running:
                self._start()

    def _start(self) -> None:
        environment = dict(os.environ if self.environment is None else self.environment)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, environment.get("PYTHONPATH")]))
        self._process = process = subprocess.Popen(
            [self.python, "-m", "modeltrace.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            start_new_session=True,
        )
        threading.Thread(target=self._drain_stderr, args=(process,), daemon=True).start()
        try:
            ready = self._read(STARTUP_TIMEOUT_SECONDS, process)
        except (EOFError, ProtocolError, ValueError):  # NOTE: ValueError: closed meanwhile (`close`)
            ready = None
        if not isinstance(ready, Ready):
            last_line = self._stderr_tail[-1].strip() if self._stderr_tail else None
            error = (
                ready
                if isinstance(ready, WorkerError)
                else WorkerError(
                    kind="WorkerStartFailed",
                    cause="start",
                    message=f"the worker ({self.python} -m modeltrace.worker) did not start: {self.stderr_tail(3)}",
                    detail=last_line or None,
                )
            )
            self.close()
            raise TraceFailed(error)
        self._ready = True

    def _drain_stderr(self, process: subprocess.Popen) -> None:
        assert process.stderr is not None
        for raw in iter(process.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self._stderr_tail.append(line)
            if self.on_log is not None:
                self.on_log(line)

    def stderr_tail(self, lines: int = 20) -> str:
        return " | ".join(list(self._stderr_tail)[-lines:])

    def _send(self, message: Message) -> None:
        assert self._process is not None and self._process.stdin is not None
        with self._write_lock:
            self._process.stdin.write(encode_frame(message.to_frame()))
            self._process.stdin.flush()

    def _read(self, timeout: float, process: subprocess.Popen | None = None) -> Message | None:
        """The next message, or None if the worker stayed silent for `timeout` seconds.

        Raises EOFError when the worker closed its output (it died, or broke off a frame), `ProtocolError` (a
        `WorkerProtocolError` naming the key) for a frame that is not one of the worker's replies.
        """
        process = process or self._process
        assert process is not None and process.stdout is not None
        fd = process.stdout.fileno()
        readable, _, _ = select.select([fd], [], [], max(timeout, 0))
        if not readable:
            return None
        frame = read_frame(fd)  # ProtocolError: a malformed frame (`_run` names it)
        if frame is None:
            raise EOFError
        return decode_frame(frame, REPLIES)

    def trace(self, request: TraceRequest, on_progress: Callable[[str], None] | None = None) -> TraceResult:
        """Run one trace request (see `job.run_trace_job`); returns its result or raises `TraceFailed`."""
        answer = self._run(request, on_progress)
        if not isinstance(answer, TraceResult):
            raise self._protocol_failure(f"a {answer.TYPE!r} frame answered a trace request")
        return answer

    def replay(self, request: TraceRequest, on_progress: Callable[[str], None] | None = None) -> ReplayAnswer:
        """Run one replay request (a `TraceRequest` with `replay`, see `worker/replay.py`); raises `TraceFailed`."""
        answer = self._run(request, on_progress)
        if not isinstance(answer, ReplayAnswer):
            raise self._protocol_failure(f"a {answer.TYPE!r} frame answered a replay request")
        return answer

    def _protocol_failure(self, what: str) -> TraceFailed:
        """Stop a worker that sent something other than a message in answer (and its child), and say what."""
        self.close()
        self._kill_child()
        return TraceFailed(
            WorkerError(
                kind="WorkerProtocolError",
                cause="protocol",
                message=(
                    f"the worker sent a malformed frame ({what}) and was stopped; "
                    f"its last output: {self.stderr_tail(3) or 'none'}"
                ),
            )
        )

    def _run(self, request: TraceRequest, on_progress: Callable[[str], None] | None) -> TraceResult | ReplayAnswer:
        if on_progress is not None and not self.ready:
            on_progress(STARTING_MESSAGE)
        self.start()
        timeout = request.timeout
        try:
            self._send(request)
        except (BrokenPipeError, OSError):
            self.close()
            raise TraceFailed(
                WorkerError(kind="WorkerCrashed", cause="crash", message="the worker process is gone; try again")
            ) from None
        deadline = time.monotonic() + timeout + HARD_TIMEOUT_GRACE_SECONDS
        while True:
            try:
                frame = self._read(deadline - time.monotonic())
            except ProtocolError as error:
                raise self._protocol_failure(str(error)) from None
            except EOFError:
                self.close()
                self._kill_child()
                raise TraceFailed(
                    WorkerError(
                        kind="WorkerCrashed",
                        cause="crash",
                        message=f"the worker process died: {self.stderr_tail(3) or 'no output'}",
                    )
                ) from None
            if frame is None:
                self.close()
                self._kill_child()
                raise TraceFailed(
                    WorkerError(
                        kind="TimeoutError",
                        cause="timeout",
                        message=f"the worker did not answer within {timeout:g} s and was stopped",
                    )
                )
            if isinstance(frame, Started):
                self._child_pid = frame.pid
            elif isinstance(frame, Progress):
                if on_progress is not None:
                    on_progress(frame.message)
            elif isinstance(frame, TraceResult | ReplayAnswer):
                self._child_pid = None
                return frame
            elif isinstance(frame, WorkerError):
                self._child_pid = None
                raise TraceFailed(frame)
            elif isinstance(frame, Ready):
                raise self._protocol_failure("a second 'ready' frame")

    def _kill_child(self) -> None:
        """Stop the trace child (and what it started) when its worker is gone and cannot do it."""
        child, self._child_pid = self._child_pid, None
        if child is None:
            return
        try:
            os.killpg(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def cancel(self) -> None:
        """Ask the worker to stop the running trace (safe from any thread; a no-op when idle)."""
        if not self.running:
            return
        try:
            self._send(Cancel())
        except (BrokenPipeError, OSError):
            pass

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        process, self._process = self._process, None
        self._ready = False
        if process is None:
            return
        if process.poll() is None:
            try:
                assert process.stdin is not None
                with self._write_lock:
                    process.stdin.write(encode_frame(Shutdown().to_frame()))
                    process.stdin.flush()
                process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
