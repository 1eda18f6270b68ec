"""A transformers checkout laid out in a test's folder, for transformers' real modular converter.

The converter (`utils/modular_model_converter.py`) and the neighbours it imports (`create_dependency_mapping.py`,
`check_copies.py`, ...) come from a transformers source checkout named by `MODELTRACE_TRANSFORMERS_SOURCE`: the
installed wheel and the source package ship no `utils/`, and this project vendors none of transformers' code, so
the tests that need the real converter run only where that variable is set (a model adder's machine, a CI that
clones transformers at the installed version's tag); elsewhere they are skipped and say why.

The layout is what a model adder has: `utils/` and `pyproject.toml` (the converter runs `ruff format --config
pyproject.toml` from the checkout root) from the source checkout, and `src/transformers/` holding the INSTALLED
package (linked entry by entry, so that the converter reads the parent models of the version under test, and
`check_copies` imports `src/transformers` from the checkout root), with the one model folder under test copied, to
be edited as the user's own.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import transformers

SOURCE_VARIABLE = "MODELTRACE_TRANSFORMERS_SOURCE"
CONVERTER = Path("utils") / "modular_model_converter.py"
INSTALLED = Path(transformers.__file__).resolve().parent


def transformers_source() -> Path | None:
    """The transformers checkout named by `MODELTRACE_TRANSFORMERS_SOURCE`, when it holds the converter."""
    text = os.environ.get(SOURCE_VARIABLE)
    if not text:
        return None
    root = Path(text).expanduser().resolve()
    return root if (root / CONVERTER).is_file() else None


SKIP_REASON = (
    f"the real converter needs a transformers source checkout: set {SOURCE_VARIABLE} to one (holding "
    f"{CONVERTER.as_posix()}, at the tag of the installed transformers {transformers.__version__})"
)


def make_checkout(root: Path, source: Path, model: str) -> Path:
    """A checkout at `root` whose `src/transformers` is the installed package with `models/<model>` copied;
    returns that model folder (the user's, to edit)."""
    shutil.copytree(source / "utils", root / "utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if (source / "pyproject.toml").is_file():
        shutil.copy2(source / "pyproject.toml", root / "pyproject.toml")
    package = root / "src" / "transformers"
    models = package / "models"
    models.mkdir(parents=True)
    for entry in INSTALLED.iterdir():
        if entry.name not in ("models", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    for entry in (INSTALLED / "models").iterdir():
        if entry.name not in (model, "__pycache__"):
            (models / entry.name).symlink_to(entry)
    folder = models / model
    shutil.copytree(INSTALLED / "models" / model, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


FORWARD_EDIT = ("attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2")
# NOTE: a declaration the parent's differs from (an `OutputRecorder` with an index): the converter must carry it
RECORDERS = """

class Qwen3PreTrainedModel(Qwen2PreTrainedModel):
    _can_record_outputs = {
        "hidden_states": Qwen3DecoderLayer,
        "attentions": OutputRecorder(Qwen3Attention, index=1),
    }
"""
# NOTE: `Qwen3DecoderLayer` is not the modular file's: the converter renames qwen2's into the generated file
IMPORTS = (
    "from ...utils.output_capturing import OutputRecorder\nfrom ..qwen2.modeling_qwen2 import Qwen2PreTrainedModel\n"
)


def edited_modular(tmp_path: Path) -> tuple[Path, Path]:
    """(checkout, its modular_qwen3.py with a model adder's edits, its generated file as installed: stale)."""
    source = transformers_source()
    assert source is not None
    checkout = tmp_path / "transformers"
    folder = make_checkout(checkout, source, "qwen3")
    modular = folder / "modular_qwen3.py"
    text = modular.read_text()
    assert text.count(FORWARD_EDIT[0]) == 1
    text = text.replace(FORWARD_EDIT[0], FORWARD_EDIT[1])
    # the imports go after the module's own (before its first class), the class after Qwen3Attention's
    first_class = text.index("\nclass ")
    text = text[:first_class] + "\n" + IMPORTS + text[first_class:]
    after_attention = text.index("\nclass ", text.index("class Qwen3Attention("))
    text = text[:after_attention] + RECORDERS + text[after_attention:]
    modular.write_text(text)
    return checkout, modular
