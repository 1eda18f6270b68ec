"""Recipes and the project file in the editor, through a real server: "Create recipe…" after a failed trace (the
failure's button and the class's lens), the recipe traced when saved, and a broken project file or recipe shown on
its own line while the last good trace stays.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import LanguageClient

from .support import execute, inlay_hints, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")


# `scale` says nothing ModelTrace can choose: only a recipe builds this class (`dim` alone would be 64).
SCALED_BLOCK = """import torch
from torch import nn


class ScaledBlock(nn.Module):
    def __init__(self, dim, scale):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.scale = scale

    def forward(self, x):
        projected = self.proj(x) * self.scale
        return torch.relu(projected)
"""

# Plain arguments only: built unaided with dim=64, hidden=128, num_heads=4.
TINY_BLOCK = """import torch
from torch import nn


class TinyBlock(nn.Module):
    def __init__(self, dim, hidden, num_heads: int = 8):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.num_heads = num_heads

    def forward(self, x):
        hidden = torch.relu(self.up(x))
        return self.down(hidden)
"""


async def _lenses(client: LanguageClient, uri: str) -> list[types.CodeLens]:
    return await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


def _save(client: LanguageClient, path: Path) -> None:
    client.text_document_did_save(
        types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=from_fs_path(str(path))))
    )


def _changed(client: LanguageClient, path: Path) -> None:
    """What VS Code's file watcher says when a project file changes on disk."""
    client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=from_fs_path(str(path)), type=types.FileChangeType.Changed)]
        )
    )


async def _hints_on(client: LanguageClient, uri: str, line: int, timeout: float = 60) -> str:
    """The hint label of `line`, once the server shows one (a trace started by a save runs in the background)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        label = (await inlay_hints(client, uri)).get(line)
        if label:
            return label
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no hint on line {line} after {timeout} s")
        await asyncio.sleep(0.1)


async def test_create_recipe_after_a_failed_build_writes_registers_opens_and_traces_on_save(
    client: LanguageClient, tmp_path: Path
) -> None:
    requests = client.recorder.message_requests  # type: ignore[attr-defined]
    block = tmp_path / "block.py"
    block.write_text(SCALED_BLOCK)
    uri = open_document(client, block)

    titles = [lens.command.title for lens in await _lenses(client, uri)]
    assert titles[:2] == ["▶ Trace forward (needs a recipe)", "Create recipe…"], titles

    asked = len(requests)
    failed = await execute(client, "modelTrace.trace", uri, "ScaledBlock")
    assert not failed["ok"] and failed["needsRecipe"] == "ScaledBlock", failed
    # No message in the editor tells the user to pass a command-line flag.
    assert "--recipe" not in failed["message"] and "--config" not in failed["message"], failed
    assert "pass --" not in failed["message"], failed
    assert failed["message"].endswith("Create recipe… writes one for ScaledBlock from what ModelTrace tried"), failed
    # The error sits on the `__init__` that takes what ModelTrace cannot choose.
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(uri))
    assert diagnostic.range.start.line == line_of(block, "def __init__(self, dim, scale)"), diagnostic
    assert "scale" in diagnostic.message and "--" not in diagnostic.message, diagnostic
    offer = await wait_until(lambda: requests[asked:])
    assert [action.title for action in offer[0].actions] == ["Create recipe…"], offer

    created = await execute(client, "modelTrace.createRecipe", uri, "ScaledBlock")
    assert created["ok"] and created["todo"] == ["scale"], created
    recipe = Path(created["recipe"])
    assert recipe.parent == tmp_path and recipe.name == "block_ScaledBlock_recipe.py"
    text = recipe.read_text()
    # Filled in from what the worker tried: the width it guessed, the input it synthesised, the argument it could not.
    assert "dim=64," in text and '"x": torch.randn((1, 7, 64)),' in text, text
    scale_line = text.splitlines()[created["todoLines"][0]]
    assert scale_line.strip().startswith("scale=None,  # TODO"), scale_line
    project = Path(created["projectFile"])
    assert project == tmp_path / "modeltrace.toml"
    assert 'file = "block.py"' in project.read_text() and f'recipe = "{recipe.name}"' in project.read_text()

    # A second recipe never overwrites the first; the project file names the newest.
    again = await execute(client, "modelTrace.createRecipe", uri, "ScaledBlock")
    second = Path(again["recipe"])
    assert second.name == "block_ScaledBlock_recipe_2.py" and recipe.read_text() == text, again
    assert f'recipe = "{second.name}"' in project.read_text()

    second.write_text(second.read_text().replace("scale=None,", "scale=2.0,"))
    _save(client, second)
    label = await _hints_on(client, uri, line_of(block, "projected = self.proj(x)"))
    assert "[1,7,64]" in label, label


async def test_a_plain_module_is_built_from_its_argument_names(client: LanguageClient, tmp_path: Path) -> None:
    block = tmp_path / "tiny_block.py"
    block.write_text(TINY_BLOCK)
    uri = open_document(client, block)
    (trace_lens,) = [lens for lens in await _lenses(client, uri) if lens.command.command == "modelTrace.trace"]
    assert trace_lens.command.title == "▶ Trace forward"
    traced = await execute(client, "modelTrace.trace", *trace_lens.command.arguments)
    assert traced["ok"] and traced["modelClass"] == "TinyBlock", traced
    hints = await inlay_hints(client, uri)
    assert "[1,7,128]" in hints[line_of(block, "hidden = torch.relu(")], hints


async def test_a_broken_project_file_or_recipe_is_shown_on_its_line_and_the_last_trace_stays(
    client: LanguageClient, tmp_path: Path
) -> None:
    block = tmp_path / "tiny_block.py"
    block.write_text(TINY_BLOCK)
    uri = open_document(client, block)
    assert (await execute(client, "modelTrace.trace", uri, "TinyBlock"))["ok"]
    hinted = line_of(block, "hidden = torch.relu(")
    before = (await inlay_hints(client, uri))[hinted]

    project = tmp_path / "modeltrace.toml"
    project_uri = from_fs_path(str(project))
    project.write_text('[[model]]\nfile = "tiny_block.py"\nrecipes = "recipe.py"\n')
    failed = await execute(client, "modelTrace.trace", uri, "TinyBlock")
    assert not failed["ok"] and "unknown key `recipes`" in failed["message"], failed
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(project_uri))
    assert diagnostic.range.start.line == 2 and "recipes" in diagnostic.message, diagnostic
    assert (await inlay_hints(client, uri))[hinted] == before

    # Edited on disk (the client watches project files): still broken, the diagnostic moves to where it is now ...
    project.write_text('[[model]]\nfile = "tiny_block.py"\nrecipe = "recipe.py"\n')
    _changed(client, project)
    (diagnostic,) = await wait_until(
        lambda: [item for item in client.diagnostics.get(project_uri, []) if "not there" in item.message]
    )
    assert diagnostic.range.start.line == 2 and "recipe.py" in diagnostic.message, diagnostic
    # ... and fixed, it goes without waiting for a trace.
    recipe = tmp_path / "recipe.py"
    recipe.write_text("import torch\n\n\ndef build_model():\n    raise ValueError('no model here')\n")
    _changed(client, project)
    await wait_until(lambda: not client.diagnostics.get(project_uri))
    failed = await execute(client, "modelTrace.trace", uri, "TinyBlock")
    assert not failed["ok"], failed
    recipe_uri = from_fs_path(str(recipe))
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(recipe_uri))
    assert diagnostic.range.start.line == 0 and "build_inputs" in diagnostic.message, diagnostic
    assert (await inlay_hints(client, uri))[hinted] == before

    recipe.write_text(
        "import torch\n\nfrom tiny_block import TinyBlock\n\n\ndef build_model():\n    raise ValueError('no model here')"
        "\n\n\ndef build_inputs(model):\n    return {'x': torch.randn(1, 3, 8)}\n"
    )
    failed = await execute(client, "modelTrace.trace", uri, "TinyBlock")
    assert not failed["ok"] and "no model here" in failed["message"], failed
    (diagnostic,) = await wait_until(
        lambda: [item for item in client.diagnostics.get(recipe_uri, []) if item.range.start.line == 6]
    )
    assert "ValueError" in diagnostic.message, diagnostic

    recipe.write_text(recipe.read_text().replace("raise ValueError('no model here')", "return TinyBlock(8, 16)"))
    traced = await execute(client, "modelTrace.trace", uri, "TinyBlock")
    assert traced["ok"], traced
    await wait_until(lambda: not client.diagnostics.get(recipe_uri))
    assert "[1,3,16]" in (await inlay_hints(client, uri))[hinted]


async def test_a_project_file_broken_on_disk_is_shown_before_any_trace_reads_it(
    client: LanguageClient, tmp_path: Path
) -> None:
    """Saving a broken project file beside a traced model shows it on its line at once; the trace stays."""
    block = tmp_path / "tiny_block.py"
    block.write_text(TINY_BLOCK)
    uri = open_document(client, block)
    assert (await execute(client, "modelTrace.trace", uri, "TinyBlock"))["ok"]
    hinted = line_of(block, "hidden = torch.relu(")
    before = (await inlay_hints(client, uri))[hinted]

    project = tmp_path / "modeltrace.toml"
    project_uri = from_fs_path(str(project))
    project.write_text('atol = 1e-3\n\n[[model]]\nfile = "tiny_block.py"\nclas = "TinyBlock"\n')
    _changed(client, project)
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(project_uri))
    assert diagnostic.range.start.line == 4 and "clas" in diagnostic.message, diagnostic
    assert (await inlay_hints(client, uri))[hinted] == before

    project.write_text('atol = 1e-3\n\n[[model]]\nfile = "tiny_block.py"\nclass = "TinyBlock"\n')
    _changed(client, project)
    await wait_until(lambda: not client.diagnostics.get(project_uri))
    assert (await inlay_hints(client, uri))[hinted] == before
