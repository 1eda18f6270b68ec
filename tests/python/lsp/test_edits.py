"""Hints follow edits: unchanged lines carry their hints, changed lines lose them, the trace turns stale."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from modeltrace.lsp.hints import STALE_SUFFIX

from .support import copy_example, execute, inlay_hints, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")


def edit(
    client: LanguageClient, uri: str, version: int, line: int, end_line: int, end_character: int, text: str
) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=line, character=0),
                        end=types.Position(line=end_line, character=end_character),
                    ),
                    text=text,
                )
            ],
        )
    )


async def traced_copy(client: LanguageClient, folder: Path) -> tuple[Path, str, dict[int, str]]:
    modeling_file = copy_example(folder)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    return modeling_file, uri, await inlay_hints(client, uri)


async def test_hints_move_with_inserted_lines_and_leave_changed_ones(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file, uri, traced = await traced_copy(client, tmp_path)
    statuses = len(client.recorder.statuses)

    edit(client, uri, 2, 0, 0, 0, "# a comment\n# another one\n")
    moved = await inlay_hints(client, uri)
    # The same labels, marked stale: the trace is older than the text now.
    assert moved == {line + 2: label + STALE_SUFFIX for line, label in traced.items()}
    # (and what the stale trace ran, for the status bar's tooltip)
    assert client.recorder.statuses[statuses:] == [
        {
            "state": "stale",
            "message": "TinyLlamaModel: the code changed since the last trace",
            "uri": uri,
            "ran": "TinyLlamaConfig as is: hidden 64, layers 2, heads 4 · 7 tokens · random weights (seed 0)",
        }
    ]

    mlp_call = line_of(modeling_file, "hidden_states = self.mlp(hidden_states)") + 2
    edit(client, uri, 3, mlp_call, mlp_call, 10_000, "        hidden_states = self.mlp(hidden_states) * 2")
    changed = await inlay_hints(client, uri)
    assert mlp_call not in changed
    assert changed == {line: label for line, label in moved.items() if line != mlp_call}
    # Stale is said once, when the trace stops matching the code; the hover says it too.
    assert [status["state"] for status in client.recorder.statuses[statuses:]] == ["stale"]
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=mlp_call - 1, character=8),
        )
    )
    assert "The file changed since this trace" in hover.contents.value


async def test_deleting_lines_moves_the_hints_below_up(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file, uri, traced = await traced_copy(client, tmp_path)
    first_class = line_of(modeling_file, "class TinyLlamaRMSNorm")

    edit(client, uri, 2, first_class - 3, first_class, 0, "")

    assert await inlay_hints(client, uri) == {line - 3: label + STALE_SUFFIX for line, label in traced.items()}


async def test_trace_on_save_traces_again(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file, uri, traced = await traced_copy(client, tmp_path)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"traceOnSave": True}})
    )
    try:
        edit(client, uri, 2, 0, 0, 0, "# saved\n")
        modeling_file.write_text("# saved\n" + modeling_file.read_text())
        await wait_until(lambda: client.recorder.statuses[-1]["state"] == "stale")
        refreshes = client.recorder.inlay_hint_refreshes
        statuses = len(client.recorder.statuses)
        client.text_document_did_save(
            types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

        await wait_until(lambda: client.recorder.inlay_hint_refreshes > refreshes)
        await wait_until(
            lambda: [status["state"] for status in client.recorder.statuses[statuses:]] == ["tracing", "idle"]
        )
        assert await inlay_hints(client, uri) == {line + 1: label for line, label in traced.items()}
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=max(traced) + 1, character=8),
            )
        )
        assert "The file changed since this trace" not in hover.contents.value
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"traceOnSave": False}})
        )
