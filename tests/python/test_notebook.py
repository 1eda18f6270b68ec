"""ModelTrace in a notebook: a notebook run headless by nbclient (a real ipykernel) captures a model defined in a
cell and the example's transformers-style model, and displays a trace and a diff as HTML without error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from conftest import REPO_ROOT


CELLS = [
    # a model written in the notebook itself: no source file, so no line records
    """
    import sys
    import torch
    from torch import nn
    import modeltrace

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, 2 * width)
            self.down = nn.Linear(2 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(self.norm(x))))

    torch.manual_seed(0)
    model = nn.Sequential(Block(16), Block(16)).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), modeltrace.capture(model, "reference.mtrace", full_tensors=True):
        model(x)
    """,
    # the port with a bug: the second block's norm scaled
    """
    with torch.no_grad():
        model[1].norm.weight.mul_(1.5)
    with torch.no_grad(), modeltrace.capture(model, "port.mtrace", full_tensors=True):
        model(x)
    result = modeltrace.diff("reference.mtrace", "port.mtrace")
    result
    """,
    """
    modeltrace.load("reference.mtrace")
    """,
    # a model from a modeling file, with its lines: the annotated source
    f"""
    sys.path.insert(0, {str(REPO_ROOT / "examples")!r})
    from tiny_llama.configuration_tiny_llama import TinyLlamaConfig
    from tiny_llama.modeling_tiny_llama import TinyLlamaModel

    llama = TinyLlamaModel(TinyLlamaConfig()).eval()
    with torch.no_grad(), modeltrace.capture(llama, "llama.mtrace", lines=True) as session:
        llama(input_ids=torch.tensor([[1, 17, 42, 99, 5, 63, 120]]))
    session.load()
    """,
]


def _html(cell: nbformat.NotebookNode) -> str:
    return "".join(
        output.get("data", {}).get("text/html", "")
        for output in cell.outputs
        if output.output_type == "execute_result"
    )


def test_a_notebook_displays_a_trace_and_a_diff(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(source).strip()) for source in CELLS]
    # NOTE: raises CellExecutionError, with the cell's traceback, when any cell fails
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert not [output for cell in notebook.cells for output in cell.outputs if output.output_type == "error"]

    diff_page = _html(notebook.cells[1])
    assert "FIRST DIVERGENCE" in diff_page and "1.norm" in diff_page, diff_page[:2000]
    assert "<svg" in diff_page and "<script" not in diff_page

    trace_page = _html(notebook.cells[2])
    assert "Sequential" in trace_page and "module calls" in trace_page, trace_page[:2000]

    llama_page = _html(notebook.cells[3])
    assert "TinyLlamaModel" in llama_page and "query_states = self.q_proj(hidden_states)" in llama_page
    assert "[1, 4, 7, 16]" in llama_page, llama_page[:3000]
    assert (tmp_path / "llama.mtrace").is_dir()
