"""What the editor mirrors from the server, compared: the protocol's custom names, defined once
(`lsp/methods.py`) and mirrored one to one by `extension/src/lsp_ext.ts` (the server registers exactly the
commands and requests it names), and the settings' defaults, defined by the server and declared in package.json."""

from __future__ import annotations

import re

from conftest import REPO_ROOT
from modeltrace.lsp import methods
from modeltrace.lsp.server import create_server


LSP_EXT = REPO_ROOT / "extension" / "src" / "lsp_ext.ts"


def _typescript_names() -> tuple[set[str], set[str], set[str]]:
    """(server commands, notifications, requests) as lsp_ext.ts declares them."""
    source = LSP_EXT.read_text()
    block = re.search(r"export const serverCommands = \{(.*?)\} as const;", source, re.S)
    assert block, "lsp_ext.ts no longer declares `serverCommands`"
    commands = set(re.findall(r'^\s*\w+: "([^"]+)",', block.group(1), re.M))
    notifications = set(re.findall(r'new lc\.NotificationType<[^>]*>\("([^"]+)"\)', source))
    requests = set(re.findall(r'new lc\.RequestType<[^>]*>\("([^"]+)"\)', source))
    return commands, notifications, requests


def test_the_editor_mirrors_every_name_of_the_protocol() -> None:
    commands, notifications, requests = _typescript_names()
    assert commands == set(methods.SERVER_COMMANDS)
    assert notifications == set(methods.NOTIFICATIONS)
    assert requests == set(methods.REQUESTS)
    # no other `modelTrace/…` method is spelled anywhere in the editor's sources
    others = {
        name
        for path in (REPO_ROOT / "extension" / "src").glob("*.ts")
        if path != LSP_EXT
        for name in re.findall(r'"(modelTrace/\w+)"', path.read_text())
    }
    assert not others, f"methods spelled outside lsp_ext.ts: {sorted(others)}"


def test_the_server_serves_every_command_and_request_it_names() -> None:
    server = create_server()
    registered = set(server.protocol.fm.commands)
    features = set(server.protocol.fm.features)
    assert set(methods.SERVER_COMMANDS) <= registered
    assert set(methods.REQUESTS) <= features
    custom = {name for name in registered | features if name.startswith("modelTrace")}
    assert custom == set(methods.SERVER_COMMANDS) | set(methods.REQUESTS)


def test_the_editor_declares_the_server_defaults() -> None:
    """Defaults live in the server (`Settings`); the editor's declared defaults (package.json) mirror them, so
    any LSP client that sends nothing gets what VS Code users get."""
    import json
    import sys
    from dataclasses import fields

    from conftest import REPO_ROOT
    from modeltrace.lsp.settings import _SETTINGS, Settings

    declared = json.loads((REPO_ROOT / "package.json").read_text())["contributes"]["configuration"]["properties"]
    defaults = {item.name: item for item in fields(Settings)}
    server = Settings()
    for name, (field_name, _parse) in _SETTINGS.items():
        if f"modelTrace.{name}" not in declared:
            assert name == "traceDirectory", f"modelTrace.{name} is not declared in package.json"
            continue
        assert field_name in defaults
        editor_default = declared[f"modelTrace.{name}"].get("default")
        mirrored = server.updated({name: editor_default}) if editor_default not in ("", None) else server
        assert getattr(mirrored, field_name) == getattr(server, field_name), (
            f"modelTrace.{name}: package.json says {editor_default!r}, the server {getattr(server, field_name)!r}"
        )
    assert server.python == sys.executable and server.lines is True
