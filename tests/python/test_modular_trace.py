"""`modeltrace trace modular_<name>.py`: a modular file traces as the generated modeling file beside it, and the CLI
prints the modular file annotated with what its generated twin's lines produced.

Each trace runs in its own interpreter on a model folder copied out of the installed transformers (importing the
copy replaces `transformers.models.<name>` in that process).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import transformers

from conftest import line_of
from fake_converter import fake_runs, make_fake_checkout


MODELS = Path(transformers.__file__).resolve().parent / "models"


def copy_model_folder(name: str, destination: Path) -> Path:
    folder = destination / name
    shutil.copytree(MODELS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def run_cli(*arguments: str, cwd: Path, temporary: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in a child process (`temporary`: its temporary folder)."""
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(temporary)} if temporary is not None else None,
    )


def listing_line(listing: str, number: int) -> str:
    """The listing's row of source line `number` (rows start with the right-aligned line number)."""
    for row in listing.splitlines():
        head = row.lstrip()
        if head.split(" ", 1)[0] == str(number):
            return row
    raise AssertionError(f"line {number} not in the listing")


def test_a_modular_file_traces_its_model_and_prints_its_own_lines_annotated(tmp_path: Path) -> None:
    folder = copy_model_folder("apertus", tmp_path)
    modular = folder / "modular_apertus.py"
    generated = folder / "modeling_apertus.py"
    out = tmp_path / "apertus.mtrace"
    completed = run_cli("trace", str(modular), "--lines", "--out", str(out), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    listing = completed.stdout
    header = listing.splitlines()[0]
    # built from the model's own config (ApertusConfig, from the modular file), by running the generated file
    assert header.startswith(f"# ApertusModel traced from {modular.resolve()} (run as its generated twin")
    assert "modeling_apertus.py" in header
    # lines of the modular file carry their generated twin's hints
    attention_norm = line_of(modular, "hidden_states = self.attention_layernorm(hidden_states)")
    assert "# [1, 7, " in listing_line(listing, attention_norm)
    # methods a class inherits unchanged are named with where they run
    rotary = line_of(modular, "class ApertusRotaryEmbedding(LlamaRotaryEmbedding):")
    forward_line = line_of(generated, "def forward(self, x, position_ids", occurrence=0)
    assert (
        "# `forward`: inherited from `LlamaRotaryEmbedding.forward`" in listing
        and f"modeling_apertus.py:{forward_line}" in listing
    ), listing.splitlines()[rotary - 1 : rotary + 6]
    # a `super().forward(...)` line says where the parent body the converter inlined for it runs
    call = line_of(modular, "return super().forward(**super_kwargs)")
    rows = listing.splitlines()
    note = rows[rows.index(listing_line(listing, call)) + 1].strip()
    assert note.startswith("# runs the parent's body, inlined: modeling_apertus.py:"), note
    first, last = (int(number) for number in note.rsplit(":", 1)[1].split("-"))
    inlined = generated.read_text().splitlines()[first - 1 : last]
    assert any("logits = self.lm_head(hidden_states)" in text for text in inlined)
    trace = json.loads(run_cli("show", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert trace["model"]["file"] == str(generated.resolve())
    assert trace["model"]["modular"] == str(modular.resolve())
    config = trace["model"]["config"]
    assert config.get("model_type") == "apertus", config.get("model_type")
    # `show` prints the modular file by default, the generated one on request
    shown = run_cli("show", str(out), cwd=tmp_path).stdout
    assert shown.splitlines()[0] == header
    shown_generated = run_cli("show", str(out), "--file", str(generated), cwd=tmp_path).stdout
    assert shown_generated.splitlines()[0].startswith(f"# ApertusModel traced from {generated.resolve()}:")


def test_a_modular_file_without_its_generated_twin_is_refused_with_the_command(tmp_path: Path) -> None:
    folder = copy_model_folder("qwen3", tmp_path)
    (folder / "modeling_qwen3.py").unlink()
    before = sorted(path.name for path in folder.iterdir())
    completed = run_cli("trace", str(folder / "modular_qwen3.py"), "--out", str(tmp_path / "q.mtrace"), cwd=tmp_path)
    assert completed.returncode == 2
    modular = (folder / "modular_qwen3.py").resolve()
    assert f"{folder.resolve() / 'modeling_qwen3.py'} does not exist" in completed.stderr
    assert f"python utils/modular_model_converter.py --files_to_parse {modular}" in completed.stderr
    assert sorted(path.name for path in folder.iterdir()) == before
    assert not (tmp_path / "q.mtrace").exists()


def test_an_out_of_date_generated_file_is_said_in_the_listing(tmp_path: Path) -> None:
    folder = copy_model_folder("qwen3", tmp_path)
    modular = folder / "modular_qwen3.py"
    out = tmp_path / "q.mtrace"
    completed = run_cli("trace", str(modular), "--out", str(out), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "out of date" not in completed.stdout
    source = modular.read_text()
    modular.write_text(
        source.replace("attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2")
    )
    shown = run_cli("show", str(out), cwd=tmp_path).stdout
    edited = line_of(modular, "attn_output = self.o_proj(attn_output) * 2")
    assert (
        f"# note: modeling_qwen3.py is out of date with modular_qwen3.py: line {edited} (Qwen3Attention.forward)"
        in shown
    )
    assert f"python utils/modular_model_converter.py --files_to_parse {modular.resolve()}" in shown
    # outside a transformers checkout there is no converter to offer
    assert "--regenerate" not in shown


def test_a_stale_modular_file_is_traced_through_a_regenerated_copy(tmp_path: Path) -> None:
    # the modular file sits in a transformers checkout (its converter is a stand-in: `fake_converter`), edited
    # since its generated file was written
    checkout = make_fake_checkout(
        tmp_path / "transformers",
        MODELS / "qwen3" / "modeling_qwen3.py",
        [("attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2")],
    )
    folder = copy_model_folder("qwen3", checkout / "src" / "transformers" / "models")
    modular = folder / "modular_qwen3.py"
    modular.write_text(
        modular.read_text().replace(
            "attn_output = self.o_proj(attn_output)", "attn_output = self.o_proj(attn_output) * 2"
        )
    )
    # traced as it is, the listing says the generated file is out of date, and how to trace a regenerated copy
    as_it_is = run_cli("trace", str(modular), "--out", str(tmp_path / "stale.mtrace"), cwd=tmp_path)
    assert as_it_is.returncode == 0, as_it_is.stderr
    assert "# note: modeling_qwen3.py is out of date with modular_qwen3.py" in as_it_is.stdout
    assert f"`modeltrace trace {modular.resolve()} --regenerate`" in as_it_is.stdout
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    completed = run_cli(
        "trace", str(modular), "--regenerate", "--out", str(tmp_path / "q.mtrace"), cwd=tmp_path, temporary=temporary
    )
    assert completed.returncode == 0, completed.stderr
    (run,) = fake_runs(checkout)
    copy = Path(run["file"])
    # the converter ran from the checkout, with its sources first, on a copy in the layout it expects
    assert run["cwd"] == str(checkout.resolve())
    assert run["pythonpath"].split(os.pathsep)[0] == str(checkout.resolve() / "src")
    assert copy.parent.parent.parent.parent.name == "src" and copy.parent.name == "qwen3"
    assert copy.is_relative_to(temporary)
    assert run["sha256"] == hashlib.sha256(modular.read_bytes()).hexdigest()
    assert f"# traced the regenerated copy {copy} (your modeling_qwen3.py is left as it is)" in completed.stderr
    # once the trace is written and printed, the temporary folder goes (it is ModelTrace's, not the user's)
    assert f"# removed the temporary folder {copy.parents[4]}" in completed.stderr
    assert not [path for path in temporary.iterdir() if path.name.startswith("modeltrace-regenerated-")]
    assert (tmp_path / "q.mtrace").exists()
    # so `show` of that trace says where its source went and what to run instead
    shown = run_cli("show", str(tmp_path / "q.mtrace"), cwd=tmp_path)
    assert shown.returncode == 2
    assert "this trace ran a copy regenerated into a temporary folder, removed after `trace --regenerate`" in (
        shown.stderr
    )
    # the user's folder is untouched (the generated file stays stale)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    # the edited line ran, from the regenerated file, and carries its hint; nothing is out of date
    edited = line_of(modular, "attn_output = self.o_proj(attn_output) * 2")
    assert "out of date" not in completed.stdout and "--regenerate" not in completed.stdout
    assert "# " in listing_line(completed.stdout, edited).split("* 2", 1)[1]


def test_regenerate_without_a_checkout_says_so(tmp_path: Path) -> None:
    folder = copy_model_folder("qwen3", tmp_path)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    completed = run_cli("trace", str(folder / "modular_qwen3.py"), "--regenerate", cwd=tmp_path)
    assert completed.returncode == 2
    assert "no transformers source checkout above it (a folder holding utils/modular_model_converter.py)" in (
        completed.stderr
    )
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
