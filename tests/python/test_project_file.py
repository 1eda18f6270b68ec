"""The project file (`modeltrace.toml`, `[tool.modeltrace]` in a pyproject.toml), the recipe writer, and the small
values a plain module's arguments get: examples of each, and every broken input named on its line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modeltrace.lsp.classes import find_module_classes
from modeltrace.plain_arguments import guess_argument
from modeltrace.project import ProjectFileError, find_project_file, project_choices, read_project
from modeltrace.recipe_writer import recipe_path_for, register_recipe, write_recipe
from modeltrace.worker.messages import RecipeArgument, RecipeDraft


def _model(folder: Path, name: str = "modeling_tiny.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("from torch import nn\n\n\nclass Block(nn.Module):\n    pass\n")
    return path


def test_the_nearest_project_file_applies_and_its_entry_wins_over_its_top_level(tmp_path: Path) -> None:
    model = _model(tmp_path / "models" / "tiny")
    (tmp_path / "models" / "tiny" / "block_recipe.py").write_text("")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "small.json").write_text("{}")
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent("""
        [project]
        name = "ported"

        [tool.modeltrace]
        config = "configs/small.json"
        atol = 1e-4
        maps = ["^h\\\\.=>layers."]

        [[tool.modeltrace.model]]
        file = "models/tiny/modeling_tiny.py"
        class = "Block"
        recipe = "models/tiny/block_recipe.py"
        rel_tol = 0.01
        """)
    )
    assert find_project_file(model) == tmp_path / "pyproject.toml"
    choices = project_choices(model, "Block")
    assert choices.recipe == (tmp_path / "models" / "tiny" / "block_recipe.py").resolve()
    assert choices.config == (tmp_path / "configs" / "small.json").resolve()
    assert (choices.atol, choices.rel_tol, choices.maps) == (1e-4, 0.01, ("^h\\.=>layers.",))
    assert choices.recipe_line == 13 and choices.entry_line == 10
    # Another class of the file: the top level only. No class asked for: the file's one entry names it.
    assert project_choices(model, "Other").recipe is None
    assert project_choices(model).model_class == "Block"
    # A modeltrace.toml nearer the file wins; a pyproject.toml without [tool.modeltrace] is not a project file.
    (tmp_path / "models" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "models" / "tiny" / "modeltrace.toml").write_text("atol = 0.5\n")
    assert find_project_file(model) == tmp_path / "models" / "tiny" / "modeltrace.toml"
    assert project_choices(model, "Block").atol == 0.5 and project_choices(model, "Block").recipe is None


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('atol = 1e-3\n[[model]\nfile = "a.py"\n', 2, "TOML syntax error"),
        ('atol = 1e-3\ncolour = "red"\n', 2, "unknown key `colour`"),
        ('[[model]]\nfile = "modeling_tiny.py"\nrecipie = "r.py"\n', 3, "unknown key `recipie`"),
        ('[[model]]\nfile = "modeling_tiny.py"\nrecipe = "missing.py"\n', 3, "missing.py, which is not there"),
        ("atol = -1\n", 1, "finite number >= 0"),
        ('maps = ["no arrow"]\n', 1, "'REGEX=>REPL'"),
        ('\n[[model]]\nclass = "Block"\n', 2, "names no `file`"),
    ],
)
def test_a_broken_project_file_is_refused_on_its_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    model = _model(tmp_path)
    (tmp_path / "modeltrace.toml").write_text(text)
    with pytest.raises(ProjectFileError) as raised:
        project_choices(model)
    assert raised.value.line == line and words in str(raised.value), str(raised.value)
    assert str(raised.value).startswith(f"{tmp_path / 'modeltrace.toml'}:{line}: ")


def test_the_cli_traces_with_the_project_files_recipe_and_names_a_broken_one(tmp_path: Path) -> None:
    model = tmp_path / "block.py"
    model.write_text(
        "from torch import nn\n\n\nclass Scaled(nn.Module):\n    def __init__(self, dim, scale):\n"
        "        super().__init__()\n        self.proj = nn.Linear(dim, dim)\n        self.scale = scale\n\n"
        "    def forward(self, x):\n        return self.proj(x) * self.scale\n"
    )
    (tmp_path / "scaled_recipe.py").write_text(
        "import torch\nfrom block import Scaled\n\n\ndef build_model():\n    return Scaled(8, 2.0)\n\n\n"
        "def build_inputs(model):\n    return {'x': torch.randn(1, 3, 8)}\n"
    )
    (tmp_path / "modeltrace.toml").write_text(
        '[[model]]\nfile = "block.py"\nclass = "Scaled"\nrecipe = "scaled_recipe.py"\n'
    )
    command = [sys.executable, "-m", "modeltrace", "trace", str(model), "--out", str(tmp_path / "t.mtrace")]
    traced = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert traced.returncode == 0, traced.stderr
    assert "[1, 3, 8]" in traced.stdout and "(from " in traced.stderr, traced.stdout
    (tmp_path / "modeltrace.toml").write_text('[[model]]\nfile = "block.py"\nrecipe = "nope.py"\n')
    refused = subprocess.run([*command[:-2], "--out", str(tmp_path / "u.mtrace")], capture_output=True, text=True)
    assert refused.returncode == 2 and "modeltrace.toml:3: `recipe` names nope.py" in refused.stderr, refused.stderr


DRAFT = RecipeDraft(
    model_class="Scaled",
    file="",
    module="modeling_tiny",
    reason="cannot guess scale",
    arguments=(RecipeArgument("dim", "64"), RecipeArgument("scale", "None", guessed=False, note="no annotation")),
    inputs=(RecipeArgument("x", "torch.randn((1, 7, 64))"),),
)


def test_the_recipe_writer_never_overwrites_and_registers_the_recipe(tmp_path: Path) -> None:
    model = _model(tmp_path)
    written = write_recipe(DRAFT, model)
    assert written.path == tmp_path / "modeling_tiny_Scaled_recipe.py"
    assert written.project_file == tmp_path / "modeltrace.toml" and written.todo_names == ("scale",)
    text = written.path.read_text()
    compile(text, str(written.path), "exec")  # the recipe is Python
    assert "from modeling_tiny import Scaled" in text and "        dim=64," in text
    assert text.splitlines()[written.todo_lines[0] - 1].strip().startswith("scale=None,  # TODO")
    assert project_choices(model, "Scaled").recipe == written.path
    # A second recipe gets a new name and replaces the entry's recipe line: one entry per file and class.
    second = write_recipe(DRAFT, model)
    assert second.path.name == "modeling_tiny_Scaled_recipe_2.py" and written.path.read_text() == text
    assert project_choices(model, "Scaled").recipe == second.path
    assert len(read_project(tmp_path / "modeltrace.toml").models) == 1
    assert recipe_path_for(model, "Scaled").name == "modeling_tiny_Scaled_recipe_3.py"


def test_a_recipe_is_registered_in_a_pyproject_and_a_broken_one_is_left_as_it_was(tmp_path: Path) -> None:
    model = _model(tmp_path)
    recipe = tmp_path / "r.py"
    recipe.write_text("")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.modeltrace]\natol = 1e-3\n')
    assert register_recipe(model, "Block", recipe) == pyproject
    assert "[[tool.modeltrace.model]]" in pyproject.read_text()
    assert project_choices(model, "Block").recipe == recipe and project_choices(model, "Block").atol == 1e-3
    broken = '[tool.modeltrace]\nmodel = "not a table"\n'
    pyproject.write_text(broken)
    with pytest.raises(ProjectFileError):
        register_recipe(model, "Block", recipe)
    assert pyproject.read_text() == broken


def test_plain_arguments_get_small_values_from_names_and_annotations() -> None:
    arguments = [
        ("dim", None, 64),
        ("hidden", None, 128),
        ("num_heads", "int", 4),
        ("head_dim", None, 16),
        ("eps", "float", 1e-6),
        ("dropout", None, 0.0),
        ("bias", "bool", True),
        ("scale", "float", 1.0),  # the annotation alone: a small value of its type
        ("size", "int", 16),
        ("scale", None, None),  # neither says anything: a recipe must give it
        ("norm", "nn.Module", None),
        ("dim", "tuple[int, int]", None),  # a width's name, but not a number
    ]
    for name, annotation, expected in arguments:
        guess = guess_argument(name, annotation)
        assert (guess.value if guess else None) == expected, (name, annotation, guess)


def test_the_lens_knows_which_plain_modules_need_a_recipe() -> None:
    source = textwrap.dedent("""
        from torch import nn

        class TinyBlock(nn.Module):
            def __init__(self, dim, hidden, num_heads=8, *, eps: float = 1e-5):
                super().__init__()

        class Scaled(nn.Module):
            def __init__(self, dim, scale):
                super().__init__()

        class Typed(nn.Module):
            def __init__(self, dim: int, scale: float, gated: bool):
                super().__init__()

        class Normed(nn.Module):
            def __init__(self, dim, *, norm: nn.Module):
                super().__init__()
    """)
    needs = {cls.name: cls.needs_recipe for cls in find_module_classes(source)}
    assert needs == {"TinyBlock": False, "Scaled": True, "Typed": False, "Normed": True}


def test_no_advice_of_the_worker_reaches_the_editor_as_a_command_line_flag() -> None:
    """Every string of the worker's code that advises an option reads, in the editor, as a setting or a lens."""
    import ast
    import re

    from modeltrace.lsp.diagnostics import editor_wording

    worker = Path(__file__).resolve().parents[2] / "pyserver" / "modeltrace" / "worker"
    advised = []
    for path in worker.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"(pass|or|give|with) --", node.value)
            ):
                advised.append((path.name, node.value))
    assert len(advised) > 10
    flags = [
        (name, text, editor_wording(text)) for name, text in advised if re.search(r"--[a-z]", editor_wording(text))
    ]
    assert flags == [], flags


def test_a_recipe_starts_from_the_config_the_build_tried_or_says_what_is_missing(tmp_path: Path) -> None:
    model = _model(tmp_path / "pkg", "modeling_tiny.py")
    tried = RecipeDraft(
        model_class="TinyModel",
        file=str(model),
        module="pkg.modeling_tiny",
        reason="no shrunk TinyConfig and synthesised input set ran",
        config_class="TinyConfig",
        config_module="pkg.configuration_tiny",
        config=(RecipeArgument("hidden_size", "64"), RecipeArgument("num_hidden_layers", "2")),
        arguments=(RecipeArgument("config", "None", guessed=False, note="a TinyConfig"),),
        inputs=(RecipeArgument("input_ids", "torch.randint(0, 128, (1, 7))"),),
    )
    written = write_recipe(tried, model, tmp_path)
    text = written.path.read_text()
    assert written.todo_names == () and "Edit what you need" in text
    assert "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))" in text
    assert "from pkg.configuration_tiny import TinyConfig" in text and "        config=config," in text
    assert "    config = TinyConfig(\n        hidden_size=64,\n        num_hidden_layers=2,\n    )" in text
    unknown = RecipeDraft(
        model_class="TinyModel",
        file=str(model),
        module="pkg.modeling_tiny",
        reason="TinyModel names no config class",
        arguments=(RecipeArgument("config", "None", guessed=False, note="its config"),),
    )
    written = write_recipe(unknown, model, tmp_path)
    assert written.todo_names == ("config", "the inputs"), written
    compile(written.path.read_text(), str(written.path), "exec")
