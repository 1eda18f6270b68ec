"""What the documentation claims per corpus case (the port-verdict table of docs/benchmarks.md, printed by
bench/port_verdicts.py), as rows the verdict tests hold each verdict to, so that a less exact verdict fails.

The truth check (`harness.judge`) accepts a verdict when any range it names holds the bug's line, and a range is
often a whole `forward` (22 lines for the Llama attention): "right module" nearly implies "right line". A row
pins, per bug, what is measured today: the bug's truth line, the line range the first divergence reports
(start, end: its width), and how exactly each trace variant names the bug's line (`harness.precision`): `LINE`
(the drill-down's `line` is the bug's), `CONSTRUCTION` (`built_at` is), or only a range, with the drill-down's
other line when it names one. A verdict that becomes more exact fails too, until its row (and the table) are
updated: the table must say what the diff does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ports.harness import Judged

LINE = "line"
CONSTRUCTION = "construction line"
ASSIGNMENT = "assignment line"
# the line that made a value the first differing line reads of repeated copies (`line.arranged`)
ARRANGEMENT = "arrangement line"
# the forward's line that called the helper function holding the first differing line (`line.called_from`)
CALL = "call line"
EXACT = (LINE, CONSTRUCTION, ASSIGNMENT, ARRANGEMENT, CALL)


@dataclass(frozen=True)
class LineClaim:
    """One bug's row: its truth line, the range (start, end) its first divergence reports in the port file, and
    the precision with full tensors (`full`) and with line records (`with_lines`: with and without `--map`)."""

    truth_line: int
    reported_range: tuple[int, int]
    full: str
    with_lines: str
    # the range with line records where the drill-down narrows it (a value out of a child without counterpart)
    range_with_lines: tuple[int, int] | None = None

    @property
    def width(self) -> int:
        return self.reported_range[1] - self.reported_range[0] + 1

    def range(self, variant: str) -> tuple[int, int]:
        """The range claimed for a trace variant."""
        return self.range_with_lines if variant == "lines" and self.range_with_lines else self.reported_range

    def precision(self, variant: str) -> str:
        """The precision claimed for a trace variant of tests/python/test_port_verdicts.py."""
        if variant not in ("full", "lines"):
            raise ValueError(f"no line claim for the trace variant {variant!r} (known: 'full', 'lines')")
        return self.full if variant == "full" else self.with_lines


# case id -> its row, in the table's order (the clean ports are matches: no row)
LINE_CLAIMS: dict[str, LineClaim] = {
    "gpt2-causal_mask_dropped": LineClaim(
        47, (42, 51), full="range of 10 lines", with_lines="range of 10 lines; line 48 is not the bug's"
    ),
    "gpt2-softmax_scale": LineClaim(46, (42, 51), full="range of 10 lines", with_lines=LINE),
    "gpt2-final_norm_eps": LineClaim(87, (97, 97), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "gpt2-relu_for_gelu": LineClaim(62, (61, 63), full="range of 3 lines", with_lines=LINE),
    "gpt2-mlp_residual_missing": LineClaim(76, (76, 77), full="range of 2 lines", with_lines="range of 2 lines"),
    "gpt2-c_proj_not_transposed": LineClaim(36, (51, 51), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "gpt2-biases_not_copied": LineClaim(69, (75, 75), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "gpt2-qkv_unpacked_as_kqv": LineClaim(
        42, (42, 51), full="range of 10 lines", with_lines="range of 10 lines; line 47 is not the bug's"
    ),
    "llama-causal_mask_dropped": LineClaim(
        93, (76, 97), full="range of 22 lines", with_lines="range of 22 lines; line 94 is not the bug's"
    ),
    "llama-softmax_scale": LineClaim(91, (76, 97), full="range of 22 lines", with_lines=LINE),
    "llama-rotary_halves": LineClaim(
        83, (76, 97), full="range of 22 lines", with_lines="range of 11 lines (the drill-down's stretch)"
    ),
    "llama-ffn_norm_eps_layer_1": LineClaim(118, (40, 42), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "llama-gelu_for_silu": LineClaim(108, (108, 108), full="range of 1 line", with_lines=LINE),
    "llama-attention_residual_missing": LineClaim(
        121, (121, 122), full="range of 2 lines", with_lines="range of 2 lines; line 122 is not the bug's"
    ),
    "llama-gate_up_swapped": LineClaim(103, (108, 108), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "llama-ffn_norm_not_copied": LineClaim(118, (40, 42), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "bert-causal_mask_added": LineClaim(60, (58, 62), full="range of 5 lines", with_lines=LINE),
    "bert-softmax_scale": LineClaim(59, (58, 62), full="range of 5 lines", with_lines=LINE),
    "bert-embedding_norm_eps": LineClaim(37, (42, 42), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "bert-silu_for_gelu": LineClaim(69, (73, 73), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "bert-ffn_residual_missing": LineClaim(87, (87, 87), full="range of 1 line", with_lines=LINE),
    "bert-query_key_swapped": LineClaim(50, (56, 56), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "bert-segment_embedding_not_copied": LineClaim(36, (42, 42), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "bert-positions_from_one": LineClaim(40, (39, 42), full="range of 4 lines", with_lines=LINE),
    "bert-mean_pooling": LineClaim(103, (102, 103), full="range of 2 lines", with_lines=LINE),
    # independent: vision (a verdict wrong in one variant: its row claims the other, see KNOWN_WRONG)
    "convnext-relu_for_gelu": LineClaim(133, (148, 148), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "convnext-layer_scale_skipped": LineClaim(
        150, (149, 154), full="range of 6 lines", with_lines="range of 4 lines (the drill-down's stretch)"
    ),
    "convnext-max_pooling": LineClaim(277, (273, 277), full="range of 5 lines", with_lines="range of 5 lines"),
    "convnext-final_norm_eps": LineClaim(259, (277, 277), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "swin-patch_merging_order": LineClaim(
        319, (309, 323), full="range of 15 lines", with_lines="range of 4 lines (the drill-down's stretch)"
    ),
    "swin-shift_not_undone": LineClaim(
        560, (555, 570), full="range of 16 lines", with_lines="range of 7 lines (the drill-down's stretch)"
    ),
    "swin-attention_scale": LineClaim(408, (418, 466), full=ASSIGNMENT, with_lines=ASSIGNMENT),
    "swin-position_bias_transposed": LineClaim(370, (367, 370), full="", with_lines=LINE),
    "resnet-average_pool_stem": LineClaim(82, (92, 92), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "resnet-relu_before_residual": LineClaim(
        175, (175, 176), full="range of 2 lines", with_lines="range of 2 lines; line 176 is not the bug's"
    ),
    "resnet-shortcut_norm_eps": LineClaim(105, (109, 109), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "resnet-stride_on_1x1": LineClaim(165, (175, 177), full=ASSIGNMENT, with_lines=ASSIGNMENT),
    "clip-gelu_for_quick_gelu": LineClaim(342, (348, 348), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "clip-class_token_last": LineClaim(213, (209, 218), full="", with_lines=LINE),
    "clip-attention_scale": LineClaim(289, (298, 335), full=ASSIGNMENT, with_lines=ASSIGNMENT),
    "clip-mean_pooling": LineClaim(640, (634, 646), full="", with_lines=LINE),
    # independent: LLMs and speech (a verdict wrong in one variant: its row claims the other, see KNOWN_WRONG)
    "meta_llama-rope_base": LineClaim(
        453,
        (274, 304),
        full="range of 5 lines (where an unpaired input was produced)",
        with_lines="range of 5 lines (where an unpaired input was produced)",
    ),
    "meta_llama-softmax_scale": LineClaim(298, (274, 304), full="range of 31 lines", with_lines=LINE),
    "meta_llama-gate_up_swapped": LineClaim(348, (348, 348), full="range of 1 line", with_lines=LINE),
    "meta_llama-mask_off_by_one": LineClaim(480, (470, 492), full="range of 23 lines", with_lines=LINE),
    "meta_llama-last_layer_not_converted": LineClaim(383, (65, 77), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    "mistral-rope_base": LineClaim(
        224,
        (112, 147),
        full="range of 2 lines (where an unpaired input was produced)",
        with_lines="range of 2 lines (where an unpaired input was produced)",
    ),
    "mistral-softmax_scale_in_init": LineClaim(78, (112, 147), full=ASSIGNMENT, with_lines=ASSIGNMENT),
    "mistral-kv_heads_tiled": LineClaim(35, (112, 147), full="", with_lines=ARRANGEMENT),
    "mistral-gelu_for_silu": LineClaim(159, (159, 159), full="range of 1 line", with_lines=LINE),
    "mistral-mask_sees_next": LineClaim(244, (232, 249), full="range of 18 lines", with_lines=LINE),
    "gemma_pytorch-embedding_scale_missing": LineClaim(
        598,
        (559, 600),
        full="range of 42 lines",
        with_lines="range of 8 lines; line 162 is not the bug's",
        range_with_lines=(593, 600),
    ),
    "gemma_pytorch-final_norm_without_unit_offset": LineClaim(
        484, (182, 190), full=CONSTRUCTION, with_lines=CONSTRUCTION
    ),
    "gemma_pytorch-scaling_in_init": LineClaim(239, (277, 338), full=ASSIGNMENT, with_lines=ASSIGNMENT),
    "gemma_pytorch-gate_up_swapped": LineClaim(207, (207, 211), full=LINE, with_lines=LINE),
    "gemma_pytorch-rotary_interleaved": LineClaim(
        107, (277, 338), full="", with_lines="range of 6 lines (the drill-down's stretch)"
    ),
    "encodec-zero_padding": LineClaim(162, (157, 171), full="range of 15 lines", with_lines=CALL),
    "encodec-first_dilation": LineClaim(298, (157, 176), full=ASSIGNMENT, with_lines=ASSIGNMENT),
    "encodec-lstm_skip_dropped": LineClaim(247, (247, 249), full="range of 3 lines", with_lines="range of 3 lines"),
    "encodec-causal_trim_centred": LineClaim(
        223, (211, 233), full="range of 23 lines", with_lines="range of 13 lines (the drill-down's stretch)"
    ),
    "encodec-final_activation_tanh": LineClaim(340, (346, 346), full=CONSTRUCTION, with_lines=CONSTRUCTION),
    # NOTE: with line records of the reference's quantizer (`Pair.reference_follow`); wrong with full tensors only
    "encodec-residual_not_carried": LineClaim(435, (716, 807), full="", with_lines=LINE),
}

# NOTE: the table's summary: "N of them naming the bug's exact line" (the line or the construction line)
EXACT_LINES_CLAIMED = {"full": 25, "lines": 45}


def claim_mismatches(judged: Judged, claim: LineClaim, variant: str) -> list[str]:
    """Where a (right) verdict departs from its row: each difference said with the row's value; [] when none."""
    port, verdict = judged.port, judged.verdict
    found = []
    if port.truth_line != claim.truth_line:
        found.append(f"the bug is on line {port.truth_line}, the row says {claim.truth_line}")
    reported = verdict.lines
    if reported is None or Path(reported[0]).resolve() != port.port_file.resolve():
        found.append(f"no line range in {port.port_file.name}; the row says {claim.reported_range}")
    elif (reported[1], reported[2]) != claim.range(variant):
        width = reported[2] - reported[1] + 1
        start, end = claim.range(variant)
        found.append(
            f"the range is {reported[1]}-{reported[2]} ({width} lines); the row says "
            f"{start}-{end} ({end - start + 1} lines)"
        )
    expected = claim.precision(variant)
    if judged.precision != expected:
        found.append(f"the bug's line is named as {judged.precision or 'nothing'!r}; the row says {expected!r}")
    return found
