"""Inlay hints: one per traced line, at its end, for any requested range, in every file the trace touched."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import LanguageClient

from .support import EXAMPLE, copy_example, execute, inlay_hints, line_of, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_traced_line_shows_its_output_at_the_end_of_the_line(client: LanguageClient) -> None:
    mlp_line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=client.example_uri),
            range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=400, character=0)),
        )
    )
    hint = next(hint for hint in hints if hint.position.line == mlp_line)
    assert hint.label == "→ [1, 7, 64] float32 ×2"
    assert hint.position.character == len(EXAMPLE.read_text().splitlines()[mlp_line])
    assert hint.padding_left


async def test_labels_of_the_example(client: LanguageClient) -> None:
    hints = await inlay_hints(client, client.example_uri)
    assert (
        hints[line_of(EXAMPLE, "gate = self.activation(self.gate_proj(hidden_states))")] == "→ [1, 7, 128] float32 ×2"
    )
    assert (
        hints[line_of(EXAMPLE, "return self.down_proj(gate * self.up_proj(hidden_states))")]
        == "→ [1, 7, 64] float32 ×2"
    )
    assert hints[line_of(EXAMPLE, "inputs_embeds = self.embed_tokens(input_ids)")] == "→ [1, 7, 64] float32"
    assert hints[line_of(EXAMPLE, "hidden_states = self.norm(hidden_states)")] == "→ [1, 7, 64] float32"
    # Lines that run no module show nothing: the class line, a plain tensor operation.
    assert line_of(EXAMPLE, "class TinyLlamaMLP") not in hints
    assert line_of(EXAMPLE, "hidden_states = residual + hidden_states") not in hints


async def test_a_range_not_starting_at_the_top_gets_the_hints_of_its_own_lines(client: LanguageClient) -> None:
    everything = await inlay_hints(client, client.example_uri)
    first = line_of(EXAMPLE, "class TinyLlamaDecoderLayer")
    last = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    visible = await inlay_hints(client, client.example_uri, first, last)
    assert visible == {line: label for line, label in everything.items() if first <= line <= last}
    assert last in visible and len(visible) == 4


async def test_a_range_ending_at_the_start_of_a_line_leaves_that_line_out(client: LanguageClient) -> None:
    mlp_line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=client.example_uri),
            range=types.Range(
                start=types.Position(line=mlp_line - 1, character=0), end=types.Position(line=mlp_line, character=0)
            ),
        )
    )
    assert [hint.position.line for hint in hints] == [mlp_line - 1]


async def test_the_tooltip_is_the_table_of_calls(client: LanguageClient) -> None:
    mlp_line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=client.example_uri),
            range=types.Range(
                start=types.Position(line=mlp_line, character=0), end=types.Position(line=mlp_line, character=200)
            ),
        )
    )
    resolved = await client.inlay_hint_resolve_async(hints[0])
    assert resolved.tooltip.kind == types.MarkupKind.Markdown
    assert "| `layers.0.mlp` | TinyLlamaMLP | [1, 7, 64] | float32 |" in resolved.tooltip.value


def _move_class_to_its_own_module(modeling_file: Path, class_name: str) -> Path:
    """Cut `class_name` out of the modeling file into a sibling module that the modeling file imports."""
    source = modeling_file.read_text()
    lines = source.splitlines(keepends=True)
    definition = next(
        node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == class_name
    )
    header = (
        "import torch\nfrom torch import nn\nfrom transformers.activations import ACT2FN\n\n"
        "from .configuration_tiny_llama import TinyLlamaConfig\n\n\n"
    )
    module = modeling_file.with_name("mlp.py")
    module.write_text(header + "".join(lines[definition.lineno - 1 : definition.end_lineno]))
    remaining = lines[: definition.lineno - 1] + [f"from .mlp import {class_name}\n"] + lines[definition.end_lineno :]
    modeling_file.write_text("".join(remaining))
    return module


async def test_files_a_trace_went_through_show_their_hints_too(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    dependency = _move_class_to_its_own_module(modeling_file, "TinyLlamaMLP")
    uri = open_document(client, modeling_file)
    result = await execute(client, "modelTrace.trace", uri)
    assert result["ok"], result
    # The dependency was never opened: its hints come from the same trace, keyed by its resolved path.
    dependency_uri = from_fs_path(str(dependency))
    hints = await inlay_hints(client, dependency_uri)
    assert hints[line_of(dependency, "gate = self.activation(")] == "→ [1, 7, 128] float32 ×2"
    open_document(client, dependency)
    assert await inlay_hints(client, dependency_uri) == hints
