"""The package's modules import one another one way only: no cycle among the imports a
module makes when it runs, at its top or inside a function (a lazy import is still a
dependency). Imports under ``if TYPE_CHECKING:`` are left out: they only name types."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "rwfs"


def _type_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package's modules ``tree`` imports when it runs."""
    found: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_only(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(a.name for a in node.names)
            elif node.level == 0 and node.module and node.module.split(".")[0] == "rwfs":
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "rwfs" and len(parts) > 1:
                    found.add(parts[1])
        todo.extend(ast.iter_child_nodes(node))
    return found & modules


def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.glob("*.py"))
    modules = {f.stem for f in files}
    return {f.stem: _imports(ast.parse(f.read_text()), modules) - {f.stem} for f in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_graph_is_read():
    g = graph()
    # Guards the reader itself: these imports exist (at the top, and inside a function).
    assert "store" in g["history"] and "timelines" in g["store"]
    assert "run" in g["cli"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = cycles(graph())
    assert found == [], f"modules that import one another: {found}"
