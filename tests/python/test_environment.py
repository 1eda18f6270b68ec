"""Running from the VS Code extension's bundle: where the bundled libraries go on the path, and what the interpreter
check reports missing with the command that installs it (the extension shows both)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO_ROOT


def _run(script: str, environment: dict[str, str]) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env={**os.environ, **environment},
        cwd="/",
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_bundled_libraries_fill_in_last_and_the_server_stack_goes_first(tmp_path: Path) -> None:
    for folder in ("libs", "fallback"):
        (tmp_path / folder).mkdir()
    found = _run(
        """
        import json, sys
        import modeltrace
        from modeltrace.bundled import add_server_libraries
        after_import = list(sys.path)
        add_server_libraries()
        print(json.dumps({"after_import": after_import, "serving": sys.path}))
    """,
        {"MODELTRACE_BUNDLE": str(tmp_path)},
    )
    # the environment's own packages win over the fallbacks: they come after site-packages
    assert found["after_import"][-1] == str(tmp_path / "fallback")
    assert any("site-packages" in entry for entry in found["after_import"][:-1])
    # the server's pygls/lsprotocol are the bundle's
    assert found["serving"][0] == str(tmp_path / "libs")
    without = _run("import json, sys, modeltrace; print(json.dumps(sys.path))", {"MODELTRACE_BUNDLE": ""})
    assert str(tmp_path / "fallback") not in without


def test_the_probe_names_what_is_missing_and_the_command_that_installs_it() -> None:
    # NOTE: libcst and numpy made unimportable for this interpreter, as in an environment without them
    found = _run(
        """
        import importlib.abc, json, sys

        class Without(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name in ("libcst", "numpy"):
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, Without())
        from modeltrace.environment import probe
        print(json.dumps(probe()))
    """,
        {"PYTHONPATH": str(REPO_ROOT / "pyserver")},
    )
    missing = {item["module"]: item for item in found["missing"]}
    assert set(missing) == {"libcst", "numpy"}
    assert missing["numpy"]["server"] and not missing["libcst"]["server"]
    assert "quick fixes" in missing["libcst"]["needed_for"]
    assert found["install"] == [sys.executable, "-m", "pip", "install", "numpy", "libcst>=1.4"]
    assert _run("import json; from modeltrace.environment import probe; print(json.dumps(probe()))", {}) == {
        "missing": [],
        "install": None,
    }
