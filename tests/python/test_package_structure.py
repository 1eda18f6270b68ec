"""The whole `modeltrace` package's structure: the imports between its modules form no cycle, and no source file is
over 900 lines (the house rule), so that each package reads top-down and each file is one idea.

Every import counts: at module level, inside functions and under `TYPE_CHECKING`, so that a cycle cannot hide
behind a late import. `tests/python/lsp/test_layers.py` checks the language server's finer layering on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT


PACKAGE_ROOT = REPO_ROOT / "pyserver" / "modeltrace"
PACKAGE_NAME = "modeltrace"
LONGEST_FILE = 900


def module_name(path: Path, root: Path = PACKAGE_ROOT, package: str = PACKAGE_NAME) -> str:
    """`diff/compare.py` -> `modeltrace.diff.compare`; a package's `__init__.py` is the package itself."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def imported_modules(path: Path, modules: set[str], name: str) -> set[str]:
    """The package's modules that the module `name` (at `path`) imports, wherever the import statement is.

    `from a.b import c` imports the module `a.b.c` when there is one, else the names that `a/b/__init__.py`
    defines (an edge to `a.b`); `import a.b.c` imports `a.b.c`. The parent packages that Python runs on the way are
    not edges: a package's `__init__` importing its own modules is the usual shape, not a cycle."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # a relative import counts from the module's package (a package's `__init__` is its own package)
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
    return (found & modules) - {name}


def import_graph(root: Path = PACKAGE_ROOT, package: str = PACKAGE_NAME) -> dict[str, set[str]]:
    paths = {module_name(path, root, package): path for path in sorted(root.rglob("*.py"))}
    return {name: imported_modules(path, set(paths), name) for name, path in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles, each as its modules in order with the first repeated at the end: in every group of
    modules that import each other (Tarjan's strongly connected components), the shortest cycle through each of
    its modules, each cycle once; empty when the imports form no cycle."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(name: str) -> None:
        index[name] = lowest[name] = len(index)
        stack.append(name)
        for imported in sorted(graph[name]):
            if imported not in index:
                connect(imported)
                lowest[name] = min(lowest[name], lowest[imported])
            elif imported in stack:
                lowest[name] = min(lowest[name], index[imported])
        if lowest[name] == index[name]:
            group = {stack.pop()}
            while name not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for name in sorted(graph):
        if name not in index:
            connect(name)
    cycles: list[list[str]] = []
    for group in sorted(groups, key=min):
        for start in sorted(group):
            cycle = shortest_cycle(start, group, graph)[:-1]
            first = cycle.index(min(cycle))  # the same cycle found from another of its modules: one rotation
            cycle = [*cycle[first:], *cycle[:first], min(cycle)]
            if cycle not in cycles:
                cycles.append(cycle)
    return cycles


def shortest_cycle(start: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest import path from `start` back to itself, through the modules of its group only."""
    paths = {imported: [start, imported] for imported in sorted(graph[start] & group)}
    frontier = list(paths)
    while start not in paths:
        reached = []
        for name in frontier:
            for imported in sorted(graph[name] & group):
                if imported not in paths:
                    paths[imported] = [*paths[name], imported]
                    reached.append(imported)
        frontier = reached
    return paths[start]


def test_the_cycle_finder_names_each_cycle_and_reads_every_kind_of_import(tmp_path: Path) -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    # one group, two cycles: each named
    assert import_cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"], ["a", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c"}}) == [["c", "d", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []

    package = tmp_path / "sample"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("from sample.top import VALUE\n")
    (package / "top.py").write_text("VALUE = 1\n\ndef late():\n    from .inner import deep\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "deep.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import top\nimport sample\n"
    )
    graph = import_graph(package, "sample")
    assert graph == {
        "sample": {"sample.top"},
        "sample.inner": set(),
        "sample.inner.deep": {"sample.top", "sample"},
        "sample.top": {"sample.inner.deep"},
    }
    assert import_cycles(graph) == [
        ["sample", "sample.top", "sample.inner.deep", "sample"],
        ["sample.inner.deep", "sample.top", "sample.inner.deep"],
    ]


def test_the_package_modules_import_no_cycle() -> None:
    graph = import_graph()
    assert {"modeltrace.api", "modeltrace.diff", "modeltrace.lsp.server", "modeltrace.worker.job"} <= set(graph)
    cycles = import_cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_source_file_is_over_900_lines() -> None:
    lengths = {
        str(path.relative_to(PACKAGE_ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE_ROOT.rglob("*.py")
    }
    assert len(lengths) > 50
    too_long = {path: length for path, length in sorted(lengths.items()) if length > LONGEST_FILE}
    assert too_long == {}, f"files over {LONGEST_FILE} lines (split them where their parts are separate ideas)"
