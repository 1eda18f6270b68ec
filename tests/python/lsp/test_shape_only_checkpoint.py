"""The `modelTrace.shapeOnly` and `modelTrace.checkpoint` settings reach the worker's trace request."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from modeltrace.trace.storage import read_trace

from .support import COLD_TRACE_SECONDS, copy_example, execute, inlay_hints, line_of, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")


def _configure(client: LanguageClient, **values: object) -> None:
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"modelTrace": values}))


def _transformers_llama() -> Path:
    # NOTE: found without importing transformers (seconds) into the test process.
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "models" / "llama" / "modeling_llama.py"


def _root_output(trace_path: str) -> tuple[list[int], float | None, float | None]:
    trace = read_trace(trace_path)
    root = next(record for record in trace.modules if record.path == "")
    output = root.outputs[0]
    return list(output.shape), output.mean, output.std


async def test_the_shape_only_setting_traces_the_full_size_config_with_no_statistics(client: LanguageClient) -> None:
    llama = _transformers_llama()
    uri = open_document(client, llama)
    mlp_call = line_of(llama, "hidden_states = self.mlp(hidden_states)")

    result = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"], result
    # Unaided: a shrunk config (hidden 64, 2 layers) with random weights.
    assert (await inlay_hints(client, uri))[mlp_call] == ": [1,7,64]"

    _configure(client, shapeOnly=True)
    try:
        result = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
        assert result["ok"], result
        # LlamaConfig()'s own sizes: hidden 4096, 32 layers, on the meta device.
        assert (await inlay_hints(client, uri))[mlp_call] == ": [1,7,4096]"
        trace = read_trace(result["trace"])
        assert trace.model["options"]["shape_only"] is True
        summaries = [summary for record in trace.modules for summary in (*record.inputs, *record.outputs)]
        assert summaries and all(summary.mean is None and summary.std is None for summary in summaries)
    finally:
        _configure(client, shapeOnly=False)


async def test_the_checkpoint_setting_traces_the_saved_weights(client: LanguageClient, tmp_path: Path) -> None:
    import torch

    from modeltrace.worker.building import import_user_file
    from modeltrace.worker.building import InputSynthesizer

    modeling = copy_example(tmp_path)
    module = import_user_file(modeling)
    torch.manual_seed(1234)  # not the trace's seed: weights a shrunk random build would not have
    saved = module.TinyLlamaModel(module.TinyLlamaModel.config_class())
    checkpoint = tmp_path / "checkpoint"
    saved.save_pretrained(checkpoint)

    # A direct run of the checkpoint on the inputs the builder synthesises (seed 0): the class built from the
    # saved config, the saved weights loaded into it.
    from safetensors.torch import load_file

    direct = module.TinyLlamaModel(module.TinyLlamaModel.config_class.from_pretrained(checkpoint))
    direct.load_state_dict(load_file(checkpoint / "model.safetensors"))
    direct.eval()
    inputs = next(InputSynthesizer(direct, direct.config, 0).variants()).inputs
    with torch.no_grad():
        expected = direct(**inputs).last_hidden_state

    uri = open_document(client, modeling)
    _configure(client, checkpoint=str(checkpoint))
    try:
        result = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
        assert result["ok"], result
    finally:
        _configure(client, checkpoint="")
    shape, mean, std = _root_output(result["trace"])
    assert read_trace(result["trace"]).model["options"]["checkpoint"] == str(checkpoint.resolve())
    assert shape == list(expected.shape)
    assert math.isclose(mean, expected.mean().item(), rel_tol=1e-4, abs_tol=1e-6)
    assert math.isclose(std, expected.std().item(), rel_tol=1e-4, abs_tol=1e-6)

    # The same file traced without the setting has random weights: another summary.
    result = await execute(client, "modelTrace.trace", uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"], result
    _, random_mean, random_std = _root_output(result["trace"])
    assert not math.isclose(random_mean, mean, rel_tol=1e-3, abs_tol=1e-6)


async def test_a_hub_id_as_checkpoint_is_refused_with_a_message_naming_it(client: LanguageClient) -> None:
    _configure(client, checkpoint="meta-llama/Llama-3.1-8B")
    try:
        result = await execute(client, "modelTrace.trace", client.example_uri, timeout=COLD_TRACE_SECONDS)
    finally:
        _configure(client, checkpoint="")

    assert not result["ok"]
    message = result["message"]
    assert "'meta-llama/Llama-3.1-8B'" in message and "Hugging Face Hub model id" in message
    assert "never downloads" in message and "save_pretrained" in message
    assert client.messages[-1] == types.ShowMessageParams(type=types.MessageType.Error, message=message)
    assert client.recorder.statuses[-1]["state"] == "error"

    # The next trace, without the setting, works again.
    result = await execute(client, "modelTrace.trace", client.example_uri, timeout=COLD_TRACE_SECONDS)
    assert result["ok"], result
