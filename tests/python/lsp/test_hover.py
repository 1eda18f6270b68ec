"""Hover on a traced line: its assigned values first, then its calls, then the calls nested inside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import EXAMPLE, copy_example, execute, line_of, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")


async def hover(client: LanguageClient, line: int, character: int = 8) -> types.Hover | None:
    return await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=client.example_uri),
            position=types.Position(line=line, character=character),
        )
    )


async def test_hover_lists_every_call_of_a_repeated_line(client: LanguageClient) -> None:
    line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    result = await hover(client, line)
    assert result.contents.kind == types.MarkupKind.Markdown
    text = result.contents.value
    # The count the inline hint leaves out, said in words.
    assert "×2: this line ran 2 times in the traced forward" in text
    assert "**Module calls on this line** (2)" in text
    assert "| call | shape | dtype | mean | std | min | max |" in text
    assert "| `layers.0.mlp` TinyLlamaMLP | [1,7,64] | float32 |" in text
    assert "| `layers.1.mlp` TinyLlamaMLP | [1,7,64] | float32 |" in text
    # No NaN/Inf anywhere: no column for them.
    assert "NaN/Inf" not in text
    assert result.range.start.line == result.range.end.line == line


async def test_a_line_that_ran_once_states_no_count(client: LanguageClient) -> None:
    text = (await hover(client, line_of(EXAMPLE, "hidden_states = self.norm(hidden_states)"))).contents.value
    assert "×" not in text and "**Module call on this line** (1)" in text


async def test_hover_shows_inner_calls_below_the_line_s_own(client: LanguageClient) -> None:
    line = line_of(EXAMPLE, "return self.down_proj(gate * self.up_proj(hidden_states))")
    text = (await hover(client, line)).contents.value
    own, inner = text.split("**Inner calls**")
    assert "`layers.0.mlp.down_proj`" in own and "up_proj" not in own
    assert "| `layers.0.mlp.up_proj` Linear | [1,7,128] | float32 |" in inner


async def test_hover_names_each_output_of_a_call_returning_a_tuple(client: LanguageClient) -> None:
    line = line_of(EXAMPLE, "hidden_states, _ = self.self_attn(")
    text = (await hover(client, line)).contents.value
    assert "| `layers.0.self_attn`[0] TinyLlamaAttention | [1,7,64] | float32 |" in text
    assert "| `layers.0.self_attn`[1] TinyLlamaAttention | [1,4,7,7] | float32 |" in text


async def test_the_first_row_is_the_line_s_assigned_value(client: LanguageClient, tmp_path: Path) -> None:
    modeling = copy_example(tmp_path)
    uri = open_document(client, modeling)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": True}})
    )
    try:
        assert (await execute(client, "modelTrace.trace", uri))["ok"]
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": False}})
        )
    line = line_of(modeling, "query_states = self.q_proj(hidden_states)")
    result = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=8)
        )
    )
    text = result.contents.value
    rows = [row for row in text.splitlines() if row.startswith("| `")]
    # The value the inline hint shows (after the transpose), before q_proj's own output (before it).
    assert rows[0].startswith("| `query_states` | 0 | [1,4,7,16] | float32 |")
    assert text.index("**Assigned on this line**") < text.index("**Module calls on this line**")
    assert "| `layers.0.self_attn.q_proj` Linear | [1,7,64] | float32 |" in text
    # `hidden_states, _ = ...`: the named value first, the discarded one after it.
    text = (
        await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=line_of(modeling, "hidden_states, _ = self.self_attn("), character=8),
            )
        )
    ).contents.value
    names = [row.split("|")[1].strip() for row in text.splitlines() if row.startswith("| `")]
    assert names[:2] == ["`hidden_states`", "`hidden_states`"] and "`_`" in names[2:]


async def test_no_hover_on_a_line_without_calls(client: LanguageClient) -> None:
    assert await hover(client, line_of(EXAMPLE, "hidden_states = residual + hidden_states")) is None
