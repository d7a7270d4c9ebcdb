"""The layer contract of docs/design.md, checked on the source: every import (top-level
and inside functions) points into the importer's own unit or a lower layer, and the
top-level imports between modules form no cycle. Known exceptions are listed below with
the issue that removes them; a new violation fails."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DESIGN = ROOT / "docs" / "design.md"

# (importer, imported) pairs that break the contract: none today, and none may be added.
ALLOWED: set[tuple[str, str]] = set()

# Cycles closed by imports inside functions or in annotations: none today.
ALLOWED_LAZY_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "gpuwarden").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The internal modules an import statement names (a ``from m import x`` names m.x
    where that is a module, else m)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            pkg = pkg[: len(pkg) - node.level + 1]
            base = ".".join(pkg + ([node.module] if node.module else []))
        targets = [
            f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
        ]
    for t in targets:
        while t and t not in MODULES:  # import a.b.c names module a.b.c or its package
            t = t.rpartition(".")[0]
        if t and t != name:
            yield t


def imports(name: str, top_only: bool, annotations: bool = True) -> set[str]:
    """The internal modules ``name`` imports: at import time only (``top_only``: outside
    functions), or anywhere; ``annotations``: with those under ``if TYPE_CHECKING``
    (never when ``top_only``)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.update(_imported(name, path, child))
            elif top_only and isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            ):
                continue  # runs when called, not when imported
            elif (
                (top_only or not annotations)
                and isinstance(child, ast.If)
                and _type_checking(child)
            ):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]))
            else:
                visit(child)

    visit(tree)
    return out


def layers() -> list[list[tuple[str, ...]]]:
    """The layer table of docs/design.md, lowest first: per layer its units, a unit
    being one package (or module) or several joined by ``+`` that may import each
    other."""
    text = DESIGN.read_text()
    section = text.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|[^|]*\|(.*)\|\s*$", line)
        if m:
            units = [tuple(re.findall(r"`([\w.]+)`", u)) for u in m.group(2).split(",")]
            rows.append((int(m.group(1)), [u for u in units if u]))
    assert rows, "no layer table in docs/design.md"
    rows.sort()
    assert [r for r, _ in rows] == list(range(len(rows))), "layers are numbered 0, 1, ..."
    return [units for _, units in rows]


LAYERS = layers()


def place(module: str) -> tuple[int, tuple[str, ...], str]:
    """(layer, unit, table entry) of a module: the longest table entry that names it or
    one of its packages (``gpuwarden`` itself names only the package's ``__init__``)."""
    best: tuple[int, tuple[str, ...], str] | None = None
    for rank, units in enumerate(LAYERS):
        for unit in units:
            for entry in unit:
                inside = "." in entry and module.startswith(entry + ".")  # the root: itself
                if (module == entry or inside) and (best is None or len(entry) > len(best[2])):
                    best = (rank, unit, entry)
    assert best is not None, f"{module} is in no layer of docs/design.md"
    return best


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        place(module)


def _violations() -> set[tuple[str, str]]:
    out = set()
    for module in MODULES:
        rank, unit, _ = place(module)
        for dep in imports(module, top_only=False):
            dep_rank, dep_unit, _ = place(dep)
            if dep_rank < rank or dep_unit == unit:
                continue
            out.add((module, dep))
    return out


def test_lower_layers_never_import_higher_ones() -> None:
    found = _violations()
    new = sorted(found - ALLOWED)
    assert not new, "imports against the layers of docs/design.md:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in new
    )
    gone = sorted(ALLOWED - found)
    assert not gone, f"fixed, take them out of ALLOWED: {gone}"


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles() -> None:
    cycles = _cycles({m: imports(m, top_only=True) for m in MODULES})
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def test_no_cycles_even_lazily_or_in_annotations() -> None:
    """Imports inside functions, or under ``TYPE_CHECKING``, can close a cycle without
    failing at import time; the modules are still one tangle to read and to change."""
    graph = {m: imports(m, top_only=False, annotations=True) for m in MODULES}
    cycles = set(_cycles(graph))
    assert cycles <= ALLOWED_LAZY_CYCLES, [sorted(c) for c in cycles - ALLOWED_LAZY_CYCLES]
    gone = ALLOWED_LAZY_CYCLES - cycles
    assert not gone, f"fixed, take them out of ALLOWED_LAZY_CYCLES: {gone}"


LAZY = "def f():\n    from gpuwarden.daemon import loop\n"
TYPING = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpuwarden.units\n"


@pytest.mark.parametrize(
    "source, top, anywhere",
    [
        ("import gpuwarden.units\n", {"gpuwarden.units"}, {"gpuwarden.units"}),
        (
            "from gpuwarden.procs import identity\n",
            {"gpuwarden.procs.identity"},
            {"gpuwarden.procs.identity"},
        ),
        ("from gpuwarden.units import MiB\n", {"gpuwarden.units"}, {"gpuwarden.units"}),
        ("import gpuwarden.nothing.here\n", {"gpuwarden"}, {"gpuwarden"}),
        (LAZY, set(), {"gpuwarden.daemon.loop"}),
        ("class C:\n    import gpuwarden.units\n", {"gpuwarden.units"}, {"gpuwarden.units"}),
        (
            "try:\n    import gpuwarden.units\nexcept ImportError:\n    pass\n",
            {"gpuwarden.units"},
            {"gpuwarden.units"},
        ),
        (TYPING, set(), {"gpuwarden.units"}),
    ],
)
def test_import_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, top: set[str], anywhere: set[str]
) -> None:
    f = tmp_path / "probe.py"
    f.write_text(source)
    monkeypatch.setitem(MODULES, "gpuwarden.probe", f)
    assert imports("gpuwarden.probe", top_only=True) == top
    assert imports("gpuwarden.probe", top_only=False) == anywhere


def test_a_new_upward_import_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "probe.py"
    f.write_text("def f():\n    from gpuwarden.daemon import loop\n")
    monkeypatch.setitem(MODULES, "gpuwarden.procs.probe", f)
    assert ("gpuwarden.procs.probe", "gpuwarden.daemon.loop") in _violations()


# (importer, module, name): another module's private name imported: none today.
ALLOWED_PRIVATE: set[tuple[str, str, str]] = set()


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and not node.level
                and node.module.startswith("gpuwarden")
            ):
                found |= {
                    (name, node.module, a.name)
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                }
    return found


def test_no_module_imports_another_ones_private_names() -> None:
    """What a module names with a leading underscore is its own: a name others need is
    made public (or the rule moves where both can use it)."""
    found = _private_imports()
    assert found - ALLOWED_PRIVATE == set(), "private names imported:\n" + "\n".join(
        f"  {a} imports {n} from {m}" for a, m, n in sorted(found - ALLOWED_PRIVATE)
    )
    assert found >= ALLOWED_PRIVATE, "fixed: drop from ALLOWED_PRIVATE " + str(
        ALLOWED_PRIVATE - found
    )


MAX_LINES = 520  # "about 500": a module past it holds more than one idea (CONTRIBUTING.md)


def test_no_module_is_much_longer_than_500_lines() -> None:
    """A module that grows past about 500 lines is split where it holds two ideas (as
    the store's file handling from its queries), not trimmed to fit."""
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
