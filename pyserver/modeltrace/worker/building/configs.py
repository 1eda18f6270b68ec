"""Configs: the class a model is built from, its defaults, a config.json read as it is, and repairs of a tree.

Shrinking the defaults is `shrink.py` (its rows: `shrink_rules.py`, `shrink_steps.py`); this module finds the
config class (the model's `config_class`, else the one the file's base model or imports name), builds its
defaults (again with what its own validation says a field must be, when it rejects them), reads `--config`, sets
the attention implementation on every config of the tree, and lends a sub-config a field another config of the
tree has (`lend_attribute`).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.worker.building import shrink as shrinking
from modeltrace.worker.building.config_tree import safe_getattr, walk_configs
from modeltrace.worker.building.source import HUB_ID, choose_model_class, refuse_hub_id


def error_line(error: BaseException) -> str:
    """The line of an exception that says what is wrong, else its type's name."""
    return shrinking.first_line(error) or type(error).__name__


def config_class_of(model_class: type, module: ModuleType | None, file: Path) -> type:
    """The config class `model_class` is built from: its `config_class`, else (a plain module) the file's."""
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


def default_config(config_class: type, file: Path) -> Any:
    """`config_class()`, or built as its own validation says when it rejects its defaults."""
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
            f"{error_line(error)}); pass --config or --recipe"
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
    config_class = config_class_of(model_class, None, file)
    if config_path is not None:
        return read_config(config_class, Path(config_path))
    return shrink_config(config_class, default_config(config_class, file), file)


def read_config(config_class: type, config_path: Path) -> Any:
    """A config.json (or a folder holding one) read as `config_class`, as it is; hub ids refused."""
    if not config_path.exists():
        if HUB_ID.match(str(config_path)) and not str(config_path).startswith(("/", ".")):
            refuse_hub_id(str(config_path), "--config")
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
            f"{config_file}: cannot be read as {config_class.__name__} ({type(error).__name__}: {error_line(error)})"
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


def set_attention(config: Any, attention: str) -> None:
    """The attention implementation on every config of the tree; mixtures of experts run their eager loop
    too (the readable reference code, and the one that runs on any device and dtype, the meta device included)."""
    for node in walk_configs(config):
        for name, value in (("_attn_implementation", attention), ("_experts_implementation", "eager")):
            try:
                setattr(node, name, value)
            except Exception:  # noqa: BLE001 - a config that refuses it keeps its own
                pass


NO_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")


def lend_attribute(config: Any, error: BaseException) -> bool:
    """After "'DbrxAttentionConfig' object has no attribute 'rope_theta'": give that sub-config the value another
    config of the tree has (as a field, or as a key of a dict field such as `rope_parameters`). True if it did."""
    match = NO_ATTRIBUTE.search(str(error))
    if not isinstance(error, AttributeError) or match is None:
        return False
    owner_name, attribute = match.groups()
    nodes = list(walk_configs(config))
    owners = [node for node in nodes if type(node).__name__ == owner_name]
    value = None
    for node in nodes:
        if node in owners:
            continue
        found = safe_getattr(node, attribute)
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
