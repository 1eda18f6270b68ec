"""What ModelTrace reads never runs code and never allocates what a file only claims.

- Nothing is unpickled: no source file calls pickle, `torch.load` or `np.load(allow_pickle=True)`, and a local
  checkpoint holding a pickled `pytorch_model.bin` whose unpickling would run code is refused (transformers'
  `torch.load(weights_only=True)`), the code never run.
- Sizes are checked before allocating: a trace or debugger JSON over the size limit is refused before it is
  read; declared lengths (msgpack arrays and strings, safetensors tensors, debugger shapes) far larger than the
  file are refused or kept as numbers, never allocated.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
from pathlib import Path

import msgpack
import pytest

from conftest import EXAMPLE_MODELING_FILE
from modeltrace.errors import ModelTraceError, TraceFormatError
from modeltrace.trace import hf_debugger, storage
from modeltrace.trace.hf_debugger import read_debugger_output
from modeltrace.trace.records import SCHEMA
from modeltrace.trace.storage import TRACE_FILE, read_trace
from modeltrace.trace.tensors import SafetensorsFile


PACKAGE = Path(__file__).resolve().parents[2] / "pyserver" / "modeltrace"
UNSAFE = re.compile(
    r"\bpickle\b|\bcPickle\b|\bdill\b|torch\.load\(|\bjoblib\b|allow_pickle\s*=\s*True|weights_only\s*=\s*False"
)


def test_no_source_file_unpickles() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 20
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if UNSAFE.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []


class _RunsCode:
    """Unpickling this writes `path`: what a malicious checkpoint would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_pickled_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    from modeltrace.worker.building import build_from_file

    checkpoint = tmp_path / "checkpoint"
    build_from_file(EXAMPLE_MODELING_FILE, None, None, seed=0).model.save_pretrained(checkpoint)
    (checkpoint / "model.safetensors").unlink()
    sentinel = tmp_path / "unpickled"
    (checkpoint / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _RunsCode(sentinel)}, protocol=2))

    with pytest.raises(ModelTraceError, match="Unpickl") as caught:
        build_from_file(EXAMPLE_MODELING_FILE, None, None, seed=0, checkpoint=checkpoint)

    assert str(checkpoint) in str(caught.value)
    assert not sentinel.exists()


# --- sizes checked before allocating ---------------------------------------------------------------------------


def _trace_folder(tmp_path: Path, payload: bytes) -> Path:
    folder = tmp_path / "claims.mtrace"
    folder.mkdir()
    (folder / TRACE_FILE).write_bytes(payload)
    return folder


def test_a_trace_over_the_size_limit_is_refused_before_reading(tmp_path: Path, monkeypatch) -> None:
    folder = _trace_folder(tmp_path, msgpack.packb({"schema": SCHEMA, "model": {}, "modules": [], "lines": []}))
    monkeypatch.setattr(storage, "MAX_TRACE_BYTES", 10)
    with pytest.raises(TraceFormatError, match="over the 10-byte limit"):
        read_trace(folder)


def test_a_debugger_output_over_the_size_limit_is_refused_before_reading(tmp_path: Path, monkeypatch) -> None:
    file = tmp_path / "Model_SUMMARY.json"
    file.write_text(json.dumps({"module_path": "Model (top-level)", "children": []}))
    monkeypatch.setattr(hf_debugger, "MAX_JSON_BYTES", 10)
    with pytest.raises(TraceFormatError, match="over the 10-byte limit"):
        read_debugger_output(file)


@pytest.mark.parametrize(
    "payload",
    [
        # the modules array claims 4 billion records
        b"\x84" + msgpack.packb("schema") + msgpack.packb(SCHEMA) + msgpack.packb("modules") + b"\xdd\xff\xff\xff\xff",
        # a string claims 4 GB
        b"\x81" + msgpack.packb("schema") + b"\xdb\xff\xff\xff\xff" + b"x" * 16,
        # a binary claims 4 GB
        b"\x81" + msgpack.packb("model") + b"\xc6\xff\xff\xff\xff" + b"x" * 16,
        # a map claims 4 billion entries
        b"\x81" + msgpack.packb("model") + b"\xdf\xff\xff\xff\xff",
    ],
    ids=["array", "str", "bin", "map"],
)
def test_declared_msgpack_lengths_beyond_the_file_are_refused(tmp_path: Path, payload: bytes) -> None:
    with pytest.raises(TraceFormatError, match="claims.mtrace"):
        read_trace(_trace_folder(tmp_path, payload))


def test_a_safetensors_entry_claiming_more_than_the_file_holds_is_refused(tmp_path: Path) -> None:
    header = json.dumps({"x": {"dtype": "F32", "shape": [2**20, 2**20], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "claims.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(TraceFormatError, match="size does not match shape"):
        SafetensorsFile(path)


def _debugger_file_with_shape(tmp_path: Path, shape: str) -> Path:
    huge = {"shape": shape, "dtype": "torch.float32", "value": ["tensor([[1.0]])"], "mean": "tensor(1.)"}
    file = tmp_path / "Model_SUMMARY.json"
    file.write_text(json.dumps({"module_path": "Model (top-level)", "outputs": huge, "children": []}))
    return file


def test_a_debugger_shape_far_larger_than_its_values_is_kept_as_numbers(tmp_path: Path) -> None:
    loaded = read_debugger_output(_debugger_file_with_shape(tmp_path, "torch.Size([100000, 100000])"))
    (summary,) = loaded.trace.modules[0].outputs
    assert summary.shape == [10**5, 10**5] and summary.mean == 1.0
    assert loaded.tensors is None  # the one printed value does not make a tensor of that shape


def test_a_debugger_shape_no_tensor_could_have_is_refused(tmp_path: Path) -> None:
    file = _debugger_file_with_shape(tmp_path, "torch.Size([100000000000, 100000000000])")
    with pytest.raises(TraceFormatError, match="100000000000 is not a size"):
        read_debugger_output(file)
