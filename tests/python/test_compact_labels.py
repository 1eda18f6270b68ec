"""The compact labels of the editor's inline hints (`trace.lines.compact_values`): what is dropped first when a
label would not fit VS Code's default 43 characters, and that a shape is never cut."""

from __future__ import annotations

from modeltrace.trace.lines import HINT_MAX_LENGTH, HintDetail, compact_values, fit_parts, is_discarded
from modeltrace.trace.records import TensorSummary


def tensor(shape: list[int], dtype: str = "float32", nan_count: int = 0) -> TensorSummary:
    return TensorSummary(key="", shape=shape, dtype=dtype, mean=0.0123, std=1.5, nan_count=nan_count)


def test_the_model_s_dtype_is_left_out_and_another_is_named() -> None:
    assert compact_values([[tensor([1, 7, 64])]], HintDetail.DTYPE, "float32") == "[1,7,64]"
    assert compact_values([[tensor([1, 7, 64], "float16")]], HintDetail.DTYPE, "float32") == "[1,7,64] float16"
    assert compact_values([[tensor([1, 7, 64], "float16")]], HintDetail.SHAPE, "float32") == "[1,7,64]"
    assert compact_values([[tensor([1, 7, 64])]], HintDetail.STATS, "float32") == "[1,7,64] μ=0.0123 σ=1.5"


def test_runs_that_agree_count_once_and_runs_that_differ_are_both_shown() -> None:
    runs = [[tensor([1, 4, 7, 16])], [tensor([1, 4, 7, 16])]]
    assert compact_values(runs, HintDetail.DTYPE, "float32") == "[1,4,7,16]"
    runs.append([tensor([1, 2, 7, 16])])
    assert compact_values(runs, HintDetail.DTYPE, "float32") == "[1,4,7,16] | [1,2,7,16]"
    # Statistics differ from run to run (each layer's own): the first run's are shown, the hover lists them all.
    second = TensorSummary(key="", shape=[1, 4, 7, 16], dtype="float32", mean=5.0, std=2.0)
    assert compact_values([runs[0], [second]], HintDetail.STATS, "float32") == "[1,4,7,16] μ=0.0123 σ=1.5"


def test_statistics_go_first_then_dtype_then_whole_leaves() -> None:
    leaves = [tensor([1, 7, 64], "bfloat16") for _ in range(2)]
    # Everything fits in 70; in 43 the statistics go, in 30 the dtype too, in 15 the second leaf.
    assert compact_values([leaves], HintDetail.STATS, "float32", 70).count("μ=") == 2
    assert compact_values([leaves], HintDetail.STATS, "float32", 43) == "[1,7,64] bfloat16, [1,7,64] bfloat16"
    assert compact_values([leaves], HintDetail.STATS, "float32", 30) == "[1,7,64], [1,7,64]"
    assert compact_values([leaves], HintDetail.STATS, "float32", 15) == "[1,7,64], …"


def test_a_label_is_never_over_the_budget_nor_a_shape_cut() -> None:
    many = [tensor([30, 7, 64]) for _ in range(30)]
    label = compact_values([many], HintDetail.DTYPE, "float32")
    assert len(label) <= HINT_MAX_LENGTH and label.endswith(", …")
    assert all(part == "[30,7,64]" for part in label.split(", ")[:-1])
    # A shape longer than the whole budget is named by its rank instead of being cut.
    assert compact_values([[tensor([123456] * 8)]], HintDetail.DTYPE, "float32") == "8-d tensor"
    # A NaN warning is kept when everything else goes.
    assert compact_values([[tensor([1, 7], nan_count=3)]], HintDetail.STATS, "float32", 12) == "[1,7] ⚠NaN"
    assert fit_parts(["[1,2]", "[3,4]"], ", ", 4) is None


def test_discarded_names_follow_pylint_s_dummy_variables() -> None:
    assert all(is_discarded(name) for name in ("_", "__", "_unused", "dummy", "unused_mask", "ignored_x"))
    assert not any(is_discarded(name) for name in ("query_states", "x", "hidden_states_"))
