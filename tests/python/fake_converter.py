"""A fake transformers checkout for the regenerate tests that run everywhere: `utils/modular_model_converter.py` is
a stand-in for transformers' converter. The installed wheel and the source package ship no `utils/`, and the real
converter cannot be vendored here; `test_modular_real_converter.py` runs the real one where a transformers checkout
is given (`MODELTRACE_TRANSFORMERS_SOURCE`). The stand-in takes the real command line (`--files_to_parse PATH`),
checks what the real converter needs (the modular file under `src/transformers/`, run from the checkout, `ruff`
on `PATH`: the real one formats its output with it and dies without it), and writes the generated file beside the
modular file: the installed generated file with the test's edits applied wherever the modular file carries the
edited line, which is what the real converter would carry over. It records how it was run; `fail` makes it exit
with an error instead."""

from __future__ import annotations

import json
from pathlib import Path

FAKE_CONVERTER = """
import argparse, hashlib, json, os, re, shutil, sys
from pathlib import Path

here = Path(__file__).resolve().parent
settings = json.loads((here / "fake_settings.json").read_text())
parser = argparse.ArgumentParser()
if settings.get("positional"):
    # a recent converter's command line: the files as positional arguments
    parser.add_argument("files_to_parse", nargs="+")
else:
    parser.add_argument("--files_to_parse", nargs="+", required=True)
arguments = parser.parse_args()
if settings.get("fail"):
    sys.exit("Traceback (most recent call last): ValueError: the stand-in converter was told to fail")
ruff = shutil.which("ruff")
if ruff is None:
    sys.exit("FileNotFoundError: [Errno 2] No such file or directory: 'ruff'")
for name in arguments.files_to_parse:
    modular = Path(name).resolve()
    if not re.search(r"/src/transformers/", str(modular)):
        sys.exit(f"{modular}: not under src/transformers/")
    text = modular.read_text()
    generated = Path(settings["pristine"]).read_text()
    for old, new in settings["edits"]:
        if new in text:
            generated = generated.replace(old, new)
    modular.with_name(modular.name.replace("modular_", "modeling_")).write_text(generated)
    with open(here / "fake_runs.json", "a") as log:
        log.write(json.dumps({"file": str(modular), "cwd": os.getcwd(), "pythonpath": os.environ.get("PYTHONPATH", ""), "ruff": ruff, "argv": sys.argv[1:], "sha256": hashlib.sha256(modular.read_bytes()).hexdigest()}) + "\\n")
"""


def make_fake_checkout(
    root: Path, pristine: Path, edits: list[tuple[str, str]], fail: bool = False, positional: bool = False
) -> Path:
    """A checkout at `root` (with `src/` and the fake converter) whose converter writes `pristine` with `edits`
    (or fails, with `fail`; takes the files as positional arguments, as recent converters do, with
    `positional`)."""
    utils = root / "utils"
    utils.mkdir(parents=True)
    (root / "src").mkdir()
    (utils / "modular_model_converter.py").write_text(FAKE_CONVERTER)
    (utils / "fake_settings.json").write_text(
        json.dumps({"pristine": str(pristine), "edits": edits, "fail": fail, "positional": positional})
    )
    return root


def fake_runs(root: Path) -> list[dict[str, str]]:
    log = root / "utils" / "fake_runs.json"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
