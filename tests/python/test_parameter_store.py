"""The shared parameter store and what a capture reuses: a model's weights are written once per content and
referred to by every trace of them; a store file that is gone or damaged costs a trace its parameters only (its
activations load, show and diff, with a note naming the file) and never touches a trace that does not use it;
`capture()` reuses the construction records and the parameters' digest while the model is unchanged, and sees a
change (a weight written in place, a setting reassigned) at the next capture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaModel

import modeltrace
from modeltrace.errors import ModelTraceError
from modeltrace.trace.parameter_store import STORE_ENVIRONMENT, parameters_file
from modeltrace.trace.reference import load_reference
from modeltrace.trace.storage import read_trace, tensors_paths
from modeltrace.trace.tensors import SafetensorsFile
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import TraceRequest

from test_tensor_stream import small_llama


INPUT_IDS = torch.tensor([[1, 17, 42, 99, 5, 63, 120]])


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "store"
    monkeypatch.setenv(STORE_ENVIRONMENT, str(folder))
    return folder


def _model(other: bool = False) -> LlamaModel:
    model = small_llama()[0]
    if other:  # other weights: another store file
        with torch.no_grad():
            model.norm.weight.add_(1)
    return model


def _capture(model: torch.nn.Module, path: Path, **options: object) -> Path:
    with torch.no_grad(), modeltrace.capture(model, path, full_tensors=True, **options) as session:
        model(INPUT_IDS)
    return session.path


def _stored_names(folder: Path) -> set[str]:
    names: set[str] = set()
    for shard in tensors_paths(folder):
        with SafetensorsFile(shard) as tensors:
            names.update(tensors.names())
    return names


def test_two_traces_of_one_model_share_one_store_file(tmp_path: Path, store: Path) -> None:
    model = _model()
    first = _capture(model, tmp_path / "first.mtrace")
    second = _capture(model, tmp_path / "second.mtrace")
    assert [path.name for path in store.iterdir()] == [read_trace(first).model["parameters"]["file"]]
    assert read_trace(second).model["parameters"] == read_trace(first).model["parameters"]
    # the trace folders hold the activations only
    assert not any(name.startswith("parameters/") for name in _stored_names(first) | _stored_names(second))
    with load_reference(second) as loaded:
        assert loaded.notes == []
        weight = loaded.tensors.get("parameters/layers.1.self_attn.o_proj.weight")
        assert torch.equal(torch.from_numpy(weight.copy()), model.layers[1].self_attn.o_proj.weight)
        assert any(name.startswith("0/") for name in _stored_names(second))


def test_a_weight_changed_in_place_is_stored_anew(tmp_path: Path, store: Path) -> None:
    model = _model()
    before = read_trace(_capture(model, tmp_path / "before.mtrace"))
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight.mul_(2)
    after = read_trace(_capture(model, tmp_path / "after.mtrace"))
    assert before.model["parameters"]["file"] != after.model["parameters"]["file"]
    assert len(list(store.iterdir())) == 2
    fingerprints = [
        next(build for build in trace.builds if build.path == "layers.0.mlp.up_proj").parameters[0].summary.abs_max
        for trace in (before, after)
    ]
    assert fingerprints[1] == pytest.approx(2 * fingerprints[0])


def test_a_setting_reassigned_between_captures_is_recorded(tmp_path: Path, store: Path) -> None:
    model = _model()
    _capture(model, tmp_path / "before.mtrace")
    model.norm.variance_epsilon = 0.125
    after = read_trace(_capture(model, tmp_path / "after.mtrace"))
    norm = next(build for build in after.builds if build.path == "norm")
    assert norm.settings["variance_epsilon"] == 0.125


@pytest.mark.parametrize("walk", ["c", "python"])
def test_other_tools_call_state_keeps_the_facts_and_a_private_scalar_does_not(
    tmp_path: Path, store: Path, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tools that run the model keep per-call state in private attributes (transformers' model debugger replaces
    `_call_tree` and `_debugger_model_call_stack` at every call): the facts are reused across it, while a private
    scalar an `extra_repr` may print, reassigned, makes them anew; the check walks the modules in C where the
    extension module is built, in Python without it."""
    from modeltrace.worker import reuse
    from modeltrace.worker.reuse import model_facts

    if walk == "python":
        monkeypatch.setattr(reuse, "_capture_core", lambda: None)
    model = _model()
    _capture(model, tmp_path / "first.mtrace")
    facts = model_facts(model)
    model._call_tree = {"module_path": "LlamaModel", "children": []}
    model.layers[0]._debugger_model_call_stack = []
    assert model_facts(model) is facts
    model.norm._eps_scale = 0.5
    assert model_facts(model) is not facts


def test_no_parameters_stores_the_activations_only(tmp_path: Path, store: Path) -> None:
    trace_path = _capture(_model(), tmp_path / "bare.mtrace", parameters=False)
    trace = read_trace(trace_path)
    assert "parameters" not in trace.model and trace.model["options"]["parameters"] is False
    assert not store.exists()
    assert all(parameter.summary.tensor is None for build in trace.builds for parameter in build.parameters)
    with pytest.raises(ModelTraceError, match="parameters must be True or False"):
        _capture(_model(), tmp_path / "bad.mtrace", parameters="no")


def test_a_deleted_store_leaves_the_activations_shown_and_diffed(tmp_path: Path, store: Path) -> None:
    model = _model()
    reference = _capture(model, tmp_path / "reference.mtrace")
    candidate = _capture(model, tmp_path / "candidate.mtrace")
    file = parameters_file(read_trace(reference))
    for item in store.iterdir():
        item.unlink()
    store.rmdir()

    view = modeltrace.load(reference)
    assert len(view.modules) > 10
    result = modeltrace.diff(reference, candidate, replay=False)
    assert result.match
    assert any("parameters are missing" in note and file.name in note for note in result.document["notes"])
    shown = subprocess.run(
        [sys.executable, "-m", "modeltrace", "show", str(reference)], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "layers.1" in shown.stdout or "LlamaDecoderLayer" in shown.stdout
    assert "parameters are missing" in shown.stderr and file.name in shown.stderr
    compared = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(reference), str(candidate), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert compared.returncode == 0, compared.stderr
    assert "parameters are missing" in compared.stdout


def test_a_damaged_store_file_is_named_and_breaks_no_other_trace(tmp_path: Path, store: Path) -> None:
    first_model, other_model = _model(), _model(other=True)
    damaged_user = _capture(first_model, tmp_path / "damaged_user.mtrace")
    unaffected = _capture(other_model, tmp_path / "unaffected.mtrace")
    statistics_only = tmp_path / "statistics.mtrace"
    with torch.no_grad(), modeltrace.capture(first_model, statistics_only):
        first_model(INPUT_IDS)
    damaged = parameters_file(read_trace(damaged_user))
    damaged.write_bytes(b"\xff" * 64)  # garbage where the store file was

    for untouched in (unaffected, statistics_only):
        with load_reference(untouched) as loaded:
            assert loaded.notes == []
    with load_reference(damaged_user) as loaded:
        assert [note for note in loaded.notes if str(damaged) in note and "cannot be read" in note]
        assert loaded.tensors is not None and "parameters/norm.weight" not in loaded.tensors
    assert modeltrace.diff(damaged_user, damaged_user, replay=False).match

    # the next capture of that model does not trust the damaged file: it writes it whole again
    _capture(first_model, tmp_path / "again.mtrace")
    with SafetensorsFile(damaged) as rewritten:
        assert "parameters/norm.weight" in rewritten


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the weights' SHA-256 digests worked out (`compute_digest`), each call's tensor count."""
    from modeltrace.worker import parameter_store

    computed: list[int] = []
    compute = parameter_store.compute_digest

    def counting(tensors: list) -> str:
        computed.append(len(tensors))
        return compute(tensors)

    monkeypatch.setattr(parameter_store, "compute_digest", counting)
    return computed


def test_a_fresh_model_with_stored_weights_is_matched_not_hashed(
    tmp_path: Path, store: Path, hashes: list[int]
) -> None:
    """The worker builds a fresh model per trace: one with the weights of a store file (same recipe, same seed)
    is compared with that file and takes its name; other weights (another seed, one value changed past the
    first 4 KB of a tensor, where the quick pass does not look) are hashed and stored anew."""
    first = read_trace(_capture(_model(), tmp_path / "first.mtrace"))
    assert len(hashes) == 1
    again = read_trace(_capture(_model(), tmp_path / "again.mtrace"))  # another object, the same weights
    assert len(hashes) == 1 and again.model["parameters"] == first.model["parameters"]

    torch.manual_seed(1)
    reseeded = LlamaModel(_model().config).eval()
    other_seed = read_trace(_capture(reseeded, tmp_path / "seed1.mtrace"))
    edited = _model()
    with torch.no_grad():
        edited.embed_tokens.weight[-1, -1] += 1  # the last value of the largest tensor
    one_value = read_trace(_capture(edited, tmp_path / "edited.mtrace"))
    assert len(hashes) == 3
    files = {trace.model["parameters"]["file"] for trace in (first, other_seed, one_value)}
    assert len(files) == 3 and sorted(files) == sorted(path.name for path in store.iterdir())


def test_a_store_file_damaged_behind_its_header_is_written_again(
    tmp_path: Path, store: Path, hashes: list[int]
) -> None:
    first = read_trace(_capture(_model(), tmp_path / "first.mtrace"))
    path = parameters_file(first)
    damaged = bytearray(path.read_bytes())
    damaged[-8:] = b"\xff" * 8  # the last bytes of the data: the header still says the right tensors
    path.write_bytes(bytes(damaged))

    again = read_trace(_capture(_model(), tmp_path / "again.mtrace"))
    assert len(hashes) == 2  # compared, found to differ, hashed: the same digest
    assert again.model["parameters"]["file"] == path.name
    with load_reference(tmp_path / "again.mtrace") as loaded:
        weight = loaded.tensors.get("parameters/norm.weight")
        assert torch.equal(torch.from_numpy(weight.copy()), _model().norm.weight)
    assert path.read_bytes() != bytes(damaged)


def test_the_worker_stores_parameters_once_and_leaves_them_out_on_request(
    tmp_path: Path, worker: WorkerClient
) -> None:
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build_model():\n    torch.manual_seed(0)\n    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))\n\n"
        "def build_inputs(model):\n    return (torch.ones(2, 8),)\n"
    )
    traces = []
    for name, parameters in (("a", True), ("b", True), ("bare", False)):
        request = TraceRequest(
            file=str(recipe),
            recipe=str(recipe),
            out=str(tmp_path / f"{name}.mtrace"),
            full_tensors=True,
            parameters=parameters,
        )
        traces.append(read_trace(worker.trace(request).trace))
    first, second, bare = traces
    assert first.model["parameters"]["file"] == second.model["parameters"]["file"]
    assert first.model["parameters"]["tensors"] == 4
    assert "parameters" not in bare.model and bare.model["options"]["parameters"] is False
    assert not any(name.startswith("parameters/") for name in _stored_names(tmp_path / "a.mtrace"))
    # the recipe's seed changed: the fresh model's other weights are hashed and stored anew, not matched
    recipe.write_text(recipe.read_text().replace("manual_seed(0)", "manual_seed(1)"))
    request = TraceRequest(file=str(recipe), recipe=str(recipe), out=str(tmp_path / "seed1.mtrace"), full_tensors=True)
    reseeded = read_trace(worker.trace(request).trace)
    assert reseeded.model["parameters"]["file"] != first.model["parameters"]["file"]
    with load_reference(tmp_path / "seed1.mtrace") as loaded:
        assert loaded.notes == [] and "parameters/0.weight" in loaded.tensors


def test_fingerprints_before_the_forward_are_the_same_on_either_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Statistics only, a model under `THREAD_MIN_ELEMENTS` gets its fingerprints on the caller's thread when
    asked, one over it on the second thread: the same records either way, and a failure is raised to the caller."""
    from modeltrace.worker import parameter_store
    from modeltrace.worker.builds import parameter_records

    model = _model()
    expected = {
        path: [(record.name, record.sample, record.sample_transposed, record.summary.mean) for record in records]
        for path, records in parameter_records(model).items()
    }
    for threshold in (0, 1 << 40):
        monkeypatch.setattr(parameter_store, "THREAD_MIN_ELEMENTS", threshold)
        before = parameter_store.WeightWork(model, None)
        assert before._threaded is (threshold == 0)
        got = {
            path: [(record.name, record.sample, record.sample_transposed, record.summary.mean) for record in records]
            for path, records in before.fingerprints().items()
        }
        assert got == expected
        before.wait()

    def broken(_plan: object) -> None:
        raise RuntimeError("fingerprints failed")

    monkeypatch.setattr("modeltrace.worker.builds.ParameterFingerprints.read", broken)
    for threshold in (0, 1 << 40):
        monkeypatch.setattr(parameter_store, "THREAD_MIN_ELEMENTS", threshold)
        with pytest.raises(RuntimeError, match="fingerprints failed"):
            parameter_store.WeightWork(model, None).fingerprints()


def test_the_digest_waits_for_the_forward_and_is_not_made_after_a_failed_one(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The match against the store reads every weight: made once the forward has ended (beside it, it slowed it),
    and not at all when the forward raised (nothing will ask for it: the thread ends)."""
    from modeltrace.worker import parameter_store

    model = _model()
    digested: list[torch.nn.Module] = []
    monkeypatch.setattr(parameter_store, "model_digest", lambda model, tensors, folder=None: digested.append(model))
    work = parameter_store.WeightWork(model, 1000.0)
    assert work._recorded.wait(10) and not work._finished.wait(0.2) and digested == []
    work.forward_exited(None, None, None)
    work.wait()
    assert digested == [model]
    failed = parameter_store.WeightWork(model, 1000.0)
    assert failed.forward_exited(RuntimeError, RuntimeError("the forward failed"), None) is False
    assert failed._finished.wait(10) and digested == [model]


def test_the_change_checks_walk_is_the_same_in_c_and_python() -> None:
    """The C walk (`watched_state`) sees what the Python one does: the same objects in the same order (modules,
    watched names, settings), the same tensor states, and none where a buffer has no version counter."""
    from modeltrace.worker import reuse
    from modeltrace.worker.capture import _capture_core

    core = _capture_core()
    if core is None:
        pytest.skip("no extension module here")
    model = _model()
    model.norm._eps_scale = 0.5
    model.layers[0].label = "first"
    modules = list(model.modules())

    def both() -> tuple:
        native = core.watched_state(modules, model, reuse._PLAIN_TYPES, reuse._CANONICAL, reuse._WATCHED_LIMIT)
        python = reuse._watched_state(model, modules)
        return native, python

    native, python = both()
    assert [id(value) for value in native[0]] == [id(value) for value in python[0]]
    assert native[1] == python[1] and len(native[1]) == len(list(model.parameters())) + len(list(model.buffers()))
    with torch.inference_mode():
        model.norm.register_buffer("frozen", torch.ones(2))
    native, python = both()
    assert native[1] is None and python[1] is None
    assert [id(value) for value in native[0]] == [id(value) for value in python[0]]
