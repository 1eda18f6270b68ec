"""Parameters and configuration of aligned modules: what differs in how the two implementations built them.

Each trace records, once per module, its construction line, its settings (`extra_repr()` fields and scalar
attributes) and a fingerprint of its own parameters and buffers (`worker/builds.py`). For every aligned module
pair this compares them: settings by normalised name (`eps`, `variance_epsilon` and `layer_norm_eps` are one
field; the tables below say which names are the same and why), activations by the function they compute, and
parameters by value (full tensors when both traces stored them, else statistics and a fixed-position sample):
a copied weight that differs, one that is transposed, one that is missing. The differences go on each
`ModuleResult` and, for the first divergence, on the `Divergence` with the line that built the module
("layers.1.ln_2: eps 1e-06 vs 1e-05, built at modeling_x.py:88").

A module whose inputs match, whose outputs differ at all (even within tolerance) and whose settings or
parameters differ is where such a bug is: when the first divergence found from tensors alone is an enclosing
module (the small difference was amplified past the tolerance later), the divergence moves to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from modeltrace.diff.result import DiffResult
from modeltrace.trace.records import ModuleBuild, ParameterRecord, SourceLocation


@dataclass(frozen=True, slots=True)
class SettingDifference:
    """A setting that differs: `name` normalised (`eps`), the values of each side, and which module (`path`,
    the candidate's) and which names on each side (`note`: "variance_epsilon vs eps") when they differ;
    `assigned_at`, the line of the candidate's `__init__` that assigned it when the trace knows it (where the
    setting is fixed, rather than the parent's line that built the module)."""

    name: str
    reference: Any
    candidate: Any
    path: str = ""
    note: str | None = None
    assigned_at: SourceLocation | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "reference": _jsonable(self.reference),
            "candidate": _jsonable(self.candidate),
            "path": self.path,
        }
        if self.note:
            data["note"] = self.note
        if self.assigned_at is not None:
            data["assigned_at"] = self.assigned_at.to_json()
        return data


@dataclass(frozen=True, slots=True)
class ParameterDifference:
    """A parameter or buffer that differs: `status` "different", "transposed" or "missing" (in the reference,
    not in the candidate), the largest difference seen (a lower bound unless `note` says full tensors)."""

    name: str
    status: str
    max_abs_diff: float | None = None
    note: str | None = None
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "max_abs_diff": self.max_abs_diff
            if self.max_abs_diff is None or math.isfinite(self.max_abs_diff)
            else None,
            "note": self.note,
            "path": self.path,
        }


DIFFERENT = "different"
TRANSPOSED = "transposed"
MISSING = "missing"


# ------------------------------------------------------------------------------------------- data tables


@dataclass(frozen=True, slots=True)
class Synonym:
    """Names that mean one setting in independently written code, with why."""

    name: str
    aliases: tuple[str, ...]
    reason: str


SYNONYMS = (
    Synonym(
        "eps",
        (
            "eps",
            "epsilon",
            "variance_epsilon",
            "layer_norm_eps",
            "layer_norm_epsilon",
            "rms_norm_eps",
            "norm_eps",
            "ln_eps",
        ),
        "the number added to the variance in LayerNorm / RMSNorm: torch calls it eps, transformers' RMSNorm "
        "variance_epsilon, configs layer_norm_eps / rms_norm_eps / layer_norm_epsilon",
    ),
    Synonym(
        "scaling",
        ("scaling", "scale", "softmax_scale", "attn_scale", "sm_scale", "attention_scale"),
        "the factor attention scores are multiplied by (1/sqrt(head_dim) unless the model says otherwise)",
    ),
    Synonym(
        "in_features",
        ("in_features", "nx", "in_dim", "input_dim", "d_in"),
        "a projection's input width: transformers' Conv1D(nf, nx) calls it nx",
    ),
    Synonym(
        "out_features",
        ("out_features", "nf", "out_dim", "output_dim", "d_out"),
        "a projection's output width: Conv1D's nf",
    ),
    Synonym(
        "num_heads",
        ("num_heads", "n_head", "n_heads", "num_attention_heads", "n_heads_q"),
        "attention heads: GPT-2 style code says n_head, Llama style num_heads",
    ),
    Synonym(
        "num_key_value_heads",
        ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head"),
        "key/value heads of grouped-query attention",
    ),
    Synonym(
        "head_dim",
        ("head_dim", "head_size", "d_head", "dim_head", "attention_head_size"),
        "width of one attention head",
    ),
    Synonym(
        "hidden_size",
        ("hidden_size", "embed_dim", "n_embd", "d_model", "all_head_size"),
        "the model width, named after each code base's config",
    ),
    Synonym("is_causal", ("is_causal", "causal"), "whether attention masks future positions"),
    Synonym("rope_theta", ("rope_theta", "theta", "rotary_base", "base"), "the base of rotary frequencies"),
    Synonym("num_embeddings", ("num_embeddings", "vocab_size", "n_vocab"), "rows of an embedding table"),
    Synonym("embedding_dim", ("embedding_dim",), "width of an embedding table"),
    Synonym("normalized_shape", ("normalized_shape",), "the trailing shape a LayerNorm normalises"),
    Synonym("elementwise_affine", ("elementwise_affine",), "whether a LayerNorm has a weight (and bias)"),
    Synonym("approximate", ("approximate",), "GELU's exact (erf) or tanh form"),
    Synonym("bias", ("bias", "use_bias"), "whether a projection adds a bias"),
    Synonym("negative_slope", ("negative_slope",), "LeakyReLU's slope"),
)

# NOTE: settings that do not change what a module computes in eval mode, or are bookkeeping of one code base:
# reporting them would bury a real difference under noise on every correct port.
IGNORED_SETTINGS: dict[str, str] = {
    "training": "train/eval mode is set by the trace, not by the model",
    "inplace": "in place or not, the values are the same",
    "p": "dropout probability: dropout is off in eval mode",
    "dropout": "dropout probability: dropout is off in eval mode",
    "attention_dropout": "dropout probability: dropout is off in eval mode",
    "resid_pdrop": "dropout probability: dropout is off in eval mode",
    "attn_pdrop": "dropout probability: dropout is off in eval mode",
    "layer_idx": "the layer's number, for caches",
    "name_or_path": "where a pretrained model came from",
    "gradient_checkpointing": "memory saving in training only",
    "kernel_config": "kernel selection, not the math",
    "loss_type": "the loss, not the forward pass",
    "is_cross_attention": "the kind of attention is given by the module's inputs",
    "padding_idx": "an embedding's padding row only changes its gradient and initialisation; the forward pass "
    "reads the table as it is (a different row is a parameter difference)",
}

# How a class stores a projection's weight: transformers' Conv1D computes `x @ weight` and stores
# [in, out] (GPT-2's original TensorFlow layout), nn.Linear computes `x @ weight.T` and stores [out, in].
IN_OUT_WEIGHT_CLASSES: dict[str, str] = {
    "Conv1D": "transformers.pytorch_utils.Conv1D stores its weight as [in_features, out_features]",
}


@dataclass(frozen=True, slots=True)
class WrapperClass:
    """A class that a library makes at run time around a module's own class: `qualified_prefix` + `name_prefix` +
    the class's name, computing what the class computes (so the module compares as one of its class)."""

    qualified_prefix: str
    name_prefix: str
    reason: str


WRAPPER_CLASSES = (
    WrapperClass(
        "torch.nn.utils.parametrize.",
        "Parametrized",
        "register_parametrization (the new weight_norm, spectral_norm, orthogonal) swaps a module's class for a "
        "subclass `Parametrized<Class>` that computes the weight from its parametrization: a weight-normed "
        "Conv1d is a Conv1d with the other form of weight_norm, whose Conv1d keeps its class",
    ),
)


def class_of(build: ModuleBuild) -> str:
    """The name of `build`'s class, a run-time wrapper class (`WRAPPER_CLASSES`) taken off."""
    for row in WRAPPER_CLASSES:
        if (build.qualified_class or "").startswith(row.qualified_prefix) and build.class_name.startswith(
            row.name_prefix
        ):
            return build.class_name.removeprefix(row.name_prefix) or build.class_name
    return build.class_name


@dataclass(frozen=True, slots=True)
class ActivationRow:
    """Activation classes (and the settings that pick a variant) that compute one function."""

    function: str
    classes: tuple[str, ...]
    setting: tuple[str, Any] | None = None
    reason: str = ""


ACTIVATIONS = (
    ActivationRow("gelu_tanh", ("GELU",), ("approximate", "tanh"), "torch's GELU(approximate='tanh')"),
    ActivationRow("gelu", ("GELU",), ("approximate", "none"), "torch's exact GELU"),
    ActivationRow("gelu", ("GELUActivation",), None, "transformers' 'gelu' (erf form)"),
    ActivationRow(
        "gelu_tanh",
        ("NewGELUActivation", "PytorchGELUTanh", "GELUTanh", "GELUPytorchTanh"),
        None,
        "transformers' 'gelu_new' / 'gelu_pytorch_tanh' (the tanh form GPT-2 uses)",
    ),
    ActivationRow("gelu_fast", ("FastGELUActivation",), None, "transformers' 'gelu_fast'"),
    ActivationRow("gelu_quick", ("QuickGELUActivation",), None, "x * sigmoid(1.702 x)"),
    ActivationRow("silu", ("SiLU", "SiLUActivation"), None, "x * sigmoid(x), Llama's MLP"),
    ActivationRow("relu", ("ReLU",), None, "max(x, 0)"),
    ActivationRow("relu2", ("ReLUSquaredActivation",), None, "relu(x)^2"),
    ActivationRow("tanh", ("Tanh",), None, "tanh"),
    ActivationRow("sigmoid", ("Sigmoid",), None, "sigmoid"),
    ActivationRow("mish", ("Mish", "MishActivation"), None, "x * tanh(softplus(x))"),
)
_FUNCTION_NAMES = {
    "torch.nn.functional.gelu": "gelu",
    "torch._C._nn.gelu": "gelu",
    "torch.nn.functional.silu": "silu",
    "torch.nn.functional.relu": "relu",
    "torch.relu": "relu",
    "torch.tanh": "tanh",
    "torch.sigmoid": "sigmoid",
}


@dataclass(frozen=True, slots=True)
class ImpliedSetting:
    """A setting a library module applies without holding it, from the settings it holds: compared with the
    other side's setting of that (canonical) name as if the module held it."""

    qualified_class: str
    name: str
    source: str
    exponent: float
    reason: str

    def value(self, settings: dict[str, Any]) -> float | None:
        base = settings.get(self.source)
        if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 0:
            return None
        return float(base) ** self.exponent


IMPLIED_SETTINGS = (
    ImpliedSetting(
        "torch.nn.modules.activation.MultiheadAttention",
        "scaling",
        "head_dim",
        -0.5,
        "nn.MultiheadAttention scales the scores by head_dim ** -0.5 inside F.multi_head_attention_forward and "
        "keeps no setting for it (open_clip's attention): a port's `self.scale` is compared with that",
    ),
)


def _with_implied(build: ModuleBuild) -> dict[str, Any]:
    """`build`'s settings, with those its library class applies without holding them (`IMPLIED_SETTINGS`)."""
    settings = dict(build.settings)
    for row in IMPLIED_SETTINGS:
        if row.qualified_class == build.qualified_class and row.name not in settings:
            value = row.value(settings)
            if value is not None:
                settings[row.name] = value
    return settings


_CANONICAL = {alias: synonym.name for synonym in SYNONYMS for alias in synonym.aliases}


def canonical_name(name: str) -> str:
    return _CANONICAL.get(name, name)


def activation_of(build: ModuleBuild) -> str | None:
    """The activation function a module computes, when the table knows its class."""
    for row in ACTIVATIONS:
        if class_of(build) in row.classes:
            if row.setting is None:
                return row.function
            name, value = row.setting
            if build.settings.get(name, "none") == value:
                return row.function
    return None


# ------------------------------------------------------------------------------------------- comparison


def compare_settings(reference: ModuleBuild, candidate: ModuleBuild) -> list[SettingDifference]:
    """Settings that differ between two aligned modules. Modules of the same class compare every setting they
    share; modules of different classes only those the synonym table names (their other attributes mean
    whatever each code base made them mean)."""
    differences: list[SettingDifference] = []
    ref_activation, cand_activation = activation_of(reference), activation_of(candidate)
    if ref_activation and cand_activation and ref_activation != cand_activation:
        differences.append(
            SettingDifference(
                "activation",
                f"{ref_activation} ({reference.class_name})",
                f"{cand_activation} ({candidate.class_name})",
                candidate.path,
            )
        )
    same_class = class_of(reference) == class_of(candidate)
    ref_fields = _normalised(_with_implied(reference), same_class)
    cand_fields = _normalised(_with_implied(candidate), same_class)
    for name, (ref_name, ref_value) in ref_fields.items():
        found = cand_fields.get(name)
        if found is None:
            continue
        cand_name, cand_value = found
        if name == "approximate" and ref_activation and cand_activation:
            continue  # said by the activation row above
        if not _same_value(ref_value, cand_value):
            note = f"{ref_name} vs {cand_name}" if ref_name != cand_name else None
            assigned_at = candidate.assigned_at.get(cand_name)
            differences.append(SettingDifference(name, ref_value, cand_value, candidate.path, note, assigned_at))
    return differences


def _normalised(settings: dict[str, Any], same_class: bool) -> dict[str, tuple[str, Any]]:
    fields: dict[str, tuple[str, Any]] = {}
    for name, value in settings.items():
        if name in IGNORED_SETTINGS:
            continue
        canonical = canonical_name(name)
        if not same_class and canonical not in _KNOWN:
            continue
        # NOTE: the first name wins: `eps` from `extra_repr()` and `variance_epsilon` from the attributes agree
        fields.setdefault(canonical, (name, value))
    return fields


_KNOWN = frozenset(synonym.name for synonym in SYNONYMS)


def _same_value(first: Any, second: Any) -> bool:
    first, second = _unwrap(first), _unwrap(second)
    if isinstance(first, bool) or isinstance(second, bool) or first is None or second is None:
        return first == second
    if isinstance(first, (int, float)) and isinstance(second, (int, float)):
        # NOTE: one side may hold eps as a float32 tensor's value, the other as a Python float
        return math.isclose(first, second, rel_tol=1e-6, abs_tol=0.0) or (first != first and second != second)
    if isinstance(first, list) and isinstance(second, list):
        return len(first) == len(second) and all(_same_value(a, b) for a, b in zip(first, second))
    return first == second


def _unwrap(value: Any) -> Any:
    """`[64]` and `64` are the same normalized_shape."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def compare_parameters(
    reference: ModuleBuild, candidate: ModuleBuild, ref_store: Any = None, cand_store: Any = None
) -> list[ParameterDifference]:
    """Parameters and buffers of two aligned modules that differ, are transposed, or are missing."""
    differences: list[ParameterDifference] = []
    cand_by_name = {parameter.name: parameter for parameter in candidate.parameters}
    leftovers = list(candidate.parameters)
    pairs: list[tuple[ParameterRecord, ParameterRecord | None]] = []
    for ref_parameter in reference.parameters:
        cand_parameter = cand_by_name.get(ref_parameter.name)
        if cand_parameter is None:
            # a parameter named differently (`scale` for `weight`): the next unpaired one of the same kind and size
            cand_parameter = next(
                (
                    parameter
                    for parameter in leftovers
                    if parameter.kind == ref_parameter.kind
                    and parameter.name not in _names(reference)
                    and _numel(parameter) == _numel(ref_parameter)
                ),
                None,
            )
        if cand_parameter is not None and cand_parameter in leftovers:
            leftovers.remove(cand_parameter)
        pairs.append((ref_parameter, cand_parameter))
    for ref_parameter, cand_parameter in pairs:
        if cand_parameter is None:
            if ref_parameter.kind == "parameter":
                differences.append(
                    ParameterDifference(
                        ref_parameter.name,
                        MISSING,
                        None,
                        f"the candidate's {candidate.class_name} has no such parameter",
                        candidate.path,
                    )
                )
            continue
        difference = _compare_parameter(reference, candidate, ref_parameter, cand_parameter, ref_store, cand_store)
        if difference is not None:
            differences.append(difference)
    return differences


def _names(build: ModuleBuild) -> set[str]:
    return {parameter.name for parameter in build.parameters}


def _numel(parameter: ParameterRecord) -> int:
    return math.prod(parameter.summary.shape)


@dataclass(slots=True)
class _Oriented:
    """A parameter in the [out, in] orientation of nn.Linear: shape, sample, transposed sample, stored array."""

    shape: list[int]
    sample: list[float]
    sample_transposed: list[float] | None
    array: np.ndarray | None


def _oriented(build: ModuleBuild, parameter: ParameterRecord, store: Any) -> _Oriented:
    array = None
    if store is not None and parameter.summary.tensor is not None:
        try:
            array = store.get(parameter.summary.tensor)
        except Exception:  # noqa: BLE001 - a damaged tensors file: the sample is the fallback
            array = None
    shape = list(parameter.summary.shape)
    sample, transposed = parameter.sample, parameter.sample_transposed
    if class_of(build) in IN_OUT_WEIGHT_CLASSES and parameter.name == "weight" and len(shape) == 2:
        shape = shape[::-1]
        if transposed is not None:
            sample, transposed = transposed, sample
        if array is not None:
            array = np.asarray(array).T
    return _Oriented(shape, sample, transposed, array)


def _tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) under which two copies of one weight are the same: exact up to the dtype's rounding."""
    return {"bfloat16": (1e-6, 1e-2), "float16": (1e-6, 2e-3)}.get(dtype, (1e-7, 1e-5))


def _compare_parameter(
    reference: ModuleBuild,
    candidate: ModuleBuild,
    ref_parameter: ParameterRecord,
    cand_parameter: ParameterRecord,
    ref_store: Any,
    cand_store: Any,
) -> ParameterDifference | None:
    ref = _oriented(reference, ref_parameter, ref_store)
    cand = _oriented(candidate, cand_parameter, cand_store)
    atol, rtol = _tolerance(
        min(
            ref_parameter.summary.dtype,
            cand_parameter.summary.dtype,
            key=lambda name: {"bfloat16": 0, "float16": 1}.get(name, 2),
        )
    )
    name = (
        cand_parameter.name
        if cand_parameter.name == ref_parameter.name
        else f"{ref_parameter.name} (candidate {cand_parameter.name})"
    )
    if ref.array is not None and cand.array is not None:
        return _compare_full(name, ref.array, cand.array, atol, rtol, candidate.path)
    if math.prod(ref.shape) != math.prod(cand.shape):
        return ParameterDifference(name, DIFFERENT, None, f"shape {ref.shape} vs {cand.shape}", candidate.path)
    if not ref.sample or not cand.sample:
        if ref.shape != cand.shape:
            return ParameterDifference(name, DIFFERENT, None, f"shape {ref.shape} vs {cand.shape}", candidate.path)
        return None  # meta tensors: shapes agree, values unknown
    same = _close(ref.sample, cand.sample, atol, rtol)
    if same and ref.shape == cand.shape:
        # NOTE: sampled statistics (large weights) are comparable only over the same elements: same stride and
        # run, same storage layout (a trace from before the runs against a newer one: the samples decide)
        comparable = (
            ref_parameter.statistics_stride == cand_parameter.statistics_stride
            and ref_parameter.statistics_run == cand_parameter.statistics_run
            and (ref_parameter.statistics_stride == 1 or ref_parameter.summary.shape == cand_parameter.summary.shape)
        )
        statistics = _statistics_gap(ref_parameter, cand_parameter) if comparable else None
        if statistics is None or statistics <= atol + rtol * _scale(ref_parameter) + 1e-6 * _scale(ref_parameter):
            return None
        return ParameterDifference(name, DIFFERENT, statistics, "statistics differ (sample agrees)", candidate.path)
    if (
        ref.sample_transposed is not None
        and _close(ref.sample_transposed, cand.sample, atol, rtol)
        and cand.shape == ref.shape[::-1]
    ):
        return ParameterDifference(
            name,
            TRANSPOSED,
            _sample_gap(ref.sample, cand.sample),
            f"the candidate holds the reference's {ref.shape} weight transposed (a copy that missed or added a .T)",
            candidate.path,
        )
    gap = _sample_gap(ref.sample, cand.sample)
    if ref.shape != cand.shape:
        return ParameterDifference(name, DIFFERENT, None, f"shape {ref.shape} vs {cand.shape}", candidate.path)
    return ParameterDifference(
        name,
        DIFFERENT,
        max(gap, _statistics_gap(ref_parameter, cand_parameter) or 0.0),
        f"values differ (a {len(ref.sample)}-value sample and statistics; a lower bound)",
        candidate.path,
    )


def _compare_full(
    name: str, ref: np.ndarray, cand: np.ndarray, atol: float, rtol: float, path: str
) -> ParameterDifference | None:
    ref64, cand64 = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    if ref64.shape == cand64.shape:
        gap = float(np.max(np.abs(ref64 - cand64))) if ref64.size else 0.0
        if np.allclose(cand64, ref64, rtol=rtol, atol=atol, equal_nan=True):
            return None
        if ref64.ndim == 2 and ref64.shape[0] == ref64.shape[1] and np.allclose(cand64, ref64.T, rtol=rtol, atol=atol):
            return ParameterDifference(
                name, TRANSPOSED, gap, "the candidate holds the reference's weight transposed (full tensors)", path
            )
        return ParameterDifference(name, DIFFERENT, gap, "full tensors", path)
    if ref64.ndim == 2 and cand64.shape == ref64.shape[::-1] and np.allclose(cand64, ref64.T, rtol=rtol, atol=atol):
        return ParameterDifference(
            name,
            TRANSPOSED,
            None,
            f"the candidate holds the reference's {list(ref64.shape)} weight transposed (full tensors)",
            path,
        )
    return ParameterDifference(name, DIFFERENT, None, f"shape {list(ref64.shape)} vs {list(cand64.shape)}", path)


def _close(first: list[float], second: list[float], atol: float, rtol: float) -> bool:
    return len(first) == len(second) and all(
        abs(a - b) <= atol + rtol * abs(a) or (a != a and b != b) for a, b in zip(first, second)
    )


def _sample_gap(first: list[float], second: list[float]) -> float:
    return max((abs(a - b) for a, b in zip(first, second)), default=0.0)


def _scale(parameter: ParameterRecord) -> float:
    summary = parameter.summary
    values = [abs(value) for value in (summary.min, summary.max, summary.std) if value is not None and value == value]
    return max(values, default=0.0)


def _statistics_gap(ref: ParameterRecord, cand: ParameterRecord) -> float | None:
    gaps = [
        abs(a - b)
        for a, b in (
            (ref.summary.mean, cand.summary.mean),
            (ref.summary.std, cand.summary.std),
            (ref.summary.min, cand.summary.min),
            (ref.summary.max, cand.summary.max),
        )
        if a is not None and b is not None and a == a and b == b
    ]
    return max(gaps) if gaps else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


# ------------------------------------------------------------------------------------- the diff's evidence


@dataclass(slots=True)
class ModuleEvidence:
    """What differs in how one aligned module pair was built."""

    path: str
    built_at: SourceLocation | None
    settings: list[SettingDifference]
    parameters: list[ParameterDifference]


def _held_below(builds: dict[str, ModuleBuild], path: str, name: str) -> bool:
    """Whether a module inside `path` holds a parameter called `name`: the other side keeps it one level deeper
    (timm's Swin attention holds its relative position bias table, transformers' a `relative_position_bias`
    submodule does), which is a difference of structure, not of build."""
    prefix = f"{path}." if path else ""
    return any(
        parameter.name == name
        for build_path, build in builds.items()
        if build_path.startswith(prefix) and build_path != path
        for parameter in build.parameters
    )


def module_evidence(result: DiffResult) -> dict[str, ModuleEvidence]:
    """Settings and parameter differences of every aligned module pair of a `DiffResult`, by candidate path,
    also set on each `ModuleResult` (every call of the module gets the same lists)."""
    ref_builds = {build.path: build for build in result.reference.trace.builds}
    cand_builds = {build.path: build for build in result.candidate.trace.builds}
    evidence: dict[str, ModuleEvidence] = {}
    if not ref_builds or not cand_builds:
        return evidence
    ref_store, cand_store = result.reference.tensors, result.candidate.tensors
    for module in result.modules:
        if module.reference is None:
            continue
        path = module.candidate.path
        found = evidence.get(path)
        if found is None and (" + " in path or " + " in module.reference.path):
            found = fused_evidence(module.reference.path, path, ref_builds, cand_builds, ref_store, cand_store)
            if found is None:
                continue
            evidence[path] = found
        if found is None:
            ref_build, cand_build = ref_builds.get(module.reference.path), cand_builds.get(path)
            if ref_build is None or cand_build is None:
                continue
            parameters = [
                difference
                for difference in compare_parameters(ref_build, cand_build, ref_store, cand_store)
                if not (difference.status == MISSING and _held_below(cand_builds, path, difference.name))
            ]
            found = evidence[path] = ModuleEvidence(
                path, cand_build.built_at, compare_settings(ref_build, cand_build), parameters
            )
        module.settings, module.parameters = found.settings, found.parameters
    return evidence


# ------------------------------------------------------------------------------------------- fused pairs

# NOTE: settings a fused module holds as the sum of its run's (its width), not as each member's
_WIDTH_SETTINGS = frozenset({"out_features", "out_channels", "num_embeddings"})


def fused_evidence(
    ref_path: str,
    cand_path: str,
    ref_builds: dict[str, ModuleBuild],
    cand_builds: dict[str, ModuleBuild],
    ref_store: Any = None,
    cand_store: Any = None,
) -> ModuleEvidence | None:
    """The build comparison of a fused pair (`qkv` against `q + k + v`, on either side), as one-to-one pairs get it
    (issue 30, item 4): each member's settings against the fused module's (its width left out), each parameter the
    reference side holds and the candidate side lacks (a member without the bias the fused module has), and the
    members' parameters concatenated on the first dimension against the fused one's (full tensors). The
    construction line is the line that built the candidate module at fault (the member without its bias), else
    the candidate's (first) module's."""
    ref_members = [ref_builds.get(path) for path in ref_path.split(" + ")]
    cand_members = [cand_builds.get(path) for path in cand_path.split(" + ")]
    if any(build is None for build in [*ref_members, *cand_members]):
        return None
    settings: list[SettingDifference] = []
    parameters: list[ParameterDifference] = []
    at_fault: list[ModuleBuild] = []
    fused_is_reference = len(ref_members) == 1
    fused, members = (ref_members[0], cand_members) if fused_is_reference else (cand_members[0], ref_members)
    for member in members:
        pair = (fused, member) if fused_is_reference else (member, fused)
        own = [difference for difference in compare_settings(*pair) if difference.name not in _WIDTH_SETTINGS]
        if own:
            settings.extend(own)
            at_fault.append(member if fused_is_reference else fused)
    names = dict.fromkeys(parameter.name for build in ref_members for parameter in build.parameters)
    for name in names:
        if any(_parameter(build, name) is None for build in ref_members):
            continue  # the reference side does not hold it throughout: nothing the candidate must have
        lacking = [build for build in cand_members if _parameter(build, name) is None]
        for build in lacking:
            holder = ref_path if fused_is_reference else " + ".join(ref_path.split(" + "))
            parameters.append(
                ParameterDifference(
                    name, MISSING, None, f"the candidate's {build.path} has no {name}; {holder} has one", build.path
                )
            )
            at_fault.append(build)
        if lacking:
            continue
        difference = _concatenated_difference(name, ref_members, cand_members, ref_store, cand_store)
        if difference is not None:
            parameters.append(difference)
    built = at_fault[0] if at_fault else cand_members[0]
    return ModuleEvidence(cand_path, built.built_at, settings, parameters)


def _parameter(build: ModuleBuild, name: str) -> ParameterRecord | None:
    return next((parameter for parameter in build.parameters if parameter.name == name), None)


def _concatenated_difference(
    name: str, ref_members: list[ModuleBuild], cand_members: list[ModuleBuild], ref_store: Any, cand_store: Any
) -> ParameterDifference | None:
    """The parameter `name` of each side, its members' concatenated on the first dimension, compared on the full
    tensors (None when either side's are not stored, or they agree to 1e-6 of their scale)."""
    sides = []
    for builds, store in ((ref_members, ref_store), (cand_members, cand_store)):
        arrays = []
        for build in builds:
            parameter = _parameter(build, name)
            if store is None or parameter is None or parameter.summary.tensor is None:
                return None
            try:
                arrays.append(np.asarray(store.get(parameter.summary.tensor), dtype=np.float64))
            except Exception:  # noqa: BLE001 - a damaged tensors file: no evidence either way
                return None
        if any(array.ndim == 0 for array in arrays):
            return None
        sides.append(np.concatenate(arrays, axis=0))
    reference, candidate = sides
    if reference.shape != candidate.shape:
        return ParameterDifference(
            name, "different", None, f"shapes {list(reference.shape)} vs {list(candidate.shape)} (concatenated)"
        )
    largest = float(np.abs(reference - candidate).max()) if reference.size else 0.0
    if largest <= 1e-6 * max(float(np.abs(reference).max()) if reference.size else 0.0, 1.0):
        return None
    return ParameterDifference(name, "different", largest, "the fused pair's parameters concatenated (full tensors)")
