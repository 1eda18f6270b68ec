"""Which generated file a transformers modular file (`modular_<name>.py`) stands for, and what to say without one.

A model adder edits `modular_<name>.py`; transformers' `utils/modular_model_converter.py` writes the standalone
`modeling_<name>.py` (and `configuration_<name>.py`, ...) beside it, and that generated file is what transformers
imports and runs. So a trace of a modular file runs its generated twin, and the editor shows the twin's lines on
the modular ones (`modular/mapping.py`). Torch-free: the server, the CLI and the worker all ask here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from modeltrace.errors import ModelTraceError


@dataclass(frozen=True)
class TwinRule:
    """A modular file's name prefix, the prefix of the generated file that runs in its place, and why."""

    modular_prefix: str
    generated_prefix: str
    reason: str


TWIN_RULES = (
    TwinRule(
        "modular_",
        "modeling_",
        "transformers' modular converter writes modeling_<name>.py from modular_<name>.py; transformers imports "
        "and runs the generated file",
    ),
)

# NOTE: the command of transformers' own contributor guide (`docs/source/en/modular_transformers.md`), run from
# the root of a transformers checkout.
REGENERATE_COMMAND = "python utils/modular_model_converter.py --files_to_parse {path}"


def twin_rule(path: Path) -> TwinRule | None:
    """The rule a file's name falls under, or None when it is no modular file."""
    for rule in TWIN_RULES:
        if path.name.startswith(rule.modular_prefix) and path.suffix == ".py":
            return rule
    return None


def is_modular_file(path: str | Path) -> bool:
    return twin_rule(Path(path)) is not None


def generated_path(modular: str | Path) -> Path:
    """Where the generated twin of a modular file sits (whether or not it exists)."""
    path = Path(modular)
    rule = twin_rule(path)
    if rule is None:
        raise ValueError(f"{path}: not a modular file (modular_<name>.py)")
    return path.with_name(rule.generated_prefix + path.name[len(rule.modular_prefix) :])


def modular_twin(generated: str | Path) -> Path | None:
    """The modular file a generated file (`modeling_x.py`) was written from, when it sits beside it."""
    path = Path(generated)
    for rule in TWIN_RULES:
        if path.name.startswith(rule.generated_prefix) and path.suffix == ".py":
            modular = path.with_name(rule.modular_prefix + path.name[len(rule.generated_prefix) :])
            if modular.is_file():
                return modular
    return None


def regenerate_command(modular: str | Path) -> str:
    return REGENERATE_COMMAND.format(path=modular)


def resolve_generated(modular: str | Path) -> Path:
    """The generated twin of a modular file, checked: it exists and parses. A ModelTraceError naming the missing
    or broken file and the command that (re)generates it otherwise; nothing is written anywhere."""
    path = Path(modular).resolve()
    twin = generated_path(path)
    advice = (
        f"a modular file runs through the file transformers' converter generates from it; from the root of a "
        f"transformers checkout run `{regenerate_command(path)}`"
    )
    if not twin.is_file():
        raise ModelTraceError(f"{path}: its generated twin {twin} does not exist; {advice}")
    try:
        ast.parse(twin.read_text(encoding="utf-8"), filename=str(twin))
    except SyntaxError as error:
        raise ModelTraceError(
            f"{twin}:{error.lineno}: the generated twin of {path.name} does not parse ({error.msg}); regenerate "
            f"it: {advice}",
            str(twin),
            error.lineno,
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ModelTraceError(f"{twin}: the generated twin of {path.name} cannot be read ({error})") from None
    return twin
