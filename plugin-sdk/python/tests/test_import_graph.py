"""The package's modules import each other without a circle (``docs/architecture.md``,
"The map"), like the Rust crates' check in ``host/src/module_graph.rs``. Read
from the source with :mod:`ast`: every ``import`` of a ``carteiro`` module, including one
inside a function, is an arrow; ``from carteiro import name`` points at the submodule
``name`` if there is one, else at the package's ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "carteiro"

Graph = dict[str, set[str]]


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def arrows(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """The package's modules that ``source`` (the module ``name``) imports."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(_deepest(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.add(target if target in known else _deepest(base, known))
    out.discard(name)
    out.discard("")
    return out


def _deepest(dotted: str, known: set[str]) -> str:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return ""


def a_circle(graph: Graph) -> list[str] | None:
    """One circle of ``graph``, if it has any (depth-first search)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            circle = visit(nxt, [*path, node])
            if circle:
                return circle
        done.add(node)
        return None

    for node in sorted(graph):
        circle = visit(node, [])
        if circle:
            return circle
    return None


def test_the_package_imports_without_a_circle() -> None:
    found = modules()
    known = set(found)
    graph = {
        name: arrows(name, path.read_text(encoding="utf-8"), known, path.name == "__init__.py")
        for name, path in found.items()
    }
    assert {"carteiro._component", "carteiro._registry", "carteiro._host.mock"} <= known
    assert "carteiro._registry" in graph["carteiro._component"], graph
    circle = a_circle(graph)
    assert circle is None, f"import circle: {' -> '.join(circle or [])}; move what both need below"


def test_the_check_finds_a_circle_even_through_a_lazy_import() -> None:
    known = {"carteiro", "carteiro._component", "carteiro._registry", "carteiro.message"}
    registry = (
        "from carteiro.message import Message\n"
        "\n"
        "def handler(fn):\n"
        "    from carteiro import _component\n"
    )
    component = "from carteiro import _registry as _handler\nimport json\n"
    graph = {
        "carteiro._registry": arrows("carteiro._registry", registry, known),
        "carteiro._component": arrows("carteiro._component", component, known),
    }
    assert graph["carteiro._registry"] == {"carteiro.message", "carteiro._component"}
    assert a_circle(graph) == ["carteiro._component", "carteiro._registry", "carteiro._component"]
    graph["carteiro._registry"].discard("carteiro._component")
    assert a_circle(graph) is None
