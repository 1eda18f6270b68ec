"""Recorder problems as pulled diagnostics and quick fixes (static: works in an untrusted workspace, no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import EXAMPLE, open_document


def _apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.splitlines(keepends=True)
    for edit in sorted(edits, key=lambda e: e.range.start.line, reverse=True):
        assert edit.range.start.character == 0 and edit.range.end.character == 0
        lines[edit.range.start.line : edit.range.end.line] = edit.new_text.splitlines(keepends=True)
    return "".join(lines)


async def _diagnostics(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    report = await client.text_document_diagnostic_async(
        types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return list(report.items)


@pytest.mark.asyncio(loop_scope="session")
async def test_missing_recorder_diagnostic_and_quick_fix(restricted_client: LanguageClient, tmp_path: Path) -> None:
    client = restricted_client
    original = EXAMPLE.read_text()
    assert '"attentions": TinyLlamaAttention,\n' in original
    broken = original.replace('        "attentions": TinyLlamaAttention,\n', "")
    path = tmp_path / "modeling_tiny_llama.py"
    path.write_text(broken)
    uri = open_document(client, path)

    assert await _diagnostics(client, open_document(client, EXAMPLE)) == []
    [diagnostic] = await _diagnostics(client, uri)
    assert diagnostic.code == "missing-recorder" and diagnostic.source == "ModelTrace recorders"
    assert "attentions" in diagnostic.message

    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic], only=[types.CodeActionKind.QuickFix]),
        )
    )
    [action] = actions
    assert action.kind == types.CodeActionKind.QuickFix and "TinyLlamaAttention" in action.title
    assert _apply(broken, action.edit.changes[uri]) == original

    # after the edit the diagnostic is gone
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=original)],
        )
    )
    assert await _diagnostics(client, uri) == []


@pytest.mark.asyncio(loop_scope="session")
async def test_syntax_error_gives_no_diagnostic(restricted_client: LanguageClient, tmp_path: Path) -> None:
    path = tmp_path / "modeling_broken.py"
    path.write_text("from transformers.utils.output_capturing import capture_outputs\nclass X(:\n")
    uri = open_document(restricted_client, path)
    assert await _diagnostics(restricted_client, uri) == []
