"""Generation traces (`trace --generate N`) and the step-aware diff, on copies of transformers' own model folders.

Each decode-only bug is injected into a copy of a real model (Llama, GPT-2, BART): the prompt's forward pass is
unchanged, so the prefill matches and the diff must name the first decode step that differs and the module where
it arises. Traces run in the shared warm worker (each in a fresh child, so each copy is imported on its own).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from modeltrace.diff import close_result, diff_paths, to_json
from modeltrace.trace.storage import read_trace
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest


MODELS = Path(transformers.__file__).resolve().parent / "models"
STEPS = 3


def copy_model(name: str, destination: Path, old: str | None = None, new: str | None = None) -> Path:
    """A copy of transformers' `models/NAME/` under `destination`, with `old` replaced by `new` (once)."""
    folder = destination / name
    shutil.copytree(MODELS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    modeling_file = folder / f"modeling_{name}.py"
    if old is not None:
        text = modeling_file.read_text()
        assert text.count(old) >= 1, f"{old!r} not in {modeling_file}"
        modeling_file.write_text(text.replace(old, new or "", 1))
    return modeling_file


def trace(worker: WorkerClient, file: Path, out: Path, **options: object) -> Path:
    request = TraceRequest(file=str(file), out=str(out), seed=0, timeout=300, **options)
    return Path(worker.trace(request).trace)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    """Unmodified copies of each model, traced once: their generation and their single forward pass."""
    root = tmp_path_factory.mktemp("references")
    traces = {}
    for name in ("llama", "gpt2", "bart"):
        file = copy_model(name, root)
        traces[name] = trace(worker, file, root / f"{name}.mtrace", generate=STEPS)
    forward_file = root / "llama" / "modeling_llama.py"
    traces["llama-forward"] = trace(worker, forward_file, root / "llama-forward.mtrace", model="LlamaForCausalLM")
    return traces


# Decode-only bugs: (model, bug name, text replaced, replacement, module path that must be named)
INDENT_LLAMA = "            "
INDENT_BART = "                "
PROMPT_MASK = (
    "        attn_weights = attn_weights + attention_mask\n"
    "    # a causal mask built for the prompt (square over the query positions), not extended for decode steps\n"
    "    prompt_causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()\n"
    "    attn_weights = attn_weights.masked_fill(~prompt_causal, torch.finfo(attn_weights.dtype).min)\n"
)
BUGS = [
    (
        "llama",
        "rotary offset ignoring the cache length",
        "position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)",
        "position_embeddings = self.rotary_emb(hidden_states, position_ids=torch.arange("
        "hidden_states.shape[1], device=hidden_states.device).unsqueeze(0))",
        "model",
    ),
    (
        "llama",
        "cache update off by one",
        "key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)\n",
        "key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)\n"
        f"{INDENT_LLAMA}if query_states.shape[2] == 1:  # the new entry written one slot early\n"
        f"{INDENT_LLAMA}    key_states[:, :, -1] = key_states[:, :, -2]\n"
        f"{INDENT_LLAMA}    value_states[:, :, -1] = value_states[:, :, -2]\n",
        "model.layers.0.self_attn",
    ),
    (
        "llama",
        "mask not extended for decode steps",
        "        attn_weights = attn_weights + attention_mask\n",
        PROMPT_MASK,
        "model.layers.0.self_attn",
    ),
    (
        "gpt2",
        "positions ignoring the cache length",
        "position_embeds = self.wpe(position_ids)",
        "position_embeds = self.wpe(torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device).unsqueeze(0))",
        "transformer",
    ),
    (
        "gpt2",
        "mask not extended for decode steps",
        "        attn_weights = attn_weights + attention_mask\n",
        PROMPT_MASK,
        "transformer.h.0.attn",
    ),
    (
        "bart",
        "cache update off by one",
        "key_states, value_states = curr_cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)\n",
        "key_states, value_states = curr_cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)\n"
        f"{INDENT_BART}if not is_cross_attention and hidden_states.shape[1] == 1:  # written one slot early\n"
        f"{INDENT_BART}    key_states[:, :, -1] = key_states[:, :, -2]\n"
        f"{INDENT_BART}    value_states[:, :, -1] = value_states[:, :, -2]\n",
        "model.decoder.layers.0.self_attn",
    ),
]


def test_generation_trace_records_steps_ids_and_cache(references: dict[str, Path]) -> None:
    loaded = read_trace(references["llama"])
    generation = loaded.generation
    assert loaded.model["class"] == "LlamaForCausalLM"  # --generate picks the file's generating class
    assert generation is not None and generation.steps == STEPS + 1 and generation.call == "generate"
    assert len(generation.generated_ids) == 1 and len(generation.generated_ids[0]) == STEPS + 1
    q_proj = [record for record in loaded.modules if record.path == "model.layers.0.self_attn.q_proj"]
    assert [loaded.step_of(record.index) for record in q_proj] == list(range(STEPS + 1))
    prompt = generation.prompt_length
    assert q_proj[0].outputs[0].shape[1] == prompt and all(record.outputs[0].shape[1] == 1 for record in q_proj[1:])
    layers = loaded.model["config"]["num_hidden_layers"]
    assert len(generation.cache) == (STEPS + 1) * layers
    # the cache grows by one position per decode step
    lengths = [entry.key.shape[2] for entry in generation.cache if entry.layer == 0]
    assert lengths == [prompt + step for step in range(STEPS + 1)]
    document = loaded.to_json()
    assert document["generation"]["steps"] == STEPS + 1
    assert {module["step"] for module in document["modules"]} == set(range(STEPS + 1))


def test_encoder_decoder_generation_runs_the_encoder_once_in_the_prefill(references: dict[str, Path]) -> None:
    loaded = read_trace(references["bart"])
    encoder = [record for record in loaded.modules if record.path == "model.encoder"]
    assert len(encoder) == 1 and loaded.step_of(encoder[0].index) == 0
    kinds = {entry.kind for entry in loaded.generation.cache}
    assert kinds == {"self", "cross"}


def test_identical_generations_match(references: dict[str, Path], worker: WorkerClient, tmp_path: Path) -> None:
    again = trace(worker, copy_model("gpt2", tmp_path), tmp_path / "again.mtrace", generate=STEPS)
    result = diff_paths(references["gpt2"], again)
    try:
        assert result.match
        document = to_json(result)
        assert document["generation"]["first_diverging_step"] is None
        assert document["generation"]["first_differing_token"] is None
        assert document["generation"]["compared_steps"] == STEPS + 1
    finally:
        close_result(result)


@pytest.mark.parametrize(("model", "bug", "old", "new", "module"), BUGS, ids=[f"{row[0]}: {row[1]}" for row in BUGS])
def test_decode_only_bug_is_found_at_its_step_and_module(
    model: str,
    bug: str,
    old: str,
    new: str,
    module: str,
    references: dict[str, Path],
    worker: WorkerClient,
    tmp_path: Path,
) -> None:
    buggy = trace(worker, copy_model(model, tmp_path, old, new), tmp_path / "buggy.mtrace", generate=STEPS)
    result = diff_paths(references[model], buggy)
    try:
        document = to_json(result)
        step_of = result.candidate.trace.step_of
        prefill = [
            entry
            for entry, record in zip(document["modules"], result.modules)
            if step_of(record.candidate.index) == 0 and entry["status"] != "not_compared"
        ]
        assert prefill and all(entry["status"] == "match" for entry in prefill), bug
        assert not result.match
        assert document["generation"]["first_diverging_step"] == 1
        assert document["first_divergence"]["step"] == 1
        assert document["first_divergence"]["path"] == module, document["first_divergence"]
    finally:
        close_result(result)


def test_a_single_forward_reference_is_compared_with_the_prefill(references: dict[str, Path]) -> None:
    result = diff_paths(references["llama-forward"], references["llama"])
    try:
        assert result.match, [(m.candidate.path, m.status, m.reason) for m in result.modules if m.status != "match"]
        assert result.steps is not None and result.steps.compared_steps == 1
        assert any("prefill (step 0)" in note for note in result.notes)
        assert all(result.candidate.trace.step_of(module.candidate.index) == 0 for module in result.modules)
    finally:
        close_result(result)


def test_cli_generate_json_and_step_diff_text(references: dict[str, Path], tmp_path: Path) -> None:
    buggy_file = copy_model("gpt2", tmp_path, BUGS[4][2], BUGS[4][3])
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "trace",
            str(buggy_file),
            "--generate",
            "2",
            "--format",
            "json",
            "--out",
            str(tmp_path / "cli.mtrace"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert document["generation"]["steps"] == 3 and {module["step"] for module in document["modules"]} == {0, 1, 2}
    diffed = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(references["gpt2"]), str(tmp_path / "cli.mtrace")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert diffed.returncode == 1, diffed.stderr
    assert "FIRST DIVERGING STEP: 1 (a decode step; the prefill matches)" in diffed.stdout
    assert "transformer.h.0.attn" in diffed.stdout


def test_generate_on_a_model_that_cannot_generate_names_what_to_use(tmp_path: Path) -> None:
    file = copy_model("llama", tmp_path)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "trace",
            str(file),
            "--model",
            "LlamaModel",
            "--generate",
            "2",
            "--out",
            str(tmp_path / "x.mtrace"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 2
    assert "LlamaModel cannot generate" in completed.stderr and "--model LlamaForCausalLM" in completed.stderr
    bert = copy_model("bert", tmp_path)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "trace",
            str(bert),
            "--model",
            "BertModel",
            "--generate",
            "2",
            "--out",
            str(tmp_path / "y.mtrace"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 2 and "BertModel cannot generate" in completed.stderr, completed.stderr


RECIPE = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64))


def build_inputs(model):
    return {"input_ids": torch.tensor([[5, 6, 7, 8]])}


def generate(model, inputs, steps):
    """A hand-written greedy loop: one call of the model per step, its cache carried along."""
    ids, cache = inputs["input_ids"], None
    new = []
    for _ in range(steps + 1):
        output = model(input_ids=ids if cache is None else new[-1], past_key_values=cache, use_cache=True)
        cache = output.past_key_values
        new.append(output.logits[:, -1:].argmax(-1))
    return torch.cat(new, dim=1)
'''


def test_a_recipe_defines_its_own_generation_call(worker: WorkerClient, tmp_path: Path) -> None:
    recipe = tmp_path / "recipe_generate.py"
    recipe.write_text(RECIPE)
    loaded = read_trace(trace(worker, recipe, tmp_path / "recipe.mtrace", recipe=str(recipe), generate=2))
    generation = loaded.generation
    assert generation.call == "recipe" and generation.steps == 3
    assert generation.prompt_length == 0 and len(generation.generated_ids[0]) == 3  # it returned the new ids only
    roots = [record for record in loaded.modules if record.path == ""]
    assert [loaded.step_of(record.index) for record in roots] == [0, 1, 2]
    assert [record.inputs[0].shape for record in roots] == [[1, 4], [1, 1], [1, 1]]
    assert {entry.step for entry in generation.cache} == {0, 1, 2}
