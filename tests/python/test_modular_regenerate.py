"""Regenerating a modular file's twin into a temporary folder (`modular/regenerate.py`): how the converter is run,
and that the temporary folders go (a failed run's at once; the server's when replaced, beyond a few, at
shutdown) while the user's files never do. The converter here is the stand-in (`fake_converter`): these run
everywhere; `test_modular_real_converter.py` runs transformers' own."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import transformers

from fake_converter import fake_runs, make_fake_checkout
from modeltrace.errors import ModelTraceError
from modeltrace.modular.regenerate import (
    TEMPORARY_PREFIX,
    RegeneratedFolders,
    regenerate_copy,
    regenerated_root,
    remove_regenerated,
)

MODELS = Path(transformers.__file__).resolve().parent / "models"
EDIT = ("attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2")


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory of this test (where the regenerated folders go)."""
    folder = tmp_path / "temporary"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def edited_checkout(tmp_path: Path, fail: bool = False, positional: bool = False) -> tuple[Path, Path]:
    """(checkout, its modular_qwen3.py edited since its generated file was written)."""
    checkout = make_fake_checkout(
        tmp_path / "transformers", MODELS / "qwen3" / "modeling_qwen3.py", [EDIT], fail, positional
    )
    folder = checkout / "src" / "transformers" / "models" / "qwen3"
    shutil.copytree(MODELS / "qwen3", folder, ignore=shutil.ignore_patterns("__pycache__"))
    modular = folder / "modular_qwen3.py"
    modular.write_text(modular.read_text().replace(*EDIT))
    return checkout, modular


def test_the_converter_runs_with_the_interpreters_ruff_on_a_copy(
    tmp_path: Path, temporary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: transformers' converter formats its output with `ruff` run by name: with a PATH that has none, the
    # interpreter's environment (where ruff is installed beside it) must provide it
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.is_file():
        pytest.skip(f"no ruff beside {sys.executable}")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    checkout, modular = edited_checkout(tmp_path)
    before = {path.name: path.read_bytes() for path in modular.parent.iterdir()}
    copy = regenerate_copy(modular, checkout, python=sys.executable)
    (run,) = fake_runs(checkout)
    assert run["ruff"] == str(ruff)
    assert run["argv"] == ["--files_to_parse", str(copy)]
    root = regenerated_root(copy)
    assert root is not None and root.parent == temporary and root.name.startswith(TEMPORARY_PREFIX)
    assert copy.read_bytes() == modular.read_bytes()
    assert EDIT[1] in (copy.parent / "modeling_qwen3.py").read_text()
    assert {path.name: path.read_bytes() for path in modular.parent.iterdir()} == before
    assert remove_regenerated(root) and not root.exists()


def test_a_converter_that_takes_its_files_as_arguments_is_run_so(tmp_path: Path, temporary: Path) -> None:
    # recent converters take the files as positional arguments (`modular_model_converter.py <file or name>`)
    checkout, modular = edited_checkout(tmp_path, positional=True)
    copy = regenerate_copy(modular, checkout, python=sys.executable)
    (run,) = fake_runs(checkout)
    assert run["argv"] == [str(copy)]
    assert EDIT[1] in (copy.parent / "modeling_qwen3.py").read_text()
    remove_regenerated(copy.parents[4])


def test_a_failed_converter_leaves_no_temporary_folder(tmp_path: Path, temporary: Path) -> None:
    checkout, modular = edited_checkout(tmp_path, fail=True)
    before = {path.name: path.read_bytes() for path in modular.parent.iterdir()}
    with pytest.raises(ModelTraceError) as raised:
        regenerate_copy(modular, checkout, python=sys.executable)
    message = str(raised.value)
    assert f"{checkout.resolve() / 'utils' / 'modular_model_converter.py'} failed on a copy of modular_qwen3.py" in (
        message
    )
    assert "the stand-in converter was told to fail" in message
    assert list(temporary.iterdir()) == []
    assert {path.name: path.read_bytes() for path in modular.parent.iterdir()} == before


def test_regenerated_folders_go_when_replaced_beyond_a_few_and_at_the_end(temporary: Path) -> None:
    def made() -> Path:
        return Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))

    folders = RegeneratedFolders(keep=2)
    first, second, third = made(), made(), made()
    assert folders.hold("/work/a/modular_a.py", first) == []
    # a new folder for the same modular file replaces the one before
    assert folders.hold("/work/a/modular_a.py", second) == [first] and not first.exists()
    assert folders.hold("/work/b/modular_b.py", third) == []
    # beyond `keep`, the oldest goes
    fourth = made()
    assert folders.hold("/work/c/modular_c.py", fourth) == [second] and not second.exists()
    assert folders.held() == {"/work/b/modular_b.py": third, "/work/c/modular_c.py": fourth}
    assert folders.release("/work/b/modular_b.py") == [third] and not third.exists()
    assert folders.release("/work/b/modular_b.py") == []
    assert folders.clear() == [fourth] and not fourth.exists()
    assert list(temporary.iterdir()) == []


def test_only_folders_regenerate_made_are_removed(tmp_path: Path, temporary: Path) -> None:
    # a user's folder, even one named like ours, is never removed: it is not directly in the temporary directory
    users = tmp_path / "work" / f"{TEMPORARY_PREFIX}mine"
    users.mkdir(parents=True)
    (users / "modular_x.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="not a folder ModelTrace regenerated into"):
        remove_regenerated(users)
    with pytest.raises(ValueError):
        remove_regenerated(temporary)
    # nor one in the temporary directory under another name, nor a link named like ours
    other = temporary / "someone-else"
    other.mkdir()
    with pytest.raises(ValueError):
        remove_regenerated(other)
    link = temporary / f"{TEMPORARY_PREFIX}link"
    link.symlink_to(users)
    with pytest.raises(ValueError):
        remove_regenerated(link)
    folders = RegeneratedFolders(keep=1)
    with pytest.raises(ValueError):
        folders.hold("/work/a/modular_a.py", users)
    assert (users / "modular_x.py").read_text() == "x = 1\n" and other.is_dir() and link.is_symlink()
    assert regenerated_root(users / "modular_x.py") is None
