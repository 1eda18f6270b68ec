"""Everything shown about a trace goes stale together on an edit: gutter marks and diagnostics move with their
unchanged lines and say they are stale, those on changed lines go (a fixed line loses its error at once), the
status says the trace is stale; the next trace replaces them all."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from modeltrace.lsp.stale import STALE_NOTE

from .support import copy_example, execute, inject_into_mlp_forward, line_of, open_document, wait_until
from .test_edits import edit
from .test_reference import REFERENCE, copy_port, warnings


pytestmark = pytest.mark.asyncio(loop_scope="session")

HEADER = "# a comment\n# another one\n"


def latest_marks(client: LanguageClient, count: int, uri: str) -> dict[int, dict] | None:
    """The latest `modelTrace/lineStatus` of `uri` after the first `count` ones, as {line: item}."""
    sent = [params for params in client.recorder.line_statuses[count:] if params["uri"] == uri]
    return {item["line"]: item for item in sent[-1]["lines"]} if sent else None


def errors(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    return [diagnostic for diagnostic in client.diagnostics.get(uri, []) if diagnostic.source == "ModelTrace"]


async def test_gutters_and_the_divergence_warning_go_stale_then_leave_with_their_line(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_port(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.setReference", uri, str(REFERENCE)))["ok"]
    sent = len(client.recorder.line_statuses)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    traced = await wait_until(lambda: latest_marks(client, sent, uri))
    (warning,) = await wait_until(lambda: warnings(client, uri))
    attention = line_of(modeling_file, "hidden_states, _ = self.self_attn(")
    assert traced[attention]["status"] == "divergence" and warning.range.start.line == attention
    assert not any(item.get("stale") for item in traced.values())
    statuses = len(client.recorder.statuses)

    # Two lines inserted on top: every mark and the warning move down two lines and say they are stale.
    sent = len(client.recorder.line_statuses)
    edit(client, uri, 2, 0, 0, 0, HEADER)
    moved = await wait_until(lambda: latest_marks(client, sent, uri))
    assert moved == {
        line + 2: {**item, "line": line + 2, "message": item["message"] + STALE_NOTE, "stale": True}
        for line, item in traced.items()
    }
    (stale_warning,) = await wait_until(
        lambda: [item for item in warnings(client, uri) if item.message.endswith(STALE_NOTE)]
    )
    assert stale_warning.range.start.line == attention + 2
    assert stale_warning.message == warning.message + STALE_NOTE
    assert [status["state"] for status in client.recorder.statuses[statuses:]] == ["stale"]

    # The diverging call edited: its mark and the warning on it go; the other marks stay, stale once.
    sent = len(client.recorder.line_statuses)
    call = attention + 2
    edit(client, uri, 3, call, call, 10_000, "        hidden_states, _ = self.self_attn(  # changed")
    changed = await wait_until(lambda: latest_marks(client, sent, uri))
    assert changed == {line: item for line, item in moved.items() if line != call}
    await wait_until(lambda: warnings(client, uri) == [])

    # A fresh trace of the file (now saved with the comments) replaces them: fresh marks, nothing stale.
    modeling_file.write_text(HEADER + modeling_file.read_text())
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=4),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=modeling_file.read_text())],
        )
    )
    sent = len(client.recorder.line_statuses)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    fresh = await wait_until(lambda: latest_marks(client, sent, uri))
    assert fresh[attention + 2]["status"] == "divergence"
    assert not any(item.get("stale") or STALE_NOTE in item["message"] for item in fresh.values())
    (fresh_warning,) = await wait_until(lambda: warnings(client, uri))
    assert fresh_warning.range.start.line == attention + 2 and not fresh_warning.message.endswith(STALE_NOTE)


async def test_a_failure_moves_with_its_line_and_clears_when_the_line_is_fixed(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    line = inject_into_mlp_forward(client, modeling_file, uri, "raise KeyError('missing_weight')")
    result = await execute(client, "modelTrace.trace", uri)
    assert not result["ok"]
    (failure,) = await wait_until(lambda: errors(client, uri))
    assert failure.range.start.line == line and failure.severity == types.DiagnosticSeverity.Error

    # An edit above it: the error moves with its line and says it is stale.
    edit(client, uri, 3, 0, 0, 0, HEADER)
    (moved,) = await wait_until(lambda: [item for item in errors(client, uri) if item.range.start.line == line + 2])
    assert moved.message == failure.message + STALE_NOTE
    assert moved.range.start.character == failure.range.start.character

    # The raising line fixed: its error leaves Problems at once, without a new trace.
    edit(client, uri, 4, line + 2, line + 2, 10_000, "        pass")
    await wait_until(lambda: errors(client, uri) == [])
