"""Evidence from a run for `_can_record_outputs`: build the file's base model, run it with
`output_hidden_states=True, output_attentions=True` (eager attention) through transformers' own capture path,
and record which classes were instantiated and called and what each call returned.

Run as `python -m modeltrace.worker.recorders_run FILE [--model CLASS]`: prints one JSON document
`{"problems": [{"code", "message", "line", "fix": null}], "calls": {...}, "notes": [...]}` (imports torch: the
CLI runs it in a subprocess, never in its own process).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _describe(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)}"
    if value is None:
        return "None"
    return type(value).__name__


def run_evidence(file: Path, model_name: str | None = None, seed: int = 0) -> dict:
    import torch
    from transformers.modeling_utils import PreTrainedModel
    from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY, OutputRecorder

    from modeltrace.recorders.static import analyze_file
    from modeltrace.worker.building import build_from_file

    static = analyze_file(file)
    built = build_from_file(file, model_name, None, seed, "eager")
    model = built.model
    problems: list[dict] = []
    calls: dict[str, dict] = {}
    hooks = []

    def hook(module, args, output):
        entry = calls.setdefault(type(module).__name__, {"calls": 0, "returns": None})
        entry["calls"] += 1
        if entry["returns"] is None:
            entry["returns"] = [_describe(o) for o in output] if isinstance(output, tuple) else _describe(output)

    instantiated = {type(m).__name__ for m in model.modules()}
    for module in model.modules():
        hooks.append(module.register_forward_hook(hook))
    # the submodel whose forward uses capture_outputs: the first PreTrainedModel with a registered recorder dict
    base = next((m for m in model.modules() if isinstance(m, PreTrainedModel) and _CAN_RECORD_REGISTRY.get(m)), None)
    line = next((u.can_record.line for u in static.uses if u.can_record), 0)
    if base is None:
        return {"problems": [], "calls": {}, "notes": ["no submodel declares _can_record_outputs"]}
    declared = _CAN_RECORD_REGISTRY.get(base)
    kwargs = dict(built.kwargs)
    kwargs.update(output_hidden_states=True, output_attentions=True, return_dict=True)
    with torch.no_grad():
        outputs = model(*built.args, **kwargs)
    for handle in hooks:
        handle.remove()
    # what each declared recorder targets, and whether it fired on a tensor
    for key, specs in declared.items():
        for spec in specs if isinstance(specs, list) else [specs]:
            target = (
                spec.target_class if isinstance(spec, OutputRecorder) else (None if isinstance(spec, str) else spec)
            )
            index = spec.index if isinstance(spec, OutputRecorder) else (0 if "hidden_states" in key else 1)
            name = getattr(target, "__name__", str(spec))
            if target is not None and not any(isinstance(m, target) for m in base.modules()):
                problems.append(
                    {
                        "code": "class-not-instantiated",
                        "line": line,
                        "fix": None,
                        "message": f"_can_record_outputs[{key!r}]: {name} is never instantiated in the model (replaced through register_patch_mapping without patch_output_recorders?)",
                    }
                )
                continue
            returns = calls.get(name, {}).get("returns")
            if (
                isinstance(returns, list)
                and -len(returns) <= index < len(returns)
                and not returns[index].startswith("tensor")
                and returns[index] != "None"
            ):
                problems.append(
                    {
                        "code": "index-not-tensor",
                        "line": line,
                        "fix": None,
                        "message": f"_can_record_outputs[{key!r}]: index {index} of what {name} returns is a {returns[index]}, not a tensor",
                    }
                )
    # transformers' own capture path: every declared key comes back filled
    layers = getattr(base.config, "num_hidden_layers", None)
    for key in declared:
        value = outputs.get(key) if hasattr(outputs, "get") else None
        if key not in ("hidden_states", "attentions") and not value:
            continue  # cross/router keys need inputs this run may not give
        if not value:
            problems.append(
                {
                    "code": "empty-output",
                    "line": line,
                    "fix": None,
                    "message": f"{key!r} came back empty from a run with output_{key}=True",
                }
            )
        elif layers and key == "hidden_states" and len(value) != layers + 1:
            problems.append(
                {
                    "code": "wrong-count",
                    "line": line,
                    "fix": None,
                    "message": f"'hidden_states' has {len(value)} entries, expected {layers + 1} (layers + initial)",
                }
            )
        elif layers and key == "attentions" and len(value) != layers:
            problems.append(
                {
                    "code": "wrong-count",
                    "line": line,
                    "fix": None,
                    "message": f"'attentions' has {len(value)} entries, expected {layers} (one per layer)",
                }
            )
        elif key == "attentions" and any(getattr(v, "dim", lambda: 0)() != 4 for v in value):
            problems.append(
                {
                    "code": "index-not-tensor",
                    "line": line,
                    "fix": None,
                    "message": "'attentions' entries are not 4-D attention weights",
                }
            )
    return {"problems": problems, "calls": calls, "instantiated": sorted(instantiated), "notes": []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--model")
    arguments = parser.parse_args(argv)
    try:
        result = run_evidence(Path(arguments.file), arguments.model)
    except Exception as error:  # noqa: BLE001 - reported as JSON, one line
        json.dump({"error": f"{type(error).__name__}: {error}"}, sys.stdout)
        sys.stdout.write("\n")
        return 2
    json.dump(result, sys.stdout, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
