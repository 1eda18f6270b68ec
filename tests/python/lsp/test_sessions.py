"""A document's session through the real server: `modelTrace.clear` drops all of it, and a new trace shown in a
document takes back what the previous one showed.

Each test is a regression test: before sessions, clear kept the reference (the next trace was compared again and
its diff came back) and the last request (trace-on-save traced the cleared document again), and a loaded trace
left the previous trace's failure and diff on screen.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import (
    copy_example,
    execute,
    inject_into_mlp_forward,
    line_of,
    open_document,
    wait_until,
)
from .test_reference import REFERENCE, copy_port, statuses_since, warnings


pytestmark = pytest.mark.asyncio(loop_scope="session")


def marks_since(client: LanguageClient, count: int, uri: str) -> list[list[dict]]:
    """Every non-empty set of gutter marks sent for `uri` after the first `count` `modelTrace/lineStatus`."""
    return [
        params["lines"] for params in client.recorder.line_statuses[count:] if params["uri"] == uri and params["lines"]
    ]


def errors(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    return [
        diagnostic
        for diagnostic in client.diagnostics.get(uri, [])
        if diagnostic.severity == types.DiagnosticSeverity.Error and diagnostic.source == "ModelTrace"
    ]


async def test_clear_forgets_the_reference_so_the_next_trace_is_not_compared(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_port(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.setReference", uri, str(REFERENCE)))["ok"]
    compared = await execute(client, "modelTrace.trace", uri)
    assert compared["ok"] and compared["diff"]["match"] is False
    await wait_until(lambda: warnings(client, uri))

    sent = len(client.recorder.line_statuses)
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
    assert await wait_until(lambda: statuses_since(client, sent, uri) == {})
    assert await wait_until(lambda: warnings(client, uri) == [])

    sent = len(client.recorder.line_statuses)
    results = len(client.recorder.diff_results)
    again = await execute(client, "modelTrace.trace", uri)

    assert again["ok"] and "diff" not in again
    assert marks_since(client, sent, uri) == []
    assert client.recorder.diff_results[results:] == []
    assert warnings(client, uri) == []
    assert (await client.protocol.send_request_async("modelTrace/diffPlot", {"uri": uri})) is None
    assert (await execute(client, "modelTrace.clear", uri))["ok"]


async def test_clear_forgets_the_last_request_so_a_save_does_not_trace_again(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"traceOnSave": True}})
    )
    try:
        statuses = len(client.recorder.statuses)
        client.text_document_did_save(
            types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        # NOTE: the server handles messages in order and runs one trace at a time, first come first served: a
        # trace the save started would run (and report "tracing") before this one.
        assert (await execute(client, "modelTrace.trace", uri))["ok"]

        tracing = [status for status in client.recorder.statuses[statuses:] if status["state"] == "tracing"]
        assert len(tracing) == 1, tracing
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"traceOnSave": False}})
        )
        await execute(client, "modelTrace.clear", uri)


async def test_a_loaded_trace_takes_back_the_previous_failure_and_diff(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path / "work")
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    assert (await execute(client, "modelTrace.pinReference", uri))["ok"]
    correct = "return self.down_proj(gate * self.up_proj(hidden_states))"
    modeling_file.write_text(modeling_file.read_text().replace(correct, correct + " * 1.5"))
    diverged = await execute(client, "modelTrace.trace", uri)
    assert diverged["ok"] and diverged["diff"]["match"] is False
    await wait_until(lambda: warnings(client, uri))
    kept = tmp_path / "diverged.mtrace"
    shutil.copytree(diverged["trace"], kept)
    fault = inject_into_mlp_forward(client, modeling_file, uri, "raise KeyError('missing_weight')")
    failed = await execute(client, "modelTrace.trace", uri)
    assert not failed["ok"]
    (error,) = await wait_until(lambda: errors(client, uri))
    assert error.range.start.line == fault

    sent = len(client.recorder.line_statuses)
    loaded = await execute(client, "modelTrace.loadTrace", uri, str(kept))

    assert loaded["ok"], loaded
    assert await wait_until(lambda: errors(client, uri) == [])
    assert await wait_until(lambda: warnings(client, uri) == [])
    assert await wait_until(lambda: statuses_since(client, sent, uri) == {})
    # NOTE: a loaded trace's hints sit on the lines it recorded: above the line the fault was inserted at
    mlp_call = line_of(modeling_file, "hidden_states = self.mlp(hidden_states)") - 1
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=mlp_call, character=8)
        )
    )
    assert hover is not None and "vs reference" not in hover.contents.value
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
