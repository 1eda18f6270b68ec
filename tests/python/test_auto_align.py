"""Automatic alignment of implementations that share no module names (`diff/auto_align.py`), the mapping file
(`modeltrace align`, `diff --mapping`), and their bad input.

The pairs: transformers' `LlamaModel` against a Llama written with Meta's reference code's names
(`tests/python/align_pairs/meta_llama.py`): renamed modules, fused `wqkv`/`w13` projections, blocks two levels
deeper inside a wrapper beside a never-called `ModuleDict`, blocks whose class is `XAttentionBlock` (two words of
the class-name vocabulary), and the renamed port with its own random weights.
Each pair's truth mapping is written below from how the port was built, not from what the aligner found.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modeltrace.diff import align_modules, read_mapping
from modeltrace.diff.auto_align import DEFAULT_THRESHOLD
from modeltrace.diff.kinds import KIND_RULES, deciding_rule, kind_of_class
from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import Trace
from modeltrace.trace.storage import read_trace
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest


PAIRS_DIR = Path(__file__).parent / "align_pairs"
PORT_FILE = PAIRS_DIR / "meta_llama.py"
VARIANTS = ("renamed", "fused", "wrapped", "attention_block", "random")

# candidate path pattern -> reference path template, the port's construction written out (meta_llama.py)
TRUTH_RULES = [
    (r"^$", ""),
    (r"^tok_embeddings$", "embed_tokens"),
    (r"^final_norm$", "norm"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)$", r"layers.\1"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention_norm$", r"layers.\1.input_layernorm"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.ffn_norm$", r"layers.\1.post_attention_layernorm"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention$", r"layers.\1.self_attn"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention\.wq$", r"layers.\1.self_attn.q_proj"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention\.wk$", r"layers.\1.self_attn.k_proj"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention\.wv$", r"layers.\1.self_attn.v_proj"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention\.wo$", r"layers.\1.self_attn.o_proj"),
    (
        r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.attention\.wqkv$",
        r"layers.\1.self_attn.q_proj + layers.\1.self_attn.k_proj + layers.\1.self_attn.v_proj",
    ),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.feed_forward$", r"layers.\1.mlp"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.feed_forward\.w1$", r"layers.\1.mlp.gate_proj"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.feed_forward\.w3$", r"layers.\1.mlp.up_proj"),
    (r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.feed_forward\.w2$", r"layers.\1.mlp.down_proj"),
    (
        r"^(?:blocks|body\.trunk\.blocks)\.(\d+)\.feed_forward\.w13$",
        r"layers.\1.mlp.gate_proj + layers.\1.mlp.up_proj",
    ),
    (r"^body\.trunk$", None),  # the wrapper the reference does not have
]


def truth(candidate_path: str) -> str | None:
    for pattern, template in TRUTH_RULES:
        if re.match(pattern, candidate_path):
            return None if template is None else re.sub(pattern, template, candidate_path)
    raise AssertionError(f"no truth rule for {candidate_path!r}")


def _recipe(folder: Path, name: str, body: str) -> Path:
    path = folder / f"recipe_{name}.py"
    path.write_text(
        textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(PAIRS_DIR)!r})
        from meta_llama import TOKENS, port_model, reference_model
    """)
        + textwrap.dedent(body)
    )
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    """The reference and each port variant, traced once (statistics; full tensors for the reference)."""
    folder = tmp_path_factory.mktemp("align")
    recipes = {
        "reference": _recipe(
            folder,
            "reference",
            """
        def build_model():
            return reference_model(seed=0)

        def build_inputs(model):
            return {"input_ids": torch.tensor(TOKENS), "use_cache": False}
    """,
        )
    }
    for variant in VARIANTS:
        recipes[variant] = _recipe(
            folder,
            variant,
            f"""
            def build_model():
                return port_model({variant!r})

            def build_inputs(model):
                return {{"tokens": torch.tensor(TOKENS)}}
        """,
        )
    found = {}
    for name, recipe in recipes.items():
        out = folder / f"{name}.mtrace"
        worker.trace(
            TraceRequest(
                file=str(PORT_FILE),
                recipe=str(recipe),
                out=str(out),
                full_tensors=name in ("reference", "fused"),
            )
        )
        found[name] = out
    return found


def _score(reference: Trace, candidate: Trace) -> tuple[float, list[str]]:
    """Fraction of the candidate's module calls (those with a counterpart) aligned to the truth, and the wrong
    pairs at or above the threshold."""
    mapping = align_modules(reference, candidate)
    found = {}
    wrong = []
    for pair in mapping.pairs:
        reference_text = " + ".join(pair.reference)
        for path in pair.candidate:
            found[path] = reference_text if len(pair.candidate) == 1 else f"{reference_text} (split)"
            expected = truth(path)
            if expected != found[path] and pair.confidence >= DEFAULT_THRESHOLD:
                wrong.append(f"{path} -> {found[path]} ({pair.confidence}: {pair.evidence}), truth {expected}")
    with_truth = [record for record in candidate.modules if truth(record.path) is not None]
    right = sum(1 for record in with_truth if found.get(record.path) == truth(record.path))
    return right / len(with_truth), wrong


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_pair_aligns_to_its_truth(traces: dict[str, Path], variant: str) -> None:
    reference, candidate = read_trace(traces["reference"]), read_trace(traces[variant])
    assert not {record.path for record in reference.modules if record.path} & {
        record.path for record in candidate.modules if record.path
    }, "the pair shares module names"
    fraction, wrong = _score(reference, candidate)
    # NOTE: measured: every module with a counterpart aligns (100%); no margin, since any miss is a regression
    assert fraction == 1.0, f"{variant}: {fraction:.1%} aligned right"
    assert not wrong, "\n".join(wrong)


def test_fused_projections_pair_with_the_runs_they_replace(traces: dict[str, Path]) -> None:
    mapping = align_modules(read_trace(traces["reference"]), read_trace(traces["fused"]))
    fused = {pair.candidate[0]: pair for pair in mapping.pairs if pair.fused}
    assert set(fused) == {f"blocks.{n}.attention.wqkv" for n in (0, 1)} | {
        f"blocks.{n}.feed_forward.w13" for n in (0, 1)
    }
    assert fused["blocks.0.attention.wqkv"].reference == [f"layers.0.self_attn.{name}_proj" for name in "qkv"]
    assert "concatenation" in fused["blocks.0.attention.wqkv"].evidence
    assert "combined values equal" in fused["blocks.0.feed_forward.w13"].evidence
    # the traces record each module's parameters: the fused weight is the concatenation of the run's
    assert "weights concatenated" in fused["blocks.0.attention.wqkv"].evidence
    one_to_one = {pair.candidate[0]: pair for pair in mapping.pairs if not pair.fused}
    assert "weights equal" in one_to_one["blocks.0.attention.wo"].evidence
    assert "weights equal" in one_to_one["tok_embeddings"].evidence


def test_random_weights_are_no_evidence(traces: dict[str, Path]) -> None:
    """Different weights neither pair nor refuse: the random-weight port aligns by structure, and no pair claims
    equal weights."""
    mapping = align_modules(read_trace(traces["reference"]), read_trace(traces["random"]))
    assert not [pair for pair in mapping.pairs if "weights equal" in pair.evidence]


def test_diff_compares_fused_pairs_on_the_concatenation(traces: dict[str, Path]) -> None:
    """Both traces hold full tensors: the fused projection is compared with the concatenated reference
    outputs, element by element, and agrees."""
    completed = _cli("diff", str(traces["reference"]), str(traces["fused"]), "--format", "json")
    assert completed.returncode in (0, 1), completed.stderr
    document = json.loads(completed.stdout)
    assert document["mapping"]["source"] == "automatic" and document["mapping"]["fused"] == 4
    module = next(item for item in document["modules"] if item["path"] == "blocks.0.attention.wqkv")
    assert (
        module["reference_path"] == "layers.0.self_attn.q_proj + layers.0.self_attn.k_proj + layers.0.self_attn.v_proj"
    )
    assert module["alignment"]["fused"] and module["check"] == "full"
    assert module["status"] == "match", module


def test_debugger_output_as_the_reference(traces: dict[str, Path], tmp_path: Path) -> None:
    """A transformers debugger output carries no weights and no outputs of non-leaf modules: structure,
    signatures and leaf values still align the renamed port."""
    exported = _cli("export", str(traces["reference"]), "--hf-debugger", str(tmp_path / "debugger"))
    assert exported.returncode == 0, exported.stderr
    from modeltrace.trace.reference import load_reference

    with load_reference(tmp_path / "debugger") as reference:
        fraction, wrong = _score(reference.trace, read_trace(traces["renamed"]))
    assert fraction == 1.0 and not wrong, (fraction, wrong)  # measured: 100%


def test_mapping_file_round_trip_and_edit(traces: dict[str, Path], tmp_path: Path) -> None:
    mapping_file = tmp_path / "renamed.map"
    written = _cli("align", str(traces["reference"]), str(traces["renamed"]), "--out", str(mapping_file))
    assert written.returncode == 0, written.stderr
    text = mapping_file.read_text()
    assert "embed_tokens => tok_embeddings  # 1.00:" in text
    assert "# unaligned reference rotary_emb: best" in text  # the port computes its rotary tables inline
    reference, candidate = read_trace(traces["reference"]), read_trace(traces["renamed"])
    parsed = read_mapping(mapping_file, reference, candidate)
    automatic = align_modules(reference, candidate)
    assert [(pair.reference, pair.candidate) for pair in parsed.pairs] == [
        (pair.reference, pair.candidate) for pair in automatic.pairs
    ]
    # a user's edit is what the diff uses: pair wk with v_proj and wv with k_proj
    edited = text.replace(
        "layers.0.self_attn.k_proj => blocks.0.attention.wk", "layers.0.self_attn.v_proj => blocks.0.attention.wk", 1
    )
    edited = edited.replace(
        "layers.0.self_attn.v_proj => blocks.0.attention.wv", "layers.0.self_attn.k_proj => blocks.0.attention.wv", 1
    )
    mapping_file.write_text(edited)
    completed = _cli(
        "diff", str(traces["reference"]), str(traces["renamed"]), "--mapping", str(mapping_file), "--format", "json"
    )
    document = json.loads(completed.stdout)
    module = next(item for item in document["modules"] if item["path"] == "blocks.0.attention.wk")
    assert module["reference_path"] == "layers.0.self_attn.v_proj"
    assert module["alignment"]["how"] == "mapping" and module["alignment"]["mapping_line"] > 0
    assert document["mapping"]["source"] == str(mapping_file)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("embed_tokens -> tok_embeddings", r":6: expected 'REFERENCE => CANDIDATE'", id="no-arrow"),
        pytest.param(
            "embed_tokns => tok_embeddings",
            r":6: the reference trace has no module 'embed_tokns' "
            r"\(did you mean 'embed_tokens'\?\)",
            id="unknown-reference-path",
        ),
        pytest.param(
            "embed_tokens => tok_embeddings\nnorm => tok_embeddings",
            r":7: candidate module "
            r"'tok_embeddings' is already paired on line 6",
            id="paired-twice",
        ),
        pytest.param("a + b => c + d", r":6: a fused pair has one module on one side", id="runs-on-both-sides"),
    ],
)
def test_bad_mapping_files_name_the_line(traces: dict[str, Path], tmp_path: Path, line: str, message: str) -> None:
    mapping_file = tmp_path / "bad.map"
    mapping_file.write_text("# a mapping\n\n# with comments\n\n\n" + line + "\n")
    completed = _cli("diff", str(traces["reference"]), str(traces["renamed"]), "--mapping", str(mapping_file))
    assert completed.returncode == 2
    assert re.search(re.escape(str(mapping_file)) + message, completed.stderr), completed.stderr
    assert "Traceback" not in completed.stderr
    with pytest.raises(ModelTraceError, match=message):
        read_mapping(mapping_file, read_trace(traces["reference"]), read_trace(traces["renamed"]))


def test_unrelated_models_align_nothing(traces: dict[str, Path], tmp_path: Path, worker: WorkerClient) -> None:
    """A convolutional image model against the Llama: `align` and `diff` say nothing aligns, exit 2."""
    recipe = tmp_path / "recipe_cnn.py"
    recipe.write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 4, 3))
                self.pool = nn.AdaptiveAvgPool2d(1)

            def forward(self, images):
                return self.pool(self.features(images)).flatten(1)

        def build_model():
            torch.manual_seed(0)
            return Net().eval()

        def build_inputs(model):
            return (torch.randn(2, 3, 16, 16),)
    """)
    )
    out = tmp_path / "cnn.mtrace"
    worker.trace(TraceRequest(file=str(recipe), recipe=str(recipe), out=str(out)))
    aligned = _cli("align", str(traces["reference"]), str(out))
    assert aligned.returncode == 2 and "nothing aligns" in aligned.stderr, aligned.stderr
    diffed = _cli("diff", str(traces["reference"]), str(out))
    assert diffed.returncode == 2 and "nothing aligns" in diffed.stderr, diffed.stderr


@pytest.mark.parametrize(
    ("class_name", "kind"),
    [
        # two words of the vocabulary: the last one decides
        ("XAttentionBlock", "block"),
        ("ResidualAttentionBlock", "block"),
        ("BlockAttention", "attention"),
        ("MLPBlock", "block"),
        ("AttnBlock", "block"),
        ("CrossAttentionLayer", "block"),
        ("MixtralDecoderLayer", "block"),
        ("OlmoeDecoderLayer", "block"),
        ("LayerNorm", "norm"),
        ("Qwen2MoeMLP", "mlp"),
        ("AttentionPoolingHead", "head"),
        ("GPT2LMHeadModel", "model"),
        ("JinaEmbeddingsV3Attention", "attention"),
        ("NormedEmbedding", "embedding"),
        ("NormMlp", "mlp"),
        # a row an earlier word fixes: matched through to the end of the name
        ("LlamaRotaryEmbedding", "rotary"),
        ("MixtralSparseMoeBlock", "moe"),
        # one word
        ("LlamaAttention", "attention"),
        ("TransformerBlock", "block"),
        ("Conv1D", "linear"),
        ("RMSNorm", "norm"),
        ("FeedForward", "mlp"),
        ("Trunk", "unknown"),
    ],
)
def test_the_last_word_of_a_class_name_decides_its_kind(class_name: str, kind: str) -> None:
    assert kind_of_class(class_name) == kind
    rule = deciding_rule(class_name)
    assert (rule is None) == (kind == "unknown")
    if rule is not None:
        assert rule in KIND_RULES and rule.reason


def _cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", *arguments], capture_output=True, text=True, timeout=300
    )


def test_vectorised_scores_are_the_scalar_rule(traces: dict[str, Path]) -> None:
    """The NumPy scoring the alignment runs on every pair gives what `pair_score` (whose evidence text the
    mapping shows) gives, on every pair of two real traces."""
    import numpy as np

    from modeltrace.diff import auto_align

    reference, candidate = read_trace(traces["reference"]), read_trace(traces["fused"])
    ref_features, cand_features = auto_align.features(reference), auto_align.features(candidate)
    codes = auto_align._Codes(ref_features, cand_features)
    matrix = auto_align._score_rows(codes, slice(None))
    expected = np.array([[auto_align.pair_score(ref, cand)[0] for ref in ref_features] for cand in cand_features])
    np.testing.assert_allclose(matrix, expected, atol=1e-5)


def test_transposed_weights_identify_conv1d_against_linear(worker: WorkerClient, tmp_path: Path) -> None:
    """transformers' GPT-2 stores its projections as `Conv1D` (weight `[in, out]`); the corpus's nanoGPT-style
    port uses `nn.Linear` (`[out, in]`) with the weights copied: the aligner sees the same values transposed."""
    pair = Path(__file__).parent / "ports" / "gpt2"
    traced = {}
    for side, modeling_file in (("reference", "gpt2_reference.py"), ("port", "gpt2_port.py")):
        out = tmp_path / f"{side}.mtrace"
        worker.trace(
            TraceRequest(file=str(pair / modeling_file), recipe=str(pair / f"recipe_{side}.py"), out=str(out))
        )
        traced[side] = read_trace(out)
    mapping = align_modules(traced["reference"], traced["port"])
    by_candidate = {pair.candidate[0]: pair for pair in mapping.pairs if not pair.fused}
    projection = by_candidate["blocks.0.attn.qkv"]
    assert projection.reference == ["transformer.h.0.attn.c_attn"]
    assert "weights equal transposed" in projection.evidence
    assert "weights equal transposed" in by_candidate["blocks.1.mlp.fc"].evidence


def test_a_split_candidate_against_a_fused_reference(traces: dict[str, Path]) -> None:
    """The reverse of the fused pair: the fused port as the reference, transformers' separate projections as the
    candidate. The run q/k/v on the candidate's side is paired with `wqkv` and compared concatenated."""
    mapping = align_modules(read_trace(traces["fused"]), read_trace(traces["reference"]))
    split = {pair.reference[0]: pair for pair in mapping.pairs if pair.fused}
    assert split["blocks.0.attention.wqkv"].candidate == [f"layers.0.self_attn.{name}_proj" for name in "qkv"]
    assert split["blocks.1.feed_forward.w13"].candidate == ["layers.1.mlp.gate_proj", "layers.1.mlp.up_proj"]
    completed = _cli("diff", str(traces["fused"]), str(traces["reference"]), "--format", "json")
    document = json.loads(completed.stdout)
    group = next(
        item
        for item in document["modules"]
        if item["path"] == "layers.0.self_attn.q_proj + layers.0.self_attn.k_proj + layers.0.self_attn.v_proj"
    )
    assert group["reference_path"] == "blocks.0.attention.wqkv" and group["alignment"]["fused"]
    assert group["status"] == "match", group
