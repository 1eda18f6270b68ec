"""Which tensors pair with which (issue 30): identical parameters against call order, and a last-position head
against the whole sequence's logits. Tiny gated-MLP models (tests/python/align_pairs/gated_mlp.py): a reference
with transformers' names and a port with Meta's, its weights copied, one bug injected at a time; the corpus
verdicts (tests/python/test_port_verdicts.py, Meta's Llama) run the same rules end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeltrace.worker.client import WorkerClient
from tiny_pairs import diff_json, trace_models


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
    builds = {name: f"port_model({'' if name == 'clean' else repr(name)})" for name in BUGS}
    return trace_models(
        worker, tmp_path_factory.mktemp("weight_pairing"), MODEL_FILE, {"reference": "reference_model()", **builds}
    )


def _diff(traces: dict[str, Path], name: str, *options: str) -> tuple[int, dict]:
    return diff_json(traces["reference"], traces[name], *options)


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


@pytest.mark.parametrize(
    ("bug", "with_map"), [("converter_swap", True), ("converter_swap", False), ("converter_up_twice", False)]
)
def test_weights_loaded_into_the_wrong_projection_are_blamed_there(
    traces: dict[str, Path], bug: str, with_map: bool
) -> None:
    """Weights loaded into the wrong projections compute what the forward's swap computes, and are blamed at the
    projection's construction line all the same. With the user's map (w1 is the gate), the map is the stronger
    evidence. Without one, construction order breaks the tie between call order and weights: the port builds w1
    before w3 as the reference builds gate_proj before up_proj, and calls w1 first as the reference calls gate_proj
    first; only the weights disagree, so they are what is wrong. w1 and w3 both loaded from up_proj match up_proj
    twice, which identifies neither: call order pairs them."""
    exit_code, document = _diff(traces, bug, *(_maps() if with_map else ()))
    assert exit_code == 1
    first = document["first_divergence"]
    assert first["path"] == "layers.0.feed_forward.w1"
    assert first["built_at"]["line"] == _line_of("self.w1 = nn.Linear")
    assert any(item["name"] == "weight" and item["status"] == "different" for item in first["parameters"])


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
