"""The trace data model: tensor summaries, module call records, line records, and their JSON form.

These types are plain data with no torch dependency: the worker fills them, `storage` writes them as msgpack,
the language server and the CLI read them back. `to_json` / `from_json` follow the `modeltrace.trace/1`
contract of DESIGN.md (`show --format json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


SCHEMA = "modeltrace.trace/1"


@dataclass(slots=True)
class TensorSummary:
    """Statistics of one tensor leaf, found at `key` inside a module's inputs or outputs.

    `key` is a dotted path: `""` for a bare tensor, `"0"` / `"1.0"` inside tuples, `"last_hidden_state"` inside
    dicts and ModelOutputs, the parameter name for inputs (`"hidden_states"`, `"position_embeddings.0"`).
    Statistics are `None` where they cannot be computed (meta tensors in shape-only mode, empty tensors).
    `tensor` names the full tensor in the trace's safetensors file when full tensors were captured;
    `not_stored` says why a tensor was not stored although full tensors were asked for (over the per-tensor or
    per-trace size limit): it keeps its statistics, and a diff compares it by them.
    """

    key: str
    shape: list[int]
    dtype: str
    device: str = "cpu"
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    abs_max: float | None = None
    nan_count: int = 0
    inf_count: int = 0
    positive_fraction: float | None = None
    tensor: str | None = None
    not_stored: str | None = None
    # NOTE: tensor-parallel traces only (`worker/parallel.py`): how the ranks held this tensor. `{"kind":
    # "shard", "dim": d, "local_shapes": [...], "ranks": [{"mean", "std", "min", "max"}, ...]}` for a tensor
    # sharded on dimension d (the summary above describes the whole), `{"kind": "replicate", "ranks": N}` for
    # one every rank held whole. Absent on single-process traces.
    placement: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "key": self.key,
            "shape": self.shape,
            "dtype": self.dtype,
            "device": self.device,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
            "abs_max": self.abs_max,
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
            "positive_fraction": self.positive_fraction,
        }
        if self.tensor is not None:
            data["tensor"] = self.tensor
        if self.not_stored is not None:
            data["not_stored"] = self.not_stored
        if self.placement is not None:
            data["placement"] = self.placement
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSummary:
        return cls(
            key=data["key"],
            # NOTE: as decoded (a shape 1.5 must not become 1): `trace.validation` checks what a file held
            shape=list(data["shape"]),
            dtype=data["dtype"],
            device=data.get("device", "cpu"),
            mean=data.get("mean"),
            std=data.get("std"),
            min=data.get("min"),
            max=data.get("max"),
            abs_max=data.get("abs_max"),
            nan_count=data.get("nan_count") or 0,
            inf_count=data.get("inf_count") or 0,
            positive_fraction=data.get("positive_fraction"),
            tensor=data.get("tensor"),
            not_stored=data.get("not_stored"),
            placement=data.get("placement"),
        )


@dataclass(slots=True)
class SourceLocation:
    """A 1-based line (and 0-based column, when known) in an absolute file path."""

    file: str
    line: int
    column: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"file": self.file, "line": self.line}
        if self.column is not None:
            data["column"] = self.column
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SourceLocation | None:
        if data is None:
            return None
        return cls(file=data["file"], line=data["line"], column=data.get("column"))


@dataclass(slots=True)
class SourceRange:
    """Lines `start`..`end` (1-based, inclusive) of an absolute file path: where a diff says the cause lies."""

    file: str
    start: int
    end: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "start": self.start, "end": self.end}

    def __contains__(self, line: object) -> bool:
        return isinstance(line, int) and self.start <= line <= self.end


@dataclass(slots=True)
class ModuleCall:
    """One call of one submodule during the forward pass.

    Records are stored in the order calls started (a pre-order walk of the call tree); `parent` is the index of
    the enclosing call (-1 for the root) and `finish_order` the position at which this call returned, which is
    the order the diff walks to find the innermost diverging module. `call_index` counts calls of the same
    `path` (0 for the first). `call_site` distinguishes several calls written on the same source line (the
    bytecode offset of the call in the caller's code): the line's hint shows the call that runs last there.
    """

    index: int
    path: str
    class_name: str
    defined_at: SourceLocation | None
    called_at: SourceLocation | None
    call_index: int
    parent: int
    finish_order: int = -1
    call_site: int | None = None
    inputs: list[TensorSummary] = field(default_factory=list)
    outputs: list[TensorSummary] = field(default_factory=list)
    # NOTE: where the call ran, when the model is spread over devices (`--device-map`): the execution device
    # of its accelerate hook ("cpu", "cuda:1"), with " (weights offloaded to disk)" / "(... to cpu)" when its
    # weights live elsewhere between calls. None on a single-device trace (every tensor's own `device` says it).
    device: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "index": self.index,
            "path": self.path,
            "class": self.class_name,
            "defined_at": self.defined_at.to_json() if self.defined_at else None,
            "called_at": self.called_at.to_json() if self.called_at else None,
            "call_index": self.call_index,
            "parent": self.parent,
            "finish_order": self.finish_order,
            "call_site": self.call_site,
            "inputs": [summary.to_json() for summary in self.inputs],
            "outputs": [summary.to_json() for summary in self.outputs],
        }
        if self.device is not None:
            data["device"] = self.device
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleCall:
        return cls(
            index=data["index"],
            path=data["path"],
            class_name=data["class"],
            defined_at=SourceLocation.from_json(data.get("defined_at")),
            called_at=SourceLocation.from_json(data.get("called_at")),
            call_index=data.get("call_index", 0),
            parent=data.get("parent", -1),
            finish_order=data.get("finish_order", -1),
            call_site=data.get("call_site"),
            inputs=[TensorSummary.from_json(item) for item in data.get("inputs", [])],
            outputs=[TensorSummary.from_json(item) for item in data.get("outputs", [])],
            device=None if data.get("device") is None else str(data["device"]),
        )


@dataclass(slots=True)
class LineRecord:
    """A tensor-valued local variable assigned on one executed source line (line-level capture).

    `module_call` is the index of the innermost module call running when the line ran (the `ModuleCall` whose
    forward, or a helper function it called, holds the line), -1 when none ran or the trace predates the field:
    the diff's line drill-down takes the lines of the diverging call by it.
    """

    file: str
    line: int
    name: str
    call_index: int
    tensor: TensorSummary
    module_call: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "name": self.name,
            "call_index": self.call_index,
            "tensor": self.tensor.to_json(),
            "module_call": self.module_call,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LineRecord:
        return cls(
            file=data["file"],
            line=data["line"],
            name=data["name"],
            call_index=data.get("call_index", 0),
            tensor=TensorSummary.from_json(data["tensor"]),
            module_call=data.get("module_call", -1),
        )


@dataclass(slots=True)
class ParameterRecord:
    """One parameter or buffer of a module (`kind` "parameter" / "buffer"), recorded once per trace.

    `summary` holds its shape, dtype and statistics (its `key` is the parameter's name, its `tensor` the name of
    the full tensor in the trace's safetensors file when full tensors were asked for and it fit the limits).
    `sample` is the values at fixed positions of the row-major order (the same positions for any tensor of the
    same element count) and `sample_transposed` those of the transpose (2-D tensors only): with them and the
    statistics the diff tells a copied weight from a different one and from a transposed one without the full
    tensors. `shared_with` names the parameter of an earlier module that is the same tensor (tied
    embeddings). Samples are empty on the meta device. `statistics_stride` > 1 says the statistics are those of a
    fixed subset of the elements (large weights): runs of `statistics_run` consecutive elements of the row-major
    order, one starting at every `statistics_stride`-th element (`worker/builds.statistics_sample`; traces
    before the runs have `statistics_run` 1: every stride-th element). Comparable between tensors of one shape,
    layout, stride and run, not exact.
    """

    name: str
    kind: str
    summary: TensorSummary
    sample: list[float] = field(default_factory=list)
    sample_transposed: list[float] | None = None
    shared_with: str | None = None
    statistics_stride: int = 1
    statistics_run: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "statistics_stride": self.statistics_stride,
            "statistics_run": self.statistics_run,
            "name": self.name,
            "kind": self.kind,
            "summary": self.summary.to_json(),
            "sample": self.sample,
            "sample_transposed": self.sample_transposed,
            "shared_with": self.shared_with,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ParameterRecord:
        transposed = data.get("sample_transposed")
        return cls(
            name=str(data["name"]),
            kind=str(data.get("kind", "parameter")),
            summary=TensorSummary.from_json(data["summary"]),
            sample=[float(value) for value in data.get("sample") or []],
            sample_transposed=None if transposed is None else [float(value) for value in transposed],
            shared_with=None if data.get("shared_with") is None else str(data["shared_with"]),
            statistics_stride=int(data.get("statistics_stride", 1)),
            statistics_run=int(data.get("statistics_run", 1)),
        )


@dataclass(slots=True)
class ModuleBuild:
    """How one module of the traced model was built, recorded once per trace (not per call).

    `built_at` is the line that built it: where its class was called (`self.ln_2 = nn.LayerNorm(...)`, for an
    item of a list later wrapped in a ModuleList `layers += [Block(...)]`), in the file of the code that
    registered it on its parent (the line of `self.act = ACT2FN[...]`, not that of the library's factory); where
    its construction was not seen (a `copy.deepcopy`), the line that registered it. `settings` are its scalar
    settings by name: the `name=value` fields of its `extra_repr()` and its public scalar attributes (eps,
    bias, in_features, variance_epsilon, scaling...), values being numbers, strings, booleans, None or lists
    of those. `qualified_class` is `module.qualname` of its class. `parameters` are its own parameters and
    buffers (not its children's). `assigned_at` gives, for the settings its class's own `__init__` (or a base's,
    in model code) assigns (`self.scaling = ...`), the line that assigns it (optional in the file: older traces
    have none).
    """

    path: str
    class_name: str
    qualified_class: str | None = None
    built_at: SourceLocation | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    parameters: list[ParameterRecord] = field(default_factory=list)
    assigned_at: dict[str, SourceLocation] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = {
            "path": self.path,
            "class": self.class_name,
            "qualified_class": self.qualified_class,
            "built_at": self.built_at.to_json() if self.built_at else None,
            "settings": self.settings,
            "parameters": [parameter.to_json() for parameter in self.parameters],
        }
        if self.assigned_at:
            data["assigned_at"] = {name: location.to_json() for name, location in self.assigned_at.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleBuild:
        settings = data.get("settings") or {}
        if not isinstance(settings, dict):
            raise ValueError(f"settings of module {data.get('path')!r} must be a map, not {type(settings).__name__}")
        return cls(
            path=str(data["path"]),
            class_name=str(data.get("class", "")),
            qualified_class=None if data.get("qualified_class") is None else str(data["qualified_class"]),
            built_at=SourceLocation.from_json(data.get("built_at")),
            settings={str(name): value for name, value in settings.items()},
            parameters=[ParameterRecord.from_json(item) for item in data.get("parameters") or []],
            assigned_at=_assignments(data.get("assigned_at"), data.get("path")),
        )


def _assignments(data: Any, path: Any) -> dict[str, SourceLocation]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"assigned_at of module {path!r} must be a map, not {type(data).__name__}")
    found = {str(name): SourceLocation.from_json(location) for name, location in data.items()}
    return {name: location for name, location in found.items() if location is not None}


@dataclass(slots=True)
class Trace:
    """A whole trace: `model` is the header (class, file, config, inputs, versions, source hashes, options)."""

    model: dict[str, Any]
    modules: list[ModuleCall] = field(default_factory=list)
    lines: list[LineRecord] = field(default_factory=list)
    schema: str = SCHEMA
    # NOTE: after `schema`, so that positional construction by older callers keeps its meaning.
    builds: list[ModuleBuild] = field(default_factory=list)
    # NOTE: only in generation traces (`--generate`) and backward traces (`--backward`); None elsewhere.
    generation: GenerationRecord | None = None
    gradients: BackwardRecord | None = None
    # NOTE: `[build.to_json() for build in builds]` when the writer has it already: `modeltrace.capture` reuses a
    # model's construction records between captures (`worker/reuse.py`), and their JSON with them
    builds_json: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    def builds_to_json(self) -> list[dict[str, Any]]:
        return self.builds_json if self.builds_json is not None else [build.to_json() for build in self.builds]

    def to_json(self) -> dict[str, Any]:
        """The `modeltrace.trace/1` JSON of the contract (`show --format json`), plus `builds`; a generation
        trace adds `generation` and a `step` to each module record, a backward trace adds `gradients`."""
        modules = [record.to_json() for record in self.modules]
        if self.generation is not None:
            for record in modules:
                record["step"] = self.generation.step_of(record["index"])
        data = {
            "schema": self.schema,
            "model": self.model,
            "modules": modules,
            "lines": [record.to_json() for record in self.lines],
            "builds": self.builds_to_json(),
        }
        if self.generation is not None:
            data["generation"] = self.generation.to_json()
        if self.gradients is not None:
            data["gradients"] = self.gradients.to_json()
        return data

    def step_of(self, record_index: int) -> int | None:
        """The generation step of a module record (0: the prefill), None in a trace that is not a generation."""
        return None if self.generation is None else self.generation.step_of(record_index)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trace:
        return cls(
            schema=str(data["schema"]),
            model=dict(data.get("model") or {}),
            modules=[ModuleCall.from_json(item) for item in data.get("modules", [])],
            lines=[LineRecord.from_json(item) for item in data.get("lines", [])],
            builds=[ModuleBuild.from_json(item) for item in data.get("builds") or []],
            generation=GenerationRecord.from_json(data.get("generation")),
            gradients=BackwardRecord.from_json(data.get("gradients")),
        )

    def files(self) -> set[str]:
        """Every source file a record points at (modeling file, files of its dependencies)."""
        found = {loc.file for record in self.modules for loc in (record.called_at, record.defined_at) if loc}
        found.update(record.file for record in self.lines)
        return found


@dataclass(slots=True)
class CacheEntry:
    """The key/value cache of one attention layer after one generation step (`kind` "self", or "cross" for an
    encoder-decoder's cross-attention): statistics, and the full tensors' names when they were stored."""

    step: int
    layer: int
    kind: str
    key: TensorSummary
    value: TensorSummary

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "layer": self.layer,
            "kind": self.kind,
            "key": self.key.to_json(),
            "value": self.value.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CacheEntry:
        return cls(
            step=int(data["step"]),
            layer=int(data["layer"]),
            kind=str(data.get("kind", "self")),
            key=TensorSummary.from_json(data["key"]),
            value=TensorSummary.from_json(data["value"]),
        )


@dataclass(slots=True)
class GenerationRecord:
    """What a generation trace (`trace --generate N`) adds: its steps, generated ids and cache, once per trace.

    Step 0 is the prefill (the prompt, and an encoder-decoder's encoder), steps 1..N-1 the decode steps; a step
    starts at each call of the traced model itself (the root module), so `step_starts[s]` is the index of the
    first module record of step `s` (records before the second root call, an encoder's included, are step 0).
    `generated_ids` are the new token ids per batch row (the prompt left out), `call` says what generated
    ("generate": `model.generate`, greedy with the model's own cache; "recipe": the recipe's `generate`).
    """

    steps: int
    step_starts: list[int]
    prompt_length: int
    generated_ids: list[list[int]]
    call: str = "generate"
    cache: list[CacheEntry] = field(default_factory=list)

    def step_of(self, record_index: int) -> int:
        """The step of the module record at `record_index`."""
        from bisect import bisect_right

        return max(0, bisect_right(self.step_starts, record_index) - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "step_starts": self.step_starts,
            "prompt_length": self.prompt_length,
            "generated_ids": self.generated_ids,
            "call": self.call,
            "cache": [entry.to_json() for entry in self.cache],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> GenerationRecord | None:
        if data is None:
            return None
        return cls(
            steps=int(data["steps"]),
            step_starts=[int(index) for index in data.get("step_starts") or [0]],
            prompt_length=int(data.get("prompt_length", 0)),
            generated_ids=[[int(token) for token in row] for row in data.get("generated_ids") or []],
            call=str(data.get("call", "generate")),
            cache=[CacheEntry.from_json(item) for item in data.get("cache") or []],
        )


@dataclass(slots=True)
class GradientCall:
    """The gradients of one module call in a backward trace (`trace --backward`).

    `outputs`: the gradient of the loss w.r.t. each of the call's outputs that required grad (keys as in the
    call's `outputs`); `inputs`: w.r.t. each input that required grad, through this call only (a residual that
    also bypasses the call is not counted here). `backward_order` is the position at which the call's backward
    finished (its input, or else its own parameters', gradients were computed): the order of the gradient diff.
    """

    module_call: int
    backward_order: int
    outputs: list[TensorSummary] = field(default_factory=list)
    inputs: list[TensorSummary] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "module_call": self.module_call,
            "backward_order": self.backward_order,
            "outputs": [summary.to_json() for summary in self.outputs],
            "inputs": [summary.to_json() for summary in self.inputs],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradientCall:
        return cls(
            module_call=int(data["module_call"]),
            backward_order=int(data.get("backward_order", -1)),
            outputs=[TensorSummary.from_json(item) for item in data.get("outputs") or []],
            inputs=[TensorSummary.from_json(item) for item in data.get("inputs") or []],
        )


@dataclass(slots=True)
class ParameterGradient:
    """The gradient of one parameter after the backward pass: `summary` None when it got none (`requires_grad`
    False: frozen; True: unused by the loss). `backward_order` as in `GradientCall` (-1: none);
    `statistics_stride` > 1: statistics of every stride-th element (large parameters, as `ParameterRecord`)."""

    name: str
    requires_grad: bool
    summary: TensorSummary | None = None
    backward_order: int = -1
    statistics_stride: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requires_grad": self.requires_grad,
            "summary": self.summary.to_json() if self.summary is not None else None,
            "backward_order": self.backward_order,
            "statistics_stride": self.statistics_stride,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ParameterGradient:
        summary = data.get("summary")
        return cls(
            name=str(data["name"]),
            requires_grad=bool(data.get("requires_grad", True)),
            summary=TensorSummary.from_json(summary) if summary is not None else None,
            backward_order=int(data.get("backward_order", -1)),
            statistics_stride=int(data.get("statistics_stride", 1)),
        )


@dataclass(slots=True)
class GradientFlag:
    """A gradient worth a look: `problem` "nan", "inf" or "zero" (all zero); `where` "loss", "module" (with the
    module call's index in `module_call`) or "parameter"; `name` the module path or parameter name, `key` the leaf."""

    problem: str
    where: str
    name: str
    key: str = ""
    module_call: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem,
            "where": self.where,
            "name": self.name,
            "key": self.key,
            "module_call": self.module_call,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradientFlag:
        return cls(
            problem=str(data["problem"]),
            where=str(data["where"]),
            name=str(data.get("name", "")),
            key=str(data.get("key", "")),
            module_call=int(data.get("module_call", -1)),
        )


@dataclass(slots=True)
class BackwardRecord:
    """What a backward trace (`trace --backward`) adds: the loss, gradients per module call and per parameter.

    `loss_source` says which loss ran: "model" (the model's own, labels synthesised), "recipe" (its
    `build_loss(outputs)`) or "default" (half the mean square of every differentiable floating output leaf).
    """

    loss: TensorSummary
    loss_source: str
    loss_description: str
    calls: list[GradientCall] = field(default_factory=list)
    parameters: list[ParameterGradient] = field(default_factory=list)
    flags: list[GradientFlag] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "loss": self.loss.to_json(),
            "loss_source": self.loss_source,
            "loss_description": self.loss_description,
            "calls": [call.to_json() for call in self.calls],
            "parameters": [parameter.to_json() for parameter in self.parameters],
            "flags": [flag.to_json() for flag in self.flags],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> BackwardRecord | None:
        if data is None:
            return None
        return cls(
            loss=TensorSummary.from_json(data["loss"]),
            loss_source=str(data.get("loss_source", "default")),
            loss_description=str(data.get("loss_description", "")),
            calls=[GradientCall.from_json(item) for item in data.get("calls") or []],
            parameters=[ParameterGradient.from_json(item) for item in data.get("parameters") or []],
            flags=[GradientFlag.from_json(item) for item in data.get("flags") or []],
        )
