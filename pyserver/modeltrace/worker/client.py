"""Start and drive the worker process from the CLI or the language server (no torch on this side).

`WorkerClient.trace()` sends one request and blocks until the worker answers; `cancel()` may be called from
another thread. The worker stays warm between traces. Whatever happens to it (a crash, a hang, a kill from
outside) ends as a `TraceFailed` carrying a structured error, and the next trace starts a fresh worker.
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
from typing import Any

from modeltrace.errors import TraceFailed
from modeltrace.worker.protocol import ProtocolError, encode_frame, read_frame


# NOTE: importing torch + transformers on a loaded 2-core machine can take well over ten seconds.
STARTUP_TIMEOUT_SECONDS = 180.0
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
        self._write_lock = threading.Lock()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=200)
        self._child_pid: int | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the worker and wait until it has torch imported."""
        if self.running:
            return
        environment = dict(os.environ if self.environment is None else self.environment)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, environment.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [self.python, "-m", "modeltrace.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            start_new_session=True,
        )
        threading.Thread(target=self._drain_stderr, args=(self._process,), daemon=True).start()
        try:
            ready = self._read(STARTUP_TIMEOUT_SECONDS)
        except (EOFError, ProtocolError):
            ready = None
        if ready is None or ready.get("type") != "ready":
            error = (ready or {}).get("error") or {
                "type": "WorkerStartFailed",
                "message": f"the worker ({self.python} -m modeltrace.worker) did not start: {self.stderr_tail(3)}",
            }
            self.close()
            raise TraceFailed(error)

    def _drain_stderr(self, process: subprocess.Popen) -> None:
        assert process.stderr is not None
        for raw in iter(process.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self._stderr_tail.append(line)
            if self.on_log is not None:
                self.on_log(line)

    def stderr_tail(self, lines: int = 20) -> str:
        return " | ".join(list(self._stderr_tail)[-lines:])

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process is not None and self._process.stdin is not None
        with self._write_lock:
            self._process.stdin.write(encode_frame(message))
            self._process.stdin.flush()

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """The next frame, or None if the worker stayed silent for `timeout` seconds.

        Raises EOFError when the worker closed its output (it died, or broke off a frame).
        """
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        readable, _, _ = select.select([fd], [], [], max(timeout, 0))
        if not readable:
            return None
        frame = read_frame(fd)  # ProtocolError: a malformed frame (`trace` names it)
        if frame is None:
            raise EOFError
        return frame

    def trace(
        self,
        request: dict[str, Any],
        on_progress: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run one trace request (see `job.run_trace_job`); returns the result frame or raises `TraceFailed`."""
        self.start()
        timeout = float(request.get("timeout") or 120)
        try:
            self._send({**request, "type": "trace", "timeout": timeout})
        except (BrokenPipeError, OSError):
            self.close()
            raise TraceFailed({"type": "WorkerCrashed", "message": "the worker process is gone; try again"}) from None
        deadline = time.monotonic() + timeout + HARD_TIMEOUT_GRACE_SECONDS
        while True:
            try:
                frame = self._read(deadline - time.monotonic())
            except ProtocolError as error:
                self.close()
                self._kill_child()
                raise TraceFailed(
                    {
                        "type": "WorkerProtocolError",
                        "message": (
                            f"the worker sent a malformed frame ({error}) and was stopped; "
                            f"its last output: {self.stderr_tail(3) or 'none'}"
                        ),
                    }
                ) from None
            except EOFError:
                self.close()
                self._kill_child()
                raise TraceFailed(
                    {
                        "type": "WorkerCrashed",
                        "message": f"the worker process died: {self.stderr_tail(3) or 'no output'}",
                    }
                ) from None
            if frame is None:
                self.close()
                self._kill_child()
                raise TraceFailed(
                    {
                        "type": "TimeoutError",
                        "message": f"the worker did not answer within {timeout:g} s and was stopped",
                    }
                )
            kind = frame.get("type")
            if kind == "started":
                self._child_pid = int(frame["pid"])
            elif kind == "progress":
                if on_progress is not None:
                    on_progress(str(frame.get("message", "")))
            elif kind == "result":
                self._child_pid = None
                return frame
            elif kind == "error":
                self._child_pid = None
                raise TraceFailed(frame.get("error") or {"type": "Error", "message": "unknown worker error"})
            elif kind != "pong":
                self.close()
                self._kill_child()
                raise TraceFailed(
                    {
                        "type": "WorkerProtocolError",
                        "message": (
                            f"the worker sent a frame of unknown type {kind!r} (expected started, progress, result or "
                            "error) and was stopped: is it the same ModelTrace version as this one?"
                        ),
                    }
                )

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
            self._send({"type": "cancel"})
        except (BrokenPipeError, OSError):
            pass

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                assert process.stdin is not None
                with self._write_lock:
                    process.stdin.write(encode_frame({"type": "shutdown"}))
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
