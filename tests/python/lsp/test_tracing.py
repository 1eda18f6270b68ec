"""`modelTrace.trace`: progress, failures (as a diagnostic at the failing line), cancel, bad documents."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import LanguageClient

from modeltrace.lsp.hints import STALE_SUFFIX

from .support import (
    EXAMPLE,
    copy_example,
    execute,
    inject_into_mlp_forward,
    inlay_hints,
    line_of,
    open_document,
    wait_until,
)


pytestmark = pytest.mark.asyncio(loop_scope="session")


def messages_since(client: LanguageClient, count: int) -> list[types.ShowMessageParams]:
    return client.messages[count:]


async def test_the_trace_reports_progress_from_begin_to_end(client: LanguageClient) -> None:
    (reports,) = [reports for reports in client.progress_reports.values() if reports][:1]
    assert reports[0].kind == "begin" and reports[0].title == "ModelTrace" and reports[0].cancellable
    assert reports[0].message == "tracing TinyLlamaModel"
    assert "running TinyLlamaModel.forward" in [report.message for report in reports if report.kind == "report"]
    assert reports[-1].kind == "end"
    assert reports[-1].message.startswith("TinyLlamaModel: 30 module calls on 14 lines")
    assert client.recorder.statuses[:2] == [
        {"state": "tracing", "message": "tracing TinyLlamaModel", "uri": client.example_uri},
        {
            "state": "idle",
            "message": reports[-1].message,
            "uri": client.example_uri,
            "ran": "TinyLlamaConfig as is: hidden 64, layers 2, heads 4 · 7 tokens · random weights (seed 0)",
            "sizes": "traced",
        },
    ]
    assert client.recorder.inlay_hint_refreshes >= 1 and client.recorder.code_lens_refreshes >= 1


async def test_an_exception_in_the_model_is_a_diagnostic_at_its_line(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    good_hints = await inlay_hints(client, uri)
    mlp_call = line_of(modeling_file, "hidden_states = self.mlp(hidden_states)")
    shown = len(client.messages)

    raise_line = inject_into_mlp_forward(client, modeling_file, uri, 'raise ValueError("boom")')
    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"]
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(uri))
    assert diagnostic.severity == types.DiagnosticSeverity.Error
    assert diagnostic.source == "ModelTrace"
    assert diagnostic.message == "ValueError: boom"
    assert diagnostic.range.start.line == raise_line and diagnostic.range.start.character == 8
    (message,) = messages_since(client, shown)
    assert message.type == types.MessageType.Error
    assert message.message.startswith("ModelTrace: ") and "ValueError: boom" in message.message
    assert message.message.endswith(f"({modeling_file.resolve()}:{raise_line + 1})")
    assert "Traceback" not in message.message
    assert client.recorder.statuses[-1]["state"] == "error"
    # The last good trace stays, its hints moved down by the inserted line.
    hints = await inlay_hints(client, uri)
    assert good_hints[mlp_call] == ": [1,7,64]"
    assert hints[mlp_call + 1] == good_hints[mlp_call] + STALE_SUFFIX

    source = modeling_file.read_text().replace('        raise ValueError("boom")\n', "")
    modeling_file.write_text(source)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    await wait_until(lambda: len(client.diagnostics[uri]) == 0)


async def test_a_worker_killed_by_the_model_leaves_the_server_and_its_hints(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    inject_into_mlp_forward(client, modeling_file, uri, "import os; os._exit(3)")
    example_hints = await inlay_hints(client, client.example_uri)

    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"]
    assert "exit code 3" in result["message"] and client.messages[-1].message == result["message"]
    assert await inlay_hints(client, client.example_uri) == example_hints
    assert (await execute(client, "modelTrace.trace", client.example_uri))["ok"]


async def test_cancelling_the_progress_stops_the_trace(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    inject_into_mlp_forward(client, modeling_file, uri, "import time; time.sleep(60)")
    known = set(client.progress_reports)

    trace = asyncio.ensure_future(execute(client, "modelTrace.trace", uri))
    # Once the worker reports progress the trace is running (whether it is building the model or in forward).
    token = await wait_until(
        lambda: next(
            (
                token
                for token, reports in client.progress_reports.items()
                if token not in known and any(report.kind == "report" for report in reports)
            ),
            None,
        )
    )
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    result = await asyncio.wait_for(trace, 10)

    assert result == {"ok": False, "message": "ModelTrace: trace cancelled", "cancelled": True}
    assert client.progress_reports[token][-1] == types.WorkDoneProgressEnd(message="cancelled")
    assert client.recorder.statuses[-1]["state"] == "idle"


async def test_a_cancel_request_for_the_trace_stops_its_worker(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    inject_into_mlp_forward(client, modeling_file, uri, "import time; time.sleep(60)")
    known = set(client.progress_reports)
    request_id = f"trace-to-cancel-{uuid.uuid4()}"
    trace = asyncio.ensure_future(
        client.protocol.send_request_async(
            types.WORKSPACE_EXECUTE_COMMAND,
            types.ExecuteCommandParams(command="modelTrace.trace", arguments=[uri]),
            msg_id=request_id,
        )
    )
    token = await wait_until(
        lambda: next(
            (
                token
                for token, reports in client.progress_reports.items()
                if token not in known and any(report.kind == "report" for report in reports)
            ),
            None,
        )
    )

    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=request_id))

    with pytest.raises(JsonRpcRequestCancelled):
        await asyncio.wait_for(trace, 30)
    # (the old server answered "canceled" at once and traced on: its progress ended with the trace's summary)
    await wait_until(lambda: client.progress_reports[token][-1] == types.WorkDoneProgressEnd(message="cancelled"), 30)
    # The worker stopped: the next trace runs now, not after the 60 s the cancelled one would have slept.
    started = asyncio.get_running_loop().time()
    assert (await execute(client, "modelTrace.trace", client.example_uri, timeout=40))["ok"]
    assert asyncio.get_running_loop().time() - started < 40


async def test_the_server_never_imports_torch(client: LanguageClient) -> None:
    # NOTE: the server has traced by now; torch lives in the worker process only.
    server_pid = client._server.pid
    maps = Path(f"/proc/{server_pid}/maps").read_text()
    assert "libtorch" not in maps
    assert "/torch/" not in maps


async def test_a_file_without_a_model_gets_a_message_naming_it(client: LanguageClient, tmp_path: Path) -> None:
    plain = tmp_path / "helpers.py"
    plain.write_text("def add(a, b):\n    return a + b\n")
    uri = open_document(client, plain)

    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"]
    assert result["message"].startswith(f"ModelTrace: {plain.resolve()}: defines no nn.Module subclass to trace")
    assert client.messages[-1].message == result["message"]
    assert client.messages[-1].type == types.MessageType.Error


async def test_untitled_and_non_python_documents_get_nothing(client: LanguageClient, tmp_path: Path) -> None:
    untitled = open_document(client, EXAMPLE, uri="untitled:Untitled-1")
    notes = tmp_path / "notes.txt"
    notes.write_text("class Notes(nn.Module):\n    pass\n")
    text_uri = open_document(client, notes, language="plaintext")

    for uri in (untitled, text_uri):
        assert await inlay_hints(client, uri) == {}
        lenses = await client.text_document_code_lens_async(
            types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        assert list(lenses) == []

    result = await execute(client, "modelTrace.trace", untitled)
    assert (
        result["message"] == "ModelTrace: untitled:Untitled-1 is not a file on disk; save it as a .py file to trace it"
    )
    result = await execute(client, "modelTrace.trace", text_uri)
    assert (
        result["message"]
        == f"ModelTrace: {notes.resolve()} is not a Python file; only Python model code can be traced"
    )
    assert client.messages[-1].message == result["message"]
