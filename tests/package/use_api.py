"""The library API from the installed wheel, as a script in the original's environment uses it: capture a reference,
capture a port with a bug, diff them; the same numbers as `modeltrace diff`.

    python tests/package/use_api.py REPOSITORY OUTPUT_FOLDER     (run by tests/package/run.sh)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

import modeltrace


def main() -> None:
    repository, output = Path(sys.argv[1]), Path(sys.argv[2])
    assert not Path(modeltrace.__file__).is_relative_to(repository / "pyserver"), (
        f"modeltrace comes from the checkout, not the wheel: {modeltrace.__file__}"
    )
    sys.path.insert(0, str(repository / "examples"))
    from tiny_llama.configuration_tiny_llama import TinyLlamaConfig
    from tiny_llama.modeling_tiny_llama import TinyLlamaModel

    torch.manual_seed(0)
    model = TinyLlamaModel(TinyLlamaConfig()).eval()
    inputs = {"input_ids": torch.tensor([[1, 17, 42, 99, 5, 63, 120]])}
    with torch.no_grad(), modeltrace.capture(model, output / "api-reference.mtrace", full_tensors=True, lines=True):
        model(**inputs)
    with torch.no_grad():
        model.layers[1].mlp.down_proj.weight.mul_(1.01)  # the port's bug
    with torch.no_grad(), modeltrace.capture(model, output / "api-port.mtrace", full_tensors=True, lines=True):
        model(**inputs)
    trace = modeltrace.load(output / "api-reference.mtrace")
    assert trace.lines and "query_states" in trace._repr_html_()
    result = modeltrace.diff(output / "api-reference.mtrace", output / "api-port.mtrace")
    assert not result.match and result.first_divergence["path"] == "layers.1.mlp.down_proj", result.text
    completed = subprocess.run(
        [
            str(Path(sys.executable).parent / "modeltrace"),
            "diff",
            str(output / "api-reference.mtrace"),
            str(output / "api-port.mtrace"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 1, completed.stderr
    assert json.loads(completed.stdout)["first_divergence"] == json.loads(json.dumps(result.first_divergence))
    print(
        f"[package] API: capture, load and diff agree with the CLI (first divergence {result.first_divergence['path']})"
    )


if __name__ == "__main__":
    main()
