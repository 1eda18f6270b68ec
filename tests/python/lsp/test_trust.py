"""Workspace trust gates every path that runs the workspace's model code, the diff's replay included.

A reference with full tensors makes the diff replay the candidate's diverging modules, which rebuilds the
candidate from its trace: it imports the workspace's modeling file. An untrusted workspace must still get the
plain comparison (reading traces runs no code), with a note saying why the replay did not run, and nothing of
the workspace's code may run. The modeling file here writes a sentinel when imported; once the workspace is
trusted, the same steps do write it (so the check can fail).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from modeltrace.lsp.commands import UNTRUSTED_MESSAGE
from modeltrace.lsp.context import ModelTraceServer, UntrustedWorkspace
from modeltrace.lsp.reference import UNTRUSTED_REPLAY_NOTE

from .support import (
    COLD_TRACE_SECONDS,
    REPOSITORY,
    SERVER_COMMAND,
    execute,
    initialize,
    open_document,
    record_server_pushes,
)


pytestmark = pytest.mark.asyncio(loop_scope="session")

PORT_PACKAGE = REPOSITORY / "examples" / "tiny_llama_port"
REFERENCE = REPOSITORY / "examples" / "reference" / "tiny_llama.mtrace"


@pytest_lsp.fixture(scope="session", config=ClientServerConfig(server_command=SERVER_COMMAND))
async def untrusted_client(
    lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    # NOTE: unlike `restricted_client`, this server's Python has torch: only trust stands between it and the code
    record_server_pushes(lsp_client)
    await initialize(
        lsp_client,
        {
            "settings": {"traceOnSave": True, "diffReplay": True},
            "workspaceTrusted": False,
            "traceDirectory": str(tmp_path_factory.mktemp("untrusted-traces")),
        },
    )
    yield
    await lsp_client.shutdown_session()


def _trapped_port(destination: Path, sentinels: Path) -> Path:
    """A copy of the example's port whose modeling file writes a file into `sentinels` whenever it is imported."""
    package = destination / PORT_PACKAGE.name
    shutil.copytree(PORT_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "*.mtrace"))
    modeling = package / "modeling_tiny_llama_port.py"
    prelude = (
        "import os as _os\n"
        f"open(_os.path.join({str(sentinels)!r}, 'modeling-import-%d' % _os.getpid()), 'w').close()\n"
    )
    source = modeling.read_text()
    # after the module docstring and `from __future__` imports, which must come first
    head, future, rest = source.partition("from __future__ import annotations\n")
    modeling.write_text(head + future + prelude + rest if future else prelude + source)
    return modeling


async def test_an_untrusted_workspace_compares_with_a_full_tensor_reference_without_running_its_code(
    untrusted_client: LanguageClient, tmp_path: Path
) -> None:
    client = untrusted_client
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    modeling = _trapped_port(tmp_path / "workspace", sentinels)
    trace = tmp_path / "port.mtrace"
    # The candidate's trace, made elsewhere (a colleague, CI): its making imports the file, as it must.
    traced = subprocess.run(
        [sys.executable, "-m", "modeltrace", "trace", str(modeling), "--full-tensors", "--out", str(trace)],
        capture_output=True,
        text=True,
        timeout=COLD_TRACE_SECONDS,
    )
    assert traced.returncode == 0, traced.stderr
    assert list(sentinels.iterdir()), "the trap does not write its sentinel: this test could not fail"
    for sentinel in sentinels.iterdir():
        sentinel.unlink()

    uri = open_document(client, modeling)
    loaded = await execute(client, "modelTrace.loadTrace", uri, str(trace))
    assert loaded["ok"], loaded
    answer = await execute(client, "modelTrace.setReference", uri, str(REFERENCE), timeout=COLD_TRACE_SECONDS)

    assert sorted(path.name for path in sentinels.iterdir()) == [], "the workspace's model code ran"
    # The plain comparison stands (the port's bug is still found), and the user is told why there was no replay.
    assert answer["ok"], answer
    assert answer["diff"]["match"] is False
    assert answer["diff"]["firstDivergence"] is not None
    assert UNTRUSTED_REPLAY_NOTE in answer["diff"]["notes"]
    assert UNTRUSTED_REPLAY_NOTE in client.recorder.diff_results[-1]["notes"]
    # Saving the file (trace-on-save is on) runs nothing either.
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    for command in ("modelTrace.trace", "modelTrace.traceGenerate", "modelTrace.traceBackward"):
        assert await execute(client, command, uri) == {"ok": False, "message": UNTRUSTED_MESSAGE}, command
    assert sorted(path.name for path in sentinels.iterdir()) == []

    # Trusted, the same reference is replayed: the replay rebuilds the candidate, importing its file.
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"workspaceTrusted": True}})
    )
    trusted = await execute(client, "modelTrace.setReference", uri, str(REFERENCE), timeout=COLD_TRACE_SECONDS)
    assert trusted["ok"], trusted
    assert UNTRUSTED_REPLAY_NOTE not in trusted["diff"]["notes"]
    assert any(path.name.startswith("modeling-import-") for path in sentinels.iterdir()), "the replay imported nothing"

    # A trace while trusted makes the next save repeat it; once trust is withdrawn, saving traces nothing.
    traced_here = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
    assert traced_here["ok"], traced_here
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"workspaceTrusted": False}})
    )
    statuses_before, messages_before = len(client.recorder.statuses), len(client.messages)
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    # NOTE: messages are handled in order: once this answer is back, a trace the save started has begun (and
    # been refused, with a message, by the gate further down if the save's own gate let it through).
    await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=0, character=0)
        )
    )
    await asyncio.sleep(1)
    assert "tracing" not in [status["state"] for status in client.recorder.statuses[statuses_before:]]
    assert [message.message for message in client.messages[messages_before:]] == []
    assert await execute(client, "modelTrace.trace", uri) == {"ok": False, "message": UNTRUSTED_MESSAGE}


async def test_the_worker_is_refused_to_an_untrusted_workspace_whatever_asks_for_it() -> None:
    # The one gate below every feature's own check: a feature that forgot to check trust still runs nothing.
    server = ModelTraceServer()
    server.workspace_trusted = False
    with pytest.raises(UntrustedWorkspace, match="not trusted"):
        server.worker()
    server.workspace_trusted = True
    assert server.worker() is server.worker()
    server.close_worker()
