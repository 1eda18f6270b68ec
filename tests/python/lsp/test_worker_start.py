"""The worker starts when a model file opens in a trusted workspace, so that the first trace does not wait for it.

Importing torch and transformers takes seconds; a user who opens a modeling file and clicks "Trace forward" a
moment later used to wait for all of it. One server walks the cases in order: untrusted (nothing starts), trusted
with `startWorkerOnOpen` off (the first trace starts the worker and says so in its progress), a file without a
module class (nothing starts), and a model file opened with the setting on (the worker is ready before any trace,
and the trace uses that same process without waiting for a start).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator

import psutil
import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from modeltrace.worker.client import STARTING_MESSAGE

from .support import (
    COLD_TRACE_SECONDS,
    EXAMPLE,
    EXAMPLE_PACKAGE,
    SERVER_COMMAND,
    execute,
    initialize,
    open_document,
    record_server_pushes,
    wait_until,
)


pytestmark = pytest.mark.asyncio(loop_scope="session")

READY_LOG = "ModelTrace: trace worker ready"


@pytest_lsp.fixture(scope="session", config=ClientServerConfig(server_command=SERVER_COMMAND))
async def starting_client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[None]:
    record_server_pushes(lsp_client)
    await initialize(
        lsp_client,
        {
            "settings": {"traceOnSave": False, "lines": False, "timeout": 60},
            "workspaceTrusted": False,
            "traceDirectory": str(tmp_path_factory.mktemp("starting-traces")),
        },
    )
    yield
    await lsp_client.shutdown_session()


def worker_processes(server_pid: int) -> list[int]:
    """The server's live child processes that run `modeltrace.worker` (its trace children are the worker's own)."""
    found = []
    for process in psutil.Process(server_pid).children():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and "modeltrace.worker" in process.cmdline():
                found.append(process.pid)
        except psutil.NoSuchProcess:
            continue  # NOTE: gone meanwhile
    return found


def ready_logs(client: LanguageClient) -> list[str]:
    return [entry.message for entry in client.log_messages if entry.message.startswith(READY_LOG)]


async def handled(client: LanguageClient, uri: str) -> None:
    """A request answered after the notifications sent before it: the server has handled them (in order)."""
    await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


def configure(client: LanguageClient, values: dict) -> None:
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"modelTrace": values}))


async def trace_progress(client: LanguageClient, uri: str) -> tuple[dict, list[str]]:
    """Trace `uri`; its result and the messages of the progress it reported."""
    tokens = set(client.progress_reports)
    result = await execute(client, "modelTrace.trace", uri, "TinyLlamaModel", timeout=COLD_TRACE_SECONDS)
    messages = [
        getattr(report, "message", None) or ""
        for token, reports in client.progress_reports.items()
        if token not in tokens
        for report in reports
    ]
    return result, messages


async def test_a_model_file_opened_in_a_trusted_workspace_starts_the_worker_before_the_first_trace(
    starting_client: LanguageClient,
) -> None:
    client = starting_client
    server = client._server.pid  # NOTE: pytest-lsp keeps no public handle on the server process

    # Untrusted: opening a model file starts nothing (the interpreter may be the workspace's own).
    uri = open_document(client, EXAMPLE)
    await handled(client, uri)
    assert worker_processes(server) == [] and ready_logs(client) == []

    # Trusted, with the setting off: still nothing until a trace, which starts the worker and says so.
    configure(client, {"workspaceTrusted": True, "startWorkerOnOpen": False})
    await handled(client, uri)
    assert worker_processes(server) == [] and ready_logs(client) == []
    result, progress = await trace_progress(client, uri)
    assert result["ok"], result
    assert STARTING_MESSAGE in progress
    assert len(worker_processes(server)) == 1

    # Another interpreter setting (the same Python, spelled differently) replaces the worker; with no model file
    # open, the new one is not started, and a file without a module class starts nothing either.
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    configure(
        client,
        {
            "startWorkerOnOpen": True,
            "python": os.path.join(os.path.dirname(sys.executable), ".", os.path.basename(sys.executable)),
        },
    )
    await wait_until(lambda: worker_processes(server) == [], timeout=30)
    configuration = open_document(client, EXAMPLE_PACKAGE / "configuration_tiny_llama.py")
    await handled(client, configuration)
    assert worker_processes(server) == [] and ready_logs(client) == []

    # The model file opened again: the worker starts at once and is ready before any trace is asked for.
    uri = open_document(client, EXAMPLE)
    await wait_until(lambda: ready_logs(client), timeout=COLD_TRACE_SECONDS)
    started = worker_processes(server)
    assert len(started) == 1
    assert "started when a model file opened" in ready_logs(client)[0]

    result, progress = await trace_progress(client, uri)
    assert result["ok"], result
    assert STARTING_MESSAGE not in progress and progress, progress
    assert worker_processes(server) == started  # NOTE: the trace ran in the worker started ahead
