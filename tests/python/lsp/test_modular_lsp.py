"""A modular file in the editor (`modular_<name>.py`, a folder copied out of the installed transformers): "Trace
forward" runs its generated twin, and its lines show what their twin lines got: hints, hovers; its classes' lenses
name the methods they inherit; a pulled Warning says when the generated file is missing or out of date."""

from __future__ import annotations

import ast
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import pytest_lsp
import transformers
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient

from checkout_layout import FORWARD_EDIT, SKIP_REASON, edited_modular, transformers_source
from fake_converter import fake_runs, make_fake_checkout

from .support import (
    COLD_TRACE_SECONDS,
    SERVER_COMMAND,
    execute,
    initialize,
    inlay_hints,
    line_of,
    open_document,
    record_server_pushes,
    wait_until,
)


pytestmark = pytest.mark.asyncio(loop_scope="session")

MODELS = Path(transformers.__file__).resolve().parent / "models"


def copy_model_folder(name: str, destination: Path) -> Path:
    folder = destination / name
    shutil.copytree(MODELS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


async def hover_text(client: LanguageClient, uri: str, line: int) -> str | None:
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=8)
        )
    )
    return hover.contents.value if hover is not None else None


async def pulled_diagnostics(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    report = await client.text_document_diagnostic_async(
        types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return list(report.items)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def modular_trace(client: LanguageClient, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    """A copy of transformers' qwen3 folder whose modular file was traced from the editor: (folder, its URI, result)."""
    folder = copy_model_folder("qwen3", tmp_path_factory.mktemp("modular"))
    uri = open_document(client, folder / "modular_qwen3.py")
    result = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"], result
    return folder, uri, result


async def test_a_traced_modular_file_shows_its_generated_twins_hints(
    client: LanguageClient, modular_trace: tuple[Path, str, dict]
) -> None:
    folder, uri, result = modular_trace
    # the model the modular file defines, built from its own config through the generated file
    assert result["modelClass"] == "Qwen3Model"
    modular, generated = folder / "modular_qwen3.py", folder / "modeling_qwen3.py"
    generated_uri = open_document(client, generated)
    modular_hints = await inlay_hints(client, uri)
    generated_hints = await inlay_hints(client, generated_uri)
    for statement in (
        "query_states = self.q_norm(self.q_proj(hidden_states)",
        "value_states = self.v_proj(hidden_states)",
        "attn_output = self.o_proj(attn_output)",
    ):
        modular_line, generated_line = line_of(modular, statement), line_of(generated, statement)
        assert modular_hints.get(modular_line), (statement, modular_hints)
        assert modular_hints[modular_line] == generated_hints[generated_line]
    # a line that is not the generated file's (the modular class header's base) shows nothing of its own
    assert line_of(modular, "class Qwen3RMSNorm(Qwen2RMSNorm):") not in modular_hints
    # the hover of a hinted modular line says which generated line it ran as
    hover = await hover_text(client, uri, line_of(modular, "attn_output = self.o_proj(attn_output)"))
    twin = line_of(generated, "attn_output = self.o_proj(attn_output)") + 1
    assert hover is not None and f"Runs as [modeling_qwen3.py:{twin}]({from_fs_path(str(generated))}#L{twin})" in hover


async def test_modular_classes_have_trace_lenses_and_lenses_for_what_they_inherit(
    client: LanguageClient, modular_trace: tuple[Path, str, dict]
) -> None:
    folder, uri, _ = modular_trace
    modular, generated = folder / "modular_qwen3.py", folder / "modeling_qwen3.py"
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    attention = line_of(modular, "class Qwen3Attention(LlamaAttention):")
    assert any(lens.range.start.line == attention and lens.command.command == "modelTrace.trace" for lens in lenses)
    norm = line_of(modular, "class Qwen3RMSNorm(Qwen2RMSNorm):")
    inherited = [
        lens for lens in lenses if lens.range.start.line == norm and lens.command.command == "modelTrace.goToLine"
    ]
    assert {lens.command.title.split(":")[0] for lens in inherited} == {"↳ __init__", "↳ forward", "↳ extra_repr"}
    norm_forward = line_of(generated, "def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:")
    forward_lens = next(lens for lens in inherited if lens.command.title.startswith("↳ forward"))
    title = forward_lens.command.title
    assert title.startswith("↳ forward: inherited from `Qwen2RMSNorm.forward`, ")
    assert title.endswith(f" lines: modeling_qwen3.py:{norm_forward + 1}")
    # it opens the generated method (the client's `modelTrace.goToLine`: URI, 0-based line)
    assert list(forward_lens.command.arguments) == [from_fs_path(str(generated)), norm_forward]
    # the `super().forward(...)` line of the head opens the parent body inlined for it
    call = line_of(modular, "return super().forward(**super_kwargs)")
    (inlined,) = [lens for lens in lenses if lens.range.start.line == call]
    assert inlined.command.title.startswith("↳ runs the parent's body, inlined: modeling_qwen3.py:")
    first = int(inlined.command.title.rsplit(":", 1)[1].split("-")[0])
    assert list(inlined.command.arguments) == [from_fs_path(str(generated)), first - 1]
    # hovering the class line lists them too, traced or not
    hover = await hover_text(client, uri, norm)
    assert hover is not None and "`forward`: inherited from `Qwen2RMSNorm.forward`" in hover


async def test_an_out_of_date_or_missing_generated_file_is_a_warning_on_the_modular_file(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    # static: an untrusted workspace whose Python has no torch sees it too
    client = restricted_client
    folder = copy_model_folder("qwen3", tmp_path)
    modular = folder / "modular_qwen3.py"
    assert await pulled_diagnostics(client, open_document(client, modular)) == []
    stale_copy = tmp_path / "stale" / "qwen3"
    shutil.copytree(folder, stale_copy)
    stale_modular = stale_copy / "modular_qwen3.py"
    stale_modular.write_text(
        modular.read_text().replace(
            "attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2"
        )
    )
    stale_uri = open_document(client, stale_modular)
    [stale] = await pulled_diagnostics(client, stale_uri)
    edited = line_of(stale_modular, "attn_output = self.o_proj(attn_output) * 2")
    assert stale.code == "modular-stale" and stale.range.start.line == edited
    assert stale.severity == types.DiagnosticSeverity.Warning
    assert f"line {edited + 1} (Qwen3Attention.forward) is not in modeling_qwen3.py" in stale.message
    assert f"python utils/modular_model_converter.py --files_to_parse {stale_modular}" in stale.message
    assert "quick fix" not in stale.message  # no transformers checkout here: nothing to regenerate with
    (stale_copy / "modeling_qwen3.py").unlink()
    # NOTE: the twin is read from disk at each pull: deleting it is seen without an edit of the modular file
    [missing] = await pulled_diagnostics(client, stale_uri)
    assert "modeling_qwen3.py does not exist" in missing.message


def line_statuses(client: LanguageClient, uri: str, since: int) -> dict[int, str] | None:
    """The gutter statuses last sent for a document after the `since`-th `modelTrace/lineStatus`, by line."""
    marks = [params for params in client.recorder.line_statuses[since:] if params["uri"] == uri]
    return {item["line"]: item["status"] for item in marks[-1]["lines"]} if marks else None


def warnings(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    return [diagnostic for diagnostic in client.diagnostics.get(uri, []) if diagnostic.source == "ModelTrace diff"]


async def test_a_diff_puts_its_marks_and_its_divergence_on_the_modular_lines(
    client: LanguageClient, modular_trace: tuple[Path, str, dict], tmp_path: Path
) -> None:
    """A port written as a modular file, diffed against the original: a q_norm built with another epsilon (in the
    modular file and, regenerated, in its twin) diverges at the modular line that calls it."""
    _, _, reference = modular_trace
    folder = copy_model_folder("qwen3", tmp_path)
    original = "self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)"
    for name in ("modular_qwen3.py", "modeling_qwen3.py"):
        source = (folder / name).read_text()
        assert source.count(original) == 1, name
        (folder / name).write_text(source.replace(original, original.replace("config.rms_norm_eps", "0.5")))
    modular = folder / "modular_qwen3.py"
    uri = open_document(client, modular)
    assert await pulled_diagnostics(client, uri) == []
    sent = len(client.recorder.line_statuses)
    assert (await execute(client, "modelTrace.setReference", uri, reference["trace"]))["ok"]
    result = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"] and result["diff"]["match"] is False
    assert result["diff"]["firstDivergence"]["path"] == "layers.0.self_attn.q_norm"
    query = line_of(modular, "query_states = self.q_norm(self.q_proj(hidden_states)")

    statuses = await wait_until(lambda: line_statuses(client, uri, sent))
    assert statuses[query] == "divergence"
    # every modular line shows the mark of its generated twin line
    generated = folder / "modeling_qwen3.py"
    generated_statuses = await wait_until(lambda: line_statuses(client, from_fs_path(str(generated)), sent))
    for statement in ("key_states = self.k_norm(", "value_states = self.v_proj(", "attn_output = self.o_proj("):
        assert statuses[line_of(modular, statement)] == generated_statuses[line_of(generated, statement)], statement
    assert len(statuses) >= 4
    (warning,) = await wait_until(lambda: warnings(client, uri))
    assert warning.range.start.line == query
    assert warning.message.startswith("First divergence from the reference: layers.0.self_attn.q_norm (Qwen3RMSNorm)")
    # "Go to Line" of `modelTrace/diffResult` goes where the diagnostic is: the modular line, not its twin
    sent = [params for params in client.recorder.diff_results if params["uri"] == uri][-1]
    assert sent["divergence"]["location"] == {"uri": uri, "line": query}


async def test_recorder_problems_of_the_generated_twin_sit_on_the_modular_file(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    client = restricted_client
    folder = copy_model_folder("qwen3", tmp_path)
    generated = folder / "modeling_qwen3.py"
    generated.write_text(generated.read_text().replace('        "attentions": Qwen3Attention,\n', "", 1))
    uri = open_document(client, folder / "modular_qwen3.py")
    (problem,) = [item for item in await pulled_diagnostics(client, uri) if item.source == "ModelTrace recorders"]
    assert problem.code == "missing-recorder" and problem.range.start.line == 0
    assert "declare `_can_record_outputs` in Qwen3PreTrainedModel here, then regenerate modeling_qwen3.py" in (
        problem.message
    )
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=problem.range,
            context=types.CodeActionContext(diagnostics=[problem], only=[types.CodeActionKind.QuickFix]),
        )
    )
    # the quick fix edits the modular file (a new Qwen3PreTrainedModel holding the full declaration) and says
    # that the generated file must be regenerated; the generated file is left as it is
    (action,) = actions
    assert action.title == (
        "Record 'attentions' with Qwen3Attention in the modular file (then regenerate: python "
        f"utils/modular_model_converter.py --files_to_parse {folder / 'modular_qwen3.py'})"
    )
    (edits,) = action.edit.changes.values()
    assert list(action.edit.changes) == [uri]
    inserted = "".join(edit.new_text for edit in edits)
    assert "class Qwen3PreTrainedModel(Qwen2PreTrainedModel):" in inserted
    assert '"attentions": Qwen3Attention,' in inserted and '"hidden_states": Qwen3DecoderLayer,' in inserted
    assert "from ..qwen2.modeling_qwen2 import Qwen2PreTrainedModel" in inserted


@pytest_lsp.fixture(scope="session", config=ClientServerConfig(server_command=SERVER_COMMAND))
async def own_server(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[None]:
    """A server of its own (the test that uses it shuts it down), trusted, as `client` is."""
    record_server_pushes(lsp_client)
    await initialize(
        lsp_client,
        {
            "settings": {"hintDetail": "dtype", "traceOnSave": False, "timeout": 60, "lines": False},
            "workspaceTrusted": True,
            "traceDirectory": str(tmp_path_factory.mktemp("own-traces")),
        },
    )
    yield
    # NOTE: a test that failed before its own shutdown leaves the server running: it is shut down here (a server
    # only stopped, never shut down, keeps the session waiting)
    server = lsp_client._server
    if server is not None and server.returncode is None:
        await lsp_client.shutdown_session()


async def test_a_stale_modular_file_in_a_checkout_is_regenerated_traced_and_shown_on_it(
    own_server: LanguageClient, restricted_client: LanguageClient, tmp_path: Path
) -> None:
    client = own_server
    # the modular file sits in a transformers checkout (a stand-in converter: `fake_converter`), edited since its
    # generated file was written
    checkout = make_fake_checkout(
        tmp_path / "transformers",
        MODELS / "qwen3" / "modeling_qwen3.py",
        [("attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2")],
    )
    folder = copy_model_folder("qwen3", checkout / "src" / "transformers" / "models")
    modular = folder / "modular_qwen3.py"
    modular.write_text(
        modular.read_text().replace(
            "attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2"
        )
    )
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    async def stale_actions(on: LanguageClient) -> tuple[types.Diagnostic, list[types.CodeAction]]:
        uri = open_document(on, modular)
        (stale,) = [item for item in await pulled_diagnostics(on, uri) if item.code == "modular-stale"]
        actions = await on.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=stale.range,
                context=types.CodeActionContext(diagnostics=[stale]),
            )
        )
        return stale, list(actions or [])

    # an untrusted workspace gets the warning, not the action (it runs the checkout's converter)
    _, untrusted = await stale_actions(restricted_client)
    assert [action.title for action in untrusted] == []
    stale, actions = await stale_actions(client)
    (action,) = actions
    assert action.title == "Regenerate into a temporary folder and trace"
    assert stale.message.endswith("; or regenerate it into a temporary folder and trace that (quick fix)")
    # NOTE: lsprotocol reads a CodeAction that carries a command as a Command (the union `Command | CodeAction`
    # is told apart by the `command` key), its `command` the CodeAction's command object, printed
    command = ast.literal_eval(action.command) if isinstance(action, types.Command) else action.command
    command = command if isinstance(command, dict) else {"command": command.command, "arguments": command.arguments}
    uri = from_fs_path(str(modular))
    assert command["command"] == "modelTrace.traceRegenerated" and command["arguments"] == [uri]

    async def regenerated() -> Path:
        result = await execute(client, command["command"], *command["arguments"], timeout=COLD_TRACE_SECONDS)
        assert result["ok"], result
        return Path(result["regenerated"])

    copy = await regenerated()
    (run,) = fake_runs(checkout)
    assert Path(run["file"]) == copy and run["cwd"] == str(checkout.resolve())
    assert copy.read_bytes() == modular.read_bytes() and copy.parent != folder
    root = copy.parents[4]
    assert root.name.startswith("modeltrace-regenerated-") and root.parent == Path(tempfile.gettempdir()).resolve()
    # the user's folder is left as it is; the copy's generated file is the regenerated one
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert "attn_output = self.o_proj(attn_output) * 2" in (copy.parent / "modeling_qwen3.py").read_text()
    # the hints show on the user's own modular document, the edited line (only in the regenerated twin) included,
    # and as the regenerated twin's lines got them
    hints = await inlay_hints(client, uri)
    edited = line_of(modular, "attn_output = self.o_proj(attn_output) * 2")
    assert hints.get(edited), hints
    twin = copy.parent / "modeling_qwen3.py"
    twin_hints = await inlay_hints(client, open_document(client, twin))
    assert hints[edited] == twin_hints[line_of(twin, "attn_output = self.o_proj(attn_output) * 2")]
    query = "query_states = self.q_norm(self.q_proj(hidden_states)"
    assert hints[line_of(modular, query)] == twin_hints[line_of(twin, query)]
    assert await inlay_hints(client, open_document(client, copy)) == {}
    # the hover of the edited line (no line of the stale generated file beside it) opens the regenerated line that ran
    hover = await hover_text(client, uri, edited)
    ran = line_of(twin, "attn_output = self.o_proj(attn_output) * 2") + 1
    assert hover is not None and f"Runs as [modeling_qwen3.py:{ran}]({from_fs_path(str(twin))}#L{ran})" in hover
    # regenerated again, the folder before goes; cleared, the one shown goes
    second = (await regenerated()).parents[4]
    assert second.is_dir() and not root.exists()
    # saved with trace-on-save, it is regenerated and traced again, and that folder replaces the one shown
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"traceOnSave": True}})
    )
    try:
        statuses = len(client.recorder.statuses)
        client.text_document_did_save(
            types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        await wait_until(
            lambda: [status["state"] for status in client.recorder.statuses[statuses:]] == ["tracing", "idle"]
        )
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"traceOnSave": False}})
        )
    saved = Path(fake_runs(checkout)[-1]["file"]).parents[4]
    assert len(fake_runs(checkout)) == 3 and saved.is_dir() and not second.exists()
    assert (await inlay_hints(client, uri)).get(edited)
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
    assert not saved.exists() and await inlay_hints(client, uri) == {}
    # a plain trace of the document replaces the regenerated one: its folder goes
    third = (await regenerated()).parents[4]
    assert third.is_dir()
    assert (await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS))["ok"]
    assert not third.exists()
    # that plain trace (the stale generated file) pinned as the reference, a regenerated trace is compared with it:
    # the user's document gets the gutter marks of the regenerated file's lines, the edited line included
    assert (await execute(client, "modelTrace.pinReference", uri, timeout=COLD_TRACE_SECONDS))["ok"]
    sent = len(client.recorder.line_statuses)
    copy = await regenerated()
    fourth, twin = copy.parents[4], copy.parent / "modeling_qwen3.py"
    marks = await wait_until(lambda: line_statuses(client, uri, sent))
    twin_marks = await wait_until(lambda: line_statuses(client, from_fs_path(str(twin)), sent))
    for statement in ("attn_output = self.o_proj(attn_output) * 2", "value_states = self.v_proj(hidden_states)"):
        assert marks[line_of(modular, statement)] == twin_marks[line_of(twin, statement)], (statement, marks)
    # and the server's shutdown removes what it still holds; never the user's files
    assert fourth.is_dir()
    await client.shutdown_session()
    assert not fourth.exists()
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


@pytest.mark.skipif(transformers_source() is None, reason=SKIP_REASON)
async def test_the_real_converter_regenerates_for_the_editor_and_its_hints_land_on_the_users_lines(
    client: LanguageClient, tmp_path: Path
) -> None:
    """`modelTrace.traceRegenerated` with transformers' own converter (`checkout_layout`): the regenerated file
    carries the modular file's edits, and the trace's hints land on the user's modular document."""
    _, modular = edited_modular(tmp_path)
    uri = open_document(client, modular)
    result = await execute(client, "modelTrace.traceRegenerated", uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"], result
    copy = Path(result["regenerated"])
    regenerated = (copy.parent / "modeling_qwen3.py").read_text()
    assert FORWARD_EDIT[1] in regenerated and "OutputRecorder(Qwen3Attention, index=1)" in regenerated
    hints = await inlay_hints(client, uri)
    assert hints.get(line_of(modular, FORWARD_EDIT[1])), hints
    assert hints.get(line_of(modular, "query_states = self.q_norm(self.q_proj(hidden_states)")), hints
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
    assert not copy.parents[4].exists()
