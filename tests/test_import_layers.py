"""Dependencies point one way, ``daemon → goals → agent``, with no import cycle inside a package.

The test reads every ``.py`` file of ``agent/``, ``goals/`` and ``daemon/`` with :mod:`ast` and
collects its imports: at module level and inside functions and classes alike (an import inside a
function still ties the modules together; it only moves the failure to run time), but not those in
an ``if TYPE_CHECKING:`` block, which never run (their ``else`` branch does). An import names the
most specific module of the three packages it reaches: ``from agent import allowlist`` is an edge
to ``agent.allowlist``, ``from agent import Event`` an edge to ``agent`` (the package's
``__init__``, which imports the rest). Relative imports are resolved; other libraries are ignored.

The self-tests below feed the reader and the cycle finder small trees, so the layer tests cannot
pass by seeing nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "goals", "daemon")

Graph = dict[str, set[str]]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[str, str | None]]:
    """``(module, name)`` pairs imported anywhere in ``source`` outside ``if TYPE_CHECKING:`` blocks
    (``name`` is ``None`` for ``import x.y``)."""
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.extend((target, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Module → the modules of ``packages`` it imports."""
    files = {module_name(root, p): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: Graph = {}
    for mod, path in files.items():
        deps: set[str] = set()
        for target, name in imported_names(path.read_text(), mod, path.name == "__init__.py"):
            full = f"{target}.{name}" if name is not None else target
            candidate = full if full in files else target
            parts = candidate.split(".")
            while parts and ".".join(parts) not in files:
                parts.pop()
            if parts and ".".join(parts) != mod:
                deps.add(".".join(parts))
        graph[mod] = deps
    return graph


def cycles(graph: Graph, package: str) -> list[list[str]]:
    """The import cycles among ``package``'s modules: its strongly connected components of two or more."""
    inside = {m for m in graph if m == package or m.startswith(package + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v] & inside):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(inside):
        if v not in index:
            connect(v)
    return sorted(found)


def _crossings(graph: Graph, source: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if mod == source or mod.startswith(source + ".")
        for dep in deps
        if dep.split(".")[0] in forbidden
    )


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(ROOT)


def test_agent_imports_neither_goals_nor_daemon(graph: Graph) -> None:
    assert _crossings(graph, "agent", ("goals", "daemon")) == []


def test_goals_does_not_import_daemon(graph: Graph) -> None:
    assert _crossings(graph, "goals", ("daemon",)) == []


@pytest.mark.parametrize("package", ["agent", "goals"])
def test_no_import_cycle_inside_the_package(graph: Graph, package: str) -> None:
    assert cycles(graph, package) == []


def test_no_import_cycle_inside_daemon(graph: Graph) -> None:
    assert cycles(graph, "daemon") == []


def test_the_scan_sees_the_packages(graph: Graph) -> None:
    assert "agent.store" in graph["agent.runtime"]
    assert "agent" in graph["goals.engine"]
    assert "goals" in graph["daemon.host"]


def test_every_name_the_agent_package_exports_is_imported_through_it() -> None:
    """``agent/__init__.py`` stays trimmed: a name it re-exports that no module or test imports from
    ``agent`` is dead weight (``docs/architecture.md#packages-and-the-import-direction``)."""
    import agent

    imported: set[str] = set()
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or path == ROOT / "agent" / "__init__.py":
            continue
        source = path.read_text()
        pairs = imported_names(source, "", False)
        imported.update(name for target, name in pairs if target == "agent" and name is not None)
        if ("agent", None) in pairs:  # ``import agent``, then ``agent.Name``
            imported.update(
                node.attr
                for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "agent"
            )
    assert sorted(set(agent.__all__) - imported) == []


# -- self-tests ------------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Graph:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path, ("pkg", "other"))


def test_reader_sees_function_level_and_relative_imports_and_skips_type_checking(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": (
                "from typing import TYPE_CHECKING\n"
                "import json\n"
                "if TYPE_CHECKING:\n"
                "    from pkg.b import B\n"
                "else:\n"
                "    from pkg import c\n"
                "def f():\n"
                "    from .d import D\n"
                "class K:\n"
                "    import other.x\n"
                "A = 1\n"
            ),
            "pkg/b.py": "",
            "pkg/c.py": "from pkg import A\n",
            "pkg/d.py": "",
            "other/__init__.py": "",
            "other/x.py": "",
        },
    )
    assert graph["pkg.a"] == {"pkg.c", "pkg.d", "other.x"}
    assert graph["pkg.c"] == {"pkg"}
    assert graph["pkg"] == {"pkg.a"}
    assert cycles(graph, "pkg") == [["pkg", "pkg.a", "pkg.c"]]
    assert _crossings(graph, "pkg", ("other",)) == ["pkg.a imports other.x"]


def test_cycle_finder_passes_a_layered_tree(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.top import T\n",
            "pkg/top.py": "from pkg.mid import M\nfrom pkg.low import L\nT = 1\n",
            "pkg/mid.py": "from pkg.low import L\nM = 1\n",
            "pkg/low.py": "L = 1\n",
        },
    )
    assert cycles(graph, "pkg") == []
