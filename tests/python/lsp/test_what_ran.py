"""What ran, said where a user looks (issue #32, item 7), over a real server and worker: the hover's header and
the status (`ran`) name the config class, the traced sizes against the config's own, the tokens and the weights;
`modelTrace.fullSizes` shows the hints at the model's full sizes (a shape-only run of the unshrunk config,
cached per file), each marked `(full)`, while the hover keeps the traced values; and the log's noise is gone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from modeltrace.lsp.full_sizes import FULL_SIZES_FOLDER
from modeltrace.lsp.server import drop_routine_cancels
from modeltrace.lsp.settings import Settings
from modeltrace.trace.ran import what_ran

from .support import EXAMPLE, copy_example, execute, hover_text, inlay_hints, line_of, open_document, wait_until


session_loop = pytest.mark.asyncio(loop_scope="session")

# The example's config, made wider and deeper than the shrink keeps (hidden 64, 2 layers).
WIDER = {"hidden_size: int = 64": "hidden_size: int = 256", "num_hidden_layers: int = 2": "num_hidden_layers: int = 3"}


@session_loop
async def test_the_hover_and_the_status_say_what_ran(client: LanguageClient) -> None:
    line = line_of(EXAMPLE, "hidden_states = self.mlp(hidden_states)")
    text = await hover_text(client, client.example_uri, line)
    header = text.split("\n\n")[1]
    # TinyLlamaConfig's own sizes are the shrink's already: nothing is "of" a larger size
    assert header.startswith("Ran: TinyLlamaConfig")
    assert "hidden 64" in header and "layers 2" in header and "7 tokens" in header
    assert "random weights (seed 0)" in header
    assert "The hints show the traced run's sizes." in text
    assert "(full)" not in text


@session_loop
async def test_full_sizes_show_the_unshrunk_shapes_marked_and_keep_the_traced_values(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    configuration = modeling_file.parent / "configuration_tiny_llama.py"
    source = configuration.read_text()
    for old, new in WIDER.items():
        assert old in source
        source = source.replace(old, new)
    configuration.write_text(source)
    uri = open_document(client, modeling_file)
    statuses = len(client.recorder.statuses)
    assert (await execute(client, "modelTrace.trace", uri, timeout=120))["ok"]
    status = await wait_until(
        lambda: next((s for s in client.recorder.statuses[statuses:] if s.get("uri") == uri and "ran" in s), None)
    )
    assert "TinyLlamaConfig shrunk: hidden 64 of 256, layers 2 of 3" in status["ran"]
    assert status["sizes"] == "traced"
    mlp = line_of(modeling_file, "hidden_states = self.mlp(hidden_states)")
    assert (await inlay_hints(client, uri))[mlp] == ": [1,7,64]"

    answer = await execute(client, "modelTrace.fullSizes", uri, timeout=120)
    assert answer == {"ok": True, "sizes": "full"}
    hints = await inlay_hints(client, uri)
    assert hints[mlp] == ": [1,7,256] (full)"
    text = await hover_text(client, uri, mlp)
    assert "Ran: TinyLlamaConfig shrunk: hidden 64 of 256, layers 2 of 3" in text
    # the full-size model's 3 layers, shape-only; the traced run's 2 layers' values stay in the table
    assert "`[1, 7, 256] float32 ×3` (TinyLlamaConfig full size, shapes only (meta device): hidden 256" in text
    assert "| `layers.1.mlp` TinyLlamaMLP | [1,7,64] | float32 |" in text
    cached = list((client.trace_directory / FULL_SIZES_FOLDER).glob("modeling_tiny_llama-*.mtrace"))
    assert len(cached) >= 1

    # Toggled back: the traced sizes, unmarked; toggled again: the cached full-size trace, the same folders.
    assert (await execute(client, "modelTrace.fullSizes", uri))["sizes"] == "traced"
    assert (await inlay_hints(client, uri))[mlp] == ": [1,7,64]"
    assert (await execute(client, "modelTrace.fullSizes", uri, True))["sizes"] == "full"
    assert (await inlay_hints(client, uri))[mlp] == ": [1,7,256] (full)"
    assert list((client.trace_directory / FULL_SIZES_FOLDER).glob("modeling_tiny_llama-*.mtrace")) == cached
    assert (await execute(client, "modelTrace.fullSizes", uri, False))["sizes"] == "traced"

    # modelTrace.hintSizes: full: every trace comes with its full sizes (here from the cache), no command needed
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"hintSizes": "full"}})
    )
    try:
        statuses = len(client.recorder.statuses)
        assert (await execute(client, "modelTrace.trace", uri, timeout=120))["ok"]
        assert (await inlay_hints(client, uri))[mlp] == ": [1,7,256] (full)"
        (idle,) = [s for s in client.recorder.statuses[statuses:] if s.get("uri") == uri and s["state"] == "idle"]
        assert idle["sizes"] == "full"
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"hintSizes": "traced"}})
        )
    assert (await inlay_hints(client, uri))[mlp] == ": [1,7,64]"


@session_loop
async def test_full_sizes_need_a_trace_first(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    answer = await execute(client, "modelTrace.fullSizes", uri)
    assert answer["ok"] is False and "trace this file first" in answer["message"]


def test_what_ran_reads_a_header_of_any_age() -> None:
    header = {
        "recipe": None,
        "config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        "inputs": [{"key": "input_ids", "shape": [1, 7]}],
        "options": {"seed": 0, "checkpoint": None, "shape_only": False},
        "build": {
            "config_class": "Qwen3Config",
            "shrink": "tiny",
            "own_sizes": {"hidden_size": [64, 4096], "num_hidden_layers": [2, 36], "num_attention_heads": [4, 32]},
        },
    }
    assert what_ran(header) == (
        "Qwen3Config shrunk: hidden 64 of 4096, layers 2 of 36, heads 4 of 32 · 7 tokens · random weights (seed 0)"
    )
    # a header written before `config_class` and `own_sizes`: the sizes it ran at
    assert what_ran({**header, "build": {"shrink": "tiny"}}) == (
        "the model's config: hidden 64, layers 2, heads 4 · 7 tokens · random weights (seed 0)"
    )
    checkpoint = {**header, "build": {"config_class": "Qwen3Config"}, "options": {"checkpoint": "/ckpt", "seed": 0}}
    assert what_ran(checkpoint).endswith("checkpoint weights (/ckpt)")
    assert what_ran(checkpoint).startswith("Qwen3Config as is: hidden 64")


def test_default_settings_and_routine_cancels_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="modeltrace.lsp.settings"):
        settings = Settings().updated({"deviceMap": "", "checkpoint": "", "recipe": "", "config": ""})
    assert settings.device_map is None and caplog.records == []
    cancel = logging.LogRecord(
        "pygls", logging.WARNING, "", 0, 'Cancel notification for unknown message id "%s"', ("7",), None
    )
    other = logging.LogRecord("pygls", logging.WARNING, "", 0, "Received response to unknown message id", (), None)
    assert drop_routine_cancels(cancel) is False and drop_routine_cancels(other) is True
