"""The first divergence's evidence in the editor: with line capture on, the warning goes on the first line whose
value differs, names the setting that was built differently, and the gutter marks that line and the line that
built the module; a setting the module's `__init__` computes is named, marked and gone to at its assignment."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from .support import copy_example, execute, line_of, open_document, wait_until
from .test_reference import statuses_since, warnings


pytestmark = pytest.mark.asyncio(loop_scope="session")

EPS_LINE = "self.post_attention_layernorm = TinyLlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)"
SCALING_LINE = "self.scaling = self.head_dim**-0.5"


async def test_an_eps_built_differently_is_warned_on_its_first_differing_line(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": True}})
    )
    try:
        assert (await execute(client, "modelTrace.trace", uri))["ok"]
        assert (await execute(client, "modelTrace.pinReference", uri))["ok"]
        source = modeling_file.read_text()
        modeling_file.write_text(
            source.replace(
                EPS_LINE,
                EPS_LINE.replace("eps=config.rms_norm_eps", "eps=config.rms_norm_eps if layer_idx != 1 else 1e-2"),
            )
        )
        sent = len(client.recorder.line_statuses)
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": False}})
        )

    assert result["ok"] and result["diff"]["match"] is False
    norm_line = line_of(modeling_file, "hidden_states = hidden_states * torch.rsqrt(")
    built_line = line_of(modeling_file, "self.post_attention_layernorm =")
    (warning,) = await wait_until(lambda: warnings(client, uri))
    assert warning.range.start.line == norm_line
    assert "layers.1.post_attention_layernorm (TinyLlamaRMSNorm)" in warning.message
    assert f"built differently: eps 1e-06 (reference) vs 0.01 (candidate), built at line {built_line + 1}" in (
        warning.message
    )
    statuses = await wait_until(lambda: statuses_since(client, sent, uri))
    assert statuses[norm_line] == "divergence" and statuses[built_line] == "divergence"
    assert (await execute(client, "modelTrace.clear", uri))["ok"]


async def test_a_setting_computed_in_init_is_warned_and_marked_at_its_assignment(
    client: LanguageClient, tmp_path: Path
) -> None:
    modeling_file = copy_example(tmp_path)
    uri = open_document(client, modeling_file)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": True}})
    )
    try:
        assert (await execute(client, "modelTrace.trace", uri))["ok"]
        assert (await execute(client, "modelTrace.pinReference", uri))["ok"]
        source = modeling_file.read_text()
        assert source.count(SCALING_LINE) == 1
        modeling_file.write_text(source.replace(SCALING_LINE, "self.scaling = self.head_dim**-0.25"))
        sent = len(client.recorder.line_statuses)
        results = len(client.recorder.diff_results)
        result = await execute(client, "modelTrace.trace", uri)
    finally:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"modelTrace": {"lines": False}})
        )

    assert result["ok"] and result["diff"]["match"] is False
    assigned = line_of(modeling_file, "self.scaling = self.head_dim**-0.25")
    built = line_of(modeling_file, "self.self_attn = TinyLlamaAttention(")
    (warning,) = await wait_until(lambda: warnings(client, uri))
    assert "layers.0.self_attn (TinyLlamaAttention)" in warning.message
    # the line that computes the setting is named, not the parent's line that built the attention
    assert f"scaling 0.25 (reference) vs 0.5 (candidate), assigned at line {assigned + 1}" in warning.message
    assert f"built at line {built + 1}" not in warning.message
    statuses = await wait_until(lambda: statuses_since(client, sent, uri))
    assert statuses[assigned] == "divergence" and statuses.get(built) != "divergence"
    # "Go to Line" goes to the assignment
    (sent_result,) = [params for params in client.recorder.diff_results[results:] if params["uri"] == uri]
    assert sent_result["divergence"]["location"] == {"uri": uri, "line": assigned}
    assert (await execute(client, "modelTrace.clear", uri))["ok"]
