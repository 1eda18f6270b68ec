"""`modelTrace.traceGenerate` and `modelTrace.traceBackward`: hints and hovers show the step, and gradient rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import transformers
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import copy_example, execute, inlay_hints, line_of, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")


async def hover_text(client: LanguageClient, uri: str, line: int) -> str:
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=4)
        )
    )
    assert hover is not None
    return hover.contents.value


async def test_trace_generate_shows_prefill_and_decode_steps(client: LanguageClient, tmp_path: Path) -> None:
    folder = tmp_path / "gpt2"
    shutil.copytree(
        Path(transformers.__file__).resolve().parent / "models" / "gpt2",
        folder,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    modeling_file = folder / "modeling_gpt2.py"
    uri = open_document(client, modeling_file)
    result = await execute(client, "modelTrace.traceGenerate", uri, "GPT2LMHeadModel", timeout=300)
    assert result["ok"] is True, result
    reports = [
        report.message for reports in client.progress_reports.values() for report in reports if report.kind == "report"
    ]
    assert "prefill done" in reports and "decode step 4 of 4" in reports  # progress per step
    hints = await inlay_hints(client, uri)
    line = line_of(modeling_file, "attn_output = self.c_proj(attn_output)")
    # the prompt's shape in the prefill, one position per decode step (4 by default: modelTrace.generateSteps)
    assert "prefill [1,7," in hints[line], hints[line]
    assert "decode [1,1," in hints[line] and "×4" in hints[line], hints[line]
    text = await hover_text(client, uri, line)
    assert "**Generation steps** (5 steps: the prefill and 4 decode steps)" in text
    assert "| prefill |" in text and "| decode 4 |" in text


async def test_trace_backward_shows_gradient_rows_and_flags(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    result = await execute(client, "modelTrace.traceBackward", uri, "TinyLlamaForCausalLM", timeout=300)
    assert result["ok"] is True, result
    hints = await inlay_hints(client, uri)
    line = line_of(modeling_file, "logits = self.lm_head(outputs.last_hidden_state)")
    assert "∇ [1,7," in hints[line] and "max|g|" in hints[line], hints[line]
    text = await hover_text(client, uri, line)
    assert "**Gradients** (loss" in text and "0.5 * mean(output ** 2)" in text
    assert "weight max" in text  # lm_head's own parameter gradient
    # the setting turns the gradient row off
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"gradientHints": False}})
    )
    try:
        hints = await inlay_hints(client, uri)
        assert "∇" not in hints.get(line, "")
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"gradientHints": True}})
        )
