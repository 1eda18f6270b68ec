"""What a capture of a model needs that does not depend on its forward pass, worked out once per model and reused
while the model is unchanged (`modeltrace.capture` in a script or notebook captures one model many times).

Reused: the model's source files, its config as JSON, its construction records (`record_builds`: settings,
parameter fingerprints) and the reference to its parameters in the shared store. A tiny model's forward takes
2 ms; these took 6-15 ms per capture before (resolving each module class's file, fingerprinting every weight).

The change check (`ChangeCheck`) costs a few µs per module: the identity of every module, of each module's
public attributes (name and value) and of its private ones that hold a plain value (a number, a string, a
tuple, a dtype: what a setting or an `extra_repr` may be made of), of every value in the config (the values
themselves are kept alive by the check, so that an identity cannot be reused by a new object), each
parameter's and buffer's identity, data pointer, shape and version counter (every in-place write bumps it:
`load_state_dict`, an optimizer step, `copy_`), and the source files' modification time and size. Anything else
changes the check and the facts are worked out again. Private attributes holding a list, a dict or an object are
left out: they are never settings, and tools that run the model store their per-call state there (transformers'
model debugger replaces `_call_tree` and `_debugger_model_call_stack` at every call; nnsight adds
`__nnsight__`), which made every capture after such a call work the facts out again (10-30 ms at medium).
What it cannot see: a list or dict attribute changed in place (`module.sizes.append(3)`), a private list or
dict reassigned that a custom `extra_repr` prints, and a file rewritten within one timestamp tick with the same
size.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modeltrace.worker.capture import _capture_core, named_modules


@dataclass
class ChangeCheck:
    """A cheap picture of the model; equal pictures mean the reused facts still hold."""

    identities: tuple[int, ...]
    tensors: tuple[tuple[int, int, int, torch.Size], ...] | None
    files: tuple[tuple[str, int, int], ...]
    # NOTE: held only so that the identities above stay theirs (never compared)
    alive: list[Any] = field(repr=False, compare=False)


@dataclass
class ModelFacts:
    """The forward-independent facts of one model (see the module docstring)."""

    check: ChangeCheck
    files: list[str]
    config: dict[str, Any]
    # (parameters stored, max tensor bytes) -> construction records
    builds: dict[tuple[bool, int | None], list] = field(default_factory=dict)
    # id of a construction records list -> (that list, the store reference it was written with, its JSON)
    _json: dict[int, tuple[list, Any, list]] = field(default_factory=dict)

    def builds_json(self, builds: list, stored: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The JSON of `builds` (one of `self.builds`), made once per list and store reference: the records
        change only when the store marks their parameters differently (a store that could not be written)."""
        cached = self._json.get(id(builds))
        if cached is not None and cached[0] is builds and cached[1] == stored:
            return cached[2]
        data = [build.to_json() for build in builds]
        self._json[id(builds)] = (builds, stored, data)
        return data


# the types of a private attribute's value that the change check looks at (see the module docstring)
_PLAIN_TYPES = frozenset({bool, int, float, str, type(None), tuple, torch.Size, torch.dtype})

_FACTS: weakref.WeakKeyDictionary[nn.Module, ModelFacts] = weakref.WeakKeyDictionary()


def model_facts(model: nn.Module) -> ModelFacts:
    """The model's facts: the ones worked out at an earlier capture when its change check is equal, else new."""
    modules = [module for _, module in named_modules(model)]
    files = model_files(modules)
    check = _change_check(model, modules, files)
    facts = _FACTS.get(model)
    if facts is not None and facts.check == check:
        return facts
    facts = ModelFacts(check=check, files=files, config=_config_json(model))
    _FACTS[model] = facts
    return facts


def _change_check(model: nn.Module, modules: list[nn.Module], files: list[str]) -> ChangeCheck:
    core = _capture_core()
    # NOTE: the walk below in one pass in C where the extension module is built (a few µs a module in Python)
    state = core.watched_state(modules, model, _PLAIN_TYPES, _CANONICAL, _WATCHED_LIMIT) if core else None
    alive, tensors = state if state is not None else _watched_state(model, modules)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "__dict__"):
        alive.extend(vars(config).values())
    identities = tuple(map(id, alive))
    if id(model) in identities:  # NOTE: searched in C; the root is left out (above) in the rare model that holds it
        alive = [value for value in alive if value is not model]
        identities = tuple(map(id, alive))
    stamps = []
    for file in files:
        try:
            status = os.stat(file)
            stamps.append((file, status.st_mtime_ns, status.st_size))
        except OSError:
            stamps.append((file, -1, -1))
    return ChangeCheck(identities, tuple(tensors) if tensors is not None else None, tuple(stamps), alive)


def _watched_state(model: nn.Module, modules: list[nn.Module]) -> tuple[list[Any], list | None]:
    """Per module (the model itself left out) the module, its watched attribute names and their values; each
    parameter's and buffer's identity, data pointer, version and shape, or None where one has no version."""
    alive: list[Any] = []
    tensors: list[tuple[int, int, int, torch.Size]] | None = []
    for module in modules:
        if module is not model:  # NOTE: never the root itself: the weak cache entry would keep it alive
            alive.append(module)
        attributes = module.__dict__
        names, read = _watched(tuple(attributes), tuple(map(type, attributes.values())))
        alive.append(names)
        alive.extend(read(attributes))
        for tensor in (*module._parameters.values(), *module._buffers.values()):
            if tensor is None or tensors is None:
                continue
            try:
                tensors.append((id(tensor), tensor.data_ptr(), tensor._version, tensor.shape))
            except RuntimeError:  # an inference-mode tensor has no version counter: never reused
                tensors = None
    return alive, tensors


def _watched(names: tuple[str, ...], kinds: tuple[type, ...]) -> tuple[tuple[str, ...], Callable[[dict], tuple]]:
    """The attributes the change check looks at, for a module whose `__dict__` has these names holding values of
    these types (see the module docstring), and a reader of their values (`operator.itemgetter`): read in C, so
    that the check costs about a µs per module instead of a Python step per attribute (25-30 per module)."""
    key = (names, kinds)
    found = _WATCHED.get(key)
    if found is None:
        watched = tuple(
            name for name, kind in zip(names, kinds, strict=True) if not name.startswith("_") or kind in _PLAIN_TYPES
        )
        # NOTE: one tuple object per watched set, whatever else the layout holds: the check compares identities,
        # and a private attribute added by another tool must leave it equal
        watched = _CANONICAL.setdefault(watched, watched)
        if len(watched) == 1:
            only = watched[0]
            found = (watched, lambda attributes: (attributes[only],))
        else:
            found = (watched, operator.itemgetter(*watched) if watched else lambda _attributes: ())
        if len(_WATCHED) >= _WATCHED_LIMIT:
            _WATCHED.clear()
            _CANONICAL.clear()
        _WATCHED[key] = found
    return found


# (attribute names, their values' types) -> what `_watched` answers; module classes share a few layouts each
_WATCHED: dict[tuple[tuple[str, ...], tuple[type, ...]], tuple[tuple[str, ...], Callable[[dict], tuple]]] = {}
_CANONICAL: dict[tuple[str, ...], tuple[str, ...]] = {}
_WATCHED_LIMIT = 4096


def model_files(modules: list[nn.Module]) -> list[str]:
    """The source files of the modules' classes, the root's first, torch's own left out: the files whose lines
    are recorded (a `Sequential` of blocks written in a script records the script)."""
    found: dict[str, None] = {}
    for module_class in dict.fromkeys(type(module) for module in modules):
        file = _class_file(module_class)
        if file is not None:
            found.setdefault(file)
    return list(found)


@functools.lru_cache(maxsize=4096)
def _class_file(module_class: type) -> str | None:
    """The resolved source file of a module class, None for torch's own and classes without one (cached: a
    class's file does not move while it is loaded; resolving it cost 0.2 ms a module)."""
    try:
        file = inspect.getsourcefile(module_class)
    except (TypeError, OSError):
        return None
    if file is None:
        return None
    resolved = Path(file).resolve()
    return None if resolved.is_relative_to(_torch_folder()) else str(resolved)


@functools.cache
def _torch_folder() -> Path:
    return Path(torch.__file__).resolve().parent


def _config_json(model: nn.Module) -> dict[str, Any]:
    from modeltrace.worker.assemble import jsonable

    config = getattr(model, "config", None)
    return jsonable(config.to_dict()) if hasattr(config, "to_dict") else {}
