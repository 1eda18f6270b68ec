"""`modelTrace.maxTensorMB` / `maxTraceMB`: the traces the editor takes against a reference (full tensors) store
nothing over the limit, and the comparison with the reference still runs, on statistics for those tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from modeltrace.lsp.settings import Settings
from modeltrace.trace.storage import read_trace
from modeltrace.trace.tensors import SafetensorsFile

from .support import configure, REPOSITORY, copy_example, execute, line_of, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")

REFERENCE = REPOSITORY / "examples" / "reference" / "tiny_llama.mtrace"


async def test_max_tensor_mb_limits_what_a_reference_trace_stores(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.setReference", uri, str(REFERENCE)))["ok"]
    limit = 0.001  # MB: 1,048 bytes; the example's hidden states are 1,792
    try:
        configure(client, {"maxTensorMB": limit})
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        configure(client, {"maxTensorMB": 1024, "maxTraceMB": 8192})

    assert result["ok"], result
    trace = read_trace(result["trace"])
    assert trace.model["options"]["full_tensors"] and trace.model["options"]["max_tensor_bytes"] == int(limit * 2**20)
    leaves = [summary for record in trace.modules for summary in (*record.inputs, *record.outputs)]
    assert any(summary.not_stored for summary in leaves) and any(summary.tensor for summary in leaves)
    with SafetensorsFile(Path(result["trace"]) / "tensors.safetensors") as tensors:
        assert max(info.end - info.begin for info in tensors.tensors.values()) <= limit * 2**20
    # The same model as the reference: it matches, the large tensors on statistics (said in the hover).
    assert result["diff"]["match"] is True
    mlp_call = line_of(modeling_file, "hidden_states = self.mlp(hidden_states)")
    position = types.Position(line=mlp_call, character=8)
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)
    )
    assert "| statistics |" in hover.contents.value, hover.contents.value
    # and says which modules were compared by statistics only, and why
    assert "not stored in full" in hover.contents.value and "mlp" in hover.contents.value, hover.contents.value
    assert (await execute(client, "modelTrace.clear", uri))["ok"]


async def test_max_trace_mb_zero_stores_no_tensor(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.setReference", uri, str(REFERENCE)))["ok"]
    try:
        configure(client, {"maxTraceMB": 0})
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        configure(client, {"maxTensorMB": 1024, "maxTraceMB": 8192})

    assert result["ok"] and result["diff"]["match"] is True
    trace = read_trace(result["trace"])
    leaves = [summary for record in trace.modules for summary in (*record.inputs, *record.outputs)]
    assert leaves and all(summary.tensor is None and "limit per trace" in summary.not_stored for summary in leaves)
    assert not (Path(result["trace"]) / "tensors.safetensors").exists()
    assert (await execute(client, "modelTrace.clear", uri))["ok"]


async def test_limit_settings_parse_and_skip_bad_values() -> None:
    settings = Settings().updated({"maxTensorMB": 0.5, "maxTraceMB": 0})
    assert settings.max_tensor_mb == 0.5 and settings.max_trace_mb == 0
    assert Settings().max_tensor_mb == 1024 and Settings().max_trace_mb == 8192
    assert Settings().updated({"tensorMemoryMB": 256}).tensor_memory_mb == 256
    assert Settings().tensor_memory_mb == 1024
    for bad in (-1, "lots", None, True, float("nan"), float("inf")):
        assert Settings().updated({"maxTensorMB": bad, "maxTraceMB": bad}) == Settings()
