"""The package's modules import one another one way only. Each layer (a package of
``src/rwfs``; ``rwfs/__init__.py`` lists them) imports from itself and the layers below,
never from one above, and no module is in a cycle. An import counts when a module makes it
as it runs, at its top or inside a function (a lazy import is still a dependency); imports
under ``if TYPE_CHECKING:`` are left out: they only name types."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "rwfs"

# Bottom first: "" is the top of the package (small modules that import nothing of rwfs).
LAYERS = ["", "checks", "journal", "core", "features", "control", "fuse", "cli"]


def _type_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, me: str, modules: set[str]) -> set[str]:
    """The package's modules (dotted, below ``rwfs``) that module ``me`` imports as it
    runs."""
    here = me.split(".")[:-1]
    found: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_only(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "rwfs":
                base = []
            else:
                base = None
            if base is not None:
                mod = (node.module or "").split(".")
                if node.level == 0:
                    mod = mod[1:]
                prefix = [*base, *[m for m in mod if m]]
                named = {".".join([*prefix, a.name]) for a in node.names}
                found.update(n for n in named if n in modules)
                if ".".join(prefix) in modules:
                    found.add(".".join(prefix))
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "rwfs" and ".".join(parts[1:]) in modules:
                    found.add(".".join(parts[1:]))
        todo.extend(ast.iter_child_nodes(node))
    return found


def graph() -> dict[str, set[str]]:
    """Each module of the package (``core.files``; a package's ``__init__`` by the
    package's name) and the modules it imports."""
    files = sorted(PACKAGE.rglob("*.py"))

    def name(f: Path) -> str:
        parts = list(f.relative_to(PACKAGE).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(f) for f in files}
    return {
        name(f): _imports(ast.parse(f.read_text()), name(f), modules) - {name(f)} for f in files
    }


def layer(module: str) -> str:
    return module.split(".")[0] if "." in module or module in LAYERS else ""


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
    # Guards the reader itself: these imports exist (at the top, and inside a function,
    # relative to the package and to the one above it).
    assert "journal.store" in g["features.history"] and "journal.timelines" in g["journal.store"]
    assert "cli.run" in g["cli.commands"] and "fuse.kernelflags" in g["cli.mounting"]
    assert "policy" in g["core.workspace"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = cycles(graph())
    assert found == [], f"modules that import one another: {found}"


def test_every_module_is_in_a_layer():
    packages = {f.name for f in PACKAGE.iterdir() if f.is_dir() and f.name != "__pycache__"}
    assert packages == set(LAYERS) - {""}


def test_no_import_goes_up_a_layer():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
        (m, d)
        for m, deps in graph().items()
        for d in deps
        if m != "" and rank[layer(d)] > rank[layer(m)]
    )
    assert upward == [], f"imports of a layer above: {upward}"
    top = {m: deps for m, deps in graph().items() if layer(m) == "" and m != "" and deps}
    assert top == {}, f"the top's modules import nothing of rwfs: {top}"
