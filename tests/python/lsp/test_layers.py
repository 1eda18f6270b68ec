"""The language server's module structure: the imports between `modeltrace/lsp/*.py` form no cycle, and the
feature modules (those `server` wires) depend on the sessions and on shared helpers, never on each other.

Every import counts: at module level, inside functions and under `TYPE_CHECKING`, so that a cycle cannot hide
behind a late import.
"""

from __future__ import annotations

import ast
from pathlib import Path

from modeltrace.lsp.loading import load_trace
from modeltrace.lsp.session import Sessions

from .support import REPOSITORY


LSP_PACKAGE = REPOSITORY / "pyserver" / "modeltrace" / "lsp"
PACKAGE_NAME = "modeltrace.lsp"
REFERENCE = REPOSITORY / "examples" / "reference" / "tiny_llama.mtrace"


def lsp_imports(path: Path, modules: set[str]) -> set[str]:
    """The `modeltrace.lsp` modules that one module imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            # `from modeltrace.lsp import hints` names modules; `from modeltrace.lsp.hints import x` names one
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name.removeprefix(PACKAGE_NAME + ".") for name in names} & modules
    return found - {path.stem}


def import_graph() -> dict[str, set[str]]:
    paths = {path.stem: path for path in LSP_PACKAGE.glob("*.py") if path.stem != "__init__"}
    return {name: lsp_imports(path, set(paths)) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in visiting:
            return visiting[visiting.index(name) :] + [name]
        if name in done:
            return None
        visiting.append(name)
        for imported in sorted(graph[name]):
            cycle = visit(imported)
            if cycle is not None:
                return cycle
        visiting.pop()
        done.add(name)
        return None

    for name in sorted(graph):
        cycle = visit(name)
        if cycle is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_language_server_modules_import_no_cycle() -> None:
    graph = import_graph()
    assert {"server", "context", "session", "publish", "commands", "hints"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_feature_modules_do_not_import_each_other() -> None:
    graph = import_graph()
    features = graph["server"] - {"context", "methods"}
    assert {"commands", "documents", "hints", "hover", "codelens", "recorders", "plot", "configuration"} <= features
    crossing = {name: sorted(graph[name] & features) for name in sorted(features) if graph[name] & features}
    assert crossing == {}, f"feature modules importing other feature modules: {crossing}"
    # nothing but the wiring imports a feature module
    importers = {name: sorted(imported & features) for name, imported in graph.items() if name != "server"}
    assert {name: imported for name, imported in importers.items() if imported} == {}


def test_closing_a_session_drops_its_trace_reference_and_hints_at_once() -> None:
    loaded = load_trace("/model/modeling_tiny_llama.py", "file:///model/modeling_tiny_llama.py", str(REFERENCE))
    sessions = Sessions()
    session = sessions.open(loaded.owner, loaded.uri)
    session.reference = str(REFERENCE)
    sessions.install(session, loaded)
    file = next(iter(loaded.files))
    assert sessions.hints(file) is loaded.files[file]
    assert sessions.showing(file) is session and sessions.owner_of(file) == loaded.owner
    assert sessions.hints_by_key(loaded.files[file].key) is loaded.files[file]
    assert sessions.references() == {loaded.owner: str(REFERENCE)}

    assert sessions.close(sessions.owner_of(file)) is session

    assert sessions.hints(file) is None and sessions.showing(file) is None
    assert sessions.hints_by_key(loaded.files[file].key) is None
    assert sessions.references() == {} and list(sessions) == []
    # a new session of the same document starts empty
    fresh = sessions.open(loaded.owner)
    assert (fresh.trace, fresh.reference, fresh.diff, fresh.failure, fresh.last_request) == (None,) * 5
