"""Where callers import model building from: the `building` package (its pipeline is in its docstring).

NOTE: kept so that `job.py`, `replay.py`, `parallel.py` and the API import one stable name while the package's
inner modules move; new code may import `modeltrace.worker.building` directly.
"""

from __future__ import annotations

from modeltrace.worker.building import (
    BATCH_SIZE,
    DECODER_SEQUENCE_LENGTH,
    SEQUENCE_LENGTH,
    BuildSpec,
    BuiltModel,
    build_from_file,
    build_from_recipe,
    build_from_request,
    choose_model_class,
    import_user_file,
    load_config,
    module_classes,
    shrink_config,
    synthesize_inputs,
)

__all__ = [
    "BATCH_SIZE",
    "DECODER_SEQUENCE_LENGTH",
    "SEQUENCE_LENGTH",
    "BuildSpec",
    "BuiltModel",
    "build_from_file",
    "build_from_recipe",
    "build_from_request",
    "choose_model_class",
    "import_user_file",
    "load_config",
    "module_classes",
    "shrink_config",
    "synthesize_inputs",
]
