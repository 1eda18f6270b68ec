"""Inlay hints: the shape of each assigned value right after its name, within VS Code's default 43 characters.

The session client traces without line capture (hints from module calls); `lines_trace` traces a copy of the
example with line capture and extra statements that stress the label rules (dozens of targets, nested tuples,
discarded names, another dtype).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import LanguageClient

from modeltrace.lsp.hints import STALE_SUFFIX, assignment_split
from modeltrace.trace.lines import HINT_MAX_LENGTH

from .support import EXAMPLE, MLP_FORWARD, copy_example, execute, inlay_hints, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")

# Statements put at the top of TinyLlamaMLP.forward (it runs once per layer: twice) in the `lines_trace` copy.
STRESS = [
    "wide_" + ", wide_".join(str(index) for index in range(30)) + " = hidden_states.expand(30, 7, 64).unbind(0)",
    "(outer, (inner_left, inner_right)), last = (hidden_states, (hidden_states[0], hidden_states[0, 0])), gate_in",
    "pieces = hidden_states.expand(30, 7, 64).unbind(0)",
    "_ = hidden_states * 2",
    "_unused = hidden_states + 1",
    "halved = hidden_states.half()",
    "a_rather_long_variable_name_for_the_hidden_states_after_the_projection = self.gate_proj(hidden_states)",
]


async def all_hints(client: LanguageClient, uri: str) -> list[types.InlayHint]:
    return (
        await client.text_document_inlay_hint_async(
            types.InlayHintParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=types.Range(
                    start=types.Position(line=0, character=0), end=types.Position(line=10_000, character=0)
                ),
            )
        )
        or []
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lines_trace(client: LanguageClient, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the example with the STRESS statements, traced with line capture; (modeling file, URI)."""
    modeling = copy_example(tmp_path_factory.mktemp("label-rules"))
    source = modeling.read_text()
    block = "".join(f"        {statement}\n" for statement in ["gate_in = hidden_states", *STRESS])
    assert source.count(MLP_FORWARD) == 1
    modeling.write_text(source.replace(MLP_FORWARD, MLP_FORWARD.replace("        gate", block + "        gate")))
    uri = open_document(client, modeling)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": True}})
    )
    try:
        result = await execute(client, "modelTrace.trace", uri)
        assert result["ok"], result
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": False}})
        )
    return modeling, uri


def name_before(text: str, hint: types.InlayHint) -> str:
    """The identifier that ends where `hint` sits (the name it labels)."""
    found = re.search(r"(\w+)$", text[: hint.position.character])
    return found.group(1) if found else ""


def hints_on(hints: list[types.InlayHint], line: int) -> list[types.InlayHint]:
    return sorted((hint for hint in hints if hint.position.line == line), key=lambda hint: hint.position.character)


async def test_a_module_call_s_shape_sits_right_after_the_assigned_name(client: LanguageClient) -> None:
    mlp_line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    (hint,) = hints_on(await all_hints(client, client.example_uri), mlp_line)
    text = EXAMPLE.read_text().splitlines()[mlp_line]
    # `hidden_states: [1,7,64] = self.mlp(...)`: compact, no float32 (the model's dtype), no ×2 (in the hover).
    assert hint.label == ": [1,7,64]"
    assert hint.position.character == text.index("hidden_states") + len("hidden_states")
    assert hint.kind == types.InlayHintKind.Type and not hint.padding_left


async def test_labels_of_the_example(client: LanguageClient) -> None:
    hints = await inlay_hints(client, client.example_uri)
    assert hints[line_of(EXAMPLE, "gate = self.activation(self.gate_proj(hidden_states))")] == ": [1,7,128]"
    # A line without an assignment target: one bounded label at its end.
    assert hints[line_of(EXAMPLE, "return self.down_proj(gate * self.up_proj(hidden_states))")] == "→ [1,7,64]"
    assert hints[line_of(EXAMPLE, "inputs_embeds = self.embed_tokens(input_ids)")] == ": [1,7,64]"
    # `hidden_states, _ = self.self_attn(...)`: each output after its target, none for `_`.
    assert hints[line_of(EXAMPLE, "hidden_states, _ = self.self_attn(")] == ": [1,7,64]"
    # Lines that run no module show nothing: the class line, a plain tensor operation.
    assert line_of(EXAMPLE, "class TinyLlamaMLP") not in hints
    assert line_of(EXAMPLE, "hidden_states = residual + hidden_states") not in hints


async def test_the_end_of_line_placement_keeps_the_full_label(client: LanguageClient) -> None:
    mlp_line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    refreshes = client.recorder.inlay_hint_refreshes
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"hintPlacement": "endOfLine"}})
    )
    try:
        await wait_until(lambda: client.recorder.inlay_hint_refreshes > refreshes)
        (hint,) = hints_on(await all_hints(client, client.example_uri), mlp_line)
        assert hint.label == "→ [1, 7, 64] float32 ×2"
        assert hint.position.character == len(EXAMPLE.read_text().splitlines()[mlp_line]) and hint.padding_left
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"hintPlacement": "afterName"}})
        )


async def test_line_capture_labels_each_assigned_name(client: LanguageClient, lines_trace: tuple[Path, str]) -> None:
    modeling, uri = lines_trace
    hints = await all_hints(client, uri)
    lines = modeling.read_text().splitlines()

    def labelled(snippet: str) -> list[tuple[str, str]]:
        """(the code right before each hint, its label) on the line holding `snippet`."""
        line = line_of(modeling, snippet)
        return [(name_before(lines[line], hint), hint.label) for hint in hints_on(hints, line)]

    # The assigned value (after the transpose), not q_proj's output; visible at the left of a long line.
    assert labelled("query_states = self.q_proj(hidden_states)") == [("query_states", ": [1,4,7,16]")]
    assert labelled("cos, sin = position_embeddings") == [("cos", ": [1,7,16]"), ("sin", ": [1,7,16]")]
    # One call (the model's norm, once) and many (the MLP's lines, once per layer) read the same: no count.
    assert labelled("hidden_states = self.norm(hidden_states)") == [("hidden_states", ": [1,7,64]")]
    assert labelled("gate = self.activation(") == [("gate", ": [1,7,128]")]
    # `_` and `_unused` are thrown away: no label; a dtype other than the model's is named.
    assert labelled("_ = hidden_states * 2") == []
    assert labelled("_unused = hidden_states + 1") == []
    assert labelled("halved = hidden_states.half()") == [("halved", ": [1,7,64] float16")]
    long_name = "a_rather_long_variable_name_for_the_hidden_states_after_the_projection"
    assert labelled(f"{long_name} = ") == [(long_name, ": [1,7,128]")]


async def test_bad_input_keeps_labels_bounded_and_right(client: LanguageClient, lines_trace: tuple[Path, str]) -> None:
    modeling, uri = lines_trace
    hints = await all_hints(client, uri)
    assert hints and all(len(hint.label) <= HINT_MAX_LENGTH for hint in hints), [
        hint.label for hint in hints if len(hint.label) > HINT_MAX_LENGTH
    ]
    lines = modeling.read_text().splitlines()
    # Thirty targets: six named hints, then one that counts the rest (listed in the hover).
    wide = hints_on(hints, line_of(modeling, "wide_0, wide_1"))
    assert [hint.label for hint in wide] == [": [7,64]"] * 6 + [" +24 more (hover)"]
    assert [name_before(lines[wide[0].position.line], hint) for hint in wide[:6]] == [f"wide_{i}" for i in range(6)]
    # Tuples nested in tuples: every name gets its own value, at its own place.
    nested_line = line_of(modeling, "(outer, (inner_left, inner_right)), last")
    nested = {name_before(lines[nested_line], hint): hint.label for hint in hints_on(hints, nested_line)}
    assert nested == {"outer": ": [1,7,64]", "inner_left": ": [7,64]", "inner_right": ": [64]", "last": ": [1,7,64]"}
    # A tuple of thirty tensors: whole shapes, then `…`; never a shape cut in the middle.
    (pieces,) = hints_on(hints, line_of(modeling, "pieces = hidden_states.expand"))
    assert pieces.label.startswith(": [7,64], [7,64], ") and pieces.label.endswith(", …")
    assert all(part == "[7,64]" for part in pieces.label[2:].split(", ")[:-1])


async def test_a_file_edited_since_the_trace_marks_its_hints_stale(
    client: LanguageClient, lines_trace: tuple[Path, str]
) -> None:
    modeling, uri = lines_trace
    before = {hint.position.line: hint for hint in await all_hints(client, uri)}
    query_line = line_of(modeling, "query_states = self.q_proj(hidden_states)")
    # Rename the variable on the query line: that line has changed, so its hint goes (never a wrong name).
    lines = modeling.read_text().splitlines()
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=query_line, character=0),
                        end=types.Position(line=query_line, character=len(lines[query_line])),
                    ),
                    text=lines[query_line].replace("query_states =", "queries ="),
                )
            ],
        )
    )
    after = await all_hints(client, uri)
    assert query_line in before and not hints_on(after, query_line)
    values = [hint for hint in after if not hint.label.endswith("more (hover)")]
    assert values and all(hint.label.endswith(STALE_SUFFIX) and len(hint.label) <= HINT_MAX_LENGTH for hint in values)


async def test_assignment_targets_end_at_the_statement_s_own_equals_sign() -> None:
    assert assignment_split("x = f(a=1)") == 2
    assert assignment_split("f(a=1, b == c)") is None
    assert assignment_split("if a == b or c <= d:") is None
    assert assignment_split("total += value") == 6
    assert assignment_split("mask <<= 1") == 5
    assert assignment_split("scale: float = 1.0") == 13
    assert assignment_split("text = 'a = b'  # c = d") == 5
    assert assignment_split("# a = b") is None
    assert assignment_split("(y := 3)") is None


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
    assert "| `layers.0.mlp` TinyLlamaMLP | [1,7,64] | float32 |" in resolved.tooltip.value


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
    assert hints[line_of(dependency, "gate = self.activation(")] == ": [1,7,128]"
    open_document(client, dependency)
    assert await inlay_hints(client, dependency_uri) == hints
