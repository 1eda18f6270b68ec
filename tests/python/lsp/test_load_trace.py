"""Load Trace (`modelTrace.loadTrace`) of a trace captured by a script (`modeltrace.capture`) in another folder:
its hints land on this workspace's copy of the files, found by content hash; a copy edited since the capture is
found by name, marked stale, with a note on the file saying so."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import LanguageClient

from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import write_trace

from .support import CAPTURE_SCRIPT, copy_example, execute, inlay_hints, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")


# NOTE: the script's copy of the example differs from the repository's (the server's workspace), so that its
# content is found only where a test puts it.
CAPTURED_MARK = "\n# the copy a script captured\n"


@pytest.fixture(scope="module")
def captured_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace a script captured from its own copy of the example, in a folder that is gone afterwards."""
    folder = tmp_path_factory.mktemp("original")
    original = copy_example(folder)
    original.write_text(original.read_text() + CAPTURED_MARK)
    script = folder / "capture.py"
    script.write_text(CAPTURE_SCRIPT)
    trace = tmp_path_factory.mktemp("traces") / "original.mtrace"
    completed = subprocess.run(
        [sys.executable, str(script), str(folder), str(trace)], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    # NOTE: as on another machine: the recorded paths do not exist here.
    shutil.rmtree(folder / "tiny_llama")
    return trace


async def test_hints_on_the_workspace_copy_found_by_content(
    client: LanguageClient, captured_elsewhere: Path, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    modeling_file.write_text(modeling_file.read_text() + CAPTURED_MARK)
    uri = open_document(client, modeling_file)
    result = await execute(client, "modelTrace.loadTrace", uri, str(captured_elsewhere))
    assert result["ok"], result
    found = {Path(item["recorded"]).name: item for item in result["files"] if item["path"] is not None}
    assert found[modeling_file.name]["how"] == "same content"
    assert found[modeling_file.name]["path"] == str(modeling_file.resolve())
    assert not found[modeling_file.name]["changed"]
    assert result["modelFile"] == str(modeling_file.resolve())
    hints = await inlay_hints(client, uri)
    query_line = line_of(modeling_file, "query_states = self.q_proj(hidden_states)")
    assert "[1,4,7,16]" in hints[query_line] and "(stale)" not in hints[query_line], hints
    assert not [
        diagnostic
        for diagnostic in client.diagnostics.get(uri, [])
        if diagnostic.severity == types.DiagnosticSeverity.Information
    ]
    await execute(client, "modelTrace.clear", uri)
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))


async def test_an_edited_copy_is_found_by_name_and_said_to_have_changed(
    client: LanguageClient, captured_elsewhere: Path, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    edited = modeling_file.read_text().replace("class TinyLlamaRMSNorm", "# edited\nclass TinyLlamaRMSNorm")
    modeling_file.write_text(edited + CAPTURED_MARK)
    uri = open_document(client, modeling_file)
    messages_before = len(client.messages)
    result = await execute(client, "modelTrace.loadTrace", uri, str(captured_elsewhere))
    match = next(item for item in result["files"] if Path(item["recorded"]).name == modeling_file.name)
    assert (match["how"], match["changed"], match["path"]) == ("same name", True, str(modeling_file.resolve()))
    notes = await wait_until(
        lambda: [
            diagnostic
            for diagnostic in client.diagnostics.get(uri, [])
            if diagnostic.severity == types.DiagnosticSeverity.Information
        ]
    )
    assert f"changed since {captured_elsewhere.name} was captured" in notes[0].message
    assert notes[0].range.start.line == 0
    said = await wait_until(
        lambda: [
            message.message
            for message in client.messages[messages_before:]
            if "changed since the capture" in message.message
        ]
    )
    assert modeling_file.name in said[0]
    hints = await inlay_hints(client, uri)
    assert hints and all("(stale)" in label for label in hints.values()), hints
    # clearing the trace removes its notes
    await execute(client, "modelTrace.clear", uri)
    await wait_until(
        lambda: (
            not [
                diagnostic
                for diagnostic in client.diagnostics.get(uri, [])
                if diagnostic.severity == types.DiagnosticSeverity.Information
            ]
        )
    )


async def test_a_trace_naming_a_file_outside_the_workspace_gets_nothing_of_it(
    client: LanguageClient, tmp_path: Path
) -> None:
    # A hostile trace names /etc/passwd as its model file, with the file's true hash: the old server answered
    # `modelFile: /etc/passwd` (which the extension then opens) and indexed the file's text.
    system_file = Path("/etc/passwd")
    if not system_file.is_file():
        pytest.skip("no /etc/passwd here")
    summary = TensorSummary(key="0", shape=[1, 4], dtype="float32", mean=0.0, std=1.0, min=-1.0, max=1.0)
    record = ModuleCall(
        index=0,
        path="layer",
        class_name="Layer",
        defined_at=SourceLocation(str(system_file), 1),
        called_at=SourceLocation(str(system_file), 1, 0),
        call_index=0,
        parent=-1,
        finish_order=0,
        inputs=[summary],
        outputs=[summary],
    )
    digest = hashlib.sha256(system_file.read_bytes()).hexdigest()
    model = {"class": "Model", "file": str(system_file), "source_hashes": {str(system_file): digest}}
    trace = write_trace(Trace(model=model, modules=[record]), tmp_path / "hostile.mtrace")
    document = tmp_path / "workspace" / "modeling.py"
    document.parent.mkdir()
    document.write_text("x = 1\n")
    uri = open_document(client, document)

    result = await execute(client, "modelTrace.loadTrace", uri, str(trace))

    assert result["ok"], result
    assert result["modelFile"] is None
    assert result["files"] == [{"recorded": str(system_file), "path": None, "how": "not found", "changed": False}]
    assert from_fs_path(str(system_file)) not in client.diagnostics
    await execute(client, "modelTrace.clear", uri)
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
