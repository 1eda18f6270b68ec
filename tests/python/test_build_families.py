"""The unaided build across transformers' model families, shape-only mode, local checkpoints, plain modules.

- Representative families of every modality are built from their shrunk default configs, with inputs
  synthesised for each modality (token ids, pixel values, patch grids, audio features, image tokens in a
  multimodal prompt), and traced with capture.
- Shape-only mode (meta device) gives exactly the shapes and dtypes of a real run of the same config, and
  a Llama-3-70B configuration traces on the meta device without allocating its weights (how fast:
  bench/bench_shape_only.py).
- A folder saved with `save_pretrained` loads as a local checkpoint; a hub id is refused, never downloaded.
- Plain modules of a file (a decoder layer, an MLP) build from the file's config; bad input ends in one
  clear message that says what to provide.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import torch
import transformers

from modeltrace.errors import ModelTraceError, TraceFailed
from modeltrace.trace.storage import read_trace
from modeltrace.worker.building import build_from_file, build_from_request
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

from conftest import EXAMPLE_MODELING_FILE


MODELS = Path(transformers.__file__).parent / "models"

# family: (modeling file, base class, what the synthesised inputs must hold)
FAMILIES = {
    "gpt2": ("gpt2/modeling_gpt2.py", "GPT2Model", {"input_ids"}),
    "gemma2 (sliding window, layer types)": ("gemma2/modeling_gemma2.py", "Gemma2Model", {"input_ids"}),
    "mixtral (mixture of experts)": ("mixtral/modeling_mixtral.py", "MixtralModel", {"input_ids"}),
    "bart (encoder-decoder)": ("bart/modeling_bart.py", "BartModel", {"input_ids", "decoder_input_ids"}),
    "whisper (audio features)": (
        "whisper/modeling_whisper.py",
        "WhisperModel",
        {"input_features", "decoder_input_ids"},
    ),
    "wav2vec2 (raw audio)": ("wav2vec2/modeling_wav2vec2.py", "Wav2Vec2Model", {"input_values"}),
    "vit (pixel values)": ("vit/modeling_vit.py", "ViTModel", {"pixel_values"}),
    "swin (staged vision)": ("swin/modeling_swin.py", "SwinModel", {"pixel_values"}),
    "clip (text + vision)": ("clip/modeling_clip.py", "CLIPModel", {"input_ids", "pixel_values"}),
    "qwen2_vl (image grid, image tokens)": (
        "qwen2_vl/modeling_qwen2_vl.py",
        "Qwen2VLModel",
        {"input_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids"},
    ),
    "mamba (state space)": ("mamba/modeling_mamba.py", "MambaModel", {"input_ids"}),
    "jamba (hybrid attention / mamba / experts)": ("jamba/modeling_jamba.py", "JambaModel", {"input_ids"}),
}


def _shapes(capture: ModuleCapture) -> list[tuple]:
    return [
        (record.path, record.call_index, tuple((s.key, tuple(s.shape), s.dtype) for s in record.outputs))
        for record in capture.records
    ]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_traces_unaided(family: str) -> None:
    relative, class_name, expected_inputs = FAMILIES[family]
    built = build_from_file(MODELS / relative, None, None, seed=0)
    assert built.model_class == class_name
    assert expected_inputs <= set(built.kwargs), (built.notes, set(built.kwargs))
    assert sum(parameter.numel() for parameter in built.model.parameters()) < 5_000_000
    with torch.no_grad(), ModuleCapture(built.model) as capture:
        built.model(*built.args, **built.kwargs)
    assert len(capture.records) > 10
    assert capture.records[0].outputs, family


def test_multimodal_prompt_holds_one_image_token_per_image_feature() -> None:
    built = build_from_file(MODELS / "qwen2_vl" / "modeling_qwen2_vl.py", None, None, seed=0)
    config = built.model.config
    input_ids = built.kwargs["input_ids"][0]
    images = int((input_ids == config.image_token_id).sum())
    grid = built.kwargs["image_grid_thw"][0]
    assert images == int(grid.prod()) // config.vision_config.spatial_merge_size**2
    assert (built.kwargs["mm_token_type_ids"][0] == 1).sum() == images
    assert config.text_config.hidden_size == 64 and config.vision_config.depth == 2


def test_shrunk_configs_keep_their_rules() -> None:
    gemma2 = build_from_file(MODELS / "gemma2" / "modeling_gemma2.py", None, None, seed=0).model.config
    assert gemma2.num_hidden_layers == 2 == len(gemma2.layer_types)
    assert set(gemma2.layer_types) == {"sliding_attention", "full_attention"}
    assert gemma2.sliding_window < 7  # shorter than the synthesised sequence, so the window really cuts
    mixtral = build_from_file(MODELS / "mixtral" / "modeling_mixtral.py", None, None, seed=0).model.config
    assert mixtral.num_local_experts == 4 and mixtral.num_experts_per_tok == 2
    assert mixtral.num_attention_heads % mixtral.num_key_value_heads == 0 < mixtral.num_key_value_heads < 4


# --- shape-only -----------------------------------------------------------------------------------------


def _saved_config(tmp_path: Path, relative: str) -> Path:
    """The shrunk config the unaided build uses, written to a config.json (so both runs share it)."""
    built = build_from_file(MODELS / relative, None, None, seed=0)
    folder = tmp_path / "config"
    built.model.config.save_pretrained(folder)
    return folder / "config.json"


@pytest.mark.parametrize(
    "relative", ["llama/modeling_llama.py", "qwen2_vl/modeling_qwen2_vl.py", "bart/modeling_bart.py"]
)
def test_shape_only_gives_the_shapes_of_a_real_run(tmp_path: Path, relative: str) -> None:
    config = _saved_config(tmp_path, relative)
    real = build_from_file(MODELS / relative, None, config, seed=0)
    with torch.no_grad(), ModuleCapture(real.model) as real_capture:
        real.model(**real.kwargs)
    meta = build_from_file(MODELS / relative, None, config, seed=0, shape_only=True)
    assert meta.shape_only
    assert all(parameter.device.type == "meta" for parameter in meta.model.parameters())
    with torch.no_grad(), meta.forward_context(), ModuleCapture(meta.model) as meta_capture:
        meta.model(**meta.kwargs)
    assert _shapes(meta_capture) == _shapes(real_capture)
    assert meta_capture.records[1].outputs[0].mean is None  # no values on the meta device
    assert not meta.notes["approximations"]


LLAMA_3_70B_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama_3_70b.json"


def test_shape_only_traces_llama_3_70b_without_allocating_its_weights(tmp_path: Path) -> None:
    # NOTE: how fast this is belongs to bench/bench_shape_only.py; here, what makes it fast: nothing is allocated.
    config = tmp_path / "config.json"
    shutil.copyfile(LLAMA_3_70B_CONFIG, config)
    built = build_from_request(
        TraceRequest(
            file=str(MODELS / "llama" / "modeling_llama.py"),
            config=str(config),
            shape_only=True,
            dtype="bfloat16",
            seed=0,
        )
    )
    with torch.no_grad(), built.forward_context(), ModuleCapture(built.model) as capture:
        built.model(**built.kwargs)
    assert sum(parameter.numel() for parameter in built.model.parameters()) > 69e9
    assert {tensor.device.type for tensor in [*built.model.parameters(), *built.model.buffers()]} == {"meta"}
    layers = {record.path for record in capture.records if record.path.startswith("layers.")}
    assert "layers.79.mlp.down_proj" in layers
    (down,) = [record for record in capture.records if record.path == "layers.79.mlp.gate_proj"]
    assert down.outputs[0].shape == [1, 7, 28672] and down.outputs[0].dtype == "bfloat16"
    assert capture.records[0].outputs[0].shape == [1, 7, 8192]
    # every captured output is a shape without values (a meta tensor has none to summarise)
    assert all(summary.mean is None for record in capture.records for summary in record.outputs)


def test_shape_only_through_the_worker(worker: WorkerClient, tmp_path: Path) -> None:
    """The request key `shape_only` (CLI `--shape-only`): the model stays on the meta device, the header says so."""
    config = tmp_path / "config.json"
    shutil.copyfile(LLAMA_3_70B_CONFIG, config)
    result = worker.trace(
        TraceRequest(
            file=str(MODELS / "llama" / "modeling_llama.py"),
            config=str(config),
            shape_only=True,
            dtype="bfloat16",
            out=str(tmp_path / "70b.mtrace"),
            timeout=120,
        )
    )
    trace = read_trace(result.trace)
    assert trace.model["options"]["shape_only"] is True
    assert trace.model["build"]["shape_only"] is True and not trace.model["build"]["approximations"]
    (gate,) = [record for record in trace.modules if record.path == "layers.79.mlp.gate_proj"]
    assert gate.outputs[0].shape == [1, 7, 28672] and gate.outputs[0].dtype == "bfloat16"
    assert gate.outputs[0].mean is None and gate.outputs[0].device == "meta"


def test_hub_id_through_the_worker_is_one_clear_line(worker: WorkerClient, tmp_path: Path) -> None:
    with pytest.raises(TraceFailed) as caught:
        worker.trace(
            TraceRequest(
                file=str(MODELS / "llama" / "modeling_llama.py"),
                checkpoint="meta-llama/Meta-Llama-3-8B",
                out=str(tmp_path / "hub.mtrace"),
                timeout=60,
            )
        )
    assert caught.value.error.kind == "ModelTraceError" and caught.value.error.cause == "input"
    assert "never downloads" in str(caught.value) and "\n" not in str(caught.value)


# --- local checkpoints ----------------------------------------------------------------------------------


def test_local_checkpoint_loads_the_saved_weights(tmp_path: Path) -> None:
    file = MODELS / "llama" / "modeling_llama.py"
    original = build_from_file(file, None, None, seed=0)
    original.model.save_pretrained(tmp_path / "checkpoint")
    loaded = build_from_file(file, None, None, seed=123, checkpoint=tmp_path / "checkpoint")
    assert loaded.notes["checkpoint"] == str((tmp_path / "checkpoint").resolve())
    for (name, expected), (_, actual) in zip(original.model.state_dict().items(), loaded.model.state_dict().items()):
        assert torch.equal(expected, actual), name
    with torch.no_grad():
        assert torch.equal(
            original.model(**original.kwargs).last_hidden_state, loaded.model(**original.kwargs).last_hidden_state
        )


@pytest.mark.parametrize("checkpoint", ["meta-llama/Meta-Llama-3-70B", "/no/such/folder"])
def test_checkpoint_never_downloads(checkpoint: str) -> None:
    with pytest.raises(ModelTraceError, match="never downloads") as caught:
        build_from_file(MODELS / "llama" / "modeling_llama.py", None, None, seed=0, checkpoint=checkpoint)
    assert checkpoint in str(caught.value)
    if "/" in checkpoint and not checkpoint.startswith("/"):
        assert "save_pretrained" in str(caught.value) and "--recipe" in str(caught.value)


# --- classes of the file --------------------------------------------------------------------------------


def test_head_on_request() -> None:
    built = build_from_file(MODELS / "llama" / "modeling_llama.py", "LlamaForCausalLM", None, seed=0)
    with torch.no_grad():
        logits = built.model(**built.kwargs).logits
    assert logits.shape == (1, 7, built.model.config.vocab_size)


@pytest.mark.parametrize(
    "class_name, output_shape",
    [("TinyLlamaMLP", (1, 7, 64)), ("TinyLlamaDecoderLayer", (1, 7, 64)), ("TinyLlamaAttention", (1, 7, 64))],
)
def test_plain_modules_of_the_file(class_name: str, output_shape: tuple) -> None:
    built = build_from_file(EXAMPLE_MODELING_FILE, class_name, None, seed=0)
    with torch.no_grad(), ModuleCapture(built.model) as capture:
        output = built.model(**built.kwargs)
    output = output[0] if isinstance(output, tuple) else output
    assert tuple(output.shape) == output_shape
    assert capture.records[0].path == "" and capture.records[0].class_name == class_name


def test_plain_module_of_a_transformers_file_shape_only() -> None:
    built = build_from_file(MODELS / "llama" / "modeling_llama.py", "LlamaDecoderLayer", None, seed=0, shape_only=True)
    with torch.no_grad(), built.forward_context():
        output = built.model(**built.kwargs)
    assert output.shape == (1, 7, 4096) and output.device.type == "meta"  # LlamaConfig() is Llama-2-7B sized


# --- bad input ------------------------------------------------------------------------------------------


def _write_package(tmp_path: Path, name: str, config_body: str, model_body: str) -> Path:
    # NOTE: a package name per test: the build imports it in this process, where a module stays cached.
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "configuration_odd.py").write_text(textwrap.dedent(config_body))
    (package / "modeling_odd.py").write_text(textwrap.dedent(model_body))
    return package / "modeling_odd.py"


_ODD_MODEL = """
    import torch
    from torch import nn
    from transformers import PreTrainedModel
    from .configuration_odd import OddConfig

    class OddPreTrainedModel(PreTrainedModel):
        config_class = OddConfig
        base_model_prefix = "model"

    class OddModel(OddPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.post_init()

        def forward(self, trajectory, reward_scale):
            return self.proj(trajectory) * reward_scale
"""


def test_inputs_that_cannot_be_synthesised_ask_for_a_recipe(tmp_path: Path) -> None:
    file = _write_package(
        tmp_path,
        "odd_inputs",
        """
        from transformers import PreTrainedConfig

        class OddConfig(PreTrainedConfig):
            model_type = "odd"
            hidden_size: int = 32
        """,
        _ODD_MODEL,
    )
    with pytest.raises(ModelTraceError, match=r"needs trajectory, reward_scale.*--recipe"):
        build_from_file(file, None, None, seed=0)


def test_a_config_that_cannot_be_built_asks_for_a_config_or_recipe(tmp_path: Path) -> None:
    file = _write_package(
        tmp_path,
        "odd_config",
        """
        from transformers import PreTrainedConfig

        class OddConfig(PreTrainedConfig):
            model_type = "odd"
            hidden_size: int = 32

            def __post_init__(self, **kwargs):
                super().__post_init__(**kwargs)
                raise ValueError("this config needs a checkpoint's values")
        """,
        _ODD_MODEL,
    )
    with pytest.raises(ModelTraceError, match=r"cannot build OddConfig\(\).*--config or --recipe"):
        build_from_file(file, None, None, seed=0)


# --- general rules learnt from the breadth benchmark (config-level checks: no model is run) -------------------


def test_validation_messages_say_what_to_set() -> None:
    from modeltrace.worker.building.shrink import told_values

    assert told_values("ValueError: Qwen4-Exp QSA requires indexer_kv_heads=1.") == {"indexer_kv_heads": 1}
    assert told_values("hidden_size_per_layer_input must be 0, got 256") == {"hidden_size_per_layer_input": 0}
    assert told_values("num_key_value_heads must match num_attention_heads") == {
        "num_key_value_heads": ("=", "num_attention_heads")
    }
    # A sum is not a field to copy.
    assert told_values("n_input_layers + n_recurrent_layers + n_output_layers must equal num_hidden_layers") == {}


def test_shrinking_rederives_what_post_init_derived_from_the_layer_count() -> None:
    from transformers.models.dory.configuration_dory import DoryConfig

    from modeltrace.worker.building.shrink import shrink

    # Dory's defaults list attention and mlp blocks separately (144 entries for 72 layers) and split the layers
    # into input, recurrent and output parts that must add up.
    config = shrink(DoryConfig(), "tiny")
    assert config.n_input_layers + config.n_recurrent_layers + config.n_output_layers == config.num_hidden_layers
    assert len(config.layer_types) == config.num_hidden_layers <= 3


def test_sizes_the_defaults_leave_unset_are_given_small_values() -> None:
    from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaConfig

    from modeltrace.worker.building.shrink import shrink

    text = shrink(DiffusionGemmaConfig(), "tiny").text_config
    assert (text.num_experts, text.top_k_experts, text.moe_intermediate_size) == (4, 2, 128)


def test_mrope_sections_cover_the_rotary_part_of_the_head() -> None:
    from transformers.models.glm4v_moe.configuration_glm4v_moe import Glm4vMoeConfig

    from modeltrace.worker.building.shrink import shrink

    text = shrink(Glm4vMoeConfig(), "tiny").text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    factor = text.rope_parameters.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0))
    assert factor == 0.5
    assert sum(text.rope_parameters["mrope_section"]) == int(head_dim * factor) // 2


def test_defaults_rejected_by_their_own_validation_are_built_as_the_message_says(tmp_path: Path) -> None:
    from transformers.models.gemma4_assistant.configuration_gemma4_assistant import Gemma4AssistantConfig

    from modeltrace.worker.building.configs import default_config

    with pytest.raises(Exception, match="must be 0"):
        Gemma4AssistantConfig()
    config = default_config(Gemma4AssistantConfig, tmp_path / "modeling_x.py")
    assert config.text_config.hidden_size_per_layer_input == 0


def test_a_base_model_whose_inputs_cannot_be_made_gives_way_to_another_class_of_the_file() -> None:
    # SLANet's `SLANetSLAHead` (the base-model rule's pick) takes a backbone's features; the table-recognition
    # model takes the image.
    built = build_from_file(MODELS / "slanet" / "modeling_slanet.py", None, None, seed=0)
    assert built.model_class == "SLANetForTableRecognition"
    assert "pixel_values" in built.kwargs and "SLANetSLAHead" in built.notes["instead_of"]


def test_an_unaided_build_that_never_ran_says_what_to_provide(tmp_path: Path) -> None:
    modeling = tmp_path / "broken" / "modeling_broken.py"
    modeling.parent.mkdir()
    (modeling.parent / "__init__.py").write_text("")
    modeling.write_text(
        textwrap.dedent("""
        import torch
        from transformers import LlamaConfig, PreTrainedModel


        class BrokenModel(PreTrainedModel):
            config_class = LlamaConfig

            def __init__(self, config):
                super().__init__(config)
                self.proj = torch.nn.Linear(config.hidden_size, 3)
                self.post_init()

            def forward(self, input_ids):
                return self.proj(input_ids.float())
    """)
    )
    request = TraceRequest(file=str(modeling), out=str(tmp_path / "broken.mtrace"), timeout=60, seed=0)
    with WorkerClient() as worker, pytest.raises(TraceFailed) as caught:
        worker.trace(request)
    message = str(caught.value)
    assert message.startswith("BrokenModel.forward raised RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert "pass --recipe with build_model() and build_inputs(model), or --config" in message
