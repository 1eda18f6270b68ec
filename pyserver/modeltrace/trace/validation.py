"""The schema a trace's records must meet once decoded: types, ranges, indices, shapes and dtype names.

The reader (`storage.read_trace`) decodes what the file holds; a trace is passed around (a colleague's
reference, a CI artifact), so what it holds may be damaged or hostile: a negative, fractional or 2⁴⁰ shape, a
dtype `float33`, a parent call that does not exist, a line 0 or 2⁶², a statistic `""`. Each is refused here
with one message naming the record and what is wrong, before anything (a listing, a hover, a diff) uses it.
Shared objects (the reader interns locations and summaries) are checked once.
"""

from __future__ import annotations

from typing import Any

from modeltrace.errors import TraceFormatError
from modeltrace.trace.records import LineRecord, ModuleCall, SourceLocation, TensorSummary, Trace


# NOTE: every `torch.dtype` name (`str(dtype)` without "torch."), torch 2.0 to 2.9: a name outside it is damage.
# A dtype added by a later torch goes here with the torch version that brought it.
DTYPE_NAMES = frozenset(
    {
        "float64", "float32", "float16", "bfloat16", "complex32", "complex64", "complex128",
        "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
        "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
        "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
        "int1", "int2", "int3", "int4", "int5", "int6", "int7",
        "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    }
)  # fmt: skip
# A dimension past 2³² or a tensor past 2⁵⁰ elements is no tensor any machine held.
MAX_DIMENSION = 2**32
MAX_ELEMENTS = 2**50
MAX_RANK = 64
# Lines and columns of a source file (the line past any file's end costs nothing, but 2⁶² is damage).
MAX_LINE = 2**31 - 1
# NOTE: NaN and ±inf are statistics too (a model's NaN is what a diff is for); a string is not
_NUMBER_TYPES = frozenset({float, int, type(None)})
_STATISTICS = ("mean", "std", "min", "max", "abs_max", "positive_fraction")


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file
        self.seen: set[int] = set()

    def fail(self, where: str, problem: str) -> TraceFormatError:
        return TraceFormatError(f"{self.file}: {where}: {problem}")

    def location(self, location: SourceLocation | None, where: str) -> None:
        if location is None or id(location) in self.seen:
            return
        self.seen.add(id(location))
        if not isinstance(location.file, str) or not location.file:
            raise self.fail(where, f"source file {location.file!r} is not a path")
        if not _is_count(location.line) or not 1 <= location.line <= MAX_LINE:
            raise self.fail(where, f"line {location.line!r} of {location.file} is not a line number")
        if location.column is not None and (not _is_count(location.column) or location.column > MAX_LINE):
            raise self.fail(where, f"column {location.column!r} is not a column number")

    def summary(self, summary: TensorSummary, owner: ModuleCall | str, side: str) -> None:
        """Check a summary of `owner` (a call, or the description of a line record); `side` says which."""
        # NOTE: the common case (a good summary) is a handful of type checks: a 50,000-call trace has as many
        # summaries, and loading it must stay fast. Shapes are shared by the reader: each is checked once.
        if id(summary) in self.seen:
            return
        self.seen.add(id(summary))
        shape = summary.shape
        if id(shape) not in self.seen:
            self.shape(shape, f"{_describe(owner)} {side} {summary.key!r}")
            self.seen.add(id(shape))
        if not (
            type(summary.key) is str
            and type(summary.device) is str
            and type(summary.dtype) is str
            and summary.dtype in DTYPE_NAMES
            and type(summary.nan_count) is int
            and type(summary.inf_count) is int
            and 0 <= summary.nan_count <= MAX_ELEMENTS
            and 0 <= summary.inf_count <= MAX_ELEMENTS
            and type(summary.mean) in _NUMBER_TYPES
            and type(summary.std) in _NUMBER_TYPES
            and type(summary.min) in _NUMBER_TYPES
            and type(summary.max) in _NUMBER_TYPES
            and type(summary.abs_max) in _NUMBER_TYPES
            and type(summary.positive_fraction) in _NUMBER_TYPES
            and (summary.tensor is None or type(summary.tensor) is str)
            and (summary.not_stored is None or type(summary.not_stored) is str)
            and (summary.placement is None or type(summary.placement) is dict)
        ):
            self.summary_fault(summary, f"{_describe(owner)} {side} {summary.key!r}")

    def shape(self, shape: Any, where: str) -> None:
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            raise self.fail(where, f"shape {shape!r} is not a list of at most {MAX_RANK} sizes")
        elements = 1
        for size in shape:
            if not _is_count(size) or size >= MAX_DIMENSION:
                raise self.fail(where, f"shape {shape!r}: {size!r} is not a size (0 to 2^32)")
            elements *= size
        if elements > MAX_ELEMENTS:
            raise self.fail(where, f"shape {shape!r} has more elements than any tensor (2^50)")

    def summary_fault(self, summary: TensorSummary, where: str) -> None:
        """Raise the message for the first fault of a summary the fast check refused."""
        if not isinstance(summary.key, str):
            raise self.fail(where, "the tensor's key is not a string")
        if not isinstance(summary.dtype, str) or summary.dtype not in DTYPE_NAMES:
            raise self.fail(where, f"unknown dtype {summary.dtype!r}")
        if not isinstance(summary.device, str):
            raise self.fail(where, f"device {summary.device!r} is not a string")
        for name in _STATISTICS:
            value = getattr(summary, name)
            # NOTE: NaN and ±inf are statistics too (a model's NaN is what a diff is for); a string is not
            if value is not None and type(value) not in (float, int):
                raise self.fail(where, f"statistic {name} is {value!r}, not a number")
        for name in ("nan_count", "inf_count"):
            if not _is_count(getattr(summary, name)) or getattr(summary, name) > MAX_ELEMENTS:
                raise self.fail(where, f"{name} {getattr(summary, name)!r} is not a count")
        for name in ("tensor", "not_stored"):
            if getattr(summary, name) is not None and not isinstance(getattr(summary, name), str):
                raise self.fail(where, f"{name} {getattr(summary, name)!r} is not a string")
        raise self.fail(where, "placement is not a map")

    def module(self, record: ModuleCall, position: int, count: int) -> None:
        parent, finish_order, call_index, call_site = (
            record.parent,
            record.finish_order,
            record.call_index,
            record.call_site,
        )
        if not (
            type(record.index) is int
            and record.index == position
            and type(record.path) is str
            and type(record.class_name) is str
            and type(parent) is int
            and -1 <= parent < position
            and type(finish_order) is int
            and -1 <= finish_order < count
            and type(call_index) is int
            and 0 <= call_index < count
            and (call_site is None or type(call_site) is int)
            and (record.device is None or type(record.device) is str)
            and type(record.inputs) is list
            and type(record.outputs) is list
        ):
            self.module_fault(record, position, count)
        seen = self.seen
        for location in (record.defined_at, record.called_at):
            if location is not None and id(location) not in seen:
                self.location(location, f"module call {position} ({record.path})")
        for side, summaries in (("input", record.inputs), ("output", record.outputs)):
            for summary in summaries:
                if id(summary) not in seen:
                    self.summary(summary, record, side)

    def module_fault(self, record: ModuleCall, position: int, count: int) -> None:
        """Raise the message for the first fault of a call the fast check refused."""
        where = f"module call {position}"
        if record.index != position:
            raise self.fail(where, f"index {record.index!r} (calls are numbered in order)")
        if not isinstance(record.path, str) or not isinstance(record.class_name, str):
            raise self.fail(where, "path and class must be strings")
        where = f"module call {position} ({record.path})"
        # NOTE: calls are stored in the order they started: the enclosing call started before.
        if not _is_int(record.parent) or not -1 <= record.parent < position:
            raise self.fail(where, f"parent {record.parent!r} is not an earlier call")
        if not _is_int(record.finish_order) or not -1 <= record.finish_order < count:
            raise self.fail(where, f"finish order {record.finish_order!r} is not one of the {count} calls")
        if not _is_count(record.call_index) or record.call_index >= count:
            raise self.fail(where, f"call index {record.call_index!r} is not one of the {count} calls")
        if record.call_site is not None and not _is_int(record.call_site):
            raise self.fail(where, f"call site {record.call_site!r} is not a number")
        if record.device is not None and not isinstance(record.device, str):
            raise self.fail(where, f"device {record.device!r} is not a string")
        raise self.fail(where, "inputs and outputs must be lists")

    def line(self, record: LineRecord, position: int, calls: int) -> None:
        where = f"line record {position}"
        if not isinstance(record.name, str):
            raise self.fail(where, f"variable name {record.name!r} is not a string")
        self.location(SourceLocation(record.file, record.line), where)
        if not _is_int(record.module_call) or not -1 <= record.module_call < calls:
            raise self.fail(where, f"module call {record.module_call!r} is not one of the {calls} calls")
        if not _is_count(record.call_index):
            raise self.fail(where, f"call index {record.call_index!r} is not a count")
        self.summary(record.tensor, where, f"({record.name})")


def _describe(owner: ModuleCall | str) -> str:
    return f"module call {owner.index} ({owner.path})" if isinstance(owner, ModuleCall) else owner


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


# NOTE: the header's deepest map in a real trace is 4 levels down (a tensor-parallel placement); a document nested
# hundreds deep is damage, and would exhaust the recursion of whatever walks it later (`show --format json`).
MAX_HEADER_DEPTH = 32


def validate_header(header: dict[str, Any], file: str) -> None:
    """Refuse a header (the document but its record tables) that is not plain JSON data: only maps with string
    keys, arrays, strings, numbers, booleans and null, at most `MAX_HEADER_DEPTH` deep (walked without
    recursion); bytes (`show --format json` cannot print them) or a nesting near msgpack's limit are damage."""
    pending: list[tuple[Any, int, str]] = [(value, 1, str(key)) for key, value in header.items()]
    while pending:
        value, depth, where = pending.pop()
        if depth > MAX_HEADER_DEPTH:
            raise TraceFormatError(f"{file}: header field {where}: nested more than {MAX_HEADER_DEPTH} deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TraceFormatError(f"{file}: header field {where}: key {key!r} is not a string")
                pending.append((item, depth + 1, where))
        elif isinstance(value, list):
            pending.extend((item, depth + 1, where) for item in value)
        elif value is not None and not isinstance(value, (str, int, float)):
            raise TraceFormatError(
                f"{file}: header field {where}: a {type(value).__name__} value, not JSON data (string, number, ...)"
            )


def validate_trace(trace: Trace, file: str) -> None:
    """Raise a `TraceFormatError` naming `file`, the record and the fault when `trace` breaks the schema."""
    checker = _Checker(file)
    if not isinstance(trace.model, dict):
        raise checker.fail("header", "model is not a map")
    for name in ("class", "file"):
        value = trace.model.get(name)
        if value is not None and not isinstance(value, str):
            raise checker.fail("header", f"model {name} {value!r} is not a string")
    hashes = trace.model.get("source_hashes")
    if hashes is not None and not (
        isinstance(hashes, dict)
        # NOTE: None for a file that could not be read when captured (a notebook cell's "<ipython-input-…>")
        and all(isinstance(key, str) and (value is None or isinstance(value, str)) for key, value in hashes.items())
    ):
        raise checker.fail("header", "source_hashes is not a map of paths to hashes")
    count = len(trace.modules)
    for position, record in enumerate(trace.modules):
        checker.module(record, position, count)
    for position, record in enumerate(trace.lines):
        checker.line(record, position, count)
