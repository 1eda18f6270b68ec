"""Helpers for the language server tests: a VS Code-like client, documents, commands, hints, waiting.

Imported by `conftest` (the fixtures) and by the tests; see `conftest` for the servers they talk to.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import LanguageClient


REPOSITORY = Path(__file__).resolve().parents[3]
EXAMPLE_PACKAGE = REPOSITORY / "examples" / "tiny_llama"
EXAMPLE = EXAMPLE_PACKAGE / "modeling_tiny_llama.py"
WITHOUT_TORCH = Path(__file__).resolve().parent / "without_torch"
SERVER_COMMAND = [sys.executable, "-m", "modeltrace", "serve"]
# NOTE: the first trace starts the worker, which imports torch + transformers: slow on a loaded 2-core box.
COLD_TRACE_SECONDS = 240


# A script (run as `python SCRIPT EXAMPLE_FOLDER TRACE`) that traces the example with `modeltrace.capture`, as a
# user's own script would, with line records.
CAPTURE_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import modeltrace
    sys.path.insert(0, sys.argv[1])
    from tiny_llama.configuration_tiny_llama import TinyLlamaConfig
    from tiny_llama.modeling_tiny_llama import TinyLlamaModel

    torch.manual_seed(0)
    model = TinyLlamaModel(TinyLlamaConfig()).eval()
    with torch.no_grad(), modeltrace.capture(model, sys.argv[2], lines=True):
        model(input_ids=torch.tensor([[1, 17, 42, 99, 5, 63, 120]]))
""")


@dataclass
class Recorder:
    """What the server pushed to the client beyond what pytest-lsp records itself."""

    statuses: list[dict[str, Any]] = field(default_factory=list)
    # `modelTrace/lineStatus` params as sent: {"uri", "lines": [{"line", "status", "message"}]}
    line_statuses: list[dict[str, Any]] = field(default_factory=list)
    # `modelTrace/diffResult` params as sent: {"uri", "reference", "match", "divergence"}
    diff_results: list[dict[str, Any]] = field(default_factory=list)
    inlay_hint_refreshes: int = 0
    code_lens_refreshes: int = 0
    # `window/showMessageRequest`s (a failure with "Create recipe…"), answered as dismissed
    message_requests: list[types.ShowMessageRequestParams] = field(default_factory=list)


def client_capabilities() -> types.ClientCapabilities:
    """A client like VS Code: progress, markdown, hint tooltips resolved lazily, refresh requests."""
    return types.ClientCapabilities(
        window=types.WindowClientCapabilities(
            work_done_progress=True,
            show_message=types.ShowMessageRequestClientCapabilities(
                message_action_item=types.ClientShowMessageActionItemOptions(additional_properties_support=False)
            ),
        ),
        workspace=types.WorkspaceClientCapabilities(
            inlay_hint=types.InlayHintWorkspaceClientCapabilities(refresh_support=True),
            code_lens=types.CodeLensWorkspaceClientCapabilities(refresh_support=True),
            did_change_configuration=types.DidChangeConfigurationClientCapabilities(),
            execute_command=types.ExecuteCommandClientCapabilities(),
        ),
        text_document=types.TextDocumentClientCapabilities(
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True),
            hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown]),
            inlay_hint=types.InlayHintClientCapabilities(
                resolve_support=types.ClientInlayHintResolveOptions(properties=["tooltip"])
            ),
            code_lens=types.CodeLensClientCapabilities(),
            publish_diagnostics=types.PublishDiagnosticsClientCapabilities(),
        ),
    )


def record_server_pushes(client: LanguageClient) -> Recorder:
    recorder = Recorder()

    @client.feature("modelTrace/status")
    def on_status(params: Any) -> None:
        # NOTE: pygls hands the params of methods it does not know as a namedtuple.
        recorder.statuses.append(params._asdict())

    @client.feature("modelTrace/lineStatus")
    def on_line_status(params: Any) -> None:
        recorder.line_statuses.append(
            {
                "uri": params.uri,
                "lines": [
                    {
                        "line": item.line,
                        "status": item.status,
                        "message": getattr(item, "message", None),
                        **({"stale": True} if getattr(item, "stale", False) else {}),
                    }
                    for item in params.lines
                ],
            }
        )

    @client.feature("modelTrace/diffResult")
    def on_diff_result(params: Any) -> None:
        divergence = params.divergence
        recorder.diff_results.append(
            {
                "uri": params.uri,
                "reference": params.reference,
                "match": params.match,
                "divergence": None
                if divergence is None
                else {
                    "path": divergence.path,
                    "className": divergence.className,
                    "maxAbsDiff": divergence.maxAbsDiff,
                    "location": None if divergence.location is None else divergence.location._asdict(),
                },
                "notes": list(params.notes),
            }
        )

    @client.feature(types.WINDOW_SHOW_MESSAGE_REQUEST)
    def on_message_request(params: types.ShowMessageRequestParams) -> None:
        recorder.message_requests.append(params)

    @client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)
    def on_inlay_hint_refresh(params: None) -> None:
        recorder.inlay_hint_refreshes += 1

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def on_code_lens_refresh(params: None) -> None:
        recorder.code_lens_refreshes += 1

    client.recorder = recorder  # type: ignore[attr-defined]
    return recorder


async def initialize(client: LanguageClient, options: dict[str, Any]) -> None:
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(),
            root_uri=from_fs_path(str(REPOSITORY)),
            initialization_options=options,
        )
    )


def open_document(client: LanguageClient, path: Path, language: str = "python", uri: str | None = None) -> str:
    uri = uri or from_fs_path(str(path))
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id=language, version=1, text=path.read_text())
        )
    )
    return uri


async def execute(client: LanguageClient, command: str, *arguments: Any, timeout: float = 60) -> Any:
    return await asyncio.wait_for(
        client.workspace_execute_command_async(types.ExecuteCommandParams(command=command, arguments=list(arguments))),
        timeout,
    )


async def wait_until(condition: Callable[[], Any], timeout: float = 60) -> Any:
    """Poll `condition` until it returns something truthy (server pushes arrive asynchronously)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := condition()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {condition}")
        await asyncio.sleep(0.02)
    return value


def line_of(path: Path, text: str, occurrence: int = 0) -> int:
    """The 0-based line of the `occurrence`-th line containing `text` (tests never hard-code line numbers)."""
    matches = [number for number, line in enumerate(path.read_text().splitlines()) if text in line]
    return matches[occurrence]


async def inlay_hints(client: LanguageClient, uri: str, first: int = 0, last: int = 10_000) -> dict[int, str]:
    """`{line: label}` of the hints in lines `first` to `last` (inclusive, up to the end of that line); a line with
    several hints (one per assigned name) has their labels joined by two spaces, in the order of the line."""
    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=first, character=0), end=types.Position(line=last, character=10_000)
            ),
        )
    )
    labels: dict[int, list[tuple[int, str]]] = {}
    for hint in hints or []:
        labels.setdefault(hint.position.line, []).append((hint.position.character, str(hint.label)))
    return {line: "  ".join(label for _, label in sorted(found)) for line, found in labels.items()}


def copy_example(destination: Path) -> Path:
    """A private copy of the example package (for tests that edit or break it); its modeling file."""
    package = destination / "tiny_llama"
    shutil.copytree(EXAMPLE_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "*.mtrace"))
    return package / EXAMPLE.name


MLP_FORWARD = "    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:\n        gate = self.activation("


def inject_into_mlp_forward(client: LanguageClient, modeling_file: Path, uri: str, statement: str) -> int:
    """Insert `statement` as the first line of TinyLlamaMLP.forward, on disk and in the open document.

    Returns the statement's 0-based line.
    """
    line = line_of(modeling_file, "gate = self.activation(self.gate_proj(hidden_states))")
    source = modeling_file.read_text()
    assert MLP_FORWARD in source
    modeling_file.write_text(
        source.replace(MLP_FORWARD, MLP_FORWARD.replace("        gate", f"        {statement}\n        gate"))
    )
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)
                    ),
                    text=f"        {statement}\n",
                )
            ],
        )
    )
    return line


async def hover_text(client: LanguageClient, uri: str, line: int, character: int = 8) -> str:
    """The hover's markdown at (`line`, `character`) of `uri`; fails when there is no hover."""
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
        )
    )
    assert hover is not None
    return hover.contents.value


def configure(client: LanguageClient, values: dict) -> None:
    """Change the server's `modelTrace` settings as the client does (`workspace/didChangeConfiguration`)."""
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"modelTrace": values}))
