"""A seeded, time-bounded mutation fuzz of every reader, and of the commands built on them (`show`, `diff`, `align`,
`export` through their Python functions): each damaged input is read and, when it reads, shown, diffed, aligned and
exported. Every outcome is counted:

- refused: one `ModelTraceError` (the message the CLI prints and the server answers);
- accepted: read and used without an error;
- traceback: any other exception (a bug);
- hang: one input that took longer than `HANG_SECONDS`;
- wrong success: an input damaged where the format forbids it (a targeted mutation) that was accepted.

All but the first two must be 0; `test_the_fuzz_figures` prints the totals (the README's reliability section).
Hypothesis runs derandomized (the same inputs on every run) and each test is bounded in examples.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeltrace.diff import align_modules, close_result, diff_paths, render_text, to_json
from modeltrace.diff.mapping import read_mapping
from modeltrace.errors import ModelTraceError
from modeltrace.trace.hf_debugger import write_debugger_output
from modeltrace.trace.listing import render_listing
from modeltrace.trace.reference import load_reference
from modeltrace.trace.storage import TENSORS_FILE, TRACE_FILE, read_trace
from modeltrace.trace.tensors import SafetensorsFile


REFERENCE = Path(__file__).resolve().parents[2] / "examples" / "reference" / "tiny_llama.mtrace"
HANG_SECONDS = 10.0
FIGURES: Counter[str] = Counter()
SETTINGS = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _outcome(run: Callable[[], Any], damaged: bool) -> str:
    """Run one input through `run`; count and return what happened (see the module docstring)."""
    FIGURES["tried"] += 1
    started = time.perf_counter()
    try:
        run()
    except ModelTraceError as error:
        outcome = "refused"
        assert "\n" not in str(error).strip(), str(error)
    except Exception as error:  # noqa: BLE001 - what the fuzz counts
        outcome = "traceback"
        FIGURES[outcome] += 1
        raise AssertionError(f"traceback: {type(error).__name__}: {error}") from error
    else:
        outcome = "wrong success" if damaged else "accepted"
    if time.perf_counter() - started > HANG_SECONDS:
        outcome = "hang"
    FIGURES[outcome] += 1
    assert outcome in ("refused", "accepted"), outcome
    return outcome


def _use_trace(folder: Path, scratch: Path) -> None:
    """What `show`, `diff`, `align` and `export` do with a trace, through their functions."""
    trace = read_trace(folder)
    json.dumps(trace.to_json(), allow_nan=True)
    try:
        render_listing(trace)
    except ModelTraceError:
        pass  # the source file is not here: the listing says so; the rest must still work
    result = diff_paths(REFERENCE, folder)
    try:
        render_text(result)
        json.dumps(to_json(result), allow_nan=False)
    finally:
        close_result(result)
    align_modules(read_trace(REFERENCE), trace)
    with load_reference(folder) as loaded:
        write_debugger_output(loaded, scratch / "export", use_repr=True)


def _reference_document() -> dict[str, Any]:
    return msgpack.unpackb((REFERENCE / TRACE_FILE).read_bytes(), raw=False, strict_map_key=False)


def _write_trace_folder(folder: Path, payload: bytes) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / TRACE_FILE).write_bytes(payload)
    return folder


# --- .mtrace: bytes ---------------------------------------------------------------------------------------------

byte_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(
        st.just("flip"), st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
    ),
    st.tuples(st.just("insert"), st.tuples(st.integers(0, 1 << 20), st.binary(min_size=1, max_size=12))),
)


def _mutate_bytes(data: bytes, change: tuple) -> bytes:
    mutated = bytearray(data)
    kind, argument = change
    if kind == "truncate":
        return bytes(mutated[: argument % (len(mutated) + 1)])
    if kind == "flip":
        for position, value in argument:
            mutated[position % len(mutated)] = value
        return bytes(mutated)
    position, extra = argument
    position %= len(mutated) + 1
    mutated[position:position] = extra
    return bytes(mutated)


@settings(SETTINGS, max_examples=150)
@given(change=byte_mutation)
def test_mutated_trace_bytes(tmp_path: Path, change: tuple) -> None:
    payload = _mutate_bytes((REFERENCE / TRACE_FILE).read_bytes(), change)
    folder = _write_trace_folder(tmp_path / "bytes.mtrace", payload)
    # (no tensors file: the mutated records must not be paired with the reference's full tensors)
    _outcome(lambda: _use_trace(folder, tmp_path), damaged=False)


# --- .mtrace: targeted damage (each must be refused) -------------------------------------------------------------

HOSTILE = {
    "shape": st.sampled_from([[-1], [1.5], [2**40], ["7"], [math.inf], None, "1,7", [[1]], [1] * 65]),
    "dtype": st.sampled_from(["float33", "", 3, None, ["float32"], "torch.float32"]),
    "statistic": st.sampled_from(["", "1.0", [1.0], {"v": 1}, True]),
    "count": st.sampled_from([-1, 1.5, "3", 2**63]),  # (absent or null: none counted)
    "index": st.sampled_from([-2, 10_000, 1.5, "0", None, True]),
    "line": st.sampled_from([0, -1, 2**62, 2.5, "12", None]),
    "key": st.sampled_from([["x"], 3, None, {"a": 1}]),
}


def _damage(document: dict[str, Any], field: str, record: int, value: Any) -> None:
    module = document["modules"][record % len(document["modules"])]
    summary = (module["outputs"] or module["inputs"])[0] if (module["outputs"] or module["inputs"]) else None
    if field in ("shape", "dtype", "key") and summary is not None:
        summary[field] = value
    elif field == "statistic" and summary is not None:
        summary["mean"] = value
    elif field == "count" and summary is not None:
        summary["nan_count"] = value
    elif field == "index":
        module["parent" if record % 2 else "finish_order"] = value
    elif field == "line":
        (module["called_at"] or module["defined_at"])["line"] = value
    else:
        module["parent"] = 10_000


@settings(SETTINGS, max_examples=150)
@given(
    damage=st.sampled_from(sorted(HOSTILE)).flatmap(
        lambda field: st.tuples(st.just(field), st.integers(1, 29), HOSTILE[field])
    )
)
def test_targeted_damage_is_refused(tmp_path: Path, damage: tuple) -> None:
    field, record, value = damage
    document = _reference_document()
    _damage(document, field, record, value)
    folder = _write_trace_folder(tmp_path / "damaged.mtrace", msgpack.packb(document, use_bin_type=True))
    _outcome(lambda: read_trace(folder), damaged=True)


# --- safetensors ------------------------------------------------------------------------------------------------


@settings(SETTINGS, max_examples=100)
@given(change=byte_mutation)
def test_mutated_tensor_files(tmp_path: Path, change: tuple) -> None:
    data = (REFERENCE / TENSORS_FILE).read_bytes()
    # NOTE: the header is where a reader can go wrong (the data is bytes): mutations land in the first 4 KB
    kind, argument = change
    if kind == "flip":
        change = (kind, [(position % 4096, value) for position, value in argument])
    elif kind == "insert":
        change = (kind, (argument[0] % 4096, argument[1]))
    folder = tmp_path / "tensors.mtrace"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(REFERENCE, folder)
    (folder / TENSORS_FILE).write_bytes(_mutate_bytes(data, change))

    def use() -> None:
        with SafetensorsFile(folder / TENSORS_FILE) as tensors:
            for name in tensors.names():
                tensors.array(name)
        result = diff_paths(REFERENCE, folder)
        close_result(result)

    _outcome(use, damaged=False)


# --- the transformers debugger's JSON ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def debugger_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("debugger")
    with load_reference(REFERENCE) as loaded:
        summary, _full = write_debugger_output(loaded, folder, use_repr=True)
    return json.loads(summary.read_text())


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["torch.Size([1, 7, 64])", "torch.Size([-1])", "torch.Size([inf])", "torch.float33", "nan"]),
)


def _json_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths.extend(_json_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            paths.extend(_json_paths(item, (*prefix, position)))
    return paths


@settings(SETTINGS, max_examples=150)
@given(
    where=st.integers(0, 1 << 30),
    value=st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3), max_leaves=6),
)
def test_mutated_debugger_outputs(tmp_path: Path, debugger_json: dict[str, Any], where: int, value: Any) -> None:
    document = json.loads(json.dumps(debugger_json))
    paths = [path for path in _json_paths(document) if path]
    target = paths[where % len(paths)]
    holder = document
    for step in target[:-1]:
        holder = holder[step]
    holder[target[-1]] = value
    file = tmp_path / "Model_debug_tree_SUMMARY.json"
    file.write_text(json.dumps(document))

    def use() -> None:
        with load_reference(file) as loaded:
            json.dumps(loaded.trace.to_json(), allow_nan=True)
        close_result(diff_paths(file, REFERENCE))

    _outcome(use, damaged=False)


# --- mapping files ----------------------------------------------------------------------------------------------


@settings(SETTINGS, max_examples=150)
@given(
    lines=st.lists(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(["layers.0 => layers.0", "=> x", "a => b => c", "# modeltrace mapping 1", "x =>", ""]),
        ),
        max_size=8,
    )
)
def test_mutated_mapping_files(tmp_path: Path, lines: list[str]) -> None:
    trace = read_trace(REFERENCE)
    file = tmp_path / "mapping.txt"
    # NOTE: text from hypothesis may hold lone surrogates: written as they come, they are bytes that are not UTF-8
    file.write_bytes("\n".join(lines).encode("utf-8", errors="surrogatepass"))
    _outcome(lambda: read_mapping(file, trace, trace), damaged=False)


def test_the_fuzz_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The totals of this module's runs (when run with the tests above): printed for the README."""
    if not FIGURES["tried"]:
        pytest.skip("run with the fuzz tests above to count")
    with capsys.disabled():
        print(
            "\nfuzz: {tried} inputs, {refused} refused cleanly, {accepted} accepted, {traceback} tracebacks, "
            "{hang} hangs, {wrong} wrong successes".format(
                tried=FIGURES["tried"],
                refused=FIGURES["refused"],
                accepted=FIGURES["accepted"],
                traceback=FIGURES["traceback"],
                hang=FIGURES["hang"],
                wrong=FIGURES["wrong success"],
            )
        )
    assert FIGURES["traceback"] == FIGURES["hang"] == FIGURES["wrong success"] == 0
