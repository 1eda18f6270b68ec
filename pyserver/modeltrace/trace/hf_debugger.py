"""Interop with transformers' `model_addition_debugger_context`: read its output as a trace, write a trace in it.

The debugger writes `{Class}_debug_tree_SUMMARY.json` and `{Class}_debug_tree_FULL_TENSORS.json`: a call tree
of nodes `{"module_path": "Class.layers.0.mlp", "inputs": {"args": [...], "kwargs": {...}}, "outputs": ...,
"children": [...]}` where each tensor is `{"shape": "torch.Size([1, 7, 64])", "dtype": "torch.float32",
"value": ..., "mean": "tensor(-4.1929e-02)", "std", "min", "max"}`. `value` is the printed tensor as a list
of lines (`use_repr=True`; tensors over 1,000 elements are printed with `...`, so only their statistics are
usable) or the relative path of a safetensors file holding the tensor as `data` (`use_repr=False`). Outputs
are kept on leaf modules only, and with `do_prune_layers=True` only the first and last of a run of numbered
layers remain.

Reading turns the tree into `ModuleCall` records (paths without the leading class name, call indices for
repeated calls, finish order = post-order), with inputs keyed `args.N` / keyword name and outputs keyed like
ours (`""`, `"0"`, `"last_hidden_state"`). Nothing is unpickled, sizes are checked before reading, and any
malformed input raises `TraceFormatError` naming the file. No torch import: the language server reads these.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from modeltrace.errors import TraceFormatError
from modeltrace.trace.validation import validate_trace
from modeltrace.trace.records import ModuleCall, TensorSummary, Trace
from modeltrace.trace.tensors import (
    DebuggerTensors,
    LoadedTrace,
    TensorStore,
    file_size_checked,
    write_safetensors,
)


SUMMARY_SUFFIX = "_SUMMARY.json"
FULL_SUFFIX = "_FULL_TENSORS.json"
DEBUG_TREE = "_debug_tree"
MAX_JSON_BYTES = int(os.environ.get("MODELTRACE_MAX_TRACE_BYTES", 2 * 1024**3))
# NOTE: the debugger walks nested inputs without a bound; a deeper structure is not a model's inputs.
_MAX_NESTING = 16
_FLOAT_DTYPES = {"float16", "float32", "bfloat16", "float64"}
_NUMPY_DTYPES = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float32,
    "bfloat16": np.float32,
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
_SIZE_RE = re.compile(r"^torch\.Size\(\[([0-9,\s]*)\]\)$")
_NUMBER_RE = re.compile(r"[-+]?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|True|False")
_DEVICE_RE = re.compile(r"device='([^']*)'")


def is_debugger_file(path: Path) -> bool:
    return path.name.endswith(SUMMARY_SUFFIX) or path.name.endswith(FULL_SUFFIX)


def find_debugger_json(path: Path) -> Path:
    """The JSON to read for `path` (a debugger file or a folder holding one): FULL_TENSORS when present."""
    if path.is_dir():
        fulls = sorted(path.glob(f"*{FULL_SUFFIX}"))
        summaries = sorted(path.glob(f"*{SUMMARY_SUFFIX}"))
        found = fulls or summaries
        if not found:
            raise TraceFormatError(
                f"{path}: neither a trace folder nor a transformers debugger output (no trace.msgpack, "
                f"*{SUMMARY_SUFFIX} or *{FULL_SUFFIX} inside)"
            )
        if len(found) > 1:
            names = ", ".join(item.name for item in found)
            raise TraceFormatError(f"{path}: holds several debugger outputs ({names}); name one of the files")
        return found[0]
    if path.name.endswith(SUMMARY_SUFFIX):
        full = path.with_name(path.name[: -len(SUMMARY_SUFFIX)] + FULL_SUFFIX)
        return full if full.is_file() else path
    return path


# ---------------------------------------------------------------------------------------------------- reading


def parse_scalar(text: Any) -> tuple[float | None, float, float]:
    """A statistic printed by torch (`"tensor(-4.1929e-02, device='cuda:0')"`) as (value, abs, rel rounding)."""
    if not isinstance(text, str):
        return (float(text), 0.0, 0.0) if isinstance(text, (int, float)) else (None, 0.0, 0.0)
    start = text.find("tensor(")
    body = text[start + 7 :] if start >= 0 else text
    match = _NUMBER_RE.match(body.strip())
    if match is None:
        return None, 0.0, 0.0
    token = match.group(0)
    if token in ("True", "False"):
        return float(token == "True"), 0.0, 0.0
    value = float(token)
    absolute, relative = _rounding(token)
    return value, absolute, relative


def _rounding(token: str) -> tuple[float, float]:
    """Half a unit in the last printed digit of `token`: relative for `1.2345e-01`, absolute for `0.1235`."""
    mantissa, _, exponent = token.lower().partition("e")
    if "." not in mantissa or mantissa.endswith("."):
        # `7`, `1.`: torch prints integral values of a tensor whose values are all integral this way: exact
        return (0.0, 0.0) if not exponent else (0.0, 0.5)
    digits = len(mantissa.split(".", 1)[1])
    half_unit = 0.5 * 10.0**-digits
    return (0.0, half_unit) if exponent else (half_unit, 0.0)


def parse_tensor_repr(lines: Any, shape: list[int], dtype: str) -> tuple[np.ndarray, float, float] | None:
    """Values of a printed tensor (`tensor([[ 2.2519e-02, ...]])` as a list of lines), with their rounding;
    None when the print is summarised (`...`) or cannot be read as `shape` values."""
    if isinstance(lines, list):
        if not all(isinstance(line, str) for line in lines):
            return None
        text = "\n".join(lines)
    elif isinstance(lines, str):
        text = lines
    else:
        return None
    start = text.find("tensor(")
    if start < 0:
        return None
    body = text[start + 7 :]
    if body.startswith("["):
        depth = 0
        end = -1
        for position, character in enumerate(body):
            if character == "[":
                depth += 1
            elif character == "]":
                depth -= 1
                if depth == 0:
                    end = position
                    break
        if end < 0:
            return None
        data = body[: end + 1]
    else:
        cut = min((index for index in (body.find(","), body.find(")")) if index >= 0), default=-1)
        if cut < 0:
            return None
        data = body[:cut]
    if "..." in data:
        return None
    tokens = _NUMBER_RE.findall(data)
    if len(tokens) != math.prod(shape):
        return None
    numpy_dtype = _NUMPY_DTYPES.get(dtype)
    if numpy_dtype is None:
        return None
    absolute = relative = 0.0
    if dtype == "bool":
        values = np.array([token == "True" for token in tokens], dtype=np.bool_)
    elif dtype in _FLOAT_DTYPES:
        values = np.array(tokens, dtype=np.float64).astype(numpy_dtype)
        for token in tokens:
            if token[-1].isdigit():
                absolute, relative = _rounding(token)
                break
        # NOTE: torch prints every element with the same number of digits; the first finite one says how many.
    else:
        try:
            values = np.array([int(float(token)) for token in tokens], dtype=numpy_dtype)
        except (ValueError, OverflowError):
            return None
    return values.reshape(shape), absolute, relative


def _parse_shape(text: Any, file: Path, where: str) -> list[int]:
    if isinstance(text, list) and all(isinstance(size, int) for size in text):
        return list(text)
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise TraceFormatError(f"{file}: {where}: unreadable tensor shape {text!r}")
    inside = match.group(1).strip()
    return [int(size) for size in inside.split(",") if size.strip()] if inside else []


def _is_tensor_entry(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("shape"), str) and isinstance(value.get("dtype"), str)


class _Reader:
    """One debugger JSON file turned into records, summaries and a tensor store."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.base = file.parent.resolve()
        self.store = DebuggerTensors()
        self.records: list[ModuleCall] = []
        self.stat_absolute = 0.0
        self.stat_relative = 0.0
        self.file_users: dict[str, list[str]] = {}
        self.use_repr: bool | None = None
        self.missing_files: list[str] = []

    def read(self) -> LoadedTrace:
        file_size_checked(self.file, MAX_JSON_BYTES, "transformers debugger output")
        try:
            with open(self.file, "rb") as handle:
                tree = json.load(handle)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise TraceFormatError(f"{self.file}: corrupt or truncated debugger JSON ({error})") from None
        except RecursionError:
            raise TraceFormatError(f"{self.file}: debugger JSON nested too deeply") from None
        except OSError as error:
            raise TraceFormatError(f"{self.file}: cannot be read ({error.strerror})") from None
        if not isinstance(tree, dict) or not isinstance(tree.get("module_path"), str):
            raise TraceFormatError(f"{self.file}: not a transformers debugger output (no root module_path)")
        root_name = tree["module_path"].removesuffix(" (top-level)")
        self._walk(tree, root_name)
        self._drop_overwritten_files()
        if self.missing_files:
            shown = ", ".join(self.missing_files[:3])
            raise TraceFormatError(
                f"{self.file}: {len(self.missing_files)} tensor file(s) it names are missing ({shown})"
            )
        pruned = _looks_pruned([record.path for record in self.records])
        notes = []
        if pruned:
            notes.append(f"{self.file.name}: layers pruned by the debugger (do_prune_layers=True): {pruned}")
        trace = Trace(
            model={
                "class": root_name,
                "file": None,
                "hf_debugger": {
                    "file": str(self.file),
                    "use_repr": self.use_repr,
                    "pruned": pruned,
                    "full_tensors": self.file.name.endswith(FULL_SUFFIX),
                },
            },
            modules=self.records,
        )
        # NOTE: the same schema as a trace's (dtype names known, shapes sizes, statistics numbers)
        validate_trace(trace, str(self.file))
        has_tensors = bool(self.store.arrays or self.store.files)
        return LoadedTrace(
            trace=trace,
            tensors=self.store if has_tensors else None,
            path=self.file,
            kind="hf-debugger",
            stat_precision=(self.stat_absolute, self.stat_relative),
            notes=notes,
        )

    def _walk(self, root: dict, root_name: str) -> None:
        prefix = root_name + "."
        counts: dict[str, int] = {}
        finished = 0
        # Iterative pre-order walk; each stack entry is (node, parent index, depth, children pushed?).
        stack: list[tuple[dict, int, bool]] = [(root, -1, False)]
        open_records: list[int] = []
        while stack:
            node, parent, expanded = stack.pop()
            if expanded:
                record = self.records[open_records.pop()]
                record.finish_order = finished
                finished += 1
                continue
            if not isinstance(node, dict) or not isinstance(node.get("module_path"), str):
                raise TraceFormatError(f"{self.file}: malformed node under {self._path_of(parent)!r}")
            module_path = node["module_path"]
            if parent < 0:
                path = ""
            elif module_path.startswith(prefix):
                path = module_path[len(prefix) :]
            else:
                path = module_path
            index = len(self.records)
            call_index = counts.get(path, 0)
            counts[path] = call_index + 1
            record = ModuleCall(index, path, root_name if parent < 0 else "", None, None, call_index, parent)
            record.inputs = self._inputs(node.get("inputs"), index, module_path)
            outputs = node.get("outputs")
            if outputs is not None:
                record.outputs = self._leaves(outputs, "", index, "outputs", module_path)
            self.records.append(record)
            open_records.append(index)
            stack.append((node, parent, True))
            children = node.get("children") or []
            if not isinstance(children, list):
                raise TraceFormatError(f"{self.file}: malformed children of {module_path!r}")
            for child in reversed(children):
                stack.append((child, index, False))

    def _path_of(self, index: int) -> str:
        return self.records[index].path if 0 <= index < len(self.records) else "<root>"

    def _inputs(self, inputs: Any, index: int, module_path: str) -> list[TensorSummary]:
        if inputs is None:
            return []
        if not isinstance(inputs, dict):
            raise TraceFormatError(f"{self.file}: malformed inputs of {module_path!r}")
        summaries: list[TensorSummary] = []
        args = inputs.get("args") or []
        if isinstance(args, list):
            for position, value in enumerate(args):
                summaries.extend(self._leaves(value, f"args.{position}", index, "inputs", module_path))
        kwargs = inputs.get("kwargs") or {}
        if isinstance(kwargs, dict):
            for name, value in kwargs.items():
                summaries.extend(self._leaves(value, str(name), index, "inputs", module_path))
        return summaries

    def _leaves(self, value: Any, key: str, index: int, side: str, module_path: str, depth: int = 0) -> list:
        if _is_tensor_entry(value):
            return [self._summary(value, key, index, side, module_path)]
        if depth >= _MAX_NESTING:
            return []
        found: list[TensorSummary] = []
        if isinstance(value, dict):
            for name, item in value.items():
                found.extend(
                    self._leaves(item, f"{key}.{name}" if key else str(name), index, side, module_path, depth + 1)
                )
        elif isinstance(value, list):
            for position, item in enumerate(value):
                found.extend(
                    self._leaves(
                        item, f"{key}.{position}" if key else str(position), index, side, module_path, depth + 1
                    )
                )
        return found

    def _summary(self, entry: dict, key: str, index: int, side: str, module_path: str) -> TensorSummary:
        where = f"{module_path} {side} {key or '(tensor)'}"
        shape = _parse_shape(entry["shape"], self.file, where)
        dtype = entry["dtype"].removeprefix("torch.")
        summary = TensorSummary(key=key, shape=shape, dtype=dtype)
        device = None
        for statistic in ("mean", "std", "min", "max"):
            text = entry.get(statistic)
            if text is None:
                continue
            value, absolute, relative = parse_scalar(text)
            setattr(summary, statistic, value)
            self.stat_absolute = max(self.stat_absolute, absolute)
            self.stat_relative = max(self.stat_relative, relative)
            if device is None and isinstance(text, str):
                found = _DEVICE_RE.search(text)
                device = found.group(1) if found else None
        summary.device = device or "cpu"
        if summary.min is not None and summary.max is not None:
            summary.abs_max = max(abs(summary.min), abs(summary.max))
        if summary.mean is not None and math.isnan(summary.mean):
            summary.nan_count = 1  # NOTE: "at least one": the debugger prints no counts
        name = f"{index}/{side}/{key}"
        value = entry.get("value")
        if isinstance(value, str) and value.endswith(".safetensors"):
            self.use_repr = False
            target = (self.base / value).resolve()
            if not target.is_relative_to(self.base):
                raise TraceFormatError(f"{self.file}: {where}: tensor file {value!r} is outside the debugger folder")
            if not target.is_file():
                self.missing_files.append(value)
            else:
                self.store.files[name] = (target, tuple(shape))
                summary.tensor = name
                self.file_users.setdefault(str(target), []).append(name)
        elif isinstance(value, list):
            self.use_repr = True
            parsed = parse_tensor_repr(value, shape, dtype)
            if parsed is not None:
                array, absolute, relative = parsed
                self.store.arrays[name] = array
                self.store.precisions[name] = (absolute, relative)
                summary.tensor = name
        return summary

    def _drop_overwritten_files(self) -> None:
        """The debugger names tensor files after the module path, so a module called twice overwrites its
        files: only the last call's values are on disk; earlier calls keep their statistics only."""
        stale = {name for users in self.file_users.values() for name in users[:-1]}
        if not stale:
            return
        for record in self.records:
            for summary in (*record.inputs, *record.outputs):
                if summary.tensor in stale:
                    summary.tensor = None
        for name in stale:
            self.store.files.pop(name, None)


_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def _looks_pruned(paths: list[str]) -> list[str]:
    """Runs of numbered layers with a gap (`layers.0`, `layers.7`): what `do_prune_layers` leaves."""
    numbers: dict[str, set[int]] = {}
    for path in paths:
        match = _NUMBERED.match(path)
        if match:
            numbers.setdefault(match.group(1), set()).add(int(match.group(2)))
    gaps = []
    for stem, found in sorted(numbers.items()):
        if len(found) >= 2 and max(found) - min(found) + 1 > len(found):
            gaps.append(f"{stem}.{min(found)}..{max(found)} (kept {len(found)})")
    return gaps


def read_debugger_output(path: Path | str) -> LoadedTrace:
    """Read a `model_addition_debugger_context` output (its folder, SUMMARY or FULL_TENSORS file)."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace or debugger output")
    return _Reader(find_debugger_json(path)).read()


# ---------------------------------------------------------------------------------------------------- writing


_DEFAULT_PRINTED_DTYPES = {"float32", "int64", "bool"}
_THRESHOLD = 1000
_EDGE_ITEMS = 3
_LINE_WIDTH = 120


def format_tensor_repr(array: np.ndarray, dtype: str) -> list[str]:
    """The tensor printed the way the debugger prints it (torch's formatter under `set_printoptions(sci_mode=True,
    linewidth=120)`, precision 4, summarised past 1,000 elements), as a list of lines."""
    summarise = array.size > _THRESHOLD
    shown = _edge_values(array, summarise)
    if dtype in _FLOAT_DTYPES:
        shown = shown.astype(np.float64)
        element = _float_formatter(shown)
    elif dtype == "bool":

        def element(value: Any) -> str:
            return "True" if value else "False"
    else:

        def element(value: Any) -> str:
            return str(int(value))

    width = max((len(element(value)) for value in shown.reshape(-1)), default=1)
    suffix = "" if dtype in _DEFAULT_PRINTED_DTYPES else f", dtype=torch.{dtype}"
    if array.ndim == 0:
        return [f"tensor({element(array.item())}{suffix})"]
    if array.size == 0:
        return [f"tensor([], size={tuple(array.shape)}{suffix})"]
    body = _format_block(array, summarise, element, width, indent=len("tensor("))
    return f"tensor({body}{suffix})".split("\n")


def _float_formatter(values: np.ndarray):
    """torch's rule: scientific notation (the debugger forces it) unless no value is finite and non-zero, in which
    case integral formatting (`0.`, `inf`, `nan`)."""
    flat = values.reshape(-1)
    integral = not np.any(np.isfinite(flat) & (flat != 0))

    def element(value: float) -> str:
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.0f}." if integral else f"{value:.4e}"

    return element


def _edge_values(array: np.ndarray, summarise: bool) -> np.ndarray:
    if not summarise or array.ndim == 0:
        return array
    for axis in range(array.ndim):
        if array.shape[axis] > 2 * _EDGE_ITEMS:
            keep = list(range(_EDGE_ITEMS)) + list(range(array.shape[axis] - _EDGE_ITEMS, array.shape[axis]))
            array = np.take(array, keep, axis=axis)
    return array


def _format_block(array: np.ndarray, summarise: bool, element, width: int, indent: int) -> str:
    size = array.shape[0]
    cut = summarise and size > 2 * _EDGE_ITEMS
    positions = list(range(_EDGE_ITEMS)) + [None] + list(range(size - _EDGE_ITEMS, size)) if cut else list(range(size))
    if array.ndim == 1:
        items = [" ..." if position is None else element(array[position]).rjust(width) for position in positions]
        per_line = max(1, (_LINE_WIDTH - indent) // (width + 2))
        rows = [", ".join(items[start : start + per_line]) for start in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(rows) + "]"
    separator = "," + "\n" * (array.ndim - 1) + " " * (indent + 1)
    parts = [
        "..." if position is None else _format_block(array[position], summarise, element, width, indent + 1)
        for position in positions
    ]
    return "[" + separator.join(parts) + "]"


def _scalar_repr(value: float | None, dtype: str) -> str | None:
    if value is None:
        return None
    suffix = "" if dtype == "float32" else f", dtype=torch.{dtype}"
    return f"tensor({_float_formatter(np.array([value]))(value)}{suffix})"


def _nest(leaves: list[tuple[list[str], Any]]) -> Any:
    """Rebuild the nested value of dotted keys: digit components become list positions, others dict keys."""
    if len(leaves) == 1 and not leaves[0][0]:
        return leaves[0][1]
    groups: dict[str, list[tuple[list[str], Any]]] = {}
    for parts, value in leaves:
        if not parts:
            continue
        groups.setdefault(parts[0], []).append((parts[1:], value))
    if groups and all(name.isdigit() for name in groups):
        length = max(int(name) for name in groups) + 1
        return [_nest(groups[str(position)]) if str(position) in groups else "None" for position in range(length)]
    return {name: _nest(items) for name, items in groups.items()}


class _Writer:
    def __init__(self, loaded: LoadedTrace, directory: Path, use_repr: bool) -> None:
        self.loaded = loaded
        self.store: TensorStore | None = loaded.tensors
        self.directory = directory
        self.use_repr = use_repr
        self.written_files: list[Path] = []

    def entry(self, summary: TensorSummary, full: bool, file_stem: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "shape": f"torch.Size({list(summary.shape)})",
            "dtype": f"torch.{summary.dtype}",
        }
        if full and summary.tensor is not None and self.store is not None and summary.tensor in self.store:
            if self.use_repr:
                array = self.store.get(summary.tensor)
                if array is not None:
                    entry["value"] = format_tensor_repr(np.asarray(array), summary.dtype)
            else:
                raw = self.store.raw(summary.tensor)
                if raw is not None:
                    code, shape, data = raw
                    name = f"{file_stem}.safetensors"
                    write_safetensors(self.directory / name, {"data": (code, shape, data)})
                    self.written_files.append(self.directory / name)
                    entry["value"] = f"./{name}"
        if summary.dtype in ("float16", "float32", "bfloat16"):
            for statistic in ("mean", "std", "min", "max"):
                text = _scalar_repr(getattr(summary, statistic), summary.dtype)
                if text is not None:
                    entry[statistic] = text
        return entry

    def side(self, summaries: list[TensorSummary], full: bool, stem: str, inputs: bool) -> Any:
        def leaf(summary: TensorSummary, parts: list[str]) -> dict[str, Any]:
            suffix = "".join(f"_{part}" for part in parts)
            return self.entry(summary, full, stem + suffix)

        if not inputs:
            leaves = [([] if not summary.key else summary.key.split("."), summary) for summary in summaries]
            return _nest([(parts, leaf(summary, parts)) for parts, summary in leaves])
        args: list[tuple[list[str], Any]] = []
        kwargs: list[tuple[list[str], Any]] = []
        for summary in summaries:
            parts = summary.key.split(".") if summary.key else ["input"]
            if parts[0] == "args" and len(parts) > 1 and parts[1].isdigit():
                args.append((parts[1:], leaf(summary, ["args", *parts[1:]])))
            else:
                kwargs.append((parts, leaf(summary, ["kwargs", *parts])))
        value: dict[str, Any] = {}
        if args:
            value["args"] = _nest(args)
        if kwargs:
            value["kwargs"] = _nest(kwargs)
        return value

    def write(self) -> tuple[Path, Path]:
        trace = self.loaded.trace
        if not trace.modules:
            raise TraceFormatError(f"{self.loaded.path}: the trace holds no module records to export")
        root_record = trace.modules[0]
        class_name = str(trace.model.get("class") or root_record.class_name or "Model")
        children: dict[int, list[int]] = {}
        for record in trace.modules[1:]:
            children.setdefault(record.parent, []).append(record.index)
        nodes: dict[int, dict[str, Any]] = {}
        trees: dict[bool, dict[str, Any]] = {}
        for full in (True, False):
            for record in reversed(trace.modules):  # children before parents
                module_path = class_name if record.index == root_record.index else f"{class_name}.{record.path}"
                stem = module_path + ("" if record.call_index == 0 else f"_call{record.call_index}")
                node: dict[str, Any] = {
                    "module_path": module_path,
                    "inputs": self.side(record.inputs, full, f"{stem}_inputs", True),
                }
                kids = children.get(record.index, [])
                if not kids and record.outputs:
                    node["outputs"] = self.side(record.outputs, full, f"{stem}_outputs", False)
                if kids:
                    node["children"] = [nodes[kid] for kid in kids]
                nodes[record.index] = node
            root = nodes[root_record.index]
            if not root.get("inputs"):
                root.pop("inputs", None)
            trees[full] = root
            nodes = {}
        self.directory.mkdir(parents=True, exist_ok=True)
        base = self.directory / f"{class_name}{DEBUG_TREE}"
        full_path = base.with_name(base.name + FULL_SUFFIX)
        summary_path = base.with_name(base.name + SUMMARY_SUFFIX)
        _write_json(full_path, trees[True])
        _write_json(summary_path, trees[False])
        return summary_path, full_path


def _write_json(path: Path, data: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, allow_nan=False)
    os.replace(temporary, path)


def write_debugger_output(loaded: LoadedTrace, directory: Path | str, use_repr: bool = True) -> tuple[Path, Path]:
    """Write `loaded` as `model_addition_debugger_context` would (all layers, `do_prune_layers=False`):
    `{Class}_debug_tree_SUMMARY.json` and `_FULL_TENSORS.json` in `directory`; with full tensors, values as
    printed reprs (`use_repr=True`) or as one safetensors file per tensor (`use_repr=False`, exact).
    Returns the (summary, full tensors) paths."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise TraceFormatError(f"{directory}: exists and is not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return _Writer(loaded, directory, use_repr).write()
    except OSError as error:
        # NOTE: `/proc/x`, a read-only folder, a full disk: what failed to be written where, not a traceback
        reason = (error.strerror or str(error)).lower()
        raise TraceFormatError(f"cannot write the debugger output to {directory}: {reason}") from None


__all__ = [
    "find_debugger_json",
    "format_tensor_repr",
    "is_debugger_file",
    "parse_scalar",
    "parse_tensor_repr",
    "read_debugger_output",
    "write_debugger_output",
]
