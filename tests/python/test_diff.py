"""Diff against a reference: injected porting bugs found at the right module and line, identical traces and
debugger outputs (exported by us or written by transformers itself) matching, and clear errors for bad input.

Models are built with the worker's own builder and captured in-process (`ModuleCapture(full_tensors=True)`),
then written with `write_trace` as `worker/job.py` does.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import EXAMPLE_PACKAGE, REPO_ROOT, line_of
from modeltrace.diff import (
    DIVERGENCE,
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    DiffOptions,
    diff_traces,
    line_statuses,
    load_reference,
    plot_data,
    render_text,
    to_json,
)
from modeltrace.trace.hf_debugger import write_debugger_output
from modeltrace.trace.records import Trace
from modeltrace.trace.storage import TENSORS_FILE, write_trace
from modeltrace.worker.building import build_from_file
from modeltrace.worker import source_map
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.messages import TraceRequest


PORT_FILE = REPO_ROOT / "examples" / "tiny_llama_port" / "modeling_tiny_llama_port.py"
REFERENCE_TRACE = REPO_ROOT / "examples" / "reference" / "tiny_llama.mtrace"


def capture(file: Path, out: Path, seed: int = 0) -> Path:
    """Build `file`'s model, run it under full-tensor capture, write the trace to `out`."""
    # NOTE: source_map caches call sites by (code object, offset), and code objects compare equal across files
    # when their code is identical (co_filename is not compared): the edited copies share most code with the
    # original, so start each in-process capture with an empty cache (the worker forks a fresh child per trace).
    getattr(source_map, "_location_cache", {}).clear()
    built = build_from_file(file, None, None, seed)
    with torch.no_grad(), ModuleCapture(built.model, full_tensors=True) as recorder:
        built.model(*built.args, **built.kwargs)
    trace = Trace(model={"class": built.model_class, "file": str(file)}, modules=recorder.records)

    def write_tensors(folder: Path) -> None:
        save_file(recorder.tensors, str(folder / TENSORS_FILE))

    return write_trace(trace, out, write_tensors)


def diff(reference: Path, candidate: Path, **options):
    with load_reference(reference) as ref, load_reference(candidate) as cand:
        return diff_traces(ref, cand, DiffOptions(**options))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture(EXAMPLE_PACKAGE / "modeling_tiny_llama.py", tmp_path_factory.mktemp("original") / "a.mtrace")


def buggy_copy(tmp_path: Path, name: str, old: str, new: str, file: str = "modeling_tiny_llama.py") -> Path:
    """A copy of the example package (under a package name of its own) with `old` replaced by `new` once in
    `file`; returns the copy's modeling file."""
    target = tmp_path / f"tiny_llama_{name}"
    shutil.copytree(EXAMPLE_PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    edited = target / file
    source = edited.read_text()
    assert source.count(old) == 1, old
    edited.write_text(source.replace(old, new))
    return target / "modeling_tiny_llama.py"


TRANSPOSED_WEIGHT = (
    "class TinyLlamaMLP(nn.Module):",
    """class TinyLlamaLinear(nn.Linear):
    \"\"\"The original stores projection weights as [in, features]: multiply by them as they are.\"\"\"

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states @ self.weight


class TinyLlamaMLP(nn.Module):""",
)

# name: (old source, new source, expected path of the first divergence, snippet on its called_at line,
#        snippet on the line of the first child receiving differing inputs, or None)
BUGS = {
    "epsilon": (
        "torch.rsqrt(variance + self.variance_epsilon)",
        "torch.rsqrt(variance + 1e-5)",
        "layers.0.input_layernorm",
        "hidden_states = self.input_layernorm(hidden_states)",
        None,
    ),
    "rotary": (
        "embedding = torch.cat((freqs, freqs), dim=-1)",
        "embedding = freqs.repeat_interleave(2, dim=-1)",
        "rotary_emb",
        "position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)",
        None,
    ),
    "residual": (
        "            **kwargs,\n        )\n        hidden_states = residual + hidden_states\n",
        "            **kwargs,\n        )\n",
        "layers.0",
        "hidden_states = decoder_layer(",
        "hidden_states = self.post_attention_layernorm(hidden_states)",
    ),
    "activation": (
        "self.activation = ACT2FN[config.hidden_act]",
        'self.activation = ACT2FN["gelu"]',
        "layers.0.mlp.activation",
        "gate = self.activation(self.gate_proj(hidden_states))",
        None,
    ),
    "transposed": (
        "self.q_proj = nn.Linear(",
        "self.q_proj = TinyLlamaLinear(",
        "layers.0.self_attn.q_proj",
        "query_states = self.q_proj(hidden_states)",
        None,
    ),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_injected_bug_is_found_at_its_module_and_line(bug: str, original: Path, tmp_path: Path) -> None:
    old, new, path, call_snippet, child_snippet = BUGS[bug]
    modeling = buggy_copy(tmp_path, bug, old, new)
    if bug == "transposed":  # the projection class the port wrote for the original's weight layout
        modeling.write_text(modeling.read_text().replace(*TRANSPOSED_WEIGHT))
    candidate = capture(modeling, tmp_path / "candidate.mtrace")
    result = diff(original, candidate)
    assert not result.match
    divergence = result.first_divergence
    assert divergence is not None and divergence.inputs_match
    record = divergence.module.candidate
    assert record.path == path, render_text(result)
    assert record.call_index == 0
    assert record.called_at.file == str(modeling.resolve())
    assert record.called_at.line == line_of(modeling, call_snippet)
    assert divergence.module.check == "full"
    assert divergence.module.max_abs_diff > 1e-3
    if child_snippet is not None:
        assert divergence.first_differing_child.candidate.called_at.line == line_of(modeling, child_snippet)
    statuses = line_statuses(result)
    assert statuses[(str(modeling.resolve()), record.called_at.line)] == DIVERGENCE
    document = json.loads(json.dumps(to_json(result), allow_nan=False))
    assert document["match"] is False
    assert document["first_divergence"]["path"] == path
    assert document["first_divergence"]["called_at"]["line"] == record.called_at.line
    assert [module["path"] for module in document["modules"] if module["status"] == DIVERGENCE] == [path]


def test_identical_traces_match(original: Path, tmp_path: Path) -> None:
    again = capture(EXAMPLE_PACKAGE / "modeling_tiny_llama.py", tmp_path / "again.mtrace")
    result = diff(original, again)
    assert result.match and result.first_divergence is None
    assert all(module.status == MATCH and module.check == "full" for module in result.modules)
    assert all(module.max_abs_diff == 0.0 for module in result.modules)
    assert set(line_statuses(result).values()) == {MATCH}
    plot = plot_data(result)
    assert len(plot["points"]) == len(result.modules) and plot["first_divergence"] is None
    assert [layer["layer"] for layer in plot["layers"]] == ["layers.0", "layers.1"]


def test_committed_reference_is_the_example_and_the_port_diverges_in_attention(original: Path, tmp_path: Path) -> None:
    assert diff(REFERENCE_TRACE, original).match, (
        "examples/reference/tiny_llama.mtrace no longer matches the example (weights or inputs built differently?); "
        "regenerate it: modeltrace trace examples/tiny_llama/modeling_tiny_llama.py --full-tensors "
        "--out examples/reference/tiny_llama.mtrace"
    )
    port = capture(PORT_FILE, tmp_path / "port.mtrace")
    result = diff(REFERENCE_TRACE, port)
    divergence = result.first_divergence
    assert divergence.module.candidate.path == "layers.0.self_attn"
    assert divergence.module.candidate.called_at.line == line_of(PORT_FILE, "hidden_states, _ = self.self_attn(")
    assert divergence.last_matching_child.candidate.path == "layers.0.self_attn.v_proj"
    assert divergence.first_differing_child.candidate.path == "layers.0.self_attn.o_proj"


@pytest.mark.parametrize("use_repr", [True, False])
def test_trace_matches_its_own_debugger_export(use_repr: bool, original: Path, tmp_path: Path) -> None:
    with load_reference(original) as loaded:
        summary, full = write_debugger_output(loaded, tmp_path / "export", use_repr=use_repr)
    assert summary.is_file() and full.is_file()
    for reference in (tmp_path / "export", full, summary):
        result = diff(reference, original)
        assert result.match, render_text(result)
        compared = [module for module in result.modules if module.status == MATCH]
        assert compared, render_text(result)
    # Full values survive the export: every leaf module is compared on full tensors.
    result = diff(tmp_path / "export", original)
    leaves = [module for module in result.modules if module.reference is not None and module.reference.outputs]
    assert leaves and all(module.check == "full" for module in leaves)


def test_export_then_diff_still_finds_the_bug(original: Path, tmp_path: Path) -> None:
    with load_reference(original) as loaded:
        write_debugger_output(loaded, tmp_path / "export", use_repr=True)
    port = capture(PORT_FILE, tmp_path / "port.mtrace")
    result = diff(tmp_path / "export", port)
    assert result.first_divergence.module.candidate.path == "layers.0.self_attn"
    assert result.first_divergence.inferred  # the debugger format keeps no outputs for self_attn


@pytest.mark.parametrize(("use_repr", "prune"), [(True, False), (False, False), (False, True)])
def test_transformers_debugger_output_matches_our_trace(use_repr: bool, prune: bool, tmp_path: Path) -> None:
    """transformers' own debugger, on the model and inputs we trace: its output, read as the reference, matches."""
    import transformers.models.llama.modeling_llama as modeling_llama
    from transformers.model_debugging_utils import model_addition_debugger_context

    built = build_from_file(Path(modeling_llama.__file__), None, None, 0)
    if prune:  # four layers, so that the debugger prunes the middle two
        config = built.model.config
        config.num_hidden_layers = 4
        torch.manual_seed(0)
        built.model = type(built.model)(config).eval()
    # 20 tokens: hidden states of 20 × 64 values are over the 1,000 elements torch prints in full.
    inputs = {"input_ids": torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(0))}
    ours = tmp_path / "ours.mtrace"
    with torch.no_grad(), ModuleCapture(built.model, full_tensors=True) as recorder:
        built.model(**inputs)
    write_trace(
        Trace(model={"class": built.model_class}, modules=recorder.records),
        ours,
        lambda folder: save_file(recorder.tensors, str(folder / TENSORS_FILE)),
    )
    folder = tmp_path / "debugger"
    try:
        with model_addition_debugger_context(
            built.model, debug_path=str(folder), do_prune_layers=prune, use_repr=use_repr
        ):
            built.model(**inputs)
    finally:
        torch.set_printoptions(profile="default", sci_mode=None)
    result = diff(folder, ours)
    assert result.match, render_text(result)
    matched = [module for module in result.modules if module.status == MATCH]
    assert len(matched) >= 10
    if use_repr:  # tensors of at most 1,000 elements are printed in full, larger ones summarised
        assert {module.check for module in matched} == {"full", "statistics"}
    else:
        assert {module.check for module in matched} == {"full"}
    if prune:
        pruned = {result.candidate.trace.modules[index].path for index in result.alignment.pruned}
        assert pruned >= {"layers.1", "layers.2", "layers.1.self_attn.q_proj"}
        assert not result.alignment.unaligned_candidate
    # The same debugger output still catches a difference: a candidate from other weights diverges.
    torch.manual_seed(1)
    other = type(built.model)(built.model.config).eval()
    different = tmp_path / "other.mtrace"
    with torch.no_grad(), ModuleCapture(other, full_tensors=True) as recorder:
        other(**inputs)
    write_trace(
        Trace(model={"class": built.model_class}, modules=recorder.records),
        different,
        lambda folder: save_file(recorder.tensors, str(folder / TENSORS_FILE)),
    )
    assert diff(folder, different).first_divergence.module.candidate.path == "embed_tokens"


def test_map_aligns_renamed_modules(original: Path, tmp_path: Path) -> None:
    renamed = buggy_copy(
        tmp_path, "renamed", "self.mlp = TinyLlamaMLP(config)", "self.feed_forward = TinyLlamaMLP(config)"
    )
    source = renamed.read_text().replace(
        "hidden_states = self.mlp(hidden_states)", "hidden_states = self.feed_forward(hidden_states)"
    )
    renamed.write_text(source)
    candidate = capture(renamed, tmp_path / "renamed.mtrace")
    plain = diff(original, candidate)
    assert any("mlp" in record_path(plain, index) for index in plain.alignment.unaligned_reference)
    from modeltrace.diff import parse_maps

    mapped = diff(original, candidate, maps=tuple(parse_maps([r"\.mlp(\.|$)=>.feed_forward\1"])))
    assert mapped.match and not mapped.alignment.unaligned_reference and not mapped.alignment.unaligned_candidate


def record_path(result, index: int) -> str:
    return result.reference.trace.modules[index].path


# ------------------------------------------------------------------------------------------------ the CLI


def run_cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", *arguments], capture_output=True, text=True, timeout=120
    )


def test_cli_diff_exit_codes_and_json(original: Path, tmp_path: Path) -> None:
    same = run_cli("diff", str(REFERENCE_TRACE), str(original), "--format", "json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["match"] is True
    port = capture(PORT_FILE, tmp_path / "port.mtrace")
    different = run_cli("diff", str(REFERENCE_TRACE), str(port), "--format", "json")
    assert different.returncode == 1, different.stderr
    document = json.loads(different.stdout)
    assert document["first_divergence"]["path"] == "layers.0.self_attn"
    assert set(document["first_divergence"]) >= {"path", "called_at", "defined_at", "max_abs_diff", "max_rel_diff"}
    assert {module["status"] for module in document["modules"]} <= {"match", "mismatch", "divergence", "not_compared"}
    text = run_cli("diff", str(REFERENCE_TRACE), str(port))
    assert text.returncode == 1 and "FIRST DIVERGENCE: layers.0.self_attn" in text.stdout
    exported = run_cli("export", str(original), "--hf-debugger", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr
    assert run_cli("diff", str(tmp_path / "hf"), str(original)).returncode == 0


def _truncated(tmp_path: Path, original: Path) -> Path:
    copy = tmp_path / "truncated.mtrace"
    shutil.copytree(original, copy)
    tensors = copy / TENSORS_FILE
    tensors.write_bytes(tensors.read_bytes()[:-100])
    return copy


def _corrupt_json(tmp_path: Path, original: Path) -> Path:
    with load_reference(original) as loaded:
        _, full = write_debugger_output(loaded, tmp_path / "hf")
    full.write_text(full.read_text()[: len(full.read_text()) // 2])
    return full


def _missing_tensor_file(tmp_path: Path, original: Path) -> Path:
    with load_reference(original) as loaded:
        _, full = write_debugger_output(loaded, tmp_path / "hf", use_repr=False)
    next((tmp_path / "hf").glob("*.safetensors")).unlink()
    return full


def _garbage_msgpack(tmp_path: Path, original: Path) -> Path:
    copy = tmp_path / "garbage.mtrace"
    copy.mkdir()
    (copy / "trace.msgpack").write_bytes(b"\xc1\xff\x00garbage")
    return copy


def _unrelated(tmp_path: Path, original: Path) -> Path:
    from modeltrace.trace.records import ModuleCall, TensorSummary

    records = [
        ModuleCall(0, "", "Other", None, None, 0, -1, 2),
        ModuleCall(1, "encoder", "Encoder", None, None, 0, 0, 1),
        ModuleCall(2, "encoder.block", "Block", None, None, 0, 1, 0),
    ]
    for record in records:
        record.outputs = [TensorSummary("", [2, 3], "float32", mean=0.0, std=1.0, min=-1.0, max=1.0)]
    return write_trace(Trace(model={"class": "Other"}, modules=records), tmp_path / "other.mtrace")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp_path, original: tmp_path / "missing.mtrace", "no such trace"),
        (_truncated, "truncated safetensors file"),
        (_corrupt_json, "corrupt or truncated debugger JSON"),
        (_missing_tensor_file, "tensor file(s) it names are missing"),
        (_garbage_msgpack, "garbage.mtrace/trace.msgpack: "),
        (_unrelated, "nothing aligns"),
        (lambda tmp_path, original: Path(__file__), "not a trace"),
    ],
    ids=["missing", "truncated", "corrupt-json", "missing-tensor-file", "garbage", "unrelated", "python-file"],
)
def test_cli_bad_reference_is_one_line_and_exit_2(make, message: str, original: Path, tmp_path: Path) -> None:
    reference = make(tmp_path, original)
    completed = run_cli("diff", str(reference), str(original))
    assert completed.returncode == 2, (completed.stdout, completed.stderr)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modeltrace: ") and message in lines[0], completed.stderr
    assert "Traceback" not in completed.stderr and not completed.stdout


def test_cli_bad_map_and_tolerance_are_exit_2(original: Path) -> None:
    completed = run_cli("diff", str(original), str(original), "--map", "([=>x")
    assert completed.returncode == 2 and "--map" in completed.stderr and "Traceback" not in completed.stderr
    completed = run_cli("diff", str(original), str(original), "--atol", "lots")
    assert completed.returncode == 2 and "Traceback" not in completed.stderr


def test_mismatched_shapes_are_reported_not_crashed(original: Path, tmp_path: Path) -> None:
    transposed = buggy_copy(
        tmp_path,
        "shapes",
        "return attn_output, attn_weights\n\n\nclass TinyLlamaDecoderLayer",
        "return attn_output, attn_weights.transpose(1, 2)\n\n\nclass TinyLlamaDecoderLayer",
    )
    candidate = capture(transposed, tmp_path / "shapes.mtrace")
    result = diff(original, candidate)
    assert not result.match
    divergence = result.first_divergence.module
    assert divergence.candidate.path == "layers.0.self_attn" and divergence.check == "shape"
    assert "shape [1, 4, 7, 7] vs [1, 7, 4, 7]" in divergence.reason
    assert "shape [1, 4, 7, 7] vs [1, 7, 4, 7]" in render_text(result)
    json.dumps(to_json(result), allow_nan=False)


def test_diff_modules_do_not_import_torch() -> None:
    code = (
        "import sys, modeltrace.diff, modeltrace.trace.hf_debugger, modeltrace.trace.reference\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr


# ------------------------------------------------------------- lines, half precision, replay on the reference


def capture_in(file: Path, out: Path, dtype: torch.dtype) -> Path:
    """As `capture`, with the model and its floating inputs in `dtype`."""
    getattr(source_map, "_location_cache", {}).clear()
    built = build_from_file(file, None, None, 0)
    built.model.to(dtype)
    kwargs = {
        name: value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value
        for name, value in built.kwargs.items()
    }
    with torch.no_grad(), ModuleCapture(built.model, full_tensors=True) as recorder:
        built.model(*built.args, **kwargs)
    trace = Trace(model={"class": built.model_class, "file": str(file)}, modules=recorder.records)
    return write_trace(trace, out, lambda folder: save_file(recorder.tensors, str(folder / TENSORS_FILE)))


def test_the_divergence_names_the_lines_that_hold_the_bug(original: Path, tmp_path: Path) -> None:
    old, new, path, *_ = BUGS["residual"]
    candidate = capture(buggy_copy(tmp_path, "residual", old, new), tmp_path / "residual.mtrace")
    result = diff(original, candidate)
    lines = result.first_divergence.lines
    file = Path(result.first_divergence.module.candidate.called_at.file)
    assert result.first_divergence.module.candidate.path == path and lines.file == str(file)
    # the missing `hidden_states = residual + hidden_states` sat between the attention call and the next norm
    assert lines.start == line_of(file, "hidden_states, _ = self.self_attn(")
    assert lines.end == line_of(file, "hidden_states = self.post_attention_layernorm(hidden_states)")
    document = to_json(result)["first_divergence"]
    assert document["lines"] == {"file": str(file), "start": lines.start, "end": lines.end}
    assert f"lines {lines.start}-{lines.end}" in render_text(result)


def test_a_bfloat16_trace_of_the_model_matches_its_float32_reference(original: Path, tmp_path: Path) -> None:
    half = capture_in(EXAMPLE_PACKAGE / "modeling_tiny_llama.py", tmp_path / "bf16.mtrace", torch.bfloat16)
    result = diff(original, half)
    assert result.match and result.verdict == "match", render_text(result)
    compared = [module for module in result.modules if module.check == "full"]
    assert compared and max(module.rel_err for module in compared if module.rel_err is not None) > 1e-3
    # a real bug still shows at bfloat16
    old, new, path, *_ = BUGS["activation"]
    broken = capture_in(buggy_copy(tmp_path, "activation", old, new), tmp_path / "bf16-bug.mtrace", torch.bfloat16)
    assert diff(original, broken).first_divergence.module.candidate.path == path


def _two_bugs(tmp_path: Path) -> Path:
    """The example with a transposed q_proj weight and the wrong activation: two bugs, in two modules."""
    file = buggy_copy(tmp_path, "two", *TRANSPOSED_WEIGHT)
    source = file.read_text()
    for old, new in ((BUGS["transposed"][0], BUGS["transposed"][1]), (BUGS["activation"][0], BUGS["activation"][1])):
        assert source.count(old) == 1
        source = source.replace(old, new)
    file.write_text(source)
    return file


def test_replay_judges_each_module_on_the_reference_inputs(original: Path, tmp_path: Path, worker) -> None:
    from modeltrace.diff import replay_unavailable, run_replay

    candidate = capture(_two_bugs(tmp_path), tmp_path / "two.mtrace")
    before = {path.name: path.read_bytes() for path in candidate.iterdir()}
    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand)
        assert replay_unavailable(result) is None
        plain = result.first_divergence.module.candidate.path
        run_replay(result, worker, limit=40)
        replays = {module.candidate.path: module.replay for module in result.modules if module.replay is not None}
        assert result.replayed and len(replays) >= 20
    # both bugs fail on the reference's inputs, each in its own module; everything between them (whose outputs
    # differ only because their inputs do) is cleared
    assert replays["layers.0.self_attn.q_proj"].status == MISMATCH
    assert replays["layers.0.mlp.activation"].status == MISMATCH
    for path in ("layers.0.self_attn.o_proj", "layers.0.post_attention_layernorm", "layers.0.mlp.gate_proj"):
        assert replays[path].status == MATCH, (path, replays[path])
    # the port's own Linear names its input `hidden_states`, nn.Linear `input`: paired by role, not name
    assert replays["layers.0.self_attn.q_proj"].replaced == ["hidden_states (from input)"]
    assert plain == result.first_divergence.module.candidate.path == "layers.0.self_attn.q_proj"
    assert result.first_divergence.by_replay
    document = to_json(result)
    assert document["first_divergence"]["replay"]["status"] == MISMATCH and document["replayed"] is True
    by_path = {module["path"]: module for module in document["modules"]}
    assert by_path["layers.0.post_attention_layernorm"]["replay"]["status"] == MATCH
    assert "replayed on the reference's inputs: its output still differs" in render_text(result)
    assert {path.name: path.read_bytes() for path in candidate.iterdir()} == before  # no trace is changed


def test_replay_on_the_candidate_kept_from_its_trace(original: Path, tmp_path: Path, worker) -> None:
    """The editor's case: the diff follows the candidate's trace in the same worker, which kept the model and its
    calls' arguments; the replay calls the suspects again without a rebuild or a forward, with the verdicts of a
    replay that rebuilds."""
    from modeltrace.diff import run_replay

    request = TraceRequest(
        file=str(_two_bugs(tmp_path)),
        model=None,
        recipe=None,
        config=None,
        full_tensors=True,
        seed=0,
        lines=False,
        timeout=120,
        out=str(tmp_path / "kept.mtrace"),
        keep_for_replay=True,
    )
    traced = worker.trace(request)
    assert traced.kept_for_replay
    candidate = Path(traced.trace)
    verdicts = {}
    for kept in (True, False):
        if not kept:  # any other request ends the kept child: this replay rebuilds the candidate
            worker.trace(dataclasses.replace(request, keep_for_replay=False, out=str(tmp_path / "other.mtrace")))
        with load_reference(original) as ref, load_reference(candidate) as cand:
            result = diff_traces(ref, cand)
            run_replay(result, worker, limit=40)
            assert result.replayed and bool(result.replay_timing["kept"]) is kept
            verdicts[kept] = {
                module.candidate.path: (module.replay.status, module.replay.max_abs_diff)
                for module in result.modules
                if module.replay is not None
            }
            assert set(result.replay_timing["direct"]) == (set(result.replay_timing["modules"]) if kept else set())
            assert result.first_divergence.module.candidate.path == "layers.0.self_attn.q_proj"
    assert len(verdicts[True]) >= 20 and verdicts[True].keys() == verdicts[False].keys()
    for path, (status, difference) in verdicts[True].items():
        assert status == verdicts[False][path][0], path
        assert difference == pytest.approx(verdicts[False][path][1], rel=1e-4, abs=1e-6), path


def capture_statistics(file: Path, out: Path) -> Path:
    """As `capture`, with statistics only (no tensors stored)."""
    getattr(source_map, "_location_cache", {}).clear()
    built = build_from_file(file, None, None, 0)
    with torch.no_grad(), ModuleCapture(built.model) as recorder:
        built.model(*built.args, **built.kwargs)
    return write_trace(Trace(model={"class": built.model_class, "file": str(file)}, modules=recorder.records), out)


@pytest.mark.parametrize("bug", ["two", "residual", "none"])
def test_the_suspects_named_during_the_comparison_are_the_finished_diffs(
    original: Path, tmp_path: Path, bug: str
) -> None:
    """`diff_traces(watch=...)` names the first suspects (in finishing order) while it still compares, so that the
    replay can start early: it names exactly `replay.suspects` of the finished diff, and only when there are
    that many; with statistics only (decided after the comparison) it names none."""
    from modeltrace.diff.replay import suspects

    file = {
        "two": lambda: _two_bugs(tmp_path),
        "residual": lambda: buggy_copy(tmp_path, "residual", *BUGS["residual"][:2]),
        "none": lambda: EXAMPLE_PACKAGE / "modeling_tiny_llama.py",
    }[bug]()
    candidate = capture(file, tmp_path / "full.mtrace")
    statistics_only = capture_statistics(file, tmp_path / "statistics.mtrace")
    fired = 0
    for limit in (1, 2, 3, 8, 40):
        named: list[list] = []
        with load_reference(original) as ref, load_reference(candidate) as cand:
            result = diff_traces(ref, cand, DiffOptions(), watch=(limit, named.append))
            final = suspects(result, limit)
        if len(final) == limit:
            assert len(named) == 1 and len(named[0]) == limit
            assert all(early is late for early, late in zip(named[0], final)), (limit, bug)
            fired += 1
        else:
            assert named == [], (limit, bug)
        named.clear()
        with load_reference(original) as ref, load_reference(statistics_only) as cand:
            result = diff_traces(ref, cand, DiffOptions(), watch=(limit, named.append))
            assert named == [] and (bug == "none" or suspects(result, limit))
    assert fired == {"two": 4, "residual": 4, "none": 0}[bug]


def test_the_replay_starts_during_the_comparison_with_the_verdicts_of_one_after_it(
    original: Path, tmp_path: Path, worker
) -> None:
    """`diff_paths(replay=True)` (the CLI, the editor, the library) starts the replay from inside the comparison;
    its verdicts are those of a replay after the diff. An early start on calls that are not the finished diff's
    suspects is dropped, and the diff's own suspects are replayed instead."""
    from modeltrace.diff import ReplayRun, close_result, diff_paths, run_replay

    candidate = capture(_two_bugs(tmp_path), tmp_path / "two.mtrace")

    def verdicts(result) -> dict:
        return {
            module.candidate.path: (module.replay.status, module.replay.max_abs_diff)
            for module in result.modules
            if module.replay is not None
        }

    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand)
        run_replay(result, worker)
        after = verdicts(result)
        assert result.replayed and result.replay_timing["started_during_diff"] is False and len(after) == 8
    during = diff_paths(original, candidate, replay=True, client=worker)
    try:
        assert during.replay_timing["started_during_diff"] is True
        assert verdicts(during) == after
        assert during.first_divergence.module.candidate.path == "layers.0.self_attn.q_proj"
    finally:
        close_result(during)
    with load_reference(original) as ref, load_reference(candidate) as cand:
        run = ReplayRun(ref, cand, worker)
        result = diff_traces(ref, cand)
        matching = [module for module in result.modules if module.status == MATCH][:2]
        run.start(matching)
        run.finish(result)
        assert result.replay_timing["started_during_diff"] is False and verdicts(result) == after
        assert all(module.replay is None for module in matching)


def test_a_kept_argument_changed_in_place_is_not_replayed_on() -> None:
    """A call's kept arguments are used only while they hold what the trace recorded for them."""
    from modeltrace.worker.replay import _kept_arguments_unchanged

    module = torch.nn.Linear(4, 4)
    scale = torch.linspace(0.5, 1.5, 4)
    call = ((torch.ones(2, 4),), {"scale": scale})
    expected = {"scale": [float(scale.double().mean()), float(scale.double().std())]}
    assert _kept_arguments_unchanged(module, call, expected)
    scale.mul_(2.0)  # what research code does to a buffer it reuses
    assert not _kept_arguments_unchanged(module, call, expected)
    assert not _kept_arguments_unchanged(module, call, {"missing": [0.0, 1.0]})


def test_replay_of_a_module_that_raises_falls_back_to_the_plain_verdict(
    original: Path, tmp_path: Path, worker
) -> None:
    from modeltrace.diff import run_replay

    old, new, path, *_ = BUGS["activation"]
    file = buggy_copy(tmp_path, "stateful", old, new)
    source = file.read_text()
    # a module that refuses a second call (research code keeping state): the replay's extra call raises
    forward = "    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:\n        gate = "
    assert source.count(forward) == 1, "the example MLP's forward changed"
    start = "        if (input_ids is None) ^ (inputs_embeds is not None):\n"
    assert source.count(start) == 1, "the example model's forward changed"
    source = source.replace(start, "        for layer in self.layers:\n            layer.mlp.calls = 0\n" + start)
    file.write_text(
        source.replace(
            forward,
            (
                "    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:\n"
                "        self.calls = getattr(self, 'calls', 0) + 1\n"
                "        if self.calls > 1:\n"
                "            raise RuntimeError('this MLP runs once per forward')\n"
                "        gate = "
            ),
        )
    )
    candidate = capture(file, tmp_path / "stateful.mtrace")
    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand)
        plain = result.first_divergence.module.candidate.path
        run_replay(result, worker, limit=40)
        mlp = next(module for module in result.modules if module.candidate.path == "layers.0.mlp")
        assert mlp.replay.status == NOT_COMPARED and "this MLP runs once per forward" in mlp.replay.reason
        assert result.first_divergence.module.candidate.path == plain == path
        json.dumps(to_json(result), allow_nan=False)


def test_replay_refuses_a_candidate_whose_source_changed(original: Path, tmp_path: Path, worker) -> None:
    from modeltrace.diff import run_replay

    old, new, path, *_ = BUGS["activation"]
    file = buggy_copy(tmp_path, "changed", old, new)
    candidate = capture(file, tmp_path / "changed.mtrace")
    with load_reference(original) as ref, load_reference(candidate) as cand:
        result = diff_traces(ref, cand)
        # the trace header's source hash no longer matches the file
        result.candidate.trace.model["source_hashes"] = {str(file): "0" * 64}
        run_replay(result, worker)
        assert not result.replayed and result.first_divergence.module.candidate.path == path
        assert any("changed since the candidate was traced" in note for note in result.notes)


def test_replay_substitution_refuses_tensors_that_do_not_fit() -> None:
    from modeltrace.errors import ModelTraceError
    from modeltrace.worker.replay import substitute

    layer = torch.nn.Linear(4, 3)
    args, kwargs = (torch.randn(2, 4),), {}
    new_args, _ = substitute(layer, args, kwargs, {"input": torch.ones(1, 2, 4, dtype=torch.float64)})
    assert new_args[0].shape == (2, 4) and new_args[0].dtype == torch.float32 and bool((new_args[0] == 1).all())
    with pytest.raises(ModelTraceError, match=r"input 'input' has shape \[2, 5\].*\[2, 4\]"):
        substitute(layer, args, kwargs, {"input": torch.ones(2, 5)})
    with pytest.raises(ModelTraceError, match="'mask' is not an argument"):
        substitute(layer, args, kwargs, {"mask": torch.ones(2, 4)})


def test_cli_replay_and_a_diff_that_compares_too_little(original: Path, tmp_path: Path) -> None:
    old, new, path, *_ = BUGS["activation"]
    candidate = capture(buggy_copy(tmp_path, "cli", old, new), tmp_path / "cli.mtrace")
    completed = run_cli("diff", str(original), str(candidate), "--replay", "--format", "json")
    assert completed.returncode == 1, completed.stderr
    document = json.loads(completed.stdout)
    first = document["first_divergence"]
    assert first["path"] == path and first["by_replay"] and first["replay"]["status"] == MISMATCH
    assert document["verdict"] == "divergence" and first["lines"]["start"] <= first["lines"]["end"]
    assert all("compared" in module for module in document["modules"] if module["status"] != "not_compared")
    # a statistics-only reference cannot be replayed: the plain verdict, and the reason
    stats_only = tmp_path / "stats.mtrace"
    shutil.copytree(original, stats_only)
    (stats_only / TENSORS_FILE).unlink()
    from modeltrace.trace.storage import read_trace

    trace = read_trace(stats_only)
    for record in trace.modules:
        for summary in (*record.inputs, *record.outputs):
            summary.tensor = None
    shutil.rmtree(stats_only)
    write_trace(trace, stats_only)
    completed = run_cli("diff", str(stats_only), str(candidate), "--replay", "--format", "json")
    document = json.loads(completed.stdout)
    assert completed.returncode == 1 and document["first_divergence"]["path"] == path
    assert any(note.startswith("replay not used: the reference has no full tensors") for note in document["notes"])
    # two of 30 calls aligned: not a match, exit 2 with the reason
    few = tmp_path / "few.mtrace"
    trace = read_trace(original)
    for record in trace.modules[3:]:
        record.path = record.path.replace(".", "_") + "_renamed"
    write_trace(trace, few)
    completed = run_cli("diff", str(original), str(few), "--no-auto-align")
    assert completed.returncode == 2 and "not comparable: only" in completed.stderr
    assert "NOT COMPARABLE" in completed.stdout
    # by evidence rather than names, the renamed calls align again, and the numbers are the same
    completed = run_cli("diff", str(original), str(few))
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_cli_trace_against_a_reference_replays_on_the_model_just_traced(tmp_path: Path) -> None:
    """`modeltrace trace FILE --against REF`: the editor's flow from a terminal: full tensors, the diff, and the
    replay on the traced model kept in the worker; `diff`'s report and exit codes."""
    out = tmp_path / "port.mtrace"
    completed = run_cli(
        "trace", str(PORT_FILE), "--against", str(REFERENCE_TRACE), "--out", str(out), "--format", "json"
    )
    assert completed.returncode == 1, completed.stderr
    document = json.loads(completed.stdout)
    first = document["first_divergence"]
    assert first["path"] == "layers.0.self_attn" and first["by_replay"] and document["replayed"] is True
    assert (out / TENSORS_FILE).is_file() and f"trace written to {out}" in completed.stderr
    missing = run_cli("trace", str(PORT_FILE), "--against", str(tmp_path / "none.mtrace"), "--out", str(out))
    assert missing.returncode == 2 and "none.mtrace: no such trace" in missing.stderr
