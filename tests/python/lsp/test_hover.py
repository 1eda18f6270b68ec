"""Hover on a traced line: a markdown table of the line's calls, then the calls nested inside them."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import EXAMPLE, line_of


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
    assert "2 calls on this line" in text
    assert "| call | class | shape | dtype | mean | std | min | max | NaN/Inf |" in text
    assert "| `layers.0.mlp` | TinyLlamaMLP | [1, 7, 64] | float32 |" in text
    assert "| `layers.1.mlp` | TinyLlamaMLP | [1, 7, 64] | float32 |" in text
    assert text.count("| 0 / 0 |") == 2
    assert result.range.start.line == result.range.end.line == line


async def test_hover_shows_inner_calls_below_the_line_s_own(client: LanguageClient) -> None:
    line = line_of(EXAMPLE, "return self.down_proj(gate * self.up_proj(hidden_states))")
    text = (await hover(client, line)).contents.value
    own, inner = text.split("**Inner calls**")
    assert "`layers.0.mlp.down_proj`" in own and "up_proj" not in own
    assert "| `layers.0.mlp.up_proj` | Linear | [1, 7, 128] | float32 |" in inner


async def test_hover_names_each_output_of_a_call_returning_a_tuple(client: LanguageClient) -> None:
    line = line_of(EXAMPLE, "hidden_states, _ = self.self_attn(")
    text = (await hover(client, line)).contents.value
    assert "| `layers.0.self_attn`[0] | TinyLlamaAttention | [1, 7, 64] | float32 |" in text
    assert "| `layers.0.self_attn`[1] | TinyLlamaAttention | [1, 4, 7, 7] | float32 |" in text


async def test_no_hover_on_a_line_without_calls(client: LanguageClient) -> None:
    assert await hover(client, line_of(EXAMPLE, "hidden_states = residual + hidden_states")) is None
