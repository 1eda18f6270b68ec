"""A trace whose parameters' store file is gone loads in the editor as any other ("Load Trace…"): its hints show,
and the answer and the message say the parameters are missing, naming the file. Run against the server without
torch (reading a trace runs no code)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_lsp import LanguageClient

from modeltrace.trace.storage import read_trace, write_trace

from .support import execute, open_document
from .test_hostile_inputs import _trace_naming


pytestmark = pytest.mark.asyncio(loop_scope="session")


def _trace_with_parameters_in(folder: Path, source: Path, store: Path) -> Path:
    trace_path = _trace_naming(folder, source, "0" * 64)
    trace = read_trace(trace_path)
    trace.model["parameters"] = {"store": str(store), "file": "0123abcd.safetensors", "digest": "sha256:0123abcd"}
    return write_trace(trace, trace_path)


async def test_a_trace_whose_parameters_are_gone_loads_and_says_so(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    source = tmp_path / "modeling.py"
    source.write_text("import torch\nhidden = layer(x)\n")
    trace = _trace_with_parameters_in(tmp_path / "gone.mtrace", source, tmp_path / "deleted-store")
    uri = open_document(restricted_client, source)

    answer = await execute(restricted_client, "modelTrace.loadTrace", uri, str(trace))

    assert answer["ok"] is True and answer["modules"] == 1
    assert "parameters are missing" in answer["parameters"]
    assert str(tmp_path / "deleted-store" / "0123abcd.safetensors") in answer["parameters"]
    messages = [message.message for message in restricted_client.messages]
    assert any("parameters are missing" in message for message in messages)
