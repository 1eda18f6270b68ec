"""The parameter store remembers the digest each build's weights had (`worker/build_identity.py`,
`parameter_store.remembered_digest`): a worker trace with full tensors of a model built the same way again names
its stored weights without the byte match, and anything the build read that changed, other fingerprints, a store
file written since or a hostile entry sends it back to the match."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
import torch

from modeltrace.trace.parameter_store import STORE_ENVIRONMENT
from modeltrace.trace.storage import read_trace
from modeltrace.worker import parameter_store
from modeltrace.worker.build_identity import BuildInputs
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.job import run_trace_job
from modeltrace.worker.messages import TraceRequest

# A recipe whose second layer's weights come from a file it loads (`torch.load`): an input no request field names.
RECIPE = """\
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 8))
    model[2].weight.data.copy_(torch.load(__file__.replace("recipe.py", "weights.pt")))
    return model.eval()

def build_inputs(model):
    return (torch.ones(2, 16),)
"""


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "store"
    monkeypatch.setenv(STORE_ENVIRONMENT, str(folder))
    return folder


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.py"
    path.write_text(RECIPE)
    torch.manual_seed(7)
    torch.save(torch.randn(512, 512), tmp_path / "weights.pt")
    return path


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the byte matches against the store (`_matching_digest`) and the SHA-256 digests worked out."""
    counts = {"matched": 0, "hashed": 0}
    match, compute = parameter_store._matching_digest, parameter_store.compute_digest

    def matching(*args: object) -> str | None:
        counts["matched"] += 1
        return match(*args)

    def hashing(*args: object) -> str:
        counts["hashed"] += 1
        return compute(*args)

    monkeypatch.setattr(parameter_store, "_matching_digest", matching)
    monkeypatch.setattr(parameter_store, "compute_digest", hashing)
    return counts


def _trace(recipe: Path, name: str, **options: object) -> dict:
    request = TraceRequest(
        file=str(recipe), recipe=str(recipe), out=str(recipe.parent / f"{name}.mtrace"), full_tensors=True, **options
    )
    result = run_trace_job(request, lambda _message: None)
    return read_trace(result.trace).model["parameters"]


def _entries(store: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((store / "builds").glob("*.json"))]


def test_a_build_made_again_names_its_stored_weights_without_the_match(
    recipe: Path, store: Path, work: dict[str, int]
) -> None:
    first = _trace(recipe, "first")
    assert work == {"matched": 1, "hashed": 1}  # an empty store: nothing matched, hashed and written
    (entry,) = _entries(store)
    assert f"{entry['digest']}.safetensors" == first["file"] and len(entry["fingerprints"]) == 64

    # how the trace is shown and how much of the activations it keeps are not part of the build
    again = _trace(recipe, "again", lines=True, max_trace_mb=4096.0, keep_for_replay=True)
    assert again == first and work == {"matched": 1, "hashed": 1}
    assert len(_entries(store)) == 1


def test_what_the_build_read_changing_sends_it_back_to_the_match(
    recipe: Path, store: Path, work: dict[str, int]
) -> None:
    """A file the recipe loads changed in one value that no fingerprint samples: the key (the file's size, time
    and inode) misses, the match finds the store file differs, and the new weights get a file of their own."""
    from modeltrace.worker.builds import parameter_records

    first = _trace(recipe, "first")
    weights = torch.load(recipe.parent / "weights.pt")
    edited = None
    for position in range(0, 512 * 512, 997):  # one the fingerprints do not sample
        layer = torch.nn.Linear(512, 512).requires_grad_(False)
        layer.weight.copy_(weights)
        layer.bias.zero_()
        reference = parameter_store.fingerprints_digest(parameter_records(layer))
        layer.weight.view(-1)[position] += 1.0
        if parameter_store.fingerprints_digest(parameter_records(layer)) == reference:
            edited = layer.weight.clone()
            break
    assert edited is not None
    torch.save(edited, recipe.parent / "weights.pt")

    changed = _trace(recipe, "changed")
    assert work["matched"] == 2 and changed["file"] != first["file"]
    assert len(_entries(store)) == 2
    # and a comment added to the recipe: the same weights, found by the match, remembered under the new key
    recipe.write_text("# edited\n" + RECIPE)
    assert _trace(recipe, "commented")["file"] == changed["file"] and work["matched"] == 3


def test_other_fingerprints_under_the_same_key_are_matched(recipe: Path, store: Path, work: dict[str, int]) -> None:
    """A build that is not a function of what it reads (an unseeded draw) makes other weights under one key:
    their fingerprints differ from the remembered ones, so the store's word is not taken."""
    unseeded = "    generator = torch.Generator().manual_seed(int.from_bytes(__import__('os').urandom(7), 'little'))\n"
    drawn = "    model[0].weight.data.normal_(generator=generator)\n    return model.eval()\n"
    recipe.write_text(RECIPE.replace("    return model.eval()\n", unseeded + drawn))
    first, second = _trace(recipe, "first"), _trace(recipe, "second")
    assert first["file"] != second["file"] and work["matched"] == 2 and work["hashed"] == 2


def test_a_store_file_written_since_is_matched_again(recipe: Path, store: Path, work: dict[str, int]) -> None:
    first = _trace(recipe, "first")
    stored = store / first["file"]
    damaged = bytearray(stored.read_bytes())
    damaged[-8:] = b"\xff" * 8  # behind the first 4 KB of every tensor: only the whole match sees it
    stored.write_bytes(bytes(damaged))
    again = _trace(recipe, "again")
    assert again["file"] == first["file"] and work["matched"] == 2
    assert stored.read_bytes() != bytes(damaged)  # found to differ, written again
    assert _trace(recipe, "third")["file"] == first["file"] and work["matched"] == 2  # remembered anew


def _other_store_file(remembered: dict, store: Path, other: dict) -> dict:
    file = parameter_store._file_identity((store / other["file"]).stat())
    return {**remembered, "digest": other["file"].removesuffix(".safetensors"), "file": file}


HOSTILE_ENTRIES = {
    "not json": lambda remembered, store, other: b"not json",
    "a list": lambda remembered, store, other: b"[1, 2]",
    "a path for a digest": lambda remembered, store, other: json.dumps(
        {**remembered, "digest": "../../../etc/passwd"}
    ).encode(),
    "oversized": lambda remembered, store, other: json.dumps(
        {**remembered, "padding": " " * parameter_store.MAX_BUILD_ENTRY_BYTES}
    ).encode(),
    # the right fingerprints and that file's identity: only the spot check of its bytes tells
    "another store file": lambda remembered, store, other: json.dumps(
        _other_store_file(remembered, store, other)
    ).encode(),
}


@pytest.mark.parametrize("hostile", sorted(HOSTILE_ENTRIES))
def test_a_hostile_build_entry_is_never_trusted(
    recipe: Path, store: Path, work: dict[str, int], hostile: str, tmp_path: Path
) -> None:
    """An entry is data another process wrote: one that is malformed, oversized, names a path, or names another
    existing store file is not taken: the weights are matched and the trace names their own file."""
    first = _trace(recipe, "first")
    other = _trace(_other_recipe(tmp_path), "other")
    assert other["file"] != first["file"]
    path = _entry_of(store, first)
    path.write_bytes(HOSTILE_ENTRIES[hostile](json.loads(path.read_text()), store, other))
    matched = work["matched"]
    assert _trace(recipe, "again")["file"] == first["file"] and work["matched"] == matched + 1
    assert (store / "builds").is_dir() and not list(tmp_path.glob("etc"))


def _other_recipe(tmp_path: Path) -> Path:
    folder = tmp_path / "other"
    folder.mkdir()
    path = folder / "recipe.py"
    path.write_text(RECIPE.replace("manual_seed(0)", "manual_seed(1)"))
    torch.save(torch.load(tmp_path / "weights.pt"), folder / "weights.pt")
    return path


def _entry_of(store: Path, parameters: dict) -> Path:
    digest = parameters["file"].removesuffix(".safetensors")
    (path,) = [path for path in (store / "builds").glob("*.json") if json.loads(path.read_text())["digest"] == digest]
    return path


def test_the_key_covers_what_the_build_opened_and_imported(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"hidden": 8}')
    module = tmp_path / "memo_helper_module.py"
    module.write_text("VALUE = 1\n")
    request = TraceRequest(file=str(tmp_path / "recipe.py"), out=str(tmp_path / "a.mtrace"), full_tensors=True)

    def build() -> BuildInputs:
        import importlib
        import sys

        sys.modules.pop("memo_helper_module", None)
        sys.path.insert(0, str(tmp_path))
        try:
            with BuildInputs() as inputs:
                json.loads(config.read_text())
                importlib.import_module("memo_helper_module")
        finally:
            sys.path.remove(str(tmp_path))
        return inputs

    inputs = build()
    assert str(config) in inputs.opened and str(module) in inputs.imported
    key = inputs.key(request)
    assert key is not None and build().key(request) == key
    import dataclasses

    assert build().key(dataclasses.replace(request, out=str(tmp_path / "b.mtrace"), lines=True)) == key
    assert build().key(dataclasses.replace(request, seed=1)) != key
    config.write_text('{"hidden": 16}')
    assert build().key(request) != key
    # the opens are replaced only while a build records, and put back whatever the build raised
    import builtins
    import io
    import os

    opens = (builtins.open, io.open, os.open)
    with pytest.raises(RuntimeError, match="the build failed"), BuildInputs():
        assert builtins.open is not opens[0] and os.open is not opens[2]
        raise RuntimeError("the build failed")
    assert (builtins.open, io.open, os.open) == opens


def test_the_worker_remembers_a_build_across_its_children(tmp_path: Path, store: Path, recipe: Path) -> None:
    """Through the real worker (a child forked per trace): the second trace finds the first's entry and names
    the same store file; an entry the child wrote is in the store, not in a dead process."""
    worker = WorkerClient()
    files = []
    try:
        for name in ("a", "b"):
            request = TraceRequest(
                file=str(recipe), recipe=str(recipe), out=str(tmp_path / f"{name}.mtrace"), full_tensors=True
            )
            files.append(read_trace(worker.trace(request).trace).model["parameters"]["file"])
    finally:
        worker.close()
    assert files[0] == files[1]
    (entry,) = _entries(store)
    assert f"{entry['digest']}.safetensors" == files[0]


def test_a_checkpoint_saved_again_sends_the_build_back_to_the_match(
    tmp_path: Path, store: Path, work: dict[str, int]
) -> None:
    """A checkpoint's weights are read by native code (no audit event): the key names each of its files by size,
    time and inode, so a checkpoint saved again with one value changed is matched, not taken on the entry's word."""
    from modeltrace.worker.building import build_from_file

    file = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"
    original = build_from_file(file, None, None, seed=0).model
    original.save_pretrained(tmp_path / "checkpoint")

    def trace(name: str) -> dict:
        request = TraceRequest(
            file=str(file), checkpoint=str(tmp_path / "checkpoint"), out=str(tmp_path / name), full_tensors=True
        )
        return read_trace(run_trace_job(request, lambda _message: None).trace).model["parameters"]

    first = trace("first.mtrace")
    assert trace("again.mtrace") == first and work["matched"] == 1
    with torch.no_grad():
        weight = original.get_input_embeddings().weight
        weight[weight.shape[0] // 2, 3] += 1.0
    original.save_pretrained(tmp_path / "checkpoint")
    changed = trace("changed.mtrace")
    assert work["matched"] == 2 and changed["file"] != first["file"]


def test_the_editor_worker_remembers_a_modeling_file_build(tmp_path: Path, store: Path, example_copy: Path) -> None:
    """The editor's path: the example modeling file built unaided by the real worker, a child forked per trace.
    The second trace takes the first's entry (it is not written again: the build was remembered); an edit of
    the configuration file the modeling file imports makes another key, whose entry names the same weights."""
    worker = WorkerClient()
    try:

        def trace(name: str) -> dict:
            request = TraceRequest(file=str(example_copy), out=str(tmp_path / name), full_tensors=True)
            return read_trace(worker.trace(request).trace).model["parameters"]

        first = trace("a.mtrace")
        (entry,) = (store / "builds").glob("*.json")
        written = entry.stat().st_mtime_ns
        assert trace("b.mtrace") == first
        assert list((store / "builds").glob("*.json")) == [entry] and entry.stat().st_mtime_ns == written
        configuration = example_copy.parent / "configuration_tiny_llama.py"
        configuration.write_text(configuration.read_text() + "\n# edited\n")
        assert trace("c.mtrace")["file"] == first["file"]
        assert len(list((store / "builds").glob("*.json"))) == 2
    finally:
        worker.close()


def test_the_oldest_build_entries_go_past_the_limit(
    store: Path, monkeypatch: pytest.MonkeyPatch, recipe: Path
) -> None:
    monkeypatch.setattr(parameter_store, "MAX_BUILD_ENTRIES", 8)
    digest = _trace(recipe, "first")["file"].removesuffix(".safetensors")
    import os

    for index in range(12):
        parameter_store.remember_digest(store, f"{index:064x}", "f" * 64, digest)
        os.utime(store / "builds" / f"{index:064x}.json", ns=(index * 10**9, index * 10**9))
    kept = sorted(path.stem for path in (store / "builds").glob("*.json"))
    # pruned when the 9th entry came (down to 6), then again at the 12th: the newest always stay
    assert len(kept) <= 8 and f"{11:064x}" in kept and f"{0:064x}" not in kept
