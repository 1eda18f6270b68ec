"""Fixtures for the language server tests: real server over stdio, real worker, the real example model.

`client` is one server for the whole session (its worker stays warm, as in the editor) that has traced
`examples/tiny_llama/modeling_tiny_llama.py`; tests that edit files work on copies of the example package.
`restricted_client` is a server in an untrusted workspace whose Python cannot import torch.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from .support import (
    COLD_TRACE_SECONDS,
    EXAMPLE,
    SERVER_COMMAND,
    WITHOUT_TORCH,
    execute,
    initialize,
    open_document,
    record_server_pushes,
)


@pytest_lsp.fixture(scope="session", config=ClientServerConfig(server_command=SERVER_COMMAND))
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[None]:
    record_server_pushes(lsp_client)
    trace_directory = tmp_path_factory.mktemp("traces")
    await initialize(
        lsp_client,
        {
            # NOTE: module-call hints only (line capture is on by default, and has tests of its own): the labels
            # these tests expect are those of module calls
            "settings": {"hintDetail": "dtype", "traceOnSave": False, "timeout": 60, "lines": False},
            "workspaceTrusted": True,
            "traceDirectory": str(trace_directory),
        },
    )
    uri = open_document(lsp_client, EXAMPLE)
    result = await execute(lsp_client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"], result
    lsp_client.example_trace = result  # type: ignore[attr-defined]
    lsp_client.example_uri = uri  # type: ignore[attr-defined]
    lsp_client.trace_directory = trace_directory  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(
    scope="session",
    config=ClientServerConfig(
        server_command=SERVER_COMMAND,
        server_env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(WITHOUT_TORCH), os.environ.get("PYTHONPATH", "")]),
        },
    ),
)
async def restricted_client(
    lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    record_server_pushes(lsp_client)
    await initialize(
        lsp_client,
        {"workspaceTrusted": False, "traceDirectory": str(tmp_path_factory.mktemp("restricted-traces"))},
    )
    yield
    await lsp_client.shutdown_session()
