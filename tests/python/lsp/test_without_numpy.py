"""A server that only shows a trace (hints, hovers, code lenses) never imports numpy: the diff machinery, which
needs it, is imported once a reference is set (numpy is ~14 MB of the server's resident memory).

The server runs with a `numpy` on its path that fails to import, so any import of it on these paths fails the
request (or the server's start) instead of going unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from modeltrace.trace.parameter_store import parameters_file
from modeltrace.trace.storage import read_trace

from .support import (
    CAPTURE_SCRIPT,
    SERVER_COMMAND,
    copy_example,
    execute,
    initialize,
    inlay_hints,
    line_of,
    open_document,
    record_server_pushes,
)


pytestmark = pytest.mark.asyncio(loop_scope="session")

WITHOUT_NUMPY = Path(__file__).resolve().parent / "without_numpy"


@pytest_lsp.fixture(
    scope="session",
    config=ClientServerConfig(
        server_command=SERVER_COMMAND,
        server_env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(WITHOUT_NUMPY), os.environ.get("PYTHONPATH", "")]),
        },
    ),
)
async def numpy_free_client(
    lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    record_server_pushes(lsp_client)
    await initialize(
        lsp_client,
        {
            "settings": {"hintDetail": "stats", "traceOnSave": False},
            "workspaceTrusted": True,
            "traceDirectory": str(tmp_path_factory.mktemp("numpy-free-traces")),
        },
    )
    yield
    await lsp_client.shutdown_session()


async def test_a_loaded_trace_shows_hints_hovers_and_lenses_without_numpy(
    numpy_free_client: LanguageClient, tmp_path: Path
) -> None:
    client = numpy_free_client
    # NOTE: captured by a script (torch runs there, not in the server) from a copy of the example
    modeling_file = copy_example(tmp_path)
    trace = tmp_path / "captured.mtrace"
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE_SCRIPT)
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(trace)], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    uri = open_document(client, modeling_file)
    loaded = await execute(client, "modelTrace.loadTrace", uri, str(trace))
    assert loaded["ok"], loaded

    hints = await inlay_hints(client, uri)
    query_line = line_of(modeling_file, "query_states = self.q_proj(hidden_states)")
    assert "[1,4,7,16]" in hints.get(query_line, ""), (loaded, hints)
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=query_line, character=8)
        )
    )
    assert hover is not None and "layers.0.self_attn.q_proj" in hover.contents.value, hover
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert lenses, "no code lens on the traced model's file"


async def test_a_trace_with_stored_parameters_loads_without_numpy_and_names_a_damaged_store(
    numpy_free_client: LanguageClient, tmp_path: Path
) -> None:
    client = numpy_free_client
    modeling_file = copy_example(tmp_path)
    trace = tmp_path / "full.mtrace"
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE_SCRIPT.replace("lines=True", "lines=True, full_tensors=True"))
    # NOTE: a store of this test's own: the file is damaged below
    environment = {**os.environ, "MODELTRACE_PARAMETER_STORE": str(tmp_path / "store")}
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(trace)],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert completed.returncode == 0, completed.stderr
    uri = open_document(client, modeling_file)
    loaded = await execute(client, "modelTrace.loadTrace", uri, str(trace))
    assert loaded["ok"] and "parameters" not in loaded, loaded

    store_file = parameters_file(read_trace(trace))
    store_file.write_bytes(store_file.read_bytes()[:100])
    loaded = await execute(client, "modelTrace.loadTrace", uri, str(trace))
    assert loaded["ok"], loaded
    assert "cannot be read" in loaded["parameters"] and str(store_file) in loaded["parameters"]
    hints = await inlay_hints(client, uri)
    assert "[1,4,7,16]" in hints.get(line_of(modeling_file, "query_states = self.q_proj(hidden_states)"), "")
