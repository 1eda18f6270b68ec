"""Port verdicts between independently written implementations (issue 15).

For each pair of tests/python/ports/ (a transformers reference, an independently written port with the
reference's weights copied in): the clean port agrees with its reference in plain torch, and `modeltrace diff`
calls it a match; each injected porting bug changes the port's output, and the diff's first divergence names
the module owning the bug and a line range, line or construction line holding it (the truth check of
tests/python/ports/harness.py).

Each verdict is checked on two pairs of traces: full tensors (`full`), and full tensors with line records
(`lines`). Verdicts the diff does not give yet are listed in `KNOWN_WRONG` with what it says today: they run
as strict xfails, so a verdict that becomes right fails the run until its row is removed. A right verdict is
also held to its row of `ports.claims.LINE_CLAIMS` (what the documentation's table claims: the bug's line, the
range reported and its width, whether the line or the construction line is named exactly), so that a verdict
that names a wider range or another line than the table says fails.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from modeltrace.worker.client import WorkerClient
from ports.sources import unavailable
from ports.claims import EXACT, EXACT_LINES_CLAIMED, LINE_CLAIMS, LineClaim, claim_mismatches
from ports.corpus import BUGS, PAIRS, PAIRS_BY_NAME, Pair, bugs_of
from ports.harness import (
    Built,
    Case,
    Judged,
    PortHarness,
    PreparedPort,
    Verdict,
    all_cases,
    apply_bug,
    bug_effect,
    build_recipe,
    judge,
    precision,
    prepare_port,
)

# What the diff says today where its verdict is wrong (case id, or `CASE_ID@full` / `CASE_ID@lines` for one
# variant -> reason); remove a row when it becomes right.
KNOWN_WRONG: dict[str, str] = {
    # independent: LLMs and speech
    "mistral-kv_heads_tiled@full": "layers.0, range 112-147: the tiled keys hold the same numbers in another "
    "order; without line records nothing names the helper's line 35 (with them, the line that made the copies)",
    "gemma_pytorch-rotary_interleaved@full": "model.layers.0.self_attn, range 277-338: the bug is in the helper "
    "apply_rotary_emb; without line records nothing narrows to it (with them: its lines 105-111)",
    "encodec-residual_not_carried@full": "blames the root, the bug's module, with its whole forward (716-807): the "
    "quantizer's encode is a method the root reaches through encode and _encode_frame, no module call, so no "
    "compared tensor crosses a boundary between the encoder's output and the decoder's input; with line records "
    "(the reference's quantizer files followed) its line 435 differs from core_vq.py's residual",
    # independent: vision (issue 30; the references are timm's and open_clip's files, the ports transformers')
    "swin-position_bias_transposed@full": "blames layers.0.blocks.0.attention: timm computes the bias inline, so "
    "the bias module has no counterpart, and it takes no tensor; the transposed bias holds the reference's numbers "
    "in another order, which only the line values stored on both sides show (with line records: its line 370)",
    "clip-class_token_last@full": "blames vision_model (603-632), its parent: open_clip builds the tokens inline, "
    "and the embeddings' output is first compared as vision_model.pre_layrnorm's input; whether "
    "CLIPVisionEmbeddings computed it wrong or its caller passes it where something else belongs, only open_clip's "
    "line values tell",
    "clip-mean_pooling@full": "blames the root (747-821): open_clip pools inline and projects with a bare "
    "parameter, so no compared tensor crosses vision_model's boundary after the pooling; with line records its "
    "line 640 differs from open_clip's pooled value and names vision_model",
}
VARIANTS = ("full", "lines")

MIN_BUG_KINDS_PER_PAIR = 5
# the independently written implementations (a reference file in the pair folder): at least 3 bugs each (issue 30)
MIN_BUG_KINDS_PER_INDEPENDENT_PAIR = 3
# NOTE: float32 ports of float32 references: the same operations in another order agree to ~1e-6.
CLEAN_PORT_ATOL = 1e-5
# a bug must move its module's output by more than this (absolute, or relative ‖broken - clean‖ / ‖clean‖: an
# attention output of small magnitude) to be a bug a diff can be asked to find
OBSERVABLE_DIFFERENCE = 1e-4
OBSERVABLE_RELATIVE = 1e-4


def _outputs_gpt2(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("logits of the last position", reference.logits[:, -1:], port)]


def _outputs_llama(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("logits", reference.logits, port)]


def _outputs_bert(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("last hidden state", reference.last_hidden_state, port[0]), ("pooled", reference.pooler_output, port[1])]


def _outputs_classifier(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """A timm classifier (logits) against a transformers `*ForImageClassification` (its output's `logits`)."""
    return [("logits", reference, port.logits)]


def _outputs_clip(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """open_clip's (image features, text features, logit scale), both normalised, against `CLIPModel`'s output."""
    image, text, scale = reference
    return [
        ("image embeddings", image, port.image_embeds),
        ("text embeddings", text, port.text_embeds),
        ("logits per image", scale * image @ text.T, port.logits_per_image),
    ]


def _outputs_last_position(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """gemma_pytorch's forward returns (next tokens, the last position's logits [B, V])."""
    return [("logits of the last position", reference.logits[:, -1], port[1])]


def _outputs_audio(reference: Any, port: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """encodec's forward returns the decoded waveform; transformers' `EncodecModel` its output's `audio_values`."""
    return [("decoded audio", reference, port.audio_values)]


COMPARABLE_OUTPUTS: dict[str, Callable[[Any, Any], list[tuple[str, torch.Tensor, torch.Tensor]]]] = {
    "gpt2": _outputs_gpt2,
    "llama": _outputs_llama,
    "bert": _outputs_bert,
    # independent: vision
    "convnext": _outputs_classifier,
    "swin": _outputs_classifier,
    "resnet": _outputs_classifier,
    "clip": _outputs_clip,
    # independent: LLMs and speech
    "meta_llama": _outputs_llama,
    "mistral": _outputs_llama,
    "gemma_pytorch": _outputs_last_position,
    "encodec": _outputs_audio,
}


@functools.cache
def _clean_port(pair: Pair) -> Built:
    """The clean port, built once per pair in this process (the runs do not change it)."""
    return build_recipe(pair.path / "recipe_port.py")


@pytest.fixture(scope="session")
def port_harnesses(worker: WorkerClient, tmp_path_factory: pytest.TempPathFactory) -> dict[str, PortHarness]:
    """One harness per variant (each traces a pair's reference once per session)."""
    return {
        variant: PortHarness(worker, tmp_path_factory.mktemp(f"port-verdicts-{variant}"), lines=variant == "lines")
        for variant in VARIANTS
    }


@functools.cache
def _missing(pair_name: str) -> str | None:
    """Why a pair's published implementation cannot be read here (its tests are skipped), or None."""
    pair = PAIRS_BY_NAME[pair_name]
    return unavailable(pair.sources) if pair.sources else None


def _skip_unless_sources(pair_name: str) -> list[Any]:
    reason = _missing(pair_name)
    return [pytest.mark.skip(reason=reason)] if reason else []


def _verdict_param(case: Case, variant: str) -> Any:
    reason = KNOWN_WRONG.get(f"{case.id}@{variant}", KNOWN_WRONG.get(case.id))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, variant, id=f"{variant}-{case.id}", marks=marks + _skip_unless_sources(case.pair.name))


def test_truth_check_reads_the_range_the_line_and_the_construction_line(tmp_path: Path) -> None:
    bug = next(bug for bug in BUGS if bug.module == "blocks.0.attn")
    case = Case(PAIRS[0], bug)
    port = PreparedPort(tmp_path, tmp_path / "port.py", tmp_path / "recipe_port.py", truth_line=47)
    here, elsewhere = str(port.port_file), str(tmp_path / "other.py")
    assert judge(case, port, Verdict(1, path=bug.module, lines=(here, 40, 50)))[0]
    assert judge(case, port, Verdict(1, path=bug.module, line=(here, 47)))[0]
    assert judge(case, port, Verdict(1, path=bug.module, built_at=(here, 47)))[0]
    assert judge(case, port, Verdict(1, path=bug.module, lines=(here, 48, 50))) == (
        False,
        "right module, but no range, line or construction line names line 47",
    )
    assert not judge(case, port, Verdict(1, path=bug.module, lines=(elsewhere, 40, 50)))[0]
    assert judge(case, port, Verdict(1, path="blocks.0", lines=(here, 40, 50))) == (
        False,
        "blames 'blocks.0', not 'blocks.0.attn'",
    )
    assert judge(case, port, Verdict(0)) == (False, "diff says match")
    assert judge(Case(PAIRS[0]), port, Verdict(0)) == (True, "")
    assert not judge(Case(PAIRS[0]), port, Verdict(1, path=""))[0]
    # beyond right or wrong: how exactly the verdict names the line
    assert precision(case, port, Verdict(1, path=bug.module, lines=(here, 40, 50), line=(here, 47))) == "line"
    assert precision(case, port, Verdict(1, path=bug.module, built_at=(here, 47))) == "construction line"
    assert precision(case, port, Verdict(1, path=bug.module, lines=(here, 40, 50), line=(here, 41))) == (
        "range of 11 lines; line 41 is not the bug's"
    )
    # the narrowest named range that holds the line: the drill-down's stretch inside the module's range
    stretch = Verdict(1, path=bug.module, lines=(here, 40, 50), line=(here, 49), line_since=45)
    assert precision(case, port, stretch) == "range of 5 lines (the drill-down's stretch)"
    wide = Verdict(1, path=bug.module, lines=(here, 44, 50), line=(here, 49), line_since=40)
    assert precision(case, port, wide) == "range of 7 lines; line 49 is not the bug's"
    # a first differing line in a helper function: the forward's line that called it is named too
    helper = Verdict(1, path=bug.module, lines=(here, 48, 50), line=(elsewhere, 3), called_from=(here, 47))
    assert judge(case, port, helper) == (True, "")
    assert precision(case, port, helper) == "call line"
    assert precision(case, port, replace(helper, called_from=(here, 49))) == ""


def test_a_verdict_is_held_to_its_line_claim(tmp_path: Path) -> None:
    """The claim check on made-up verdicts: the bug on line 93 of a 22-line range (76-97), claimed exactly."""
    bug = next(bug for bug in BUGS if bug.pair == "llama" and bug.name == "softmax_scale")
    case = Case(next(pair for pair in PAIRS if pair.name == "llama"), bug)
    port = PreparedPort(tmp_path, tmp_path / "port.py", tmp_path / "recipe_port.py", truth_line=93)
    here = str(port.port_file)
    claim = LineClaim(93, (76, 97), full="range of 22 lines", with_lines="line")

    def mismatches(verdict: Verdict, variant: str) -> list[str]:
        right, why = judge(case, port, verdict)
        assert right, why  # each of these verdicts passes the truth check: only the claim tells them apart
        return claim_mismatches(
            Judged(case, port, verdict, right, why, precision(case, port, verdict)), claim, variant
        )

    exact = Verdict(1, path=bug.module, lines=(here, 76, 97), line=(here, 93))
    assert mismatches(exact, "lines") == []
    assert mismatches(Verdict(1, path=bug.module, lines=(here, 76, 97)), "full") == []
    # a drill-down one line off, still inside the range: right by the truth check, wrong by the claim
    assert mismatches(Verdict(1, path=bug.module, lines=(here, 76, 97), line=(here, 94)), "lines") == [
        "the bug's line is named as \"range of 22 lines; line 94 is not the bug's\"; the row says 'line'"
    ]
    assert mismatches(Verdict(1, path=bug.module, lines=(here, 70, 97), line=(here, 93)), "lines") == [
        "the range is 70-97 (28 lines); the row says 76-97 (22 lines)"
    ]
    assert mismatches(exact, "full") == ["the bug's line is named as 'line'; the row says 'range of 22 lines'"]
    moved = PreparedPort(port.folder, port.port_file, port.recipe, truth_line=92)
    moved_verdict = Verdict(1, path=bug.module, lines=(here, 76, 97), line=(here, 92))
    assert claim_mismatches(
        Judged(case, moved, moved_verdict, True, "", precision(case, moved, moved_verdict)), claim, "lines"
    ) == ["the bug is on line 92, the row says 93"]
    with pytest.raises(ValueError, match="no line claim for the trace variant 'automatic'"):
        claim.precision("automatic")


def test_line_claims_cover_every_bug_and_add_up_to_the_table() -> None:
    """A row per bug whose verdict is right in at least one variant (a known wrong one has none)."""
    assert list(LINE_CLAIMS) == [
        case.id for case in all_cases() if case.bug is not None and case.id not in KNOWN_WRONG
    ]
    for variant, claimed in EXACT_LINES_CLAIMED.items():
        exact = [case for case, claim in LINE_CLAIMS.items() if claim.precision(variant) in EXACT]
        assert len(exact) == claimed, f"{variant}: {len(exact)} rows name the exact line, the table says {claimed}"


def test_a_patch_whose_text_is_not_unique_is_refused() -> None:
    bug = next(bug for bug in BUGS if bug.pair == "gpt2")
    ambiguous = type(bug)(**{**bug.__dict__, "name": "ambiguous", "old": "self.proj = nn.Linear("})
    port_file = PAIRS[0].path / PAIRS[0].port_file
    with pytest.raises(ValueError, match=r"gpt2_port\.py: bug 'ambiguous': its old text occurs 2 times"):
        apply_bug(port_file.read_text(), ambiguous, port_file)


@pytest.mark.parametrize(
    "pair", [pytest.param(pair, id=pair.name, marks=_skip_unless_sources(pair.name)) for pair in PAIRS]
)
def test_clean_port_agrees_with_its_reference(pair: Pair) -> None:
    reference = build_recipe(pair.path / "recipe_reference.py")
    port = build_recipe(pair.path / "recipe_port.py")
    compared = COMPARABLE_OUTPUTS[pair.name](reference.run(), port.run())
    assert compared
    for name, expected, actual in compared:
        assert expected.shape == actual.shape, name
        difference = (expected - actual).abs().max().item()
        assert difference < CLEAN_PORT_ATOL, f"{pair.name}: {name} differs by {difference:.3g}"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.name)
def test_each_pair_has_enough_bug_kinds(pair: Pair) -> None:
    kinds = {bug.kind for bug in bugs_of(pair.name)}
    least = MIN_BUG_KINDS_PER_INDEPENDENT_PAIR if pair.reference_file else MIN_BUG_KINDS_PER_PAIR
    assert len(kinds) >= least, f"{pair.name}: only {sorted(kinds)}"


@pytest.mark.parametrize(
    "bug", [pytest.param(bug, id=f"{bug.pair}-{bug.name}", marks=_skip_unless_sources(bug.pair)) for bug in BUGS]
)
def test_bug_is_observable_and_owned_by_its_module(bug: Any, tmp_path: Path) -> None:
    """The corpus's own truth: the bug leaves the inputs of the module named unchanged and changes its output
    (so that module is where a diff must find it), and the truth line belongs to that module (inside its
    class's forward, or the `self.NAME = ...` line of its parent's `__init__` that builds it)."""
    pair = next(pair for pair in PAIRS if pair.name == bug.pair)
    port = prepare_port(Case(pair, bug), tmp_path)
    broken = build_recipe(port.recipe)
    effect = bug_effect(bug.module, _clean_port(pair), broken)
    if bug.unpaired_input:  # it arrives through an input with no counterpart in the reference, and only that one
        assert effect.input_max_abs > 0 and effect.input_max_abs_real == 0, (
            f"{bug.name}: {bug.module}'s inputs move by {effect}; only the complex {bug.unpaired_input} should"
        )
    else:
        assert effect.input_max_abs == 0, f"{bug.name}: {bug.module} already receives different inputs"
    assert effect.output_max_abs > OBSERVABLE_DIFFERENCE or effect.output_relative > OBSERVABLE_RELATIVE, (
        f"{bug.name}: {bug.module}'s output moves by {effect}"
    )
    modules = dict(broken.model.named_modules())
    assert bug.module in modules, f"{bug.name}: the port has no module {bug.module!r}"
    line = port.truth_line
    assert line is not None
    owner = modules[bug.module]
    if bug.unpaired_input:  # built once in the root's `__init__` (a rotary table), passed down to the module
        assert _in_function(type(modules[""]).__init__, line, port.port_file), f"{bug.name}: {line} is not in __init__"
    elif bug.helper:  # a module-level function of the port file that the module's class calls
        assert _in_function(_port_function(owner, bug.helper), line, port.port_file), (
            f"{bug.name}: line {line} is not in {bug.helper}()"
        )
        callers = {type(module) for module in owner.modules()}
        assert any(f"{bug.helper}(" in inspect.getsource(inspect.unwrap(cls.forward)) for cls in callers), (
            f"{bug.name}: {bug.module} never calls {bug.helper}"
        )
    else:
        # NOTE: the owner's submodules count too: a port may call a child's `forward` directly (Mistral's
        # one-file reference does), so the child never runs as a module call and the owner is the innermost one
        classes = {type(module) for module in owner.modules()}
        assert any(
            _in_function(method, line, port.port_file) for cls in classes for method in _methods(cls)
        ) or _builds(modules, bug.module, line, port.port_file), (
            f"{bug.name}: line {line} is neither in a method of {bug.module} (or of a module inside it) nor the "
            "line of its parent's __init__ that builds it"
        )
    if bug.truth_at is not None:  # converter bugs are judged at the module's construction
        assert _builds(modules, bug.module, line, port.port_file)


def _in_function(function: Callable[..., Any], line: int, file: Path) -> bool:
    function = inspect.unwrap(function)  # `@torch.no_grad()` / `@torch.inference_mode()` forwards
    if Path(inspect.getsourcefile(function) or "").resolve() != file.resolve():
        return False
    source, first = inspect.getsourcelines(function)
    return first <= line < first + len(source)


def _methods(cls: type) -> list[Callable[..., Any]]:
    """`forward`, `__init__`, and the other methods a class defines itself: a forward may run a module's work
    through another of its methods (EnCodec's root calls `quantizer.encode`, which is no module call)."""
    own = [value for value in vars(cls).values() if inspect.isfunction(inspect.unwrap(value))]
    return [cls.forward, cls.__init__, *own]


def _port_function(module: torch.nn.Module, name: str) -> Callable[..., Any]:
    """The module-level function `name` of the file that defines the module's class (read from its forward's
    globals: the harness forgets the port's modules once built)."""
    return inspect.unwrap(type(module).forward).__globals__[name]


def _builds(modules: dict[str, torch.nn.Module], path: str, line: int, file: Path) -> bool:
    """`line` is the `self.NAME = ...` line of the parent's `__init__` that builds the module, or a line of the
    module's own `__init__` (a setting it assigns, `self.scaling = ...`, or a submodule it builds). A module held
    in a container (`nn.ModuleList`) is built in an ancestor's `__init__` (`model += [nn.ELU()]`), and a setting
    may be passed down through several (`EncodecEncoder` -> `EncodecResnetBlock` -> `EncodecConv1d`): a line of
    the `__init__` of an ancestor above the nearest container counts too."""
    parent_path, _, attribute = path.rpartition(".")
    source, first = inspect.getsourcelines(type(modules[parent_path]).__init__)
    if first <= line < first + len(source) and f"self.{attribute} = " in source[line - first]:
        return True
    source, first = inspect.getsourcelines(type(modules[path]).__init__)
    if first <= line < first + len(source):
        return True
    containers = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)
    ancestors = [".".join(path.split(".")[:end]) for end in range(path.count("."), -1, -1)]
    held = [index for index, ancestor in enumerate(ancestors) if isinstance(modules[ancestor], containers)]
    if not held:
        return False
    return any(
        _in_function(type(modules[ancestor]).__init__, line, file)
        for ancestor in ancestors[held[0] + 1 :]
        if not isinstance(modules[ancestor], containers)
    )


@pytest.mark.parametrize(
    ("case", "variant"), [_verdict_param(case, variant) for variant in VARIANTS for case in all_cases()]
)
def test_port_verdict(port_harnesses: dict[str, PortHarness], case: Case, variant: str) -> None:
    judged = port_harnesses[variant].judge(case)
    assert judged.right, f"{case.id}: truth {judged.truth()}, diff says {judged.verdict.located()}: {judged.why}"
    _assert_line_claim(judged, variant)


def _automatic_param(case: Case) -> Any:
    reason = KNOWN_WRONG.get(f"{case.id}@automatic", KNOWN_WRONG.get(case.id))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, id=case.id, marks=marks + _skip_unless_sources(case.pair.name))


@pytest.mark.parametrize("case", [_automatic_param(case) for case in all_cases()])
def test_port_verdict_aligned_automatically(port_harnesses: dict[str, PortHarness], case: Case) -> None:
    """The same verdicts (on the traces with line records) without the pairs' hand-written `--map` rules: the
    diff aligns each port with its reference by evidence alone (issue 16), and localises every bug as well."""
    judged = port_harnesses["lines"].judge(case, maps=False)
    assert judged.right, f"{case.id}: truth {judged.truth()}, diff says {judged.verdict.located()}: {judged.why}"
    _assert_line_claim(judged, "lines")


def _assert_line_claim(judged: Judged, variant: str) -> None:
    """A right verdict on a bug names the bug's line as exactly as its row of `LINE_CLAIMS` says."""
    if judged.case.bug is None:
        return
    found = claim_mismatches(judged, LINE_CLAIMS[judged.case.id], variant)
    assert not found, f"{judged.case.id} ({variant}): diff says {judged.verdict.located()}: " + "; ".join(found)
