"""The messages between the server (or the CLI) and the worker: frozen dataclasses, one codec, defaults once.

A frame that is not one of the messages (an unknown type or key, a value of the wrong type) is a
`WorkerProtocolError` naming the frame and the key; a request the worker cannot read is answered with that
error (cause `protocol`), and the worker goes on serving.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from modeltrace.errors import TraceFailed, format_worker_error
from modeltrace.worker.client import WorkerClient
from modeltrace.worker.messages import (
    DEFAULT_TIMEOUT_SECONDS,
    DTYPE_NAMES,
    REPLIES,
    REQUESTS,
    Cancel,
    Progress,
    ReplayAnswer,
    ReplayedModule,
    ReplaySpec,
    ReplayTarget,
    TraceRequest,
    TraceResult,
    WorkerError,
    WorkerProtocolError,
    decode_frame,
)
from modeltrace.worker.protocol import encode_frame

from conftest import EXAMPLE_MODELING_FILE


REPLAY_REQUEST = TraceRequest(
    file="/models/modeling_port.py",
    model="PortModel",
    seed=3,
    attention="sdpa",
    timeout=30.0,
    replay=ReplaySpec(
        targets=(
            ReplayTarget(
                name="m0",
                path="layers.0.mlp",
                call_index=1,
                inputs={"hidden_states": "m0/hidden_states"},
                expect={"mask": (0.5, 0.25)},
            ),
        ),
        out="/tmp/replay-out",
        inputs_file="/tmp/replay_inputs.safetensors",
        candidate_trace="/traces/port.mtrace",
    ),
)


def _over_the_wire(frame: dict) -> dict:
    """A frame as the other side reads it: msgpack turns tuples into lists."""
    return msgpack.unpackb(msgpack.packb(frame, use_bin_type=True), raw=False)


@pytest.mark.parametrize(
    "message",
    [
        TraceRequest(file="/models/modeling_tiny.py", out="/traces/tiny.mtrace"),
        TraceRequest(
            file="/models/modeling_tiny.py",
            out="/traces/tiny.mtrace",
            lines=True,
            follow=("/models/rope_utils.py",),
            attention="sdpa",
            generate=4,
            device_map="auto",
            max_tensor_mb=0.5,
        ),
        REPLAY_REQUEST,
        Cancel(),
        Progress(message="building the model from modeling_tiny.py"),
        TraceResult(trace="/traces/tiny.mtrace", model_class="TinyModel", modules=31, seconds=1.5),
        ReplayAnswer(
            replay={
                "m0": ReplayedModule(ran=True, keys=("",), live={"": (0.1, 1.0)}, replay_seconds=0.01, direct=True)
            },
            outputs="/tmp/replay-out/replay_outputs.safetensors",
            model_class="PortModel",
            seconds=0.5,
            build_seconds=0.0,
            kept=True,
        ),
        WorkerError(
            kind="ValueError",
            cause="forward",
            message="boom",
            file="/models/modeling_tiny.py",
            line=12,
            model_class="TinyModel",
        ),
    ],
    ids=lambda message: type(message).__name__,
)
def test_every_message_survives_the_round_trip(message: object) -> None:
    frame = _over_the_wire(message.to_frame())
    assert frame["type"] == message.TYPE
    assert decode_frame(frame) == message


def test_request_defaults_are_defined_once() -> None:
    """The CLI's `--timeout`/`--dtype`/`--attention` defaults and the editor's settings are the messages'."""
    from modeltrace.cli import build_parser
    from modeltrace.lsp.settings import Settings

    request = TraceRequest(file="f.py")
    arguments = build_parser().parse_args(["trace", "f.py"])
    assert request.timeout == DEFAULT_TIMEOUT_SECONDS == arguments.timeout == Settings().timeout == 120.0
    assert request.dtype == arguments.dtype == Settings().dtype == DTYPE_NAMES[0] == "float32"
    assert request.attention == arguments.attention == Settings().attention == "eager"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.model = "Other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"colour": "red"}, "a 'trace' frame has an unknown key 'colour'"),
        ({"seed": "0"}, "a 'trace' frame, key 'seed' should be int, not str '0'"),
        ({"timeout": True}, "a 'trace' frame, key 'timeout' should be float, not bool True"),
        ({"follow": "helpers.py"}, "a 'trace' frame, key 'follow' should be a tuple, not str 'helpers.py'"),
        ({"file": None}, "a 'trace' frame, key 'file' should be str, not NoneType None"),
        (
            {"replay": {**REPLAY_REQUEST.to_frame()["replay"], "targets": [{"name": "m0", "path": "x"}]}},
            "a 'trace' frame, key 'replay', key 'targets'[0] lacks the key 'call_index'",
        ),
    ],
    ids=["unknown key", "int", "bool is no float", "tuple", "required str", "nested"],
)
def test_a_frame_that_does_not_fit_names_its_key(change: dict, expected: str) -> None:
    frame = {**_over_the_wire(REPLAY_REQUEST.to_frame()), **change}
    with pytest.raises(WorkerProtocolError) as error:
        TraceRequest.from_frame(frame)
    assert expected in str(error.value)


def test_unknown_types_and_causes_are_refused_by_name() -> None:
    with pytest.raises(WorkerProtocolError, match="unknown type 'traceTree'"):
        decode_frame({"type": "traceTree"}, REPLIES)
    with pytest.raises(WorkerProtocolError, match="unknown type 'trace'"):
        decode_frame(TraceRequest(file="f.py").to_frame(), REPLIES)  # a request is no reply
    with pytest.raises(WorkerProtocolError, match="key 'cause' should be 'start' or 'import'"):
        decode_frame({"type": "error", "kind": "ValueError", "cause": "bad luck", "message": "boom"})
    assert {message.TYPE for message in REQUESTS}.isdisjoint(message.TYPE for message in REPLIES)


def test_the_user_sees_the_same_line_whatever_the_cause() -> None:
    """The one-line message is made from the error's fields: bad input as it is, a model error with its class."""
    located = WorkerError(kind="ValueError", cause="forward", message="boom\nmore", file="/m.py", line=3)
    assert format_worker_error(located) == "ValueError: boom (/m.py:3)"
    in_class = dataclasses.replace(located, model_class="TinyModel", advice="pass --recipe")
    assert format_worker_error(in_class) == "TinyModel.forward raised ValueError: boom; pass --recipe (/m.py:3)"
    bad_input = WorkerError(kind="ModelTraceError", cause="input", message="--dtype 'int8': choose one of float32")
    assert format_worker_error(bad_input) == "--dtype 'int8': choose one of float32"


def test_the_server_side_of_the_messages_imports_no_torch() -> None:
    code = (
        "import sys; import modeltrace.worker.messages, modeltrace.worker.client, modeltrace.lsp.commands; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_request_the_worker_cannot_read_is_answered_and_the_worker_goes_on(
    worker: WorkerClient, tmp_path: Path
) -> None:
    """A client of another version: the worker answers with a protocol error naming the key, then still traces."""
    worker.start()
    frame = {**TraceRequest(file=str(EXAMPLE_MODELING_FILE), out=str(tmp_path / "x.mtrace")).to_frame(), "colour": 1}
    assert worker._process is not None and worker._process.stdin is not None
    worker._process.stdin.write(encode_frame(frame))
    worker._process.stdin.flush()
    answer = worker._read(60)
    assert isinstance(answer, WorkerError) and answer.cause == "protocol"
    assert "unknown key 'colour'" in answer.message
    result = worker.trace(TraceRequest(file=str(EXAMPLE_MODELING_FILE), out=str(tmp_path / "after.mtrace")))
    assert result.model_class == "TinyLlamaModel" and result.modules > 20


def test_a_build_failure_says_so(worker: WorkerClient, tmp_path: Path) -> None:
    """An exception while the model is built is cause `build`, without a class (none ran yet)."""
    recipe = tmp_path / "recipe_broken.py"
    recipe.write_text(
        "def build_model():\n    raise RuntimeError('no weights here')\n\n\ndef build_inputs(model):\n    return ()\n"
    )
    with pytest.raises(TraceFailed) as failure:
        worker.trace(TraceRequest(file=str(recipe), recipe=str(recipe), out=str(tmp_path / "x.mtrace"), timeout=60))
    error = failure.value.error
    assert (error.cause, error.kind, error.model_class) == ("build", "RuntimeError", None)
    assert error.file == str(recipe.resolve()) and error.line == 2
