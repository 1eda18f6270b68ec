"""The user's file: import it as its package sees it, list its classes, pick the one to build.

The first step after the spec for every strategy but a recipe: the file is imported (a folder copied out of
transformers is mounted inside it), its `nn.Module` classes are listed in source order, and the class to build
is the one `--model` names or the file's base model (`rules.pick_base_model`, shared with the editor).
ModelTrace never downloads: a hub id where a local path is expected is refused with what to do instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.modular.twins import is_modular_file, resolve_generated
from modeltrace.rules import base_model_order, pick_base_model

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


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
    """Import a modeling file as its package sees it, so relative imports (`.configuration_x`) work; a modular
    file (`modular_x.py`) is its generated twin (`modeling_x.py`).

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
    if is_modular_file(path):
        # NOTE: modular source only means something through transformers' converter (`nn.Module.__init__()` without
        # `self`, `del` of inherited attributes): what runs is the generated twin beside it (`modular/twins.py`)
        path = resolve_generated(path)
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


def is_pretrained_model(cls: type) -> bool:
    from transformers import PreTrainedModel

    return issubclass(cls, PreTrainedModel)


def forbid_downloads() -> None:
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


def refuse_hub_id(value: str, what: str) -> None:
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
        if "/" in requested and not Path(requested).exists() and HUB_ID.match(requested):
            refuse_hub_id(requested, "--model")
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
        if is_pretrained_model(cls)
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


def other_models(module: ModuleType, chosen: type) -> list[type]:
    """The file's other non-abstract models, base models first (by the base-model rule), then heads."""
    models = [
        cls
        for cls in module_classes(module)
        if cls is not chosen
        and is_pretrained_model(cls)
        and not cls.__name__.endswith("PreTrainedModel")
        and getattr(cls, "forward", None) is not getattr(nn.Module, "forward", None)
    ]
    return sorted(models, key=lambda cls: base_model_order(cls.__name__))
