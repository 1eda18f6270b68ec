"""The CUDA path, on a machine with a GPU (skipped elsewhere; `bench/gpu_check.sh` runs these): statistics computed on
the device and fetched in one batch per forward, the same as the CPU's; full tensors copied off the device within
the size limits; a model spread with `--device-map` records the device each call ran on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLE_MODELING_FILE


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tiny_llama(dtype: torch.dtype, device: str) -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = LlamaModel(config).eval().to(device=device, dtype=dtype)
    input_ids = torch.arange(7, device=device).reshape(1, 7)
    return model, input_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_statistics_equal_the_cpu_ones(dtype: torch.dtype) -> None:
    from modeltrace.worker.capture import ModuleCapture

    captures = {}
    for device in ("cpu", "cuda"):
        model, input_ids = _tiny_llama(dtype, device)
        with torch.no_grad(), ModuleCapture(model) as capture:
            model(input_ids)
        captures[device] = capture.records
    assert [record.path for record in captures["cpu"]] == [record.path for record in captures["cuda"]]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for cpu_record, cuda_record in zip(captures["cpu"], captures["cuda"]):
        for cpu_summary, cuda_summary in zip(cpu_record.outputs, cuda_record.outputs):
            assert cuda_summary.device.startswith("cuda")
            assert cuda_summary.shape == cpu_summary.shape
            for name in ("mean", "std", "min", "max"):
                expected, got = getattr(cpu_summary, name), getattr(cuda_summary, name)
                assert got == pytest.approx(expected, rel=tolerance, abs=tolerance), (cuda_record.path, name)


def test_statistics_of_a_forward_are_fetched_in_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-tensor `.item()` / `.tolist()` during the forward: the device is synchronised once, at the end."""
    from modeltrace.worker.capture import ModuleCapture

    model, input_ids = _tiny_llama(torch.float32, "cuda")
    calls = {"item": 0}
    original_item = torch.Tensor.item

    def counting_item(self: torch.Tensor):  # noqa: ANN202
        if self.is_cuda:
            calls["item"] += 1
        return original_item(self)

    with torch.no_grad(), ModuleCapture(model) as capture:
        monkeypatch.setattr(torch.Tensor, "item", counting_item)
        model(input_ids)
        monkeypatch.undo()
    assert calls["item"] == 0
    assert all(
        summary.mean is not None
        for record in capture.records
        for summary in record.outputs
        if summary.dtype.startswith(("float", "bfloat"))
    )


def test_full_tensors_are_copied_off_the_device_within_the_limits() -> None:
    from modeltrace.worker.capture import ModuleCapture

    model, input_ids = _tiny_llama(torch.float32, "cuda")
    with (
        torch.no_grad(),
        ModuleCapture(model, full_tensors=True, max_tensor_bytes=1024 * 1024, max_trace_bytes=40 * 1024) as capture,
    ):
        model(input_ids)
    assert capture.tensors and all(tensor.device.type == "cpu" for tensor in capture.tensors.values())
    assert capture.stored_bytes <= 40 * 1024 and capture.skipped > 0
    stored = next(summary for record in capture.records for summary in record.outputs if summary.tensor)
    assert capture.tensors[stored.tensor].mean().item() == pytest.approx(stored.mean, rel=1e-5, abs=1e-6)


def test_device_map_auto_runs_on_the_gpu_and_says_so(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    model, _ = _tiny_llama(torch.float32, "cpu")
    model.save_pretrained(checkpoint)
    out = tmp_path / "gpu.mtrace"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeltrace",
            "trace",
            str(_llama_file()),
            "--checkpoint",
            str(checkpoint),
            "--device-map",
            "auto",
            "--out",
            str(out),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    devices = {record["path"]: record.get("device") for record in document["modules"]}
    assert devices["layers.0.self_attn.q_proj"] == "cuda:0"
    outputs = [summary for record in document["modules"] for summary in record["outputs"]]
    assert any(summary["device"].startswith("cuda") for summary in outputs)
    assert EXAMPLE_MODELING_FILE.exists()


def _llama_file() -> Path:
    import transformers.models.llama.modeling_llama as modeling

    return Path(modeling.__file__)


def test_the_library_capture_of_a_cuda_model_matches_its_cpu_twin(tmp_path: Path) -> None:
    """`modeltrace.capture` on the GPU (full tensors and lines: the streamed writer, the line hooks and the
    parameter store all see CUDA tensors) writes a trace that the diff finds equal to the same model's CPU trace."""
    import modeltrace

    paths = {}
    for device in ("cpu", "cuda"):
        model, input_ids = _tiny_llama(torch.float32, device)
        paths[device] = tmp_path / f"{device}.mtrace"
        with torch.no_grad(), modeltrace.capture(model, paths[device], full_tensors=True, lines=True) as session:
            model(input_ids)
        assert session.trace is not None and not session.trace.model.get("incomplete")
    document = modeltrace.load(paths["cuda"]).to_json()
    devices = {summary["device"] for record in document["modules"] for summary in record["outputs"]}
    assert devices == {"cuda:0"}, devices
    assert document["lines"], "no line of modeling_llama.py was recorded on the GPU"
    result = modeltrace.diff(paths["cpu"], paths["cuda"], replay=False)
    assert result.match, result.first_divergence


def test_the_cli_traces_the_example_on_cuda_forward_and_backward_and_matches_the_cpu(tmp_path: Path) -> None:
    """The worker's job with `--device cuda` (the CLI's and the editor's path), gradients included; then
    `modeltrace diff` of it against the CPU's trace of the same file and seed finds no divergence."""
    outs = {}
    for device in ("cpu", "cuda"):
        outs[device] = tmp_path / f"{device}.mtrace"
        completed = subprocess.run(
            [sys.executable, "-m", "modeltrace", "trace", str(EXAMPLE_MODELING_FILE), "--device", device]
            + ["--full-tensors", "--lines", "--backward", "--out", str(outs[device]), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert completed.returncode == 0, completed.stderr
    document = json.loads(
        subprocess.run(
            [sys.executable, "-m", "modeltrace", "show", str(outs["cuda"]), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout
    )
    outputs = [summary for record in document["modules"] for summary in record["outputs"]]
    assert outputs and all(summary["device"].startswith("cuda") for summary in outputs)
    compared = subprocess.run(
        [sys.executable, "-m", "modeltrace", "diff", str(outs["cpu"]), str(outs["cuda"]), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert compared.returncode == 0, compared.stdout[-2000:] + compared.stderr[-2000:]
    assert json.loads(compared.stdout)["match"] is True
