"""Build what a trace runs: import the user's file, pick the class, make its config, synthesise its inputs.

For a transformers-style modeling file nothing needs to be provided. The configuration class comes from the
model class (`config_class`); a copy of its defaults is shrunk (`shrink`) and inputs come from the `forward`
signature and the config (`inputs`). No rule set fits several hundred model families, so the builder tries
candidates: shrink levels from `tiny` to the config as it is, and input sets from every modality the model
takes to text alone, and keeps the first pair whose forward pass runs (a trial run of a tiny model costs
milliseconds). When none runs, the first candidate is returned, so that the trace fails where the model fails,
with a note that says what to provide instead (`--recipe`, `--config`).

Errors that name what they want are acted on, not just reported: a config class's validation saying what a field
must be ("requires indexer_kv_heads=1"), a sub-config missing a field that another config of the tree has, a
layer wanting another prompt length or audio frame width ("size of tensor a (7) must match ... b (8)"). A base
model whose forward takes inputs ModelTrace cannot make (a head fed by a backbone) gives way to another model
class of the file.

Other ways in:
- `--model CLASS`: any class of the file; a task head (`…ForCausalLM`), or a plain `nn.Module` such as a
  decoder layer or an MLP, built from the file's shrunk config (with `layer_idx=0` where its `__init__` wants
  one) and fed hidden states, rotary position embeddings from the file's rotary class, and so on;
- `--config PATH`: a config.json (or a folder holding one) used as it is, unshrunk;
- `checkpoint`: a local folder saved with `save_pretrained`, loaded with `from_pretrained(local_files_only=True)`;
- `shape_only`: the full-size config (`--config`, else the class defaults) built on the meta device (`shape_only`);
- a recipe file (`build_model()` and `build_inputs(model)`) for anything else.
ModelTrace never downloads: a hub id where a local path is expected is refused with what to do instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.rules import base_model_order, pick_base_model
from modeltrace.worker.assemble import jsonable
from modeltrace.worker.messages import DTYPE_NAMES, TraceRequest
from modeltrace.worker import shrink as shrinking
from modeltrace.worker.inputs import (
    BATCH_SIZE,
    DECODER_SEQUENCE_LENGTH,
    SEQUENCE_LENGTH,
    InputSynthesizer,
    sub_config,
    synthesize_inputs,
)


__all__ = [
    "BATCH_SIZE",
    "DECODER_SEQUENCE_LENGTH",
    "SEQUENCE_LENGTH",
    "BuiltModel",
    "build_from_file",
    "build_from_recipe",
    "build_from_request",
    "choose_model_class",
    "import_user_file",
    "load_config",
    "module_classes",
    "shrink_config",
    "synthesize_inputs",
]

# A model built for real (not on the meta device) above this many parameters is refused: it would take minutes
# and gigabytes on a laptop CPU. The shape-only mode has no such limit.
MAX_PARAMETERS = 300_000_000
# Seconds the builder may spend trying candidates before it settles for the first one.
DEFAULT_TRIAL_BUDGET = 60.0
# NOTE: the names are the messages' (`DTYPE_NAMES`, torch-free, what the CLI and the editor accept)
_DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass
class BuiltModel:
    """A model ready to trace, its inputs, and what the trace header says about them.

    `forward_context` wraps the traced forward pass (the shape-only mode's dispatch mode); `notes` say how the
    model was made (shrink level, input set, candidates that failed), for the header and for error messages.
    """

    model: nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    model_class: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    shape_only: bool = False
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


# --- the user's file ----------------------------------------------------------------------------------------


# `from ...modeling_utils import X`: the dots of a relative import statement, at the start of a line.
_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.+)[\w.]*[ \t]+import\b", re.MULTILINE)
# Where a copied folder is mounted inside transformers, by how many levels its imports climb past its top:
# `models/qwen3/` copied out of transformers climbs 2 (`from ...modeling_utils` in `qwen3/modeling_qwen3.py`).
# NOTE: only model folders: mounting a copy of another part of transformers (`generation/`, `models/` itself)
# would replace that part for the whole library.
_TRANSFORMERS_PARENTS = {2: "transformers.models"}
# NOTE: a model folder holds a handful of files; past this many the folder is not a copied model folder.
_MAX_SCANNED_FILES = 200


def _climb_past_top(folder: Path, depth: int) -> tuple[int, Path | None, int | None]:
    """How many levels the relative imports of the files in `folder` (a package `depth` levels below the top of
    its chain: 1 for the top itself) climb above that top (0: none), with the file and line that climbs highest.

    Only the traced file's own folder is read: the files a modeling file imports relatively sit beside it."""
    highest, where, where_line = 0, None, None
    for count, file in enumerate(sorted(folder.glob("*.py"))):
        if count >= _MAX_SCANNED_FILES:
            break
        try:
            source = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # In the package `top.a` (depth 2) `from ...x` (3 dots) climbs one level above `top`.
        for match in _RELATIVE_IMPORT.finditer(source):
            climb = len(match.group(1)) - depth
            if climb > highest:
                highest, where, where_line = climb, file, source.count("\n", 0, match.start()) + 1
    return highest, where, where_line


def _copied_folder_parent(top: Path, climb: int, where: Path | None, where_line: int | None) -> str:
    """The transformers package a copied folder (`models/qwen3/`) is imported into, so that its `...` imports
    resolve against the installed transformers; a ModelTraceError saying what to change where that cannot work."""
    statement = f"{where}:{where_line}" if where is not None else str(top)
    advice = (
        f"{statement}: a relative import climbs {climb} folder{'s' if climb > 1 else ''} above `{top.name}/`, the "
        f"top of its package (a folder copied out of transformers, such as `models/{top.name}/`?)"
    )
    parent = _TRANSFORMERS_PARENTS.get(climb)
    if parent is None or not top.name.isidentifier():
        raise ModelTraceError(
            f"{advice}; ModelTrace imports such a folder as part of transformers (as transformers.models."
            f"{top.name}) only when it is a model folder (its imports climb 2 levels, to transformers) and its name "
            "is a Python name: rename the folder, or make the imports absolute instead "
            "(`from ...modeling_utils import X` -> `from transformers.modeling_utils import X`)",
            str(where) if where is not None else None,
            where_line,
        )
    try:
        importlib.import_module(parent)
    except ImportError as error:
        raise ModelTraceError(
            f"{advice}; it is imported as {parent}.{top.name}, which needs transformers installed beside this torch "
            f"({error}): install transformers, or make the imports absolute (`from transformers.modeling_utils "
            "import X`)",
            str(where) if where is not None else None,
            where_line,
        ) from None
    return parent


def _mount_package(name: str, top: Path) -> None:
    """Import the folder `top` as the package `name` (`transformers.models.qwen3`): its modules are the folder's
    files, its relative imports resolve inside `name`'s parents. A package of that name imported before (the
    installed transformers' own `qwen3`) is forgotten first, so the copy is the one traced."""
    for loaded in [loaded for loaded in sys.modules if loaded == name or loaded.startswith(name + ".")]:
        del sys.modules[loaded]
    init = top / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(top)])
    if spec is None or spec.loader is None:
        raise ModelTraceError(f"{init}: cannot be imported as the package {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent_name, _, child = name.rpartition(".")
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    # NOTE: transformers' lazy `__init__` replaces its own sys.modules entry; the parent names whatever is there.
    setattr(sys.modules[parent_name], child, sys.modules[name])


def import_user_file(path: Path) -> ModuleType:
    """Import a modeling file as its package sees it, so relative imports (`.configuration_x`) work.

    The topmost folder of the chain of packages (folders with `__init__.py`) above the file is put on
    `sys.path` and the file imported under its dotted name; a file outside any package is imported by stem.
    A package whose relative imports climb above its top (`from ...modeling_utils` in a copy of transformers'
    `models/qwen3/`) is imported as the transformers package it was copied from (`transformers.models.qwen3`),
    so those imports resolve against the installed transformers.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelTraceError(f"{path}: no such file")
    if path.suffix != ".py":
        raise ModelTraceError(f"{path}: not a Python file")
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    climb, where, where_line = _climb_past_top(path.parent, len(parts) - 1) if len(parts) > 1 else (0, None, None)
    if climb > 0:
        parent = _copied_folder_parent(folder / parts[0], climb, where, where_line)
        package = f"{parent}.{parts[0]}"
        try:
            _mount_package(package, folder / parts[0])
            return importlib.import_module(".".join([package, *parts[1:]]))
        except SyntaxError as error:
            raise ModelTraceError(
                f"{error.filename}:{error.lineno}: syntax error: {error.msg}", error.filename, error.lineno
            ) from None
        except ImportError as error:
            raise ModelTraceError(
                f"{path}: imported as {package} (its relative imports climb above `{parts[0]}/`, resolved against "
                f"the installed transformers), the import failed: {error}; the copy may need a transformers version "
                f"that has what it imports, or absolute imports (`from transformers.modeling_utils import X`)"
            ) from None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module_name = ".".join(parts)
    cached = sys.modules.get(module_name)
    if cached is not None and Path(getattr(cached, "__file__", "") or "").resolve() != path:
        # The same dotted name imported from another folder earlier in this process (a copy of the package):
        # forget that package so that this file is the one imported.
        for name in [name for name in sys.modules if name == parts[0] or name.startswith(parts[0] + ".")]:
            del sys.modules[name]
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.path.insert(0, str(folder))
        importlib.invalidate_caches()
    try:
        return importlib.import_module(module_name)
    except SyntaxError as error:
        raise ModelTraceError(
            f"{error.filename}:{error.lineno}: syntax error: {error.msg}", error.filename, error.lineno
        ) from None
    except ModuleNotFoundError as error:
        missing = error.name or str(error)
        if missing.split(".")[0] in ("torchvision", "torchaudio", "timm", "PIL", "scipy", "librosa", "cv2"):
            raise ModelTraceError(
                f"{path}: imports {missing}, which is not installed beside this torch; install it, or pass --recipe"
            ) from None
        raise


def module_classes(module: ModuleType) -> list[type[nn.Module]]:
    """The `nn.Module` subclasses defined in `module` itself (not imported into it), in source order."""
    # NOTE: a module's namespace keeps definition order; `inspect.getsourcelines` would parse the whole file
    # once per class (seconds for a large modeling file).
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, nn.Module) and value.__module__ == module.__name__
    ]


def _is_pretrained_model(cls: type) -> bool:
    from transformers import PreTrainedModel

    return issubclass(cls, PreTrainedModel)


def _forbid_downloads() -> None:
    """Make every Hugging Face Hub call fail fast instead of reaching the network (config classes may resolve a
    backbone name on the hub; `from_pretrained` might fall back to it). This process is a per-trace child."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True
    except (ImportError, AttributeError):
        pass


def _refuse_hub_id(value: str, what: str) -> None:
    raise ModelTraceError(
        f"{what} {value!r} looks like a Hugging Face Hub model id, and ModelTrace never downloads: save the model "
        "locally with save_pretrained and point to that folder (checkpoint setting, or --config for its "
        "config.json), or pass --recipe"
    )


def choose_model_class(module: ModuleType, requested: str | None, file: Path) -> type[nn.Module]:
    """`requested` by name, else the file's base model: a PreTrainedModel that is neither the abstract
    `…PreTrainedModel` nor a head (`…ForCausalLM`); among several, the one named like `XModel` (the shortest).

    The rule is `rules.pick_base_model`, which also picks the editor's "Trace forward" class.
    """
    classes = module_classes(module)
    if requested:
        if "/" in requested and not Path(requested).exists() and _HUB_ID.match(requested):
            _refuse_hub_id(requested, "--model")
        for cls in classes:
            if cls.__name__ == requested:
                return cls
        candidate = getattr(module, requested, None)
        if inspect.isclass(candidate) and issubclass(candidate, nn.Module):
            return candidate
        names = ", ".join(cls.__name__ for cls in classes) or "none"
        raise ModelTraceError(f"{file}: no nn.Module class named {requested!r} (classes in the file: {names})")
    if not classes:
        raise ModelTraceError(f"{file}: defines no nn.Module subclass to trace; pass --recipe to build one")
    # A composite that only generates (Bark) has no forward of its own: one of its parts is traced instead.
    models = [
        cls
        for cls in classes
        if _is_pretrained_model(cls)
        and not cls.__name__.endswith("PreTrainedModel")
        and getattr(cls, "forward", None) is not getattr(nn.Module, "forward", None)
    ]
    chosen = pick_base_model([cls.__name__ for cls in models])
    if chosen is not None:
        return next(cls for cls in models if cls.__name__ == chosen)
    raise ModelTraceError(
        f"{file}: defines nn.Module classes ({', '.join(cls.__name__ for cls in classes)}) but no transformers "
        "model (PreTrainedModel subclass) whose config ModelTrace could build; pass --model CLASS or --recipe"
    )


# --- configs ------------------------------------------------------------------------------------------------


def _config_class(model_class: type, module: ModuleType | None, file: Path) -> type:
    config_class = getattr(model_class, "config_class", None)
    if config_class is None and module is not None:
        # A plain nn.Module: the config of the file's model, else the one config class the file imports.
        try:
            base = choose_model_class(module, None, file)
            config_class = getattr(base, "config_class", None)
        except ModelTraceError:
            config_class = None
        if config_class is None:
            from transformers import PretrainedConfig

            found = [
                value
                for value in vars(module).values()
                if inspect.isclass(value)
                and issubclass(value, PretrainedConfig)
                and value is not PretrainedConfig
                and getattr(value, "model_type", "")
            ]
            config_class = found[0] if len(found) == 1 else None
    if config_class is None:
        raise ModelTraceError(
            f"{file}: {model_class.__name__} names no config class (`config_class` or a `config:` annotation); "
            "pass --config or --recipe"
        )
    return config_class


def _default_config(config_class: type, file: Path) -> Any:
    try:
        return config_class()
    except Exception as error:  # noqa: BLE001 - any failure of user config code is reported, not raised
        # Defaults that the class's own validation rejects with a message saying what a field must be
        # ("hidden_size_per_layer_input must be 0, got 256"): built again with that value (a field of a
        # sub-config, the text config of a composite, goes to each sub-config in turn).
        built = _default_config_as_told(config_class, error)
        if built is not None:
            return built
        raise ModelTraceError(
            f"{file}: cannot build {config_class.__name__}() with its defaults ({type(error).__name__}: "
            f"{_first_line(error)}); pass --config or --recipe"
        ) from None


def _default_config_as_told(config_class: type, error: BaseException) -> Any:
    parameters = inspect.signature(config_class).parameters
    told: dict[str, int] = {}
    for _ in range(4):
        fresh = {
            name: value
            for name, value in shrinking.told_values(str(error)).items()
            if isinstance(value, int) and told.get(name) != value
        }
        if not fresh:
            return None
        told.update(fresh)
        own = {name: value for name, value in told.items() if name in parameters}
        tries = (
            [own]
            if len(own) == len(told)
            else [
                {**own, sub_name: {name: value for name, value in told.items() if name not in own}}
                for sub_name in getattr(config_class, "sub_configs", None) or {}
            ]
        )
        for arguments in tries:
            try:
                return config_class(**arguments)
            except Exception as next_error:  # noqa: BLE001
                error = next_error
    return None


def load_config(model_class: type[nn.Module], config_path: Path | None, file: Path) -> Any:
    """The config to build with: `config_path` as it is, else a shrunk copy of the config class's defaults."""
    config_class = _config_class(model_class, None, file)
    if config_path is not None:
        return _read_config(config_class, Path(config_path))
    return shrink_config(config_class, _default_config(config_class, file), file)


def _read_config(config_class: type, config_path: Path) -> Any:
    if not config_path.exists():
        if _HUB_ID.match(str(config_path)) and not str(config_path).startswith(("/", ".")):
            _refuse_hub_id(str(config_path), "--config")
        raise ModelTraceError(
            f"{config_path}: no such config file or folder (ModelTrace never downloads: give a local "
            "config.json or a folder saved with save_pretrained)"
        )
    config_file = config_path / "config.json" if config_path.is_dir() else config_path
    if not config_file.is_file():
        raise ModelTraceError(f"{config_path}: holds no config.json")
    try:
        config = config_class.from_json_file(str(config_file))
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{config_file}: cannot be read as {config_class.__name__} ({type(error).__name__}: {_first_line(error)})"
        ) from None
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def shrink_config(config_class: type, defaults: Any, file: Path) -> Any:
    """The most shrunk config of `defaults` that its class accepts (see `shrink`): hidden 64, 2 layers, ..."""
    try:
        for _, config in shrinking.shrink_candidates(defaults):
            return config
    except ModelTraceError as error:
        raise ModelTraceError(f"{file}: {error}") from None
    raise ModelTraceError(f"{file}: {config_class.__name__} cannot be shrunk; pass --config or --recipe")


def _set_attention(config: Any, attention: str) -> None:
    """The attention implementation on every config of the tree; mixtures of experts run their eager loop
    too (the readable reference code, and the one that runs on any device and dtype, the meta device included)."""
    for node in shrinking.walk_configs(config):
        for name, value in (("_attn_implementation", attention), ("_experts_implementation", "eager")):
            try:
                setattr(node, name, value)
            except Exception:  # noqa: BLE001 - a config that refuses it keeps its own
                pass


# --- building -----------------------------------------------------------------------------------------------


def _first_line(error: BaseException) -> str:
    return shrinking.first_line(error) or type(error).__name__


def _count_parameters_on_meta(build: Callable[[], nn.Module]) -> int | None:
    from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

    try:
        with ShapeOnlyMode(), meta_device():
            model = build()
    except Exception:  # noqa: BLE001 - a model whose __init__ needs real tensors: no estimate
        return None
    return sum(parameter.numel() for parameter in model.parameters())


_NO_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")


def _lend_attribute(config: Any, error: BaseException) -> bool:
    """After "'DbrxAttentionConfig' object has no attribute 'rope_theta'": give that sub-config the value another
    config of the tree has (as a field, or as a key of a dict field such as `rope_parameters`). True if it did."""
    match = _NO_ATTRIBUTE.search(str(error))
    if not isinstance(error, AttributeError) or match is None:
        return False
    owner_name, attribute = match.groups()
    nodes = list(shrinking.walk_configs(config))
    owners = [node for node in nodes if type(node).__name__ == owner_name]
    value = None
    for node in nodes:
        if node in owners:
            continue
        found = shrinking.safe_getattr(node, attribute)
        if found is None:
            found = next(
                (item[attribute] for item in vars(node).values() if isinstance(item, dict) and attribute in item), None
            )
        if found is not None:
            value = found
            break
    if value is None or not owners:
        return False
    lent = False
    for owner in owners:
        try:
            setattr(owner, attribute, value)
            lent = True
        except Exception:  # noqa: BLE001
            pass
    return lent


def _construct(model_class: type, config: Any, seed: int, file: Path) -> nn.Module:
    torch.manual_seed(seed)
    try:
        try:
            model = model_class(config)
        except AttributeError as error:
            # A sub-config missing a field the model reads and the parent config has: lent, then built again.
            if not _lend_attribute(config, error):
                raise
            torch.manual_seed(seed)
            model = model_class(config)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__} failed: {type(error).__name__}: {_first_line(error)}"
        ) from error
    _prepare(model)
    return model.eval()


def _prepare(model: nn.Module) -> None:
    """What a model needs set before any forward pass: X-MOD's default language adapter."""
    languages = getattr(getattr(model, "config", None), "languages", None)
    if callable(getattr(model, "set_default_language", None)) and languages:
        try:
            model.set_default_language(list(languages)[0])
        except Exception:  # noqa: BLE001 - the forward pass says what is missing
            pass


@dataclass
class _Attempt:
    level: str
    inputs: str
    error: str


def _run(model: nn.Module, kwargs: dict[str, Any], context: Callable[[], contextlib.AbstractContextManager]) -> None:
    with torch.no_grad(), context():
        model(**kwargs)


def _try_inputs(
    model: nn.Module,
    synthesizer: InputSynthesizer,
    context: Callable[[], contextlib.AbstractContextManager],
    deadline: float,
    attempts: list[_Attempt],
    level: str,
    always_try: bool,
) -> tuple[str, dict[str, Any]] | None:
    """The first input set `model` runs with, or None. An error that names the token count a tower wants
    ("tokens: 3, features: 16") rebuilds the prompt with that count and retries (twice at most)."""
    variants = list(synthesizer.variants())
    if not variants:
        attempts.append(_Attempt(level, "-", f"forward needs {', '.join(synthesizer.missing())}"))
        return None
    if len(variants) == 1 and not always_try:
        return variants[0]
    for name, kwargs in variants:
        # What the retries below learn (a prompt length, a feature width) holds for this input set only.
        learnt = (synthesizer.text_length, synthesizer.feature_width)
        for _ in range(3):
            try:
                _run(model, kwargs, context)
                return name, kwargs
            except Exception as error:  # noqa: BLE001 - the next candidate may run
                message = f"{type(error).__name__}: {_first_line(error)}"
                changed = (
                    _repair_config(synthesizer, error)
                    or synthesizer.fit_text_length(kwargs, error)
                    or synthesizer.fit_feature_width(kwargs, error)
                )
                for modality in ("image", "video", "audio"):
                    if modality in name and modality in str(error).lower():
                        changed = synthesizer.note_mismatch(modality, error) or changed
                if not changed:
                    attempts.append(_Attempt(level, name, message))
                    break
                kwargs = dict(_rebuild_variant(synthesizer, name))
                if time.monotonic() > deadline:
                    return None
        synthesizer.text_length, synthesizer.feature_width = learnt
    return None


def _repair_config(synthesizer: InputSynthesizer, error: BaseException) -> bool:
    """A config read by the forward pass for a field it lacks: lent from another config of the tree, or, for a
    special token id (Qwen3-Omni's `vision_start_token_id`), given an ordinary id no other special token uses.
    True if the config changed (the inputs are then synthesised again: the prompt may use the new token)."""
    config = synthesizer.config
    if _lend_attribute(config, error):
        synthesizer.feature_counts.clear()
        return True
    match = _NO_ATTRIBUTE.search(str(error))
    if not isinstance(error, AttributeError) or match is None or not match.group(2).endswith("_token_id"):
        return False
    owners = [node for node in shrinking.walk_configs(config) if type(node).__name__ == match.group(1)]
    if not owners:
        return False
    token = int(synthesizer.text_tokens(1)[0])
    for owner in owners:
        try:
            setattr(owner, match.group(2), token)
        except Exception:  # noqa: BLE001
            return False
    return True


def _rebuild_variant(synthesizer: InputSynthesizer, name: str) -> dict[str, Any]:
    for candidate, kwargs in synthesizer.variants():
        if candidate == name:
            return kwargs
    return {}


def build_from_file(
    file: Path,
    model_name: str | None,
    config_path: Path | None,
    seed: int,
    attention: str = "eager",
    *,
    checkpoint: Path | str | None = None,
    shape_only: bool = False,
    dtype: str = "float32",
    trial_budget: float = DEFAULT_TRIAL_BUDGET,
    load_options: dict[str, Any] | None = None,
) -> BuiltModel:
    """The file's model (or `model_name`) ready to run, with synthesised inputs; see the module docstring.
    `load_options` go to `from_pretrained` with a checkpoint: `device_map` (`worker/placement.py`), `tp_plan`
    (`worker/parallel.py`)."""
    _forbid_downloads()
    file = Path(file)
    if checkpoint is not None:
        _check_checkpoint(checkpoint)
    module = import_user_file(file)
    model_class = choose_model_class(module, model_name, file)
    if checkpoint is not None:
        return _build_checkpoint(model_class, Path(checkpoint), seed, attention, file, load_options)
    if load_options:
        raise ModelTraceError(
            f"{', '.join('--' + name.replace('_', '-') for name in load_options)} loads a checkpoint: give the "
            "local folder saved with save_pretrained (--checkpoint DIR, or the checkpoint setting)"
        )
    if not _is_pretrained_model(model_class):
        return _build_plain_module(module, model_class, config_path, seed, attention, file, shape_only, dtype)
    config_class = _config_class(model_class, module, file)
    if shape_only:
        config = (
            _read_config(config_class, Path(config_path))
            if config_path
            else shrinking.shrink(_default_config(config_class, file), "default")
        )
        return _build_shape_only(model_class, config, seed, attention, file, dtype)
    if config_path is not None:
        config = _read_config(config_class, Path(config_path))
        _set_attention(config, attention)
        model = _construct(model_class, config, seed, file)
        synthesizer = InputSynthesizer(model, config, seed)
        chosen = _try_inputs(
            model, synthesizer, contextlib.nullcontext, time.monotonic() + trial_budget, [], "config", always_try=False
        )
        return _result(model, model_class, config, chosen, synthesizer, {"config": str(config_path)})
    try:
        return _build_shrunk(model_class, _default_config(config_class, file), seed, attention, file, trial_budget)
    except (_NothingBuilt, _CannotSynthesise) as error:
        if model_name:
            raise
        # The base model cannot even be constructed from its class's defaults (a composite whose default parts
        # disagree), or its forward takes inputs that cannot be synthesised (a table-recognition head fed by a
        # backbone, a detection model whose image input is named `hidden_states`): another model class of the
        # file may do, its task head included (`…ForObjectDetection` takes `pixel_values`).
        reason = getattr(error, "reason", None) or str(error).split(": ", 1)[-1]
        for other in _other_models(module, model_class)[:3]:
            try:
                config_class = _config_class(other, module, file)
                built = _build_shrunk(
                    other, _default_config(config_class, file), seed, attention, file, trial_budget / 2
                )
            except ModelTraceError:
                continue
            built.notes["instead_of"] = f"{model_class.__name__} ({reason})"
            return built
        raise


_MISSING_LIBRARY = re.compile(r"requires the ([\w.-]+) library but it was not found")


class _CannotSynthesise(ModelTraceError):
    """The model builds but its forward needs inputs ModelTrace cannot make (another class of the file may not)."""


class _NothingBuilt(ModelTraceError):
    """No shrunk config of the class could even be constructed (as opposed to built and failed to run)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _other_models(module: ModuleType, chosen: type) -> list[type]:
    """The file's other non-abstract models, base models first (by the base-model rule), then heads."""
    models = [
        cls
        for cls in module_classes(module)
        if cls is not chosen
        and _is_pretrained_model(cls)
        and not cls.__name__.endswith("PreTrainedModel")
        and getattr(cls, "forward", None) is not getattr(nn.Module, "forward", None)
    ]
    return sorted(models, key=lambda cls: base_model_order(cls.__name__))


def _build_shrunk(
    model_class: type, defaults: Any, seed: int, attention: str, file: Path, trial_budget: float
) -> BuiltModel:
    deadline = time.monotonic() + trial_budget
    attempts: list[_Attempt] = []
    first: Candidate | None = None  # the first model that built, kept in case no input set runs unaided
    previous_failures: list[_Attempt] = []
    rejected: list[str] = []
    try:
        candidates = list(shrinking.shrink_candidates(defaults, rejected))
    except ModelTraceError as error:
        raise _NothingBuilt(f"{file}: {error}", str(error)) from None
    for reason in rejected:
        level, _, error = reason.partition(": ")
        attempts.append(_Attempt(level, "-", f"config rejected: {error}"))
    for level, config in candidates:
        _set_attention(config, attention)
        if True:  # every level: a name the rules do not know can leave a huge table in a "tiny" config
            count = _count_parameters_on_meta(lambda: model_class(config))
            if count is not None and count > MAX_PARAMETERS:
                limit = f"{count / 1e6:.0f}M parameters, above the {MAX_PARAMETERS / 1e6:.0f}M limit"
                attempts.append(_Attempt(level, "-", limit))
                continue
        try:
            model = _construct(model_class, config, seed, file)
        except ModelTraceError as error:
            attempts.append(_Attempt(level, "-", str(error).split(": ", 1)[-1]))
            if time.monotonic() > deadline:
                break
            continue
        synthesizer = InputSynthesizer(model, config, seed)
        failed_before = len(attempts)
        chosen = _try_inputs(model, synthesizer, contextlib.nullcontext, deadline, attempts, level, always_try=True)
        if chosen is None and _same_failure(attempts, failed_before, previous_failures):
            # The same programming error at two sizes (a NameError, a missing attribute): a bug, not a size.
            first = first or _first_candidate(model, config, synthesizer, level)
            break
        previous_failures = attempts[failed_before:]
        if chosen is not None:
            notes = {"shrink": level}
            if attempts:
                notes["failed_candidates"] = [f"{a.level} / {a.inputs}: {a.error}" for a in attempts]
            return _result(model, model_class, config, chosen, synthesizer, notes)
        if first is None:
            first = _first_candidate(model, config, synthesizer, level)
        if time.monotonic() > deadline:
            break
    if first is None or first.inputs is None:
        reasons = "; ".join(f"{a.level}: {a.error}" for a in attempts[:3]) or "no candidate"
        missing = first.synthesizer.missing() if first is not None else []
        if missing:
            raise _CannotSynthesise(
                f"{file}: {model_class.__name__}.forward needs {', '.join(missing)}, which ModelTrace cannot "
                "synthesise; pass --recipe with build_model() and build_inputs(model)"
            )
        message = (
            f"{file}: {model_class.__name__} could not be built from a shrunk {type(defaults).__name__}: {reasons}; "
            "pass --config with a small config.json, or --recipe"
        )
        libraries = [_MISSING_LIBRARY.search(attempt.error) for attempt in attempts]
        if first is None and attempts and all(libraries):
            # Not a size problem: a library the model (or a part of it, a timm backbone) imports is missing.
            message = (
                f"{file}: {model_class.__name__} needs the {libraries[0].group(1)} library, which is not installed "
                "here; install it, or pass --recipe with build_model() and build_inputs(model)"
            )
        if first is None:
            raise _NothingBuilt(message, attempts[0].error if attempts else "no candidate")
        raise ModelTraceError(message)
    config, chosen, level = first.config, first.inputs, first.level
    notes = {"shrink": level, "failed_candidates": [f"{a.level} / {a.inputs}: {a.error}" for a in attempts]}
    tried = len({(a.level, a.inputs) for a in attempts})
    notes["unverified"] = (
        f"no shrunk {type(defaults).__name__} and synthesised input set ran unaided ({tried} tried); pass --recipe "
        "with build_model() and build_inputs(model), or --config with a small config.json"
    )
    # Rebuilt so that the traced run starts from the same weights and inputs as a fresh build.
    model = _construct(model_class, config, seed, file)
    synthesizer = InputSynthesizer(model, config, seed)
    return _result(model, model_class, config, _rebuild_first(synthesizer, chosen), synthesizer, notes)


@dataclass
class Candidate:
    """A model built from one shrunk config, with its synthesiser and first input set (None: it has none)."""

    model: nn.Module
    config: Any
    inputs: tuple[str, dict[str, Any]] | None
    synthesizer: InputSynthesizer
    level: str


def _first_candidate(model: nn.Module, config: Any, synthesizer: InputSynthesizer, level: str) -> Candidate:
    variants = list(synthesizer.variants())
    return Candidate(model, config, variants[0] if variants else None, synthesizer, level)


_NOT_SIZE_ERRORS = (
    "NameError",
    "AttributeError",
    "TypeError",
    "KeyError",
    "ImportError",
    "ModuleNotFoundError",
    "NotImplementedError",
    "ZeroDivisionError",
    "UnboundLocalError",
    "SyntaxError",
)


def _same_failure(attempts: list[_Attempt], start: int, previous: list[_Attempt]) -> bool:
    """Whether this level failed with exactly the errors of the level before, and not with size errors."""
    current = attempts[start:]
    if not current or not previous:
        return False
    signature = [re.sub(r"\d+", "N", attempt.error) for attempt in current]
    if signature != [re.sub(r"\d+", "N", attempt.error) for attempt in previous]:
        return False
    return all(attempt.error.split(":", 1)[0] in _NOT_SIZE_ERRORS for attempt in current)


def _rebuild_first(synthesizer: InputSynthesizer, chosen: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    for name, kwargs in synthesizer.variants():
        if name == chosen[0]:
            return name, kwargs
    return chosen


def _result(
    model: nn.Module,
    model_class: type,
    config: Any,
    chosen: tuple[str, dict[str, Any]] | None,
    synthesizer: InputSynthesizer,
    notes: dict[str, Any],
) -> BuiltModel:
    if chosen is None:
        raise ModelTraceError(
            f"{model_class.__name__}.forward needs {', '.join(synthesizer.missing())}, which ModelTrace cannot "
            "synthesise; pass --recipe with build_model() and build_inputs(model)"
        )
    name, kwargs = chosen
    # Fresh inputs (the trial run may have changed them in place), from the same seed.
    kwargs = _rebuild_variant(synthesizer, name) or kwargs
    return BuiltModel(
        model=model,
        kwargs=kwargs,
        model_class=model_class.__name__,
        config=jsonable(config.to_dict()),
        notes={**notes, "inputs": name},
    )


# --- local checkpoints --------------------------------------------------------------------------------------


def _check_checkpoint(checkpoint: Path | str) -> None:
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelTraceError(
                f"checkpoint {str(checkpoint)!r}: the folder holds no config.json (save the model with "
                "save_pretrained into it)"
            )
        return
    if _HUB_ID.match(str(checkpoint)) and not str(checkpoint).startswith(("/", ".", "~")):
        _refuse_hub_id(str(checkpoint), "checkpoint")
    raise ModelTraceError(
        f"checkpoint {str(checkpoint)!r}: no such folder (ModelTrace never downloads: save the model locally "
        "with save_pretrained and point to that folder, or pass --recipe)"
    )


def _build_checkpoint(
    model_class: type, folder: Path, seed: int, attention: str, file: Path, load_options: dict[str, Any] | None = None
) -> BuiltModel:
    if not _is_pretrained_model(model_class):
        raise ModelTraceError(
            f"{file}: {model_class.__name__} is not a transformers model (PreTrainedModel), so it cannot load a "
            "checkpoint folder; pass --recipe"
        )
    torch.manual_seed(seed)
    options = dict(load_options or {})
    if options.get("device_map") is not None:
        from modeltrace.worker.placement import check_device_map_fits, check_device_map_names

        check_device_map_fits(options["device_map"], model_class)
        if isinstance(options["device_map"], dict):
            skeleton = None
            with contextlib.suppress(Exception), torch.device("meta"):
                skeleton = model_class(model_class.config_class.from_pretrained(str(folder), local_files_only=True))
            if skeleton is not None:
                check_device_map_names(options["device_map"], skeleton, model_class)
    try:
        # NOTE: weights_only=True (also transformers' default): a pickled `pytorch_model.bin` is read with torch's
        # restricted unpickler, so a checkpoint cannot run code; safetensors files are never pickles.
        model = model_class.from_pretrained(
            str(folder), local_files_only=True, attn_implementation=attention, weights_only=True, **options
        )
    except ModelTraceError:
        raise
    except Exception as error:  # noqa: BLE001
        if options.get("device_map") is not None:
            _explain_device_map_failure(error, options["device_map"], model_class, folder)
        raise ModelTraceError(
            f"{folder}: loading {model_class.__name__} from this folder failed ({type(error).__name__}: "
            f"{_first_line(error)})"
        ) from error
    model.eval()
    config = model.config
    _restore_buffers(model, model_class, config)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    synthesizer = InputSynthesizer(model, config, seed)
    chosen = _try_inputs(
        model,
        synthesizer,
        contextlib.nullcontext,
        time.monotonic() + DEFAULT_TRIAL_BUDGET,
        [],
        "checkpoint",
        always_try=False,
    )
    return _result(model, model_class, config, chosen, synthesizer, {"checkpoint": str(folder.resolve())})


def _explain_device_map_failure(error: Exception, device_map: Any, model_class: type, folder: Path) -> None:
    """A failed `from_pretrained(device_map=...)` said in the map's terms, when the cause is the map."""
    from modeltrace.worker.placement import check_device_map_covers

    if isinstance(device_map, dict):
        skeleton = None
        with contextlib.suppress(Exception), torch.device("meta"):
            skeleton = model_class(model_class.config_class.from_pretrained(str(folder), local_files_only=True))
        if skeleton is not None:
            check_device_map_covers(device_map, skeleton, model_class)
    raise ModelTraceError(
        f"{folder}: loading {model_class.__name__} with --device-map {json_text(device_map)} failed "
        f"({type(error).__name__}: {_first_line(error)})"
    ) from error


def json_text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built in here get their parameters on the meta device (one at a time on the CPU first) and their
    buffers for real: what `__init__` computes (rotary frequencies, position ids) without the weights."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, parameter: Any) -> None:
        register(self, name, parameter)
        if parameter is not None and parameter.device.type != "meta":
            self._parameters[name] = nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _restore_buffers(model: nn.Module, model_class: type, config: Any) -> None:
    """Non-persistent buffers (not in the checkpoint) as the class's `__init__` computes them.

    `from_pretrained` builds the model on the meta device and leaves non-persistent buffers (a rotary embedding's
    `inv_freq`) to the model's `_init_weights`; a model that does not set them there gets uninitialised memory.
    """
    persistent = set(model.state_dict())
    loose = {name: buffer for name, buffer in model.named_buffers() if name not in persistent}
    if not loose:
        return
    try:
        with _parameters_on_meta():
            fresh = model_class(config)
    except Exception:  # noqa: BLE001 - the loaded model keeps what from_pretrained gave it
        return
    computed = dict(fresh.named_buffers())
    with torch.no_grad():
        for name, buffer in loose.items():
            value = computed.get(name)
            if value is not None and value.device.type != "meta" and value.shape == buffer.shape:
                buffer.copy_(value.to(device=buffer.device, dtype=buffer.dtype))


# --- shape-only ---------------------------------------------------------------------------------------------


def _build_shape_only(model_class: type, config: Any, seed: int, attention: str, file: Path, dtype: str) -> BuiltModel:
    from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

    torch_dtype = _DTYPES.get(dtype)
    if torch_dtype is None:
        raise ModelTraceError(f"--dtype {dtype!r}: choose one of {', '.join(_DTYPES)}")
    _set_attention(config, attention)
    mode = ShapeOnlyMode()
    torch.manual_seed(seed)
    try:
        with mode, meta_device():
            model = model_class(config)
            model.to(dtype=torch_dtype)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__} on the meta device failed: {type(error).__name__}: "
            f"{_first_line(error)}"
        ) from error
    model.eval()
    synthesizer = InputSynthesizer(
        model, config, seed, convert=lambda value: _meta_inputs(mode, value, torch_dtype), context=lambda: mode
    )
    chosen = _try_inputs(
        model, synthesizer, lambda: mode, time.monotonic() + DEFAULT_TRIAL_BUDGET, [], "shape-only", always_try=False
    )
    built = _result(model, model_class, config, chosen, synthesizer, {"shape_only": True})
    built.shape_only = True
    built.forward_context = lambda: mode
    built.notes["approximations"] = mode.approximations
    return built


def _meta_inputs(mode: Any, value: Any, dtype: torch.dtype) -> Any:
    """Synthesised inputs on the meta device (with their values as shadows), floating ones in `dtype`."""
    from torch.utils import _pytree as pytree

    from modeltrace.worker.shape_only import to_meta_inputs

    def cast(item: Any) -> Any:
        return item.to(dtype) if isinstance(item, torch.Tensor) and item.is_floating_point() else item

    return to_meta_inputs(mode, pytree.tree_map(cast, value))


# --- plain nn.Modules ---------------------------------------------------------------------------------------


_HIDDEN_INPUTS = (
    "hidden_states",
    "hidden_state",
    "x",
    "input",
    "inputs",
    "hidden",
    "features",
    "inputs_embeds",
    "embeddings",
    "input_tensor",
    "h",
)


def _build_plain_module(
    module: ModuleType,
    model_class: type,
    config_path: Path | None,
    seed: int,
    attention: str,
    file: Path,
    shape_only: bool,
    dtype: str,
) -> BuiltModel:
    """A non-model class of the file (a decoder layer, an attention block, an MLP) from the file's config."""
    config_class = _config_class(model_class, module, file)
    if config_path is not None:
        config = _read_config(config_class, Path(config_path))
    elif shape_only:
        config = shrinking.shrink(_default_config(config_class, file), "default")
    else:
        config = shrink_config(config_class, _default_config(config_class, file), file)
    _set_attention(config, attention)
    text_config = sub_config(config, "text")
    torch.manual_seed(seed)
    mode = None
    if shape_only:
        from modeltrace.worker.shape_only import ShapeOnlyMode, meta_device

        mode = ShapeOnlyMode()
        with mode, meta_device():
            model = _construct_plain(model_class, text_config, file)
            model.to(dtype=_DTYPES.get(dtype, torch.float32))
    else:
        model = _construct_plain(model_class, text_config, file)
    model.eval()
    kwargs = _plain_inputs(module, model, text_config, seed, file)
    if mode is not None:
        kwargs = {name: _meta_inputs(mode, value, _DTYPES.get(dtype, torch.float32)) for name, value in kwargs.items()}
    built = BuiltModel(
        model=model,
        kwargs=kwargs,
        model_class=model_class.__name__,
        config=jsonable(text_config.to_dict()),
        notes={"plain_module": True},
        shape_only=shape_only,
    )
    if mode is not None:
        built.forward_context = lambda: mode
    return built


def _construct_plain(model_class: type, config: Any, file: Path) -> nn.Module:
    parameters = inspect.signature(model_class.__init__).parameters
    arguments: dict[str, Any] = {}
    unknown = []
    hidden = _hidden_size(config)
    for name, parameter in list(parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name == "config" or name.endswith("_config") and parameter.default is inspect.Parameter.empty:
            arguments[name] = config
        elif name in ("layer_idx", "layer_id", "layer_index", "layer_number", "block_idx"):
            arguments[name] = 0
        elif parameter.default is not inspect.Parameter.empty:
            continue
        elif name in ("hidden_size", "dim", "embed_dim", "d_model", "hidden_dim", "in_features", "input_dim"):
            arguments[name] = hidden
        elif isinstance(getattr(config, name, None), (int, float, str)):
            arguments[name] = getattr(config, name)
        else:
            unknown.append(name)
    if unknown:
        raise ModelTraceError(
            f"{file}: {model_class.__name__}.__init__ needs {', '.join(unknown)}, which ModelTrace cannot guess; "
            "pass --recipe with build_model() and build_inputs(model)"
        )
    try:
        return model_class(**arguments)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: building {model_class.__name__}({', '.join(arguments)}) failed: {type(error).__name__}: "
            f"{_first_line(error)}; pass --recipe"
        ) from error


def _hidden_size(config: Any) -> int:
    for name in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return shrinking.WIDTH


def _plain_inputs(module: ModuleType, model: nn.Module, config: Any, seed: int, file: Path) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    hidden = _hidden_size(config)
    shape = (BATCH_SIZE, SEQUENCE_LENGTH)
    parameters = inspect.signature(model.forward).parameters
    inputs: dict[str, Any] = {}
    missing: list[str] = []
    hidden_states = torch.randn(*shape, _width_of(model, hidden), generator=generator)
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        required = parameter.default is inspect.Parameter.empty
        if name in _HIDDEN_INPUTS:
            inputs[name] = hidden_states
        elif name == "position_embeddings" and (required or _rotary_class(module) is not None):
            embeddings = _position_embeddings(module, config, hidden_states, file)
            if embeddings is None and required:
                missing.append(name)
            elif embeddings is not None:
                inputs[name] = embeddings
        elif name in ("position_ids", "cache_position"):
            if required:
                positions = torch.arange(SEQUENCE_LENGTH)
                inputs[name] = positions.unsqueeze(0) if name == "position_ids" else positions
        elif name == "input_ids" and required:
            vocab = int(getattr(config, "vocab_size", 128) or 128)
            inputs[name] = torch.randint(0, vocab, shape, generator=generator)
        elif name == "use_cache":
            inputs[name] = False
        elif required:
            missing.append(name)
    if missing:
        raise ModelTraceError(
            f"{file}: {type(model).__name__}.forward needs {', '.join(missing)}, which ModelTrace cannot synthesise "
            "for a plain module; pass --recipe with build_model() and build_inputs(model)"
        )
    return inputs


def _width_of(model: nn.Module, hidden: int) -> int:
    """The feature size the module's first linear layer takes (an MLP's input), else the config's hidden size."""
    for submodule in model.modules():
        if isinstance(submodule, nn.Linear):
            return submodule.in_features
        if isinstance(submodule, nn.LayerNorm) and submodule.normalized_shape:
            return int(submodule.normalized_shape[-1])
    return hidden


def _rotary_class(module: ModuleType) -> type | None:
    for cls in module_classes(module):
        if "Rotary" in cls.__name__ and "Embedding" in cls.__name__:
            return cls
    return None


def _position_embeddings(module: ModuleType, config: Any, hidden_states: torch.Tensor, file: Path) -> Any:
    rotary_class = _rotary_class(module)
    if rotary_class is None:
        return None
    try:
        rotary = rotary_class(config=config)
        positions = torch.arange(hidden_states.shape[1]).unsqueeze(0)
        with torch.no_grad():
            return rotary(hidden_states, positions)
    except Exception as error:  # noqa: BLE001
        raise ModelTraceError(
            f"{file}: computing position_embeddings with {rotary_class.__name__} failed ({type(error).__name__}: "
            f"{_first_line(error)}); pass --recipe"
        ) from None


# --- recipes and requests -----------------------------------------------------------------------------------


def build_from_recipe(recipe: Path, seed: int) -> BuiltModel:
    """Call the recipe's `build_model()` and `build_inputs(model)` (with the seed set before each)."""
    recipe = Path(recipe).resolve()
    if not recipe.is_file():
        raise ModelTraceError(f"{recipe}: no such recipe file")
    spec = importlib.util.spec_from_file_location(f"modeltrace_recipe_{recipe.stem}", recipe)
    if spec is None or spec.loader is None:
        raise ModelTraceError(f"{recipe}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered like any import, so that inspect (and so `defined_at`) finds the recipe's classes.
    sys.modules[spec.name] = module
    sys.path.insert(0, str(recipe.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ModelTraceError(
            f"{error.filename}:{error.lineno}: syntax error: {error.msg}", error.filename, error.lineno
        ) from None
    for function_name in ("build_model", "build_inputs"):
        if not callable(getattr(module, function_name, None)):
            raise ModelTraceError(
                f"{recipe}: defines no {function_name}() (a recipe needs build_model() and build_inputs(model))"
            )
    torch.manual_seed(seed)
    model = module.build_model()
    if not isinstance(model, nn.Module):
        raise ModelTraceError(f"{recipe}: build_model() returned {type(model).__name__}, not an nn.Module")
    model.eval()
    torch.manual_seed(seed)
    inputs = module.build_inputs(model)
    args: tuple = ()
    kwargs: dict[str, Any] = {}
    if isinstance(inputs, dict):
        kwargs = dict(inputs)
    elif isinstance(inputs, tuple):
        args = inputs
    elif isinstance(inputs, torch.Tensor):
        args = (inputs,)
    else:
        raise ModelTraceError(
            f"{recipe}: build_inputs(model) returned {type(inputs).__name__}; return a dict of keyword "
            "arguments or a tuple of positional ones"
        )
    config = getattr(model, "config", None)
    return BuiltModel(
        model=model,
        args=args,
        kwargs=kwargs,
        model_class=type(model).__name__,
        config=jsonable(config.to_dict()) if hasattr(config, "to_dict") else {},
    )


def build_from_request(request: TraceRequest, offload_folder: str | None = None) -> BuiltModel:
    """Build what a trace request (see `job.run_trace_job`) asks for: recipe, checkpoint, config, shape-only.
    `offload_folder`: where accelerate offloads the weights of a `device_map` run to disk (the job removes it)."""
    if request.recipe:
        if request.shape_only:
            raise ModelTraceError("--shape-only works on a modeling file's classes, not with --recipe")
        return build_from_recipe(Path(request.recipe), request.seed)
    return build_from_file(
        Path(request.file),
        request.model,
        Path(request.config) if request.config else None,
        request.seed,
        request.attention,
        checkpoint=request.checkpoint or None,
        shape_only=request.shape_only,
        dtype=request.dtype,
        trial_budget=min(DEFAULT_TRIAL_BUDGET, request.timeout / 2),
        load_options=_load_options(request, offload_folder),
    )


def _load_options(request: TraceRequest, offload_folder: str | None) -> dict[str, Any] | None:
    """`from_pretrained` options for a model spread over devices (`device_map`) or ranks (`tp_plan`)."""
    options: dict[str, Any] = {}
    if request.device_map:
        import tempfile

        from modeltrace.worker.placement import parse_device_map

        options["device_map"] = parse_device_map(request.device_map)
        options["offload_folder"] = offload_folder or tempfile.mkdtemp(prefix="modeltrace-offload-")
        options["dtype"] = _DTYPES.get(request.dtype, torch.float32)
    if request.tp_plan:
        options["tp_plan"] = request.tp_plan
        options["dtype"] = _DTYPES.get(request.dtype, torch.float32)
    return options or None
