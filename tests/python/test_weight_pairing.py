"""Which tensors pair with which (issue 30): identical parameters against call order, and a last-position head
against the whole sequence's logits. Tiny gated-MLP models (tests/python/align_pairs/gated_mlp.py): a reference
with transformers' names and a port with Meta's, its weights copied, one bug injected at a time; the corpus
verdicts (tests/python/test_port_verdicts.py, Meta's Llama) run the same rules end to end."""

from __future__ import annotations

import io
import json
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from modeltrace.cli import main
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest


MODEL_FILE = Path(__file__).parent / "align_pairs" / "gated_mlp.py"
BUGS = ("clean", "silu_on_w3", "converter_swap", "converter_up_twice", "last_position")
# the pairs a user would write by hand (the llama corpus pair's rules, for these names)
MAPS = (
    r"^tok_embeddings$=>embed_tokens",
    r"\.feed_forward\.w1$=>.mlp.gate_proj",
    r"\.feed_forward\.w2$=>.mlp.down_proj",
    r"\.feed_forward\.w3$=>.mlp.up_proj",
    r"\.feed_forward$=>.mlp",
)


def _line_of(text: str) -> int:
    """The line of MODEL_FILE holding `text` (the truth of a bug, read from the model file, not from the diff)."""
    lines = MODEL_FILE.read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, worker: WorkerClient) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("weight_pairing")
    found = {}
    for name in ("reference", *BUGS):
        build = "reference_model()" if name == "reference" else f"port_model({'' if name == 'clean' else repr(name)})"
        recipe = folder / f"recipe_{name}.py"
        recipe.write_text(
            textwrap.dedent(f"""
            import sys
            import torch
            sys.path.insert(0, {str(MODEL_FILE.parent)!r})
            from gated_mlp import TOKENS, port_model, reference_model

            def build_model():
                return {build}

            def build_inputs(model):
                return (torch.tensor(TOKENS),)
            """)
        )
        out = folder / f"{name}.mtrace"
        worker.trace(TraceRequest(file=str(MODEL_FILE), recipe=str(recipe), out=str(out), full_tensors=True))
        found[name] = out
    return found


def _diff(traces: dict[str, Path], name: str, *options: str) -> tuple[int, dict]:
    stdout = io.StringIO()
    arguments = ["diff", str(traces["reference"]), str(traces[name]), "--format", "json", *options]
    with redirect_stdout(stdout), redirect_stderr(io.StringIO()):
        exit_code = main(arguments)
    return exit_code, json.loads(stdout.getvalue())


def _maps() -> tuple[str, ...]:
    return tuple(option for rule in MAPS for option in ("--map", rule))


def test_the_clean_port_matches_with_and_without_maps(traces: dict[str, Path]) -> None:
    assert _diff(traces, "clean")[0] == 0
    assert _diff(traces, "clean", *_maps())[0] == 0


def test_identical_weights_pair_projections_against_call_order(traces: dict[str, Path]) -> None:
    """The port's forward applies the SiLU to w3 (called first), whose weights are up_proj's: paired by call order,
    w3 would be blamed as a gate projection with the wrong weights; paired by its weights, the projections match
    and the feed-forward's own line is the first divergence."""
    exit_code, document = _diff(traces, "silu_on_w3")
    assert exit_code == 1
    first = document["first_divergence"]
    assert first["path"] == "layers.0.feed_forward"
    bug_line = _line_of("F.silu(self.w3(x)) * self.w1(x)")
    assert first["lines"]["start"] <= bug_line <= first["lines"]["end"]
    modules = {item["path"]: item for item in document["modules"]}
    for projection, counterpart in (("w1", "gate_proj"), ("w3", "up_proj")):
        record = modules[f"layers.0.feed_forward.{projection}"]
        assert record["reference_path"] == f"layers.0.mlp.{counterpart}"
        assert record["status"] == "match" and "weights equal" in record["alignment"]["evidence"]


def test_a_converter_swap_is_still_blamed_at_the_projection_where_a_map_names_its_role(
    traces: dict[str, Path],
) -> None:
    """Weights loaded into the wrong projections compute what the forward's swap computes; with the user's map
    (w1 is the gate), the map is the stronger evidence and the projection is blamed at its construction."""
    exit_code, document = _diff(traces, "converter_swap", *_maps())
    assert exit_code == 1
    first = document["first_divergence"]
    assert first["path"] == "layers.0.feed_forward.w1"
    assert first["built_at"]["line"] == _line_of("self.w1 = nn.Linear")
    assert any(item["name"] == "weight" and item["status"] == "different" for item in first["parameters"])


def test_a_converter_swap_is_blamed_at_the_projection_without_a_map(traces: dict[str, Path]) -> None:
    """With no map, the order each side built its modules breaks the tie between call order and weights: the
    port builds w1 before w3 as the reference builds gate_proj before up_proj, and calls w1 first as the reference
    calls gate_proj first; only the weights disagree, so they are what is wrong."""
    exit_code, document = _diff(traces, "converter_swap")
    assert exit_code == 1
    first = document["first_divergence"]
    assert first["path"] == "layers.0.feed_forward.w1"
    assert first["built_at"]["line"] == _line_of("self.w1 = nn.Linear")


def test_a_weight_copied_to_two_projections_identifies_neither(traces: dict[str, Path]) -> None:
    """w1 and w3 both loaded from up_proj: their weights match up_proj twice, which is no evidence of role, so the
    call order pairs them and the gate projection with up_proj's weights is blamed, at its construction line."""
    exit_code, document = _diff(traces, "converter_up_twice")
    assert exit_code == 1
    first = document["first_divergence"]
    assert first["path"] == "layers.0.feed_forward.w1"
    assert first["built_at"]["line"] == _line_of("self.w1 = nn.Linear")


def test_a_last_position_head_pairs_with_the_whole_sequence_head(traces: dict[str, Path]) -> None:
    """Issue 30, item 10: the port computes the logits of the last position only ([1, 1, V] against [1, T, V]).
    The head's signature differs, but it holds the reference head's weights under the same name: the two pair,
    are compared on the position they share, and the report says which positions were compared."""
    exit_code, document = _diff(traces, "last_position")
    assert exit_code == 0
    assert document["unaligned"] == {"reference": [], "candidate": []}
    head = next(item for item in document["modules"] if item["path"] == "lm_head")
    assert head["status"] == "match" and "reference_path" not in head  # the reference's lm_head
    assert head["alignment"]["evidence"].startswith("weights equal, outputs overlap")
    assert head["alignment"]["overlap"].startswith("the last 1 of 7 positions of dimension 1")
    assert [pair["relation"] for pair in head["compared"]["outputs"]] == ["overlap"]
