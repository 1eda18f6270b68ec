"""Walking and reading a transformers config tree: a composite config's sub-configs, and reads that may refuse.

A composite model's config holds sub-configs (`text_config`, `vision_config`, an encoder-decoder's `encoder` and
`decoder`); the shrink, the config repairs and the input synthesiser all walk that tree the same way, here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def is_config(value: Any) -> bool:
    """Whether `value` is a transformers config (a sub-config of a composite one, say)."""
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def walk_configs(config: Any) -> Iterator[Any]:
    """A config and every sub-config inside it, depth first (the one walk of the config tree)."""
    yield config
    for value in vars(config).values():
        if is_config(value):
            yield from walk_configs(value)


def safe_getattr(config: Any, name: str, default: Any = None) -> Any:
    """`getattr` that takes a config's refusal (an exception) for absence."""
    try:
        return getattr(config, name, default)
    except Exception:  # noqa: BLE001 - per-layer attributes refuse a global read (Gemma 4)
        return default
