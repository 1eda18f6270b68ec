"""What a worker's build of a model depends on, as one key: the parameter store remembers the digest of the
weights each key's build made (`parameter_store.WeightWork`), so that a trace with full tensors of a model built
the same way again names its stored weights without reading all of them.

The worker builds a fresh model for every trace (a new process, or a child forked per trace), so the digest that
`capture()` keeps per model object is lost each time; proving the new weights equal a stored file's bytes read
every weight and the file (a medium Llama: 17-32 ms after each forward, a quarter of the forward). The key covers
what a build reads (`BuildInputs`, around `build_from_request`):

- the request's fields that can change the model (every field but where the trace goes and how it is shown);
- every file the build opens through Python (`open`, `pathlib`, `os.open`: the recipe, a config, `torch.load`,
  `numpy.load`) and every module it imports, each by size, modification time and inode; a checkpoint folder's
  files the same way (safetensors reads them in native code, which no Python open sees);
- the code loaded before the build (the project's, an editable transformers: every module file outside the
  interpreter's own library and its site-packages, whose folders' times change when a package is installed),
  the library versions, the CPU and the environment variables torch, transformers and ModelTrace read.

A key never proves the weights: the store's entry also holds the digest of the weights' fingerprints (statistics
and samples of every tensor, `builds.ParameterFingerprints`), which must be equal, and the store file must start
every tensor with the model's bytes. What passes all three and still differs would take an input no key names
(a file read by native code, a clock) that changes only elements no fingerprint samples.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import io
import json
import os
import platform
import sys
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

# NOTE: bumped when what a key covers changes: older entries then miss, never match wrongly
KEY_FORMAT = 1
# Request fields that say where the trace goes, what it shows and how much of the activations it keeps, never what
# is built (the editor's `max_trace_mb` changes once a reference is pinned). The stored weights' own limit
# (`max_tensor_mb`) stays in: it decides which tensors the digest covers.
OUTPUT_FIELDS = frozenset(
    {
        "out",
        "timeout",
        "lines",
        "follow",
        "replay",
        "keep_for_replay",
        "keep_calls_mb",
        "max_trace_mb",
        "tensor_memory_mb",
    }
)
# Environment variables whose prefixes name what can change a build (the libraries' switches, torch's threads).
ENVIRONMENT_PREFIXES = ("HF_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA_", "MODELTRACE_", "OMP_", "MKL_")
# NOTE: a checkpoint folder with more files than this is not keyed (its listing would cost more than the match)
MAX_CHECKPOINT_FILES = 512

_recorders: list[BuildInputs] = []
_lock = threading.Lock()
# module file -> (the module, its file's identity when the module was first seen): the code in memory is what
# the file held when it was imported (the zygote takes those it preloaded before it forks); a module made again
# (a recipe, executed by every build) is a new object, its file looked at again
_loaded_code: dict[str, tuple[weakref.ref, tuple | None]] = {}


def _note_opened(file: Any, relative_to_folder: bool = False) -> None:
    if not _recorders or isinstance(file, int):  # NOTE: an open file descriptor was opened, and noted, before
        return
    try:
        if relative_to_folder:
            raise ValueError("a path relative to a folder's descriptor")
        _recorders[-1].opened.add(os.path.abspath(os.fsdecode(file)))
    except Exception:  # noqa: BLE001 - never fails the build's own open; the build is only not keyed
        _recorders[-1].unnamed = True


def _recording_open(file: Any, *args: Any, **kwargs: Any) -> Any:
    _note_opened(file)
    return _OPENS["builtins.open"](file, *args, **kwargs)


def _recording_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
    _note_opened(path, kwargs.get("dir_fd") is not None)
    return _OPENS["os.open"](path, *args, **kwargs)


# NOTE: the opens a build's Python code reaches (`open`, `pathlib`'s `io.open`, `os.open`), replaced while a build
# records, not an audit hook: a hook, never removable, is called for every `id()` and `sys._getframe` of the
# process after it (~3,000 in a tiny Llama's worker trace: ~0.4 ms on a 2.6 ms forward). `linecache` reads
# through `tokenize.open`, bound when it was imported: the source lines read for the records are not inputs.
_REPLACEMENTS = {"builtins.open": _recording_open, "io.open": _recording_open, "os.open": _recording_os_open}
_HOLDERS = {"builtins.open": builtins, "io.open": io, "os.open": os}
# what each was when the replacements went in (put back as found, whoever had set it)
_OPENS: dict[str, Any] = {"builtins.open": builtins.open, "io.open": io.open, "os.open": os.open}


def _replace_opens(replace: bool) -> None:
    for name, holder in _HOLDERS.items():
        attribute = name.split(".")[1]
        if replace:
            _OPENS[name] = getattr(holder, attribute)
        setattr(holder, attribute, _REPLACEMENTS[name] if replace else _OPENS[name])


def identity(path: str) -> tuple | None:
    """A file's size, modification time and inode, None when it cannot be read."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return (status.st_size, status.st_mtime_ns, status.st_ino)


@functools.cache
def _library_folders() -> tuple[str, ...]:
    """The interpreter's standard library and site-packages folders: their files change only by an install."""
    import sysconfig

    folders = {sys.base_prefix, sys.base_exec_prefix}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        folder = sysconfig.get_paths().get(name)
        if folder:
            folders.add(folder)
    folders.update(path for path in sys.path if path.endswith(("site-packages", "dist-packages")))
    # NOTE: never the root, under which everything would count as installed
    return tuple(sorted(folder.rstrip(os.sep) + os.sep for folder in folders if folder.strip(os.sep)))


def _module_files(names: Iterable[str]) -> list[tuple[str, ModuleType]]:
    files = []
    for name in names:
        module = sys.modules.get(name)
        # NOTE: the module's own dict, not getattr: a lazy module (transformers') would import on a getattr
        namespace = getattr(module, "__dict__", None)
        file = namespace.get("__file__") if isinstance(namespace, dict) else None
        if isinstance(file, str) and isinstance(module, ModuleType):
            files.append((file, module))
    return files


def note_loaded_code() -> set[str]:
    """Take the identity of the code loaded so far, outside the library folders (the zygote, before it forks:
    its children run the code as it was imported, whatever the files hold by then); returns every loaded
    module's file."""
    libraries = _library_folders()
    modules = _module_files(list(sys.modules))
    for file, module in modules:
        known = _loaded_code.get(file)
        if (known is None or known[0]() is not module) and not file.startswith(libraries):
            _loaded_code[file] = (weakref.ref(module), identity(file))
    return {file for file, _ in modules}


def _code_identities(loaded: set[str]) -> list:
    """The identities taken of the module files loaded now (outside the library folders)."""
    return sorted([file, known[1]] for file, known in _loaded_code.items() if file in loaded)


class BuildInputs:
    """Context manager around a build: the files it opens and the modules it imports; `key(request)` after it."""

    def __init__(self) -> None:
        self.opened: set[str] = set()
        self.unnamed = False  # a file opened whose path could not be read: no key
        self._modules_before: set[str] = set()
        self.imported: list[str] = []

    def __enter__(self) -> BuildInputs:
        self._modules_before = set(sys.modules)
        with _lock:
            if not _recorders:
                _replace_opens(True)
            _recorders.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with _lock:
            if self in _recorders:
                _recorders.remove(self)
            if not _recorders:
                _replace_opens(False)
        self.imported = [
            file for file, _ in _module_files(name for name in list(sys.modules) if name not in self._modules_before)
        ]

    def key(self, request: Any) -> str | None:
        """The build's key (hex SHA-256), or None when it cannot be told (anything unreadable: not remembered)."""
        if self.unnamed:
            return None
        try:
            return hashlib.sha256(json.dumps(self._described(request), sort_keys=True).encode()).hexdigest()
        except Exception:  # noqa: BLE001 - a build not keyed is only a byte match: never the trace's failure
            return None

    def _described(self, request: Any) -> dict[str, Any]:
        import dataclasses

        import torch
        import transformers

        # NOTE: a module's file, or its bytecode, counts as code, not as a file read: the first build in a process
        # imports what later ones find loaded, and reads the source lines of the frames it records (`linecache`)
        module_files = note_loaded_code()
        fields = {
            field.name: getattr(request, field.name)
            for field in dataclasses.fields(request)
            if field.name not in OUTPUT_FIELDS
        }
        for name in ("file", "recipe", "config", "checkpoint"):
            if isinstance(fields.get(name), str) and fields[name]:
                fields[name] = os.path.realpath(fields[name])
        files = sorted(
            file
            for file in {*self.opened, *self.imported}
            if file not in module_files and f"{os.sep}__pycache__{os.sep}" not in file
        )
        return {
            "format": KEY_FORMAT,
            "request": fields,
            "read": {file: identity(file) for file in files},
            "checkpoint": _checkpoint_files(fields.get("checkpoint")),
            "code": _code_identities(module_files),
            "libraries": {folder: identity(folder) for folder in _library_folders()},
            "versions": {
                "python": sys.version,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "machine": platform.machine(),
                "cpu": torch.backends.cpu.get_cpu_capability(),
                "threads": torch.get_num_threads(),
            },
            "environment": {
                name: value for name, value in os.environ.items() if name.startswith(ENVIRONMENT_PREFIXES)
            },
        }


def _checkpoint_files(checkpoint: Any) -> list | None:
    """Every file of a checkpoint (a folder, walked; or a file) by identity. Raises ValueError past
    `MAX_CHECKPOINT_FILES` (the build is then not keyed)."""
    if not isinstance(checkpoint, str) or not checkpoint:
        return None
    if not os.path.isdir(checkpoint):
        return [[checkpoint, identity(checkpoint)]]
    files = []
    for folder, _, names in os.walk(checkpoint):
        for name in names:
            path = str(Path(folder, name))
            files.append([path, identity(path)])
            if len(files) > MAX_CHECKPOINT_FILES:
                raise ValueError(f"{checkpoint} holds more than {MAX_CHECKPOINT_FILES} files")
    return sorted(files)
