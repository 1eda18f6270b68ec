"""The messages that cross the process boundary between the CLI or the language server and the trace worker.

The only shapes the two sides share (esbonio's `sphinx_agent/types` is the model): frozen dataclasses, no torch,
imported by the server, the CLI, the diff's replay and the worker alike. Each is a msgpack frame (a map with a
`type`, `worker/protocol.py`) through `to_frame()` and back through `decode_frame()` / `Message.from_frame()`,
the one place where a frame is checked: an unknown `type`, an unknown key, a missing key or a value of the wrong
type is a `WorkerProtocolError` naming the frame and the key. Defaults are defined here and nowhere else.

Requests: `TraceRequest` (a replay of a diff's suspect modules is a `TraceRequest` carrying a `ReplaySpec`),
`Cancel`, `Shutdown`, `Ping`. Replies: `Ready`, `Started`, `Progress`, `TraceResult`, `ReplayAnswer`,
`WorkerError`, `Pong`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from modeltrace.worker.protocol import (
    DEFAULT_KEEP_CALLS_MB,
    DEFAULT_MAX_TENSOR_MB,
    DEFAULT_MAX_TRACE_MB,
    DEFAULT_TENSOR_MEMORY_MB,
    ProtocolError,
)


# NOTE: the CLI's `--timeout`, the editor's `modelTrace.timeout` and the worker's own limit: one number.
DEFAULT_TIMEOUT_SECONDS = 120.0
DEFAULT_DTYPE = "float32"
# The floating-point dtypes a model can be traced in (`--dtype`, `modelTrace.dtype`); the worker maps each to
# its torch dtype (`worker/job.py`), the server only passes the name on.
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64")
# NOTE: the readable reference code, and the one implementation that returns attention weights (DESIGN: Capture).
DEFAULT_ATTENTION = "eager"
# What `--attention` / `modelTrace.attention` may name: transformers' `attn_implementation` values that need no
# extra package.
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")

# Why a trace failed, as data: the CLI and the editor decide on it, never on a message's text.
FailureCause = Literal[
    "start",  # the worker process did not start (a wrong interpreter, a crash while importing)
    "import",  # the worker started but cannot import torch / transformers
    "timeout",  # the trace ran past its timeout (or the worker stopped answering) and was stopped
    "cancelled",  # the user cancelled it
    "crash",  # the worker process died from a signal (segfault, out of memory) or broke off its reply
    "exit",  # the model code ended the process (os._exit, sys.exit)
    "protocol",  # a frame that is not one of these messages (an unknown type or key, a wrong type)
    "input",  # bad input: a file, class, config, option or recipe that cannot be used (a ModelTraceError)
    "build",  # the model code raised while the model or its inputs were built
    "forward",  # the model code raised while it ran (forward, generate, backward, a replay)
]


class WorkerProtocolError(ProtocolError):
    """A frame that is not one of this module's messages; the message names the frame and the key at fault."""


_Message = TypeVar("_Message", bound="Message")


class Message:
    """Base of every frame: `to_frame()` for the wire, `from_frame()` to check and read one back."""

    TYPE: ClassVar[str]

    def to_frame(self) -> dict[str, Any]:
        """The msgpack map for this message (nested messages as maps, tuples as lists)."""
        return {"type": self.TYPE, **_fields_to_plain(self)}

    @classmethod
    def from_frame(cls: type[_Message], frame: Any) -> _Message:
        """The message a frame holds; `WorkerProtocolError` naming the key when it does not fit."""
        if not isinstance(frame, dict):
            raise WorkerProtocolError(f"a {cls.TYPE!r} frame must be a map, not {type(frame).__name__}")
        if frame.get("type") != cls.TYPE:
            raise WorkerProtocolError(f"expected a {cls.TYPE!r} frame, got one of type {frame.get('type')!r}")
        return _from_plain(cls, {key: value for key, value in frame.items() if key != "type"}, f"a {cls.TYPE!r} frame")


# --- requests --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayTarget:
    """One suspect module call of a replay: its candidate path and call index, which of its inputs come from the
    reference (input key -> tensor name in the replay's inputs file), and the statistics (`[mean, std]`) of the
    inputs it keeps, checked against a kept call's arguments before they are reused."""

    name: str
    path: str
    call_index: int
    inputs: dict[str, str] = field(default_factory=dict)
    expect: dict[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplaySpec:
    """What a replay re-runs (`diff/replay.py` asks, `worker/replay.py` answers): the reference's input tensors
    (a safetensors file), the targets, where the outputs go, and the candidate trace (whose kept model serves it)."""

    targets: tuple[ReplayTarget, ...]
    out: str
    inputs_file: str | None = None
    candidate_trace: str | None = None
    # torch's threads for the replayed calls (the diff still runs alongside them on the other cores); None: as is
    threads: int | None = None


@dataclass(frozen=True)
class TraceRequest(Message):
    """A `trace` frame: what to build, how to run it and where the trace goes (see `worker/job.py`).

    Built by the CLI (`cli.py`), the editor (`lsp/commands.py`), the diff's replay (`diff/replay.py`) and scripts;
    read, never changed, by the worker: a step that decides something (the class `--generate` traces) makes a
    new request with `dataclasses.replace`.
    """

    TYPE: ClassVar[str] = "trace"

    file: str
    # The trace folder to write; a replay writes none (its outputs go to `replay.out`).
    out: str | None = None
    model: str | None = None
    recipe: str | None = None
    config: str | None = None
    checkpoint: str | None = None
    shape_only: bool = False
    full_tensors: bool = False
    max_tensor_mb: float = DEFAULT_MAX_TENSOR_MB
    max_trace_mb: float = DEFAULT_MAX_TRACE_MB
    tensor_memory_mb: float = DEFAULT_TENSOR_MEMORY_MB
    # With full tensors: the model's parameters go to the shared parameter store (`trace/parameter_store.py`),
    # once per content; False leaves them out.
    parameters: bool = True
    keep_calls_mb: float = DEFAULT_KEEP_CALLS_MB
    # Leave the child alive after answering, holding the model for the diff's replay (`worker/zygote.py`).
    keep_for_replay: bool = False
    # Line capture of `file`, and of these other files (helpers the model calls into) as well.
    lines: bool = False
    follow: tuple[str, ...] = ()
    attention: str = DEFAULT_ATTENTION
    device: str = "cpu"
    dtype: str = DEFAULT_DTYPE
    seed: int = 0
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    # Greedy generation of this many decode steps (0: a forward), or a forward and a backward pass.
    generate: int = 0
    backward: bool = False
    # accelerate's device map (`auto` or JSON), or transformers' tensor-parallel plan (a rank of `--nproc`).
    device_map: str | None = None
    tp_plan: str | None = None
    replay: ReplaySpec | None = None


@dataclass(frozen=True)
class Cancel(Message):
    """Stop the running trace (a no-op when idle)."""

    TYPE: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class Shutdown(Message):
    """End the worker (and a child kept for replay)."""

    TYPE: ClassVar[str] = "shutdown"


@dataclass(frozen=True)
class Ping(Message):
    TYPE: ClassVar[str] = "ping"


# --- replies ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready(Message):
    """The worker has torch imported and waits for requests."""

    TYPE: ClassVar[str] = "ready"

    pid: int


@dataclass(frozen=True)
class Started(Message):
    """A trace child runs the request (its process group is killed if the worker itself is lost)."""

    TYPE: ClassVar[str] = "started"

    pid: int


@dataclass(frozen=True)
class Progress(Message):
    TYPE: ClassVar[str] = "progress"

    message: str


@dataclass(frozen=True)
class Pong(Message):
    TYPE: ClassVar[str] = "pong"


@dataclass(frozen=True)
class TraceResult(Message):
    """A trace written: its folder, the class that ran, how many module calls, and how long it took."""

    TYPE: ClassVar[str] = "result"

    trace: str
    model_class: str
    modules: int
    seconds: float
    # The child stays alive holding the model, for the diff's replay (`TraceRequest.keep_for_replay`).
    kept_for_replay: bool = False
    # The source files the trace's records name and its module classes come from: the zygote reads them ahead for
    # the next trace (`zygote._warm`).
    source_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplayedModule:
    """What the replay of one target gave: whether it ran (its output keys), or why not; the statistics
    (`[mean, std]`) of the live call's outputs; its timings; whether it was called directly on kept arguments."""

    ran: bool = False
    error: str | None = None
    keys: tuple[str, ...] = ()
    live: dict[str, tuple[float, ...]] = field(default_factory=dict)
    replay_seconds: float | None = None
    live_seconds: float | None = None
    direct: bool = False


@dataclass(frozen=True)
class ReplayAnswer(Message):
    """The answer to a replay: one `ReplayedModule` per target name, and the safetensors file of their outputs."""

    TYPE: ClassVar[str] = "replayed"

    replay: dict[str, ReplayedModule]
    outputs: str
    model_class: str
    seconds: float
    build_seconds: float
    # Served by the model kept from the candidate's own trace (no rebuild).
    kept: bool = False
    forward_error: str | None = None


@dataclass(frozen=True)
class CodeFrame:
    """A frame of a failure's traceback in the user's code: the file, the line it was at, its function."""

    file: str
    line: int
    function: str


@dataclass(frozen=True)
class RecipeArgument:
    """One argument of a recipe draft: its name, a Python expression for its value, and whether ModelTrace chose
    that value (`guessed`: from its name, annotation or default) or could not (a placeholder the user fills in,
    `note` says what is known about it)."""

    name: str
    expression: str
    guessed: bool = True
    note: str = ""


@dataclass(frozen=True)
class RecipeDraft:
    """What the worker tried for a class it could not trace unaided, for the editor's "Create recipe…": the class
    and the file defining it, the config it built (`config_class` and the fields it set, as Python expressions),
    the constructor arguments (`arguments`, each guessed or not), the inputs it synthesised (`inputs`), and why
    the attempt failed (`reason`)."""

    model_class: str
    file: str
    module: str = ""  # the dotted name the worker imported the file under (`modeling_tiny`, `pkg.modeling_x`)
    reason: str = ""
    config_class: str | None = None
    config_module: str | None = None  # where the config class is imported from, when not the model file
    config: tuple[RecipeArgument, ...] = ()
    arguments: tuple[RecipeArgument, ...] = ()
    inputs: tuple[RecipeArgument, ...] = ()


@dataclass(frozen=True)
class WorkerError(Message):
    """Why a trace failed: `cause` (what the CLI and the editor decide on), `kind` (the exception type, or the
    worker's own name for what happened: `TimeoutError`, `Cancelled`, `WorkerCrashed`...), the message, and
    the place in the user's code (`file`, `line`) when there is one, and `callers`: the frames of the user's code
    that led there, nearest caller first (the line that passed the arguments the error is about).

    `model_class` names the class that was being run, `advice` what to provide instead when the unaided build
    settled for a model and inputs that never ran; `detail` is the underlying reason on its own (the import
    error, the worker's last line of output), for a client's own wording. `recipe` is what the worker tried when
    only a recipe can build the class (the editor's "Create recipe…" writes one from it).
    """

    TYPE: ClassVar[str] = "error"

    kind: str
    cause: FailureCause
    message: str
    file: str | None = None
    line: int | None = None
    model_class: str | None = None
    advice: str | None = None
    detail: str | None = None
    traceback: str | None = None
    signal: str | None = None
    exit_code: int | None = None
    callers: tuple[CodeFrame, ...] = ()
    recipe: RecipeDraft | None = None


REQUESTS: tuple[type[Message], ...] = (TraceRequest, Cancel, Shutdown, Ping)
REPLIES: tuple[type[Message], ...] = (Ready, Started, Progress, Pong, TraceResult, ReplayAnswer, WorkerError)
# The replies that end a request.
ANSWERS: tuple[type[Message], ...] = (TraceResult, ReplayAnswer, WorkerError)
ANSWER_TYPES = frozenset(message.TYPE for message in ANSWERS)
_BY_TYPE: dict[str, type[Message]] = {message.TYPE: message for message in (*REQUESTS, *REPLIES)}


def decode_frame(frame: dict[str, Any], expected: tuple[type[Message], ...] = (*REQUESTS, *REPLIES)) -> Message:
    """The message of a frame among `expected`; `WorkerProtocolError` for any other type, or a bad key."""
    frame_type = frame.get("type") if isinstance(frame, dict) else None
    message_class = _BY_TYPE.get(frame_type) if isinstance(frame_type, str) else None
    if message_class is None or message_class not in expected:
        names = ", ".join(message.TYPE for message in expected)
        raise WorkerProtocolError(
            f"a frame of unknown type {frame_type!r} (expected {names}): is the other side the same ModelTrace "
            "version as this one?"
        )
    return message_class.from_frame(frame)


# --- the one codec ---------------------------------------------------------------------------------------------


def _fields_to_plain(message: Any) -> dict[str, Any]:
    return {item.name: _to_plain(getattr(message, item.name)) for item in dataclasses.fields(message)}


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields_to_plain(value)
    if isinstance(value, tuple | list):
        return [_to_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_plain(item) for key, item in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _from_plain(cls: type, values: Any, where: str) -> Any:
    if not isinstance(values, dict):
        raise WorkerProtocolError(f"{where}: expected a map, not {type(values).__name__}")
    known = {item.name: item for item in dataclasses.fields(cls) if item.init}
    unknown = sorted(str(key) for key in values if key not in known)
    if unknown:
        raise WorkerProtocolError(
            f"{where} has an unknown key {unknown[0]!r} (expected some of: {', '.join(known)}): "
            "is the other side the same ModelTrace version as this one?"
        )
    missing = [
        name
        for name, item in known.items()
        if name not in values and item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise WorkerProtocolError(f"{where} lacks the key {missing[0]!r}")
    hints = _hints(cls)
    return cls(**{name: _check(value, hints[name], f"{where}, key {name!r}") for name, value in values.items()})


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " or ".join(repr(value) for value in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return "nil"
    if origin is not None:
        return f"a {origin.__name__}"
    return getattr(hint, "__name__", str(hint))


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` as the field's type says (lists become tuples, maps messages), or `WorkerProtocolError`."""
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in arguments:
            return None
        arms = [arm for arm in arguments if arm is not type(None)]
        if len(arms) == 1:  # NOTE: an optional field: the error of its one type names the key inside it
            return _check(value, arms[0], where)
        for arm in arms:
            try:
                return _check(value, arm, where)
            except WorkerProtocolError:
                continue
    elif origin is Literal:
        if value in arguments and isinstance(value, str):
            return value
    elif hint is type(None):
        if value is None:
            return None
    elif dataclasses.is_dataclass(hint):
        return _from_plain(hint, value, where)
    elif origin is tuple:
        if isinstance(value, list | tuple):
            return tuple(_check(item, arguments[0], f"{where}[{index}]") for index, item in enumerate(value))
    elif origin is dict:
        if isinstance(value, dict):
            return {
                _check(key, arguments[0], f"{where} (a key)"): _check(item, arguments[1], f"{where}[{key!r}]")
                for key, item in value.items()
            }
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"{where}: no rule for the type {hint!r}")  # a field type this codec does not know
    raise WorkerProtocolError(f"{where} should be {_describe(hint)}, not {type(value).__name__} {value!r:.80}")
