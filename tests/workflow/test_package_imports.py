"""The package's import structure (issue #50): no runtime import circle between its modules, and no module imports
another's private (underscore) name. Imports under TYPE_CHECKING are for annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

from support.common import REPO

SRC = REPO / "src"


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


def runtime_imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported module, names) of every import a module runs (at its top or inside a function)."""
    out = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                out.extend((a.name, []) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.append((node.module, [a.name for a in node.names]))
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return [(m, names) for m, names in out if m in known and m != name]


def test_no_runtime_import_circle():
    known = modules()
    graph = {m: {dep for dep, _ in runtime_imports(m, p, known)} for m, p in known.items()}
    circles, index, low, stack, on, counter = [], {}, {}, [], set(), [0]

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on.discard(w)
                component.append(w)
            on.discard(v)
            if component:
                circles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            strong(v)
    assert circles == []


def test_no_module_imports_another_modules_private_name():
    known = modules()
    private = [f"{m} imports {dep}.{n}" for m, p in known.items() for dep, names in runtime_imports(m, p, known)
               for n in names if n.startswith("_") and not n.startswith("__")]
    assert private == []
