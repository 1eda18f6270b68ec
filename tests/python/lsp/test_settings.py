"""Settings and trust: hint detail, an untrusted workspace, a Python without torch."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import EXAMPLE, copy_example, execute, inlay_hints, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_changing_the_hint_detail_redraws_the_hints(client: LanguageClient) -> None:
    mlp_call = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    refreshes = client.recorder.inlay_hint_refreshes
    try:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"hintDetail": "stats"}})
        )
        await wait_until(lambda: client.recorder.inlay_hint_refreshes > refreshes)
        label = (await inlay_hints(client, client.example_uri))[mlp_call]
        # The model's dtype is left out even at stats detail; the statistics fit in VS Code's 43 characters.
        assert label.startswith(": [1,7,64] μ=") and " σ=" in label and len(label) <= 43

        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"hintDetail": "shape"}})
        )
        await wait_until(lambda: client.recorder.inlay_hint_refreshes > refreshes + 1)
        assert (await inlay_hints(client, client.example_uri))[mlp_call] == ": [1,7,64]"
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"hintDetail": "dtype"}})
        )


async def test_an_untrusted_workspace_keeps_static_features_but_does_not_trace(
    restricted_client: LanguageClient,
) -> None:
    client = restricted_client
    uri = open_document(client, EXAMPLE)
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert len([lens for lens in lenses if lens.command.command == "modelTrace.trace"]) == 8

    result = await execute(client, "modelTrace.trace", uri, "TinyLlamaModel")

    message = "ModelTrace: tracing runs this workspace's model code; trust the workspace to enable it"
    assert result == {"ok": False, "message": message}
    assert client.messages[-1] == types.ShowMessageParams(type=types.MessageType.Warning, message=message)


async def test_a_python_without_torch_gets_a_clear_message(restricted_client: LanguageClient) -> None:
    # This server's environment cannot import torch (see conftest): it serves anyway, and a trace says why not.
    client = restricted_client
    uri = open_document(client, EXAMPLE)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"workspaceTrusted": True}})
    )

    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"]
    assert result["message"].startswith("ModelTrace: the worker cannot import torch in ")
    assert "No module named 'torch'" in result["message"]
    assert client.messages[-1].type == types.MessageType.Error
    assert await inlay_hints(client, uri) == {}
    # Trusting the workspace with the model file open started the worker ahead of the trace: it failed the same
    # way, said only in the log (nothing had been asked for yet)
    ahead = await wait_until(
        lambda: [entry.message for entry in client.log_messages if "did not start ahead of a trace" in entry.message]
    )
    assert "No module named 'torch'" in ahead[0]


async def test_a_python_that_does_not_exist_gets_a_clear_message(restricted_client: LanguageClient) -> None:
    client = restricted_client
    uri = open_document(client, EXAMPLE)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"modelTrace": {"workspaceTrusted": True, "python": "/nonexistent/bin/python"}}
        )
    )
    try:
        result = await execute(client, "modelTrace.trace", uri)

        assert result["message"].startswith("ModelTrace: cannot run the trace worker with /nonexistent/bin/python: ")
        assert client.recorder.statuses[-1]["state"] == "error"
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"python": ""}})
        )


async def test_the_lines_setting_traces_line_by_line_and_names_variables(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling = copy_example(tmp_path)
    uri = open_document(client, modeling)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": True}})
    )
    try:
        result = await execute(client, "modelTrace.trace", uri)
        assert result["ok"], result
        hints = await inlay_hints(client, uri)
        assert hints[line_of(modeling, "query_states = self.q_proj(hidden_states)")] == ": [1,4,7,16]"
        assert hints[line_of(modeling, "cos, sin = position_embeddings")] == ": [1,7,16]  : [1,7,16]"
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=line_of(modeling, "variance = hidden_states.pow(2)"), character=8),
            )
        )
        assert "**Assigned on this line**" in hover.contents.value
        assert "| `variance` | 4 | [1,7,1] | float32 |" in hover.contents.value
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": False}})
        )
