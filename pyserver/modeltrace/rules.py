"""Rules the editor and the worker share, written once on plain class names (no torch, no user code imported).

The language server reads a file's classes with `ast` (`lsp/classes.py`), the worker imports them
(`worker/building/source.py`); both ask here which class a plain "Trace forward" builds, so the code lens and the CLI
build the same model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


# A task head is `…For` + a capitalised task (`…ForCausalLM`, `…ForSequenceClassification`); `MaskFormerModel`
# and `PPFormulaNetModel` are not heads, although their names contain "For".
TASK_HEAD_NAME = re.compile(r"For[A-Z]")
ABSTRACT_MODEL_SUFFIX = "PreTrainedModel"


def is_task_head(class_name: str) -> bool:
    """Whether a model class is a task head (`LlamaForCausalLM`) rather than a base model."""
    return TASK_HEAD_NAME.search(class_name) is not None


def is_abstract_model(class_name: str) -> bool:
    """The `…PreTrainedModel` base class: a model class that cannot be built on its own."""
    return class_name.endswith(ABSTRACT_MODEL_SUFFIX)


def base_model_order(class_name: str) -> tuple[bool, bool, int]:
    """Sort key among a file's buildable model classes: base models before heads, `…Model` first, then the
    shortest name (`LlamaModel` before `LlamaForCausalLM`, `BarkCoarseModel` before `BarkCoarseModelForX`)."""
    return is_task_head(class_name), not class_name.endswith("Model"), len(class_name)


def pick_base_model(model_names: Sequence[str]) -> str | None:
    """The class a plain trace builds among a file's buildable model classes (in definition order): the first
    by `base_model_order` that is not a head; else the first model, a head; None without any."""
    bases = sorted((name for name in model_names if not is_task_head(name)), key=base_model_order)
    if bases:
        return bases[0]
    return model_names[0] if model_names else None
