"""Reference traces: `modelTrace.setReference` / `pinReference`, then gutters (`modelTrace/lineStatus`), the
first-divergence warning, hover numbers and `modelTrace/diffPlot` after each trace."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from modeltrace.lsp.settings import Settings

from .support import REPOSITORY, configure, copy_example, execute, line_of, open_document, wait_until


pytestmark = pytest.mark.asyncio(loop_scope="session")

PORT_PACKAGE = REPOSITORY / "examples" / "tiny_llama_port"
REFERENCE = REPOSITORY / "examples" / "reference" / "tiny_llama.mtrace"


def copy_port(destination: Path) -> Path:
    """A private copy of the example port (it has a real bug in its attention); its modeling file."""
    package = destination / "tiny_llama_port"
    shutil.copytree(PORT_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "*.mtrace"))
    return package / "modeling_tiny_llama_port.py"


def statuses_since(client: LanguageClient, count: int, uri: str) -> dict[int, str] | None:
    """The latest `modelTrace/lineStatus` of `uri` after the first `count` ones, as {line: status}."""
    sent = [params for params in client.recorder.line_statuses[count:] if params["uri"] == uri]
    return {item["line"]: item["status"] for item in sent[-1]["lines"]} if sent else None


def messages_since(client: LanguageClient, count: int, uri: str) -> dict[int, str]:
    """The gutter marks' messages of the latest `modelTrace/lineStatus` of `uri`, as {line: message}."""
    sent = [params for params in client.recorder.line_statuses[count:] if params["uri"] == uri]
    return {item["line"]: item["message"] for item in sent[-1]["lines"]}


def warnings(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    return [diagnostic for diagnostic in client.diagnostics.get(uri, []) if diagnostic.source == "ModelTrace diff"]


async def hover_text(client: LanguageClient, uri: str, line: int) -> str:
    result = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=8)
        )
    )
    return result.contents.value


async def diff_plot(client: LanguageClient, uri: str) -> Any:
    return await client.protocol.send_request_async("modelTrace/diffPlot", {"uri": uri})


async def test_the_port_diverges_from_its_reference_in_the_attention(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_port(tmp_path)
    uri = open_document(client, modeling_file)
    sent = len(client.recorder.line_statuses)

    chosen = await execute(client, "modelTrace.setReference", uri, str(REFERENCE))
    assert chosen["ok"] and chosen["reference"] == str(REFERENCE) and chosen["diff"] is None
    result = await execute(client, "modelTrace.trace", uri)

    assert result["ok"] and result["diff"]["match"] is False
    assert result["diff"]["firstDivergence"]["path"] == "layers.0.self_attn"
    attention = line_of(modeling_file, "hidden_states, _ = self.self_attn(")
    statuses = await wait_until(lambda: statuses_since(client, sent, uri))
    assert statuses[attention] == "divergence"
    assert statuses[line_of(modeling_file, "inputs_embeds = self.embed_tokens(input_ids)")] == "match"
    # Lines that run before the attention are green (layer 0 matches there; layer 1 only inherits), those that only
    # carry its difference on are inherited; only the decoder layer's call, which holds the bug, is orange.
    assert statuses[line_of(modeling_file, "hidden_states = self.input_layernorm(")] == "match"
    assert statuses[line_of(modeling_file, "hidden_states = self.post_attention_layernorm(")] == "inherited"
    assert [line for line, status in statuses.items() if status == "mismatch"] == [
        line_of(modeling_file, "hidden_states = decoder_layer(")
    ]
    assert set(statuses.values()) <= {"match", "mismatch", "inherited", "divergence", "not_compared"}
    # Each mark says which call decides it: layer 0's q_proj matches; layer 1's, which differs because its inputs
    # do, is named too.
    messages = messages_since(client, sent, uri)
    assert messages[attention].startswith(
        "First divergence from the reference: layers.0.self_attn (TinyLlamaPortAttention), max abs diff 0.0107"
    )
    query = line_of(modeling_file, "query_states = self.q_proj(")
    assert statuses[query] == "match"
    assert messages[query].startswith("Matches the reference: layers.0.self_attn.q_proj, max abs diff ")
    assert messages[query].endswith("other calls on this line: 1 inherited (layers.1.self_attn.q_proj)")
    output = line_of(modeling_file, "attn_output = self.o_proj(attn_output)")
    assert statuses[output] == "inherited"
    assert messages[output].startswith("Differs only through its inputs: layers.0.self_attn.o_proj, max abs diff ")
    # NOTE: the editor's diff replays its suspects on the reference's inputs: o_proj's replay matches
    assert "(a replay on the reference's inputs matches)" in messages[output]
    # The client hears the result once, with where to look.
    (result_sent,) = [params for params in client.recorder.diff_results if params["uri"] == uri]
    assert result_sent["match"] is False and result_sent["reference"] == str(REFERENCE)
    assert result_sent["divergence"]["path"] == "layers.0.self_attn"
    assert result_sent["divergence"]["location"] == {"uri": uri, "line": attention}

    (warning,) = await wait_until(lambda: warnings(client, uri))
    assert warning.severity == types.DiagnosticSeverity.Warning
    assert warning.range.start.line == attention and warning.range.start.character == 8
    assert warning.message == (
        "First divergence from the reference: layers.0.self_attn (TinyLlamaPortAttention): max abs diff 0.01073, "
        "max rel diff 0.9239, relative error 0.01153, cosine 0.999934 (full check); it arises after "
        "layers.0.self_attn.v_proj "
        f"(line {line_of(modeling_file, 'value_states = self.v_proj(') + 1}) (still matches) and before "
        f"layers.0.self_attn.o_proj (line {line_of(modeling_file, 'attn_output = self.o_proj(') + 1}) (already differs)"
    )

    text = await hover_text(client, uri, attention)
    assert "**vs reference** `tiny_llama.mtrace`" in text
    assert "| `layers.0.self_attn` | same path | **first divergence** | 0.01073 | 0.9239 | full |" in text
    # layer 1's attention differs only because its inputs do: the hover says so, as its gutter does
    assert "| `layers.1.self_attn` | same path | inherited |" in text

    plot = await diff_plot(client, uri)
    assert len(plot.points) == 30
    assert plot.points[plot.first_divergence].path == "layers.0.self_attn"
    assert plot.atol == 1e-3 and plot.divergence.path == "layers.0.self_attn"


async def test_a_bad_reference_path_is_an_error_naming_it_and_changes_nothing(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_port(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.setReference", uri, str(REFERENCE)))["ok"]
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    (warning,) = await wait_until(lambda: warnings(client, uri))
    sent = len(client.recorder.line_statuses)
    missing = tmp_path / "nowhere.mtrace"

    result = await execute(client, "modelTrace.setReference", uri, str(missing))

    assert not result["ok"] and str(missing) in result["message"]
    assert client.messages[-1].type == types.MessageType.Error and str(missing) in client.messages[-1].message
    assert client.recorder.line_statuses[sent:] == []
    assert warnings(client, uri) == [warning]
    assert (await diff_plot(client, uri)).divergence.path == "layers.0.self_attn"


async def test_a_pinned_trace_is_the_reference_of_the_next_trace(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    assert (await execute(client, "modelTrace.trace", uri))["ok"]
    sent = len(client.recorder.line_statuses)

    pinned = await execute(client, "modelTrace.pinReference", uri)

    assert pinned["ok"] and pinned["diff"]["match"] is True
    assert pinned["reference"].endswith("-reference.mtrace") and Path(pinned["reference"], "trace.msgpack").is_file()
    # The editor's trace kept its full tensors (within modelTrace.fullTensorsMB): pinned as they are, no new trace.
    assert pinned["tensors"] == "full" and pinned["retraced"] is False, pinned
    assert Path(pinned["reference"], "tensors.safetensors").is_file()
    assert pinned["message"] == "ModelTrace: pinned modeling_tiny_llama.py as its reference with full tensors"
    assert client.messages[-1].message == pinned["message"]
    assert set((await wait_until(lambda: statuses_since(client, sent, uri))).values()) == {"match"}
    assert warnings(client, uri) == []

    source = modeling_file.read_text()
    correct = "return self.down_proj(gate * self.up_proj(hidden_states))"
    modeling_file.write_text(source.replace(correct, correct + " * 1.5"))
    sent = len(client.recorder.line_statuses)
    result = await execute(client, "modelTrace.trace", uri)

    assert result["ok"] and result["diff"]["match"] is False
    mlp_call = line_of(modeling_file, "hidden_states = self.mlp(hidden_states)")
    (warning,) = await wait_until(lambda: warnings(client, uri))
    assert warning.range.start.line == mlp_call
    assert "layers.0.mlp (TinyLlamaMLP)" in warning.message
    assert (await wait_until(lambda: statuses_since(client, sent, uri)))[mlp_call] == "divergence"
    # Pinning kept the reference: the new trace went to the trace folder, not over the pinned copy.
    assert Path(pinned["reference"]).is_dir() and result["trace"] != pinned["reference"]

    sent = len(client.recorder.line_statuses)
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
    assert await wait_until(lambda: statuses_since(client, sent, uri) == {})
    assert await wait_until(lambda: warnings(client, uri) == [])


async def test_a_trace_over_the_editors_budget_is_traced_again_with_full_tensors_to_pin_it(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    try:
        configure(client, {"fullTensorsMB": 0.001})  # MB: the example's hidden states alone are 1,792 bytes
        assert (await execute(client, "modelTrace.trace", uri))["ok"]
        pinned = await execute(client, "modelTrace.pinReference", uri)
    finally:
        configure(client, {"fullTensorsMB": Settings().full_tensors_mb})

    assert pinned["ok"] and pinned["tensors"] == "full" and pinned["retraced"] is True, pinned
    assert pinned["message"] == (
        "ModelTrace: pinned modeling_tiny_llama.py as its reference with full tensors "
        "(traced again with full tensors to pin it)"
    )


async def test_pinning_where_no_full_tensors_can_be_had_says_it_is_a_statistics_only_reference(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    try:
        configure(client, {"fullTensorsMB": 0})  # statistics only until a reference is set
        assert (await execute(client, "modelTrace.trace", uri))["ok"]
    finally:
        configure(client, {"fullTensorsMB": Settings().full_tensors_mb})
    # Untrusted, the file cannot be traced again with full tensors: what there is gets pinned, and said to be weaker.
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"workspaceTrusted": False}})
    )
    try:
        pinned = await execute(client, "modelTrace.pinReference", uri)
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"workspaceTrusted": True}})
        )

    assert pinned["ok"] and pinned["tensors"] == "statistics" and pinned["retraced"] is False, pinned
    assert not Path(pinned["reference"], "tensors.safetensors").exists()
    assert pinned["message"] == (
        "ModelTrace: pinned modeling_tiny_llama.py as a statistics-only reference: the diff compares each call's "
        "shape, mean, std, min and max, not every value, so a small difference can pass unseen and the first "
        "divergence is placed less precisely (the workspace is not trusted, so it cannot be traced again with full "
        "tensors)"
    )
    assert client.messages[-1].message == pinned["message"]
    assert client.messages[-1].type == types.MessageType.Warning
    assert (await execute(client, "modelTrace.clear", uri))["ok"]


async def test_pinning_needs_a_trace(client: LanguageClient, tmp_path: Path) -> None:
    modeling_file = copy_port(tmp_path)
    uri = open_document(client, modeling_file)

    result = await execute(client, "modelTrace.pinReference", uri)

    assert not result["ok"] and result["message"] == (
        "ModelTrace: modeling_tiny_llama_port.py has no trace to pin; trace it first"
    )


async def test_diff_settings_take_tolerances_and_rename_maps_and_skip_bad_values() -> None:
    settings = Settings().updated({"diffAtol": 1e-4, "diffRtol": 0, "diffMaps": [r"h\.(\d+)=>layers.\1"]})
    assert (settings.diff_atol, settings.diff_rtol, settings.diff_maps) == (1e-4, 0.0, (r"h\.(\d+)=>layers.\1",))
    unchanged = settings.updated({"diffAtol": -1, "diffMaps": ["no arrow"]})
    assert (unchanged.diff_atol, unchanged.diff_maps) == (1e-4, (r"h\.(\d+)=>layers.\1",))
    # NaN compares false with everything, inf passes any bug, a map with nested repetition can hang the diff
    for bad in ({"diffAtol": float("nan")}, {"diffRtol": float("inf")}, {"diffMaps": ["^(([a-z_.0-9])+)+X$=>y"]}):
        kept = settings.updated(bad)
        assert (kept.diff_atol, kept.diff_rtol, kept.diff_maps) == (1e-4, 0.0, (r"h\.(\d+)=>layers.\1",)), bad
    assert Settings().updated({"timeout": float("nan")}).timeout == Settings().timeout


async def test_an_independently_named_port_aligns_and_its_hover_names_the_reference(
    client: LanguageClient, tmp_path: Path
) -> None:
    """A Meta-style Llama (`blocks.0.attention.wq`) against transformers' `LlamaModel` (`…self_attn.q_proj`):
    the editor's diff aligns them by evidence and each compared line's hover names the reference call and how it
    was aligned; `modelTrace.diffMapping` makes the diff use an edited mapping file instead."""
    import subprocess
    import sys
    import textwrap

    pairs = REPOSITORY / "tests" / "python" / "align_pairs"
    port_file = tmp_path / "meta_llama.py"
    shutil.copy(pairs / "meta_llama.py", port_file)
    recipes = {
        "reference": "def build_model():\n    return reference_model(seed=0)\n\n"
        "def build_inputs(model):\n    return {'input_ids': torch.tensor(TOKENS), 'use_cache': False}\n",
        "port": "def build_model():\n    return port_model('renamed')\n\n"
        "def build_inputs(model):\n    return {'tokens': torch.tensor(TOKENS)}\n",
    }
    for name, body in recipes.items():
        recipe = tmp_path / f"recipe_{name}.py"
        recipe.write_text(
            textwrap.dedent(f"""
            import sys
            import torch
            sys.path.insert(0, {str(tmp_path)!r})
            from meta_llama import TOKENS, port_model, reference_model
        """)
            + body
        )
        traced = subprocess.run(
            [
                sys.executable,
                "-m",
                "modeltrace",
                "trace",
                str(port_file),
                "--recipe",
                str(recipe),
                "--out",
                str(tmp_path / f"{name}.mtrace"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert traced.returncode == 0, traced.stderr
    uri = open_document(client, port_file)
    await execute(client, "modelTrace.loadTrace", uri, str(tmp_path / "port.mtrace"))
    outcome = await execute(client, "modelTrace.setReference", uri, str(tmp_path / "reference.mtrace"))
    assert outcome["ok"] and outcome["diff"] is not None
    line = line_of(port_file, "xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)")
    hover = await hover_text(client, uri, line)
    assert "`layers.0.self_attn.q_proj` (aligned automatically, confidence 1.00)" in hover, hover
    assert "`layers.0.self_attn.k_proj` (aligned automatically" in hover

    mapping_file = tmp_path / "port.map"
    written = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "align",
            str(tmp_path / "reference.mtrace"),
            str(tmp_path / "port.mtrace"),
            "--out",
            str(mapping_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert written.returncode == 0, written.stderr
    text = mapping_file.read_text().replace(
        "layers.0.self_attn.k_proj => blocks.0.attention.wk", "layers.0.self_attn.v_proj => blocks.0.attention.wk", 1
    )
    text = text.replace(
        "layers.0.self_attn.v_proj => blocks.0.attention.wv", "layers.0.self_attn.k_proj => blocks.0.attention.wv", 1
    )
    mapping_file.write_text(text)
    mapped_line = next(
        number
        for number, content in enumerate(text.splitlines(), 1)
        if content.startswith("layers.0.self_attn.v_proj => blocks.0.attention.wk")
    )
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"diffMapping": str(mapping_file)}})
    )
    try:
        await execute(client, "modelTrace.setReference", uri, str(tmp_path / "reference.mtrace"))
        hover = await hover_text(client, uri, line)
        assert f"`layers.0.self_attn.v_proj` (mapping line {mapped_line})" in hover, hover
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"diffMapping": ""}})
        )
