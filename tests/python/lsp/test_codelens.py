"""Code lenses: "▶ Trace forward" above every module class (found without importing the file), "Clear trace"."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import EXAMPLE, copy_example, execute, inlay_hints, line_of, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")


async def code_lenses(client: LanguageClient, uri: str) -> list[types.CodeLens]:
    return await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


async def test_one_trace_lens_per_module_class(client: LanguageClient) -> None:
    uri = client.example_uri
    lenses = [lens for lens in await code_lenses(client, uri) if lens.command.command == "modelTrace.trace"]
    assert {lens.command.title for lens in lenses} == {"▶ Trace forward"}
    by_line = {lens.range.start.line: list(lens.command.arguments) for lens in lenses}
    # Models are traced as they are; any other module through the file's base model, named to be highlighted.
    assert by_line[line_of(EXAMPLE, "class TinyLlamaModel(")] == [uri, "TinyLlamaModel"]
    assert by_line[line_of(EXAMPLE, "class TinyLlamaForCausalLM(")] == [uri, "TinyLlamaForCausalLM"]
    assert by_line[line_of(EXAMPLE, "class TinyLlamaMLP(")] == [uri, "TinyLlamaModel", "TinyLlamaMLP"]
    assert by_line[line_of(EXAMPLE, "class TinyLlamaDecoderLayer(")] == [
        uri,
        "TinyLlamaModel",
        "TinyLlamaDecoderLayer",
    ]
    assert by_line[line_of(EXAMPLE, "class TinyLlamaPreTrainedModel(")] == [
        uri,
        "TinyLlamaModel",
        "TinyLlamaPreTrainedModel",
    ]
    assert len(by_line) == 8  # RMSNorm, rotary embedding, MLP, attention, decoder layer, and the three models


async def test_generate_and_backward_lenses_above_model_classes(client: LanguageClient, tmp_path: Path) -> None:
    uri = client.example_uri
    lenses = await code_lenses(client, uri)
    backward = [lens for lens in lenses if lens.command.command == "modelTrace.traceBackward"]
    # the example's head does not derive from GenerationMixin: no "Trace generate"
    assert not [lens for lens in lenses if lens.command.command == "modelTrace.traceGenerate"]
    modeling_file = copy_example(tmp_path)
    text = modeling_file.read_text()
    modeling_file.write_text(
        text.replace(
            "class TinyLlamaForCausalLM(TinyLlamaPreTrainedModel):",
            "class TinyLlamaForCausalLM(TinyLlamaPreTrainedModel, GenerationMixin):",
        )
    )
    copied = open_document(client, modeling_file)
    generate = [
        lens for lens in await code_lenses(client, copied) if lens.command.command == "modelTrace.traceGenerate"
    ]
    assert [(lens.command.title, lens.range.start.line, list(lens.command.arguments)) for lens in generate] == [
        ("▶ Trace generate", line_of(EXAMPLE, "class TinyLlamaForCausalLM("), [copied, "TinyLlamaForCausalLM"])
    ]
    assert {lens.command.title for lens in backward} == {"▶ Trace forward + backward"}
    assert {tuple(lens.command.arguments) for lens in backward} == {
        (uri, "TinyLlamaModel"),
        (uri, "TinyLlamaForCausalLM"),
    }


async def test_clear_removes_the_hints_and_load_trace_brings_them_back(client: LanguageClient) -> None:
    uri = client.example_uri
    clear = [lens for lens in await code_lenses(client, uri) if lens.command.command == "modelTrace.clear"]
    assert [lens.command.title for lens in clear] == ["✕ Clear trace"]
    assert list(clear[0].command.arguments) == [uri]
    assert clear[0].range.start.line == line_of(EXAMPLE, "class TinyLlamaModel(")
    hints = await inlay_hints(client, uri)

    assert (await execute(client, "modelTrace.clear", uri))["ok"]
    assert await inlay_hints(client, uri) == {}
    assert not [lens for lens in await code_lenses(client, uri) if lens.command.command == "modelTrace.clear"]

    # A trace on disk (from the CLI, CI, or this server's trace folder) can be shown again without tracing.
    loaded = await execute(client, "modelTrace.loadTrace", uri, client.example_trace["trace"])
    assert {key: loaded[key] for key in ("ok", "modelClass", "modules")} == {
        "ok": True,
        "modelClass": "TinyLlamaModel",
        "modules": 30,
    }
    # the trace was made here: every file it names is where it recorded it, unchanged
    assert {(item["how"], item["changed"]) for item in loaded["files"]} == {("recorded path", False)}
    assert await inlay_hints(client, uri) == hints


async def test_lenses_of_a_file_that_does_not_parse_stay_as_they_were(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    before = await code_lenses(client, uri)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
                    ),
                    text="def broken(:\n",
                )
            ],
        )
    )
    after = await code_lenses(client, uri)
    assert [lens.command.arguments for lens in after] == [lens.command.arguments for lens in before]
    assert len([lens for lens in after if lens.command.command == "modelTrace.trace"]) == 8


TINY_BLOCK = """import torch
from torch import nn


class TinyBlock(nn.Module):
    def __init__(self, dim, hidden, activation):
        super().__init__()
        self.activation = activation
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        hidden = torch.relu(self.up(x))
        return self.down(hidden)
"""

TINY_BLOCK_RECIPE = """import torch

from block import TinyBlock


def build_model():
    return TinyBlock(8, 16, torch.relu)


def build_inputs(model):
    return {"x": torch.randn(2, 3, 8)}
"""


async def test_a_module_only_a_recipe_builds_says_so_on_its_lens_and_traces_with_the_recipe_setting(
    client: LanguageClient, tmp_path: Path
) -> None:
    block = tmp_path / "block.py"
    block.write_text(TINY_BLOCK)
    (tmp_path / "recipe_block.py").write_text(TINY_BLOCK_RECIPE)
    uri = open_document(client, block)

    (lens,) = [lens for lens in await code_lenses(client, uri) if lens.command.command == "modelTrace.trace"]
    # `activation` says nothing ModelTrace can choose (`dim` and `hidden` alone would be 64 and 128)
    assert lens.command.title == "▶ Trace forward (needs a recipe)"
    failed = await execute(client, "modelTrace.trace", *lens.command.arguments)
    # The advice names the editor's setting, not a command-line flag.
    assert not failed["ok"] and "modelTrace.recipe" in failed["message"], failed
    assert "--recipe" not in failed["message"] and "--config" not in failed["message"]

    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"recipe": str(tmp_path / "recipe_block.py")}})
    )
    try:
        (lens,) = [lens for lens in await code_lenses(client, uri) if lens.command.command == "modelTrace.trace"]
        assert lens.command.title == "▶ Trace forward"
        traced = await execute(client, "modelTrace.trace", *lens.command.arguments)
        assert traced["ok"] and traced["modelClass"] == "TinyBlock", traced
        hints = await inlay_hints(client, uri)
        assert "[2,3,16]" in hints[line_of(block, "hidden = torch.relu(")], hints
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"recipe": ""}})
        )
        assert (await execute(client, "modelTrace.clear", uri))["ok"]
