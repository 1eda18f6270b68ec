"""The ResNet pair's weight conversion: timm's ResNet -> transformers' `ResNetForImageClassification`.

transformers converts timm's ResNets with `convert_resnet_to_pytorch.py` (`Tracker` and
`ModuleTransfer` below, staged from a snapshot of a transformers fork, feisenyu/transformers_4573 at e9d73c3118): both models run the same input with hooks on their leaf modules,
and the parametrised leaves are matched in call order, each destination loading its source's state dict.
"""

from __future__ import annotations

from pathlib import Path


from vision_common import upstream_definitions


# transformers' own conversion code, staged from the corpus's mirror (never committed; see ports/sources.py):
# Tracker, ModuleTransfer from models/resnet/convert_resnet_to_pytorch.py, unchanged
_UPSTREAM = upstream_definitions(
    Path(__file__).resolve().parent / "upstream" / "convert_resnet_to_pytorch.py", ("Tracker", "ModuleTransfer")
)
Tracker = _UPSTREAM["Tracker"]
ModuleTransfer = _UPSTREAM["ModuleTransfer"]
