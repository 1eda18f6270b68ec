"""What the vision pairs share: the input image, and stand-ins for packages their references import but never
use in a forward.

Stand-ins: torchvision (no CPU
build in the registry here) and PIL (not installed): timm and open_clip import them at module level for data
transforms, datasets and `FrozenBatchNorm2d`, none of which the traced models run. The speech pair (EnCodec) asks for
torchaudio the same way (`importing_without(("torchaudio",))`: its utilities read and write audio files).

`importing_without()` is a context manager: inside it, each of those packages that is not importable is found
as a stand-in (with every submodule asked for); any name read from a stand-in is a fresh class that accepts
anything, so module-level imports, subclassing and attribute reads (`InterpolationMode.BILINEAR`) work. On
leaving, the stand-ins are taken out of `sys.modules` again (the modules that imported them keep their names),
so that later `find_spec("PIL")` checks (transformers' `is_vision_available`) in the same process still see the
truth. Used by the vision pairs' recipes (test setup only, never by ModelTrace itself).

Like `corpus_common.py`, this file sits beside the pair folders, and the harness copies it beside a patched copy.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STUBBED = ("torchvision", "PIL")


class _StandInMeta(type):
    """Class attributes of a stand-in class are stand-in classes too (`InterpolationMode.BILINEAR`)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(name)


def _stand_in(name: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        pass

    return _StandInMeta(name, (), {"__init__": __init__, "__module__": "torchvision"})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stand_in(name)
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the packages it was given (and their submodules) as stand-in packages."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.packages:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0"  # read at import time (timm parses PIL's version)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def importing_without(packages: tuple[str, ...] = STUBBED) -> Iterator[None]:
    """Stand in for each of `packages` that is not importable here, for the imports made inside.

    NOTE: name only what the imports inside need: a library imported inside that probes for a stand-in package
    (transformers caches `is_vision_available()` from `find_spec("PIL")`) would believe it installed."""
    missing = tuple(name for name in packages if importlib.util.find_spec(name) is None)
    finder = _StandInFinder(missing)
    sys.meta_path.append(finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if name.split(".")[0] in missing]:
            if isinstance(sys.modules[name], _StandInModule):
                del sys.modules[name]


IMAGE_SIZE = 64


def pixel_values(size: int = IMAGE_SIZE, seed: int = 0) -> Any:
    """A seeded `[1, 3, size, size]` image batch, the same on both sides of a pair."""
    import torch

    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed))


def import_timm() -> None:
    """Import timm (its package `__init__` imports its data transforms, which import torchvision and PIL)."""
    with importing_without():
        import timm  # noqa: F401


def upstream_definitions(script: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The top-level functions, classes and assigned names (`MAPPING = {...}`) `names` of a transformers conversion
    script, by name, run in the order the script defines them.

    The script is published code, not committed here: the corpus stages it from its mirror beside the pair's
    files (`Pair.sources`, see ports/sources.py). It cannot be imported as a module (it imports the package it
    was written in, a hub client and image libraries at its top, for the download and checks around the
    conversion), so its own imports are run one by one, those that cannot be satisfied here skipped (the
    functions used do not read them), and then just the named definitions, unchanged.
    """
    # NOTE: a module registered under its own name, as an import would: dataclasses look their class's module up
    module = types.ModuleType(f"upstream_{script.stem}")
    module.__file__ = str(script)
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    source = script.read_text()
    tree = ast.parse(source, filename=str(script))
    with importing_without():
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                try:
                    exec(compile(ast.Module(body=[node], type_ignores=[]), str(script), "exec"), namespace)  # noqa: S102
                except ImportError:
                    continue
    found = {_defined_name(node): node for node in tree.body if _defined_name(node) in names}
    missing = [name for name in names if name not in found]
    if missing:
        raise LookupError(f"{script}: no top-level definition of {', '.join(missing)}")
    # NOTE: in the script's order: a mapping table may be built from others (`MAPPING_24K = {**MAPPING_ENCODER}`)
    body = [node for node in tree.body if _defined_name(node) in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(script), "exec"), namespace)  # noqa: S102
    return {name: namespace[name] for name in names}


def _defined_name(node: ast.stmt) -> str | None:
    """The name a top-level statement defines: a function, a class, or a single name assigned (`MAPPING = ...`)."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None
