"""Fault injection through the real server: whatever the model code does, the server keeps serving, the
last good trace and its hints stay, the user gets one clear message naming the cause (and the line, where
there is one), and no partial trace folder or stray process is left behind.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import copy_example, execute, inject_into_mlp_forward, inlay_hints, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")


def _break_file(old: str, new: str) -> Callable[[Path], int]:
    """A fault made by editing the copied modeling file; returns the 0-based line the cause is on."""

    def apply(modeling_file: Path) -> int:
        source = modeling_file.read_text()
        assert old in source
        modeling_file.write_text(source.replace(old, new, 1))
        return line_of(modeling_file, new.splitlines()[-1].strip() or new.strip())

    return apply


FAULTS = {
    "segfault": ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "segmentation fault"),
    "exception": ("raise KeyError('missing_weight')", "KeyError: 'missing_weight'"),
    "memory": ("torch.empty(2**62, dtype=torch.uint8)", "RuntimeError"),
    "exit": ("raise SystemExit(5)", "SystemExit: 5"),
}


def _descendants(client: LanguageClient) -> list[psutil.Process]:
    """The server's live child processes and theirs (processes that end while listed are left out)."""
    alive = []
    for process in psutil.Process(client._server.pid).children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                process.ppid()
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


def _trace_folder_leftovers(client: LanguageClient) -> list[Path]:
    folder = Path(client.trace_directory)
    return [path for path in folder.iterdir() if ".tmp-" in path.name or ".old-" in path.name]


async def _assert_unharmed(client: LanguageClient, example_hints: dict[int, str], shown: int) -> None:
    # One message, the example's hints unchanged, nothing left behind, and the server still traces.
    assert len(client.messages) == shown + 1, client.messages[shown:]
    assert await inlay_hints(client, client.example_uri) == example_hints
    assert _trace_folder_leftovers(client) == []
    await wait_until(lambda: len(_descendants(client)) <= 1, timeout=10)  # the warm worker only, or none
    assert (await execute(client, "modelTrace.trace", client.example_uri))["ok"]


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_faults_inside_forward(client: LanguageClient, tmp_path: Path, fault: str) -> None:
    statement, cause = FAULTS[fault]
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    example_hints = await inlay_hints(client, client.example_uri)
    shown = len(client.messages)

    line = inject_into_mlp_forward(client, modeling_file, uri, statement)
    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"] and cause in result["message"], result
    assert "Traceback" not in result["message"]
    if fault != "segfault":
        # The model code's own exception points at the line that raised it.
        assert result["message"].endswith(f"({modeling_file.resolve()}:{line + 1})"), result["message"]
    await _assert_unharmed(client, example_hints, shown)


@pytest.mark.parametrize(
    ("fault", "edit", "cause"),
    [
        (
            "syntax error",
            _break_file("class TinyLlamaMLP(nn.Module):", "class TinyLlamaMLP(nn.Module:"),
            "syntax error",
        ),
        (
            "import error",
            _break_file("import torch\n", "import torch\nimport not_a_module_of_this_machine\n"),
            "No module named 'not_a_module_of_this_machine'",
        ),
        (
            "missing config",
            _break_file(
                "from .configuration_tiny_llama import TinyLlamaConfig",
                "from .configuration_tiny_llama_gone import TinyLlamaConfig",
            ),
            "configuration_tiny_llama_gone",
        ),
    ],
)
async def test_broken_files(
    client: LanguageClient, tmp_path: Path, fault: str, edit: Callable[[Path], int], cause: str
) -> None:
    modeling_file = copy_example(tmp_path)
    line = edit(modeling_file)
    uri = open_document(client, modeling_file)
    example_hints = await inlay_hints(client, client.example_uri)
    shown = len(client.messages)

    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"] and cause in result["message"], result
    assert f"{modeling_file.resolve()}:{line + 1}" in result["message"], result["message"]
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(uri))
    assert diagnostic.range.start.line == line and diagnostic.severity == types.DiagnosticSeverity.Error
    await _assert_unharmed(client, example_hints, shown)


async def test_endless_forward_is_stopped_by_the_timeout(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    example_hints = await inlay_hints(client, client.example_uri)
    shown = len(client.messages)
    inject_into_mlp_forward(client, modeling_file, uri, "while True: pass")
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"timeout": 4}})
    )
    try:
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"timeout": 60}})
        )
    assert not result["ok"] and "4 s timeout" in result["message"], result
    await _assert_unharmed(client, example_hints, shown)


async def test_trace_process_killed_from_outside(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    example_hints = await inlay_hints(client, client.example_uri)
    shown = len(client.messages)
    inject_into_mlp_forward(client, modeling_file, uri, "import time; time.sleep(60)")

    # NOTE: an earlier trace's child may still be flushing its trace to disk after answering: let it end, and
    # never take it for this trace's child.
    await wait_until(lambda: len(_descendants(client)) <= 1, timeout=10)
    before = {process.pid for process in _descendants(client)}
    trace = asyncio.ensure_future(execute(client, "modelTrace.trace", uri))
    # The trace child is the worker's child: the server's grandchild.
    child = await wait_until(
        lambda: next(
            (
                process
                for process in _descendants(client)
                if process.pid not in before and process.ppid() != client._server.pid
            ),
            None,
        )
    )
    await asyncio.sleep(1.0)
    child.send_signal(signal.SIGKILL)
    result = await asyncio.wait_for(trace, 30)

    assert not result["ok"] and "killed" in result["message"], result
    await _assert_unharmed(client, example_hints, shown)


async def test_a_code_error_every_input_set_hits_is_said_as_such_and_names_the_call_that_passed_the_tensor(
    client: LanguageClient, tmp_path: Path
) -> None:
    # An edit that passes the MLP half the hidden width: the matmul inside the MLP raises, at every size and
    # with every input set. It is the code, not the inputs, and the edited call line is named.
    modeling_file = copy_example(tmp_path)
    edited = _break_file(
        "hidden_states = self.mlp(hidden_states)", "hidden_states = self.mlp(hidden_states[..., :32])"
    )
    call_line = edited(modeling_file)
    uri = open_document(client, modeling_file)
    raising_line = line_of(modeling_file, "gate = self.activation(self.gate_proj(hidden_states))")

    result = await execute(client, "modelTrace.trace", uri)

    assert not result["ok"], result
    message = result["message"]
    assert message.startswith("ModelTrace: TinyLlamaModel.forward raised RuntimeError: mat1 and mat2 shapes"), message
    assert (
        f"fails with this error at line {raising_line + 1} of modeling_tiny_llama.py, called from line "
        f"{call_line + 1}: an error in the code, not in the inputs"
    ) in message, message
    assert "ran unaided" not in message
    # Should the inputs be at fault after all, the editor's setting is named, not a command-line flag.
    assert "set modelTrace.recipe to a recipe" in message and "--recipe" not in message, message
    (diagnostic,) = await wait_until(lambda: client.diagnostics.get(uri))
    assert diagnostic.range.start.line == raising_line
    # Nearest caller first: the edited line, then the model's loop over its layers that called it.
    nearest, *further = diagnostic.related_information
    assert nearest.location.uri == uri and nearest.location.range.start.line == call_line, nearest
    assert nearest.message == (
        f"called from forward, line {call_line + 1}: hidden_states = self.mlp(hidden_states[..., :32])"
    )
    assert further and all(item.location.uri == uri and item.location.range.start.line > call_line for item in further)

    # Two lines added at the top: the error and its calling lines move with their lines.
    broken = modeling_file.read_text()
    _replace_document(client, uri, 2, "# one\n# two\n" + broken)
    (moved,) = await wait_until(
        lambda: [item for item in client.diagnostics.get(uri, []) if item.range.start.line == raising_line + 2]
    )
    assert moved.related_information[0].location.range.start.line == call_line + 2
    # The call that passed the wrong tensor fixed (the line that raised is untouched): the error leaves at once.
    fixed = broken.replace("self.mlp(hidden_states[..., :32])", "self.mlp(hidden_states)")
    _replace_document(client, uri, 3, "# one\n# two\n" + fixed)
    await wait_until(lambda: not client.diagnostics.get(uri))


def _replace_document(client: LanguageClient, uri: str, version: int, text: str) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )
