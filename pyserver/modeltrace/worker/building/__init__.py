"""Build what a trace runs, as a pipeline: request → spec → strategy → candidates → trials → built model.

1. `spec.py`: the request (a dict, or an object with the same attributes) is read once into a `BuildSpec`.
2. `strategies.py`: the first row of `STRATEGIES` that applies picks the way to build: a recipe, a local
   checkpoint, a plain module of the file, shape-only on the meta device, a given config, or (with nothing
   given) a shrunk copy of the config class's defaults. `source.py` imports the user's file and picks its class;
   `configs.py` finds, builds and reads configs.
3. `candidates.py`: the shrunk strategy's candidates are shrink levels × input variants.
   The shrink: `shrink.py` is the engine, `sizes.py` what a field's name says it is and the sizes,
   `shrink_rules.py` the size rules and `shrink_steps.py` the consistency steps (rows with their reason),
   `config_tree.py` the walk of a composite config. The inputs: `inputs.py` is the synthesiser (stateless given
   an `InputSpec`, `input_spec.py`), `input_media.py` the per-modality builders, `input_forms.py` the family
   layouts (rows with their reason).
4. `trials.py`: each candidate runs on the CPU in milliseconds; what an error names is repaired (`REPAIRS`,
   rows with their reason) and the first candidate that runs is kept (else the first that built, with a note
   saying what to provide instead).
5. `built.py`: the `BuiltModel` handed to the capture: the model, its inputs, and notes on how it was made.

Adding a family's rule is adding a row next to its reason: a size rule in `shrink_rules.py` (a consistency step
in `shrink_steps.py`), an input layout or companion input in `input_forms.py`, a repair in `trials.py`.
ModelTrace never downloads: a hub id where a local path is expected is refused with what to do instead.
"""

from __future__ import annotations

from modeltrace.worker.building.built import BuiltModel
from modeltrace.worker.building.candidates import Candidate
from modeltrace.worker.building.configs import load_config, shrink_config
from modeltrace.worker.building.input_spec import BATCH_SIZE, DECODER_SEQUENCE_LENGTH, SEQUENCE_LENGTH, InputSpec
from modeltrace.worker.building.inputs import InputSynthesizer, synthesize_inputs
from modeltrace.worker.building.recipe import build_from_recipe
from modeltrace.worker.building.source import choose_model_class, import_user_file, module_classes
from modeltrace.worker.building.spec import BuildSpec
from modeltrace.worker.building.strategies import STRATEGIES, build, build_from_file, build_from_request

__all__ = [
    "BATCH_SIZE",
    "DECODER_SEQUENCE_LENGTH",
    "SEQUENCE_LENGTH",
    "STRATEGIES",
    "BuildSpec",
    "BuiltModel",
    "Candidate",
    "InputSpec",
    "InputSynthesizer",
    "build",
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
