"""What the editor's settings send to the worker (`modelTrace.attention`, `modelTrace.follow`), and a failure's
cause handed to the client as data (`cause` in the command's answer), not read back from a message's text."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_lsp import LanguageClient

from modeltrace.trace.storage import read_trace

from .support import configure, MLP_FORWARD, copy_example, execute, inject_into_mlp_forward, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")

HELPERS = '''"""Helpers the model calls into: their lines are captured when the file is followed."""

import torch


def scaled(hidden_states: torch.Tensor) -> torch.Tensor:
    doubled = hidden_states * 2.0
    return doubled / 2.0
'''


async def test_the_attention_setting_reaches_the_worker(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, copy_example(tmp_path))
    try:
        configure(client, {"attention": "sdpa"})
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        configure(client, {"attention": "eager"})
    assert result["ok"], result
    assert read_trace(result["trace"]).model["options"]["attention"] == "sdpa"
    # and the default is the readable reference code
    again = await execute(client, "modelTrace.trace", uri)
    assert read_trace(again["trace"]).model["options"]["attention"] == "eager"


async def test_a_followed_file_gets_its_lines_captured(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    helpers = modeling_file.parent / "helpers.py"
    helpers.write_text(HELPERS)
    source = modeling_file.read_text()
    source = source.replace(
        "from .configuration_tiny_llama import TinyLlamaConfig",
        "from .configuration_tiny_llama import TinyLlamaConfig\nfrom .helpers import scaled",
    )
    modeling_file.write_text(
        source.replace(
            MLP_FORWARD,
            MLP_FORWARD.replace("        gate", "        hidden_states = scaled(hidden_states)\n        gate"),
        )
    )
    uri = open_document(client, modeling_file)
    helper_lines: dict[bool, set[str]] = {}
    try:
        for follow in (True, False):
            configure(client, {"lines": True, "follow": [str(helpers)] if follow else []})
            result = await execute(client, "modelTrace.trace", uri)
            assert result["ok"], result
            # NOTE: read now: the next trace of this document replaces the trace folder
            helper_lines[follow] = {
                record.name for record in read_trace(result["trace"]).lines if record.file == str(helpers.resolve())
            }
    finally:
        configure(client, {"lines": False, "follow": []})
    assert "doubled" in helper_lines[True] and not helper_lines[False], helper_lines


async def test_a_timeout_is_told_to_the_client_as_its_cause(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    inject_into_mlp_forward(client, modeling_file, uri, "while True: pass")
    try:
        configure(client, {"timeout": 3})
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        configure(client, {"timeout": 60})
    assert not result["ok"] and result["cause"] == "timeout", result
    assert "3 s timeout" in result["message"]
