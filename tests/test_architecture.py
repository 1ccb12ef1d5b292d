"""Import contracts of the tree, checked with ``ast`` alone.

- ``tier_store`` has no import cycle. Imports inside functions count (they run when the
  function does); imports under ``if TYPE_CHECKING:`` do not (they never run).
- Adapters (``pafka_source``, ``migration``, ``pyspark_pafka.py``, ``bench/*.py``, the code
  cells of ``notebooks/*.ipynb``) import the ``tier_store`` package, never one of its modules:
  the package's names are the store's interface, its modules are free to move.
- Data flows one way: ``tier_store`` and ``migration`` never import ``pyspark`` or
  ``pafka_source``.
- Modules stay under 400 lines and classes under 300 (a report: see the marks).

The checkers take a root directory, so the self-tests run them on a package in tmp_path.
"""

from __future__ import annotations

import ast
import json
import textwrap
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from .conftest import ROOT

REPO = Path(ROOT)
STORE = "tier_store"
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300

# -- reading imports --------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (any ``x.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_nodes(tree: ast.AST,
                 type_checking: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth (functions, classes, try blocks).

    The body of ``if TYPE_CHECKING:`` is left out unless ``type_checking``; its ``else``
    branch runs and is kept."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and not type_checking and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` under ``root`` (a package is its
    ``__init__.py``, named like the package)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if all(p.isidentifier() for p in parts):
            out[".".join(parts)] = path
    return out


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from`` import reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
                     known: Iterable[str]) -> set[str]:
    """The modules of ``known`` whose code an import statement in ``module`` runs.

    ``import a.b.c`` and ``from a.b.c import x`` run a, a.b and a.b.c; ``from a.b import c``
    runs a.b.c too when c is a module, and only a.b's ``__init__`` when c is a name in it.
    Packages enclosing ``module`` itself are left out where only implied by the path (they
    are already being imported when ``module`` runs); named directly they count."""
    known = set(known)
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
        direct = set(targets)
    else:
        source = _resolve(node, module, is_package)
        targets = []
        direct = set()
        for a in node.names:
            sub = f"{source}.{a.name}"
            if sub in known:
                targets.append(sub)
                direct.add(sub)
            else:
                targets.append(source)
                direct.add(source)
    own = module.split(".")
    enclosing = {".".join(own[:i]) for i in range(1, len(own) + (1 if is_package else 0))}
    out = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in known and name != module and (name in direct or name not in enclosing):
                out.add(name)
    return out


def import_graph(root: Path, package: str) -> dict[str, dict[str, list[int]]]:
    """module -> {imported module of the package: lines}, imports under TYPE_CHECKING out."""
    modules = package_modules(root, package)
    graph: dict[str, dict[str, list[int]]] = {m: {} for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node in import_nodes(tree):
            for target in imported_modules(node, module, is_package, modules):
                graph[module].setdefault(target, []).append(node.lineno)
    return graph


def _components(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def _shortest_cycle(graph: dict[str, dict[str, list[int]]], start: str,
                    within: set[str]) -> list[str] | None:
    """The shortest path start -> ... -> start inside ``within`` (breadth first)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if v != start else [start, start]
            if w in within and w not in seen:
                seen.add(w)
                parent[w] = v
                queue.append(w)
    return None


def find_cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """Import cycles, each ``[m1, m2, ..., m1]``: for every module in a cycle, the shortest
    cycle through it (duplicates dropped), so each tangle shows every module it holds."""
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for comp in _components(graph):
        if len(comp) == 1 and comp[0] not in graph[comp[0]]:
            continue
        for start in comp:
            cycle = _shortest_cycle(graph, start, set(comp))
            if cycle is None:
                continue
            ring = cycle[:-1]
            i = ring.index(min(ring))
            key = tuple(ring[i:] + ring[:i])
            if key not in seen:
                seen.add(key)
                cycles.append([*key, key[0]])
    return sorted(cycles, key=lambda c: (len(c), c))


def describe_cycle(graph: dict[str, dict[str, list[int]]], cycle: list[str]) -> str:
    """``a -> b -> a`` and where each step is imported (``a.py:12``)."""
    sites = []
    for a, b in zip(cycle, cycle[1:], strict=False):
        is_package = any(m.startswith(a + ".") for m in graph)
        file = a.replace(".", "/") + ("/__init__.py" if is_package else ".py")
        sites.append(f"{file}:{','.join(map(str, sorted(set(graph[a][b]))))}")
    return " -> ".join(cycle) + "   [" + "; ".join(sites) + "]"


# -- adapters ---------------------------------------------------------------------------------


def notebook_code(path: Path) -> Iterator[tuple[str, str]]:
    """(where, code) of each code cell, IPython magics and shell lines blanked."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb.get("cells", []), 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        lines = ["" if line.lstrip().startswith(("%", "!")) else line
                 for line in text.splitlines()]
        yield f"cell {i}", "\n".join(lines)


def sources(root: Path, patterns: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(name, code) of every file matching ``patterns`` under ``root``; a notebook gives one
    per code cell, named ``path:cell n``."""
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if path.suffix == ".ipynb":
                for where, code in notebook_code(path):
                    yield f"{rel}:{where}", code
            elif "__pycache__" not in path.parts:
                yield rel, path.read_text(encoding="utf-8")


def _imports_anywhere(name: str, code: str) -> Iterator[tuple[int, str, ast.AST]]:
    """(line, absolute module, node) of every import in ``code``, TYPE_CHECKING ones too (a
    type-only import still ties the file to where the name lives)."""
    tree = ast.parse(code, name)
    for node in sorted(import_nodes(tree, type_checking=True), key=lambda n: n.lineno):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, node
        elif not node.level and node.module:
            yield node.lineno, node.module, node


def submodule_imports(root: Path, patterns: Iterable[str], package: str) -> list[str]:
    """``file:line: statement`` of every import of a module of ``package`` (not the package)
    in the files ``patterns`` match."""
    modules = {m.split(".", 1)[1].split(".")[0]
               for m in package_modules(root, package) if "." in m}
    out = []
    for name, code in sources(root, patterns):
        for line, module, node in _imports_anywhere(name, code):
            bad = module.startswith(package + ".") or (
                module == package and isinstance(node, ast.ImportFrom)
                and any(a.name in modules for a in node.names))
            if bad:
                out.append(f"{name}:{line}: {ast.unparse(node)}")
    return out


def forbidden_imports(root: Path, patterns: Iterable[str], forbidden: Iterable[str]) -> list[str]:
    """``file:line: statement`` of every import of a ``forbidden`` package (or module of it)."""
    forbidden = tuple(forbidden)
    out = []
    for name, code in sources(root, patterns):
        for line, module, node in _imports_anywhere(name, code):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                out.append(f"{name}:{line}: {ast.unparse(node)}")
    return out


ADAPTERS = ("pafka_source/**/*.py", "migration/**/*.py", "pyspark_pafka.py", "bench/*.py",
            "notebooks/*.ipynb")
SIZED = ("tier_store/**/*.py", "pafka_source/**/*.py", "migration/**/*.py")

# -- sizes ------------------------------------------------------------------------------------


def long_modules(root: Path, patterns: Iterable[str], limit: int) -> list[str]:
    """``file: n lines`` of every module over ``limit`` lines, longest first."""
    found = [(len(code.splitlines()), name) for name, code in sources(root, patterns)]
    return [f"{name}: {n} lines" for n, name in sorted(found, reverse=True) if n > limit]


def long_classes(root: Path, patterns: Iterable[str], limit: int) -> list[str]:
    """``file:line class: n lines`` of every class over ``limit`` lines, longest first."""
    found = []
    for name, code in sources(root, patterns):
        for node in ast.walk(ast.parse(code, name)):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = (node.end_lineno or node.lineno) - first + 1
                if n > limit:
                    found.append((n, f"{name}:{node.lineno} {node.name}: {n} lines"))
    return [text for _, text in sorted(found, reverse=True)]


# -- the real tree ----------------------------------------------------------------------------


def test_tier_store_has_no_import_cycle():
    graph = import_graph(REPO, STORE)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in tier_store (TYPE_CHECKING imports left out):\n" + \
        "\n".join(describe_cycle(graph, c) for c in cycles)


# The one benchmark that takes a store internal out to measure what it costs: the full
# validation of every batch written (tier_store.topic's check_valid), in and out.
MEASURES_INTERNALS = {"bench/validation_bench.py": "tier_store.topic"}


def test_adapters_import_only_the_tier_store_package():
    found = [f for f in submodule_imports(REPO, ADAPTERS, STORE)
             if not any(f.startswith(name + ":") and f.split(": ", 1)[1].startswith(
                 f"import {module}") for name, module in MEASURES_INTERNALS.items())]
    assert not found, ("adapters must import names from the tier_store package "
                       "(from tier_store import X), not its modules; export what is "
                       "missing from tier_store/__init__.py:\n" + "\n".join(found))


def test_the_store_and_migration_never_import_spark_or_the_spark_source():
    found = forbidden_imports(REPO, ("tier_store/**/*.py", "migration/**/*.py"),
                              ("pyspark", "pafka_source", "pyspark_pafka"))
    assert not found, "Spark stays out of the store and migration:\n" + "\n".join(found)


def test_no_module_is_over_400_lines():
    found = long_modules(REPO, SIZED, MAX_MODULE_LINES)
    assert not found, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(found)


def test_no_class_is_over_300_lines():
    found = long_classes(REPO, SIZED, MAX_CLASS_LINES)
    assert not found, f"classes over {MAX_CLASS_LINES} lines:\n" + "\n".join(found)


def test_the_real_tree_is_read():
    """Guards the tests above from passing vacuously on a tree they cannot read."""
    graph = import_graph(REPO, STORE)
    assert {STORE, f"{STORE}.config", f"{STORE}.tiers.base"} <= set(graph)
    assert f"{STORE}.config" in graph[STORE]
    assert any(name.startswith("notebooks/") for name, _ in sources(REPO, ADAPTERS))


# -- the checkers on a synthetic package ------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, code in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))


@pytest.fixture
def pkg(tmp_path):
    """A small acyclic package ``pkg``: a -> b -> c, a subpackage, a TYPE_CHECKING import."""
    _write(tmp_path, {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "from .b import B\nfrom pkg.sub import mod\n\nclass A: pass\n",
        "pkg/b.py": "import pkg.c\n\nclass B: pass\n",
        "pkg/c.py": """\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .a import A
            else:
                import json
            """,
        "pkg/sub/__init__.py": "",
        "pkg/sub/mod.py": "from ..c import x\n",
    })
    return tmp_path


def test_the_graph_follows_relative_absolute_and_package_imports(pkg):
    graph = import_graph(pkg, "pkg")
    assert {m: sorted(t) for m, t in graph.items()} == {
        "pkg": ["pkg.a"],
        "pkg.a": ["pkg.b", "pkg.sub", "pkg.sub.mod"],
        "pkg.b": ["pkg.c"],
        "pkg.c": [],  # the TYPE_CHECKING import of .a is no edge
        "pkg.sub": [],
        "pkg.sub.mod": ["pkg.c"],
    }
    assert find_cycles(graph) == []


def test_a_cycle_through_an_import_inside_a_function_is_reported(pkg):
    _write(pkg, {"pkg/c.py": """\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .a import A

        def late():
            from .a import A  # runs when late() does: a cycle all the same
            return A
        """})
    graph = import_graph(pkg, "pkg")
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"],
                                  ["pkg.a", "pkg.sub.mod", "pkg.c", "pkg.a"]]
    assert describe_cycle(graph, ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]) == (
        "pkg.a -> pkg.b -> pkg.c -> pkg.a   [pkg/a.py:1; pkg/b.py:1; pkg/c.py:6]")


def test_a_type_checking_only_import_is_no_cycle(pkg):
    _write(pkg, {"pkg/b.py": """\
        import typing
        import pkg.c
        if typing.TYPE_CHECKING:
            from . import a
            from pkg.a import A
        """})
    assert find_cycles(import_graph(pkg, "pkg")) == []


def test_importing_a_name_from_a_package_imports_its_init(pkg):
    # pkg/__init__ imports .a, so a name taken from the package closes a cycle; a submodule
    # taken from it (from . import c) does not.
    _write(pkg, {"pkg/b.py": "from . import c\n\ndef f():\n    from . import A\n"})
    assert find_cycles(import_graph(pkg, "pkg")) == [["pkg", "pkg.a", "pkg.b", "pkg"]]


def test_a_module_of_a_subpackage_runs_the_subpackage_init(pkg):
    _write(pkg, {"pkg/sub/__init__.py": "from pkg.a import A\n"})
    cycles = find_cycles(import_graph(pkg, "pkg"))
    assert ["pkg.a", "pkg.sub", "pkg.a"] in cycles


def test_every_module_of_a_tangle_is_shown(pkg):
    _write(pkg, {"pkg/b.py": "import pkg.c\nfrom .a import A\n",
                 "pkg/c.py": "from . import b\n"})
    assert find_cycles(import_graph(pkg, "pkg")) == [
        ["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.c", "pkg.b"],
        ["pkg.a", "pkg.sub.mod", "pkg.c", "pkg.b", "pkg.a"]]


def test_adapter_imports_of_modules_are_listed_with_file_and_line(pkg):
    _write(pkg, {
        "app/__init__.py": "",
        "app/ok.py": "import pkg\nfrom pkg import A\nfrom .x import y\n",
        "app/bad.py": """\
            from typing import TYPE_CHECKING
            import pkg.b
            from pkg import sub

            def f():
                from pkg.sub.mod import x
            if TYPE_CHECKING:
                from pkg.a import A
            """,
        "nb/n.ipynb": json.dumps({"cells": [
            {"cell_type": "markdown", "source": ["from pkg.a import A"]},
            {"cell_type": "code", "source": ["%matplotlib inline\n", "from pkg import A\n"]},
            {"cell_type": "code", "source": ["!ls\n", "import os\n", "from pkg.c import x"]},
        ]}),
    })
    assert submodule_imports(pkg, ["app/*.py", "nb/*.ipynb"], "pkg") == [
        "app/bad.py:2: import pkg.b",
        "app/bad.py:3: from pkg import sub",
        "app/bad.py:6: from pkg.sub.mod import x",
        "app/bad.py:8: from pkg.a import A",
        "nb/n.ipynb:cell 3:3: from pkg.c import x",
    ]
    assert forbidden_imports(pkg, ["app/*.py"], ["pkg.sub"]) == [
        "app/bad.py:6: from pkg.sub.mod import x"]


def test_sizes_are_reported_with_counts(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    _write(tmp_path, {"m/big.py": f"class Big:\n{body}\n", "m/small.py": "x = 1\n"})
    assert long_modules(tmp_path, ["m/*.py"], 5) == ["m/big.py: 6 lines"]
    assert long_classes(tmp_path, ["m/*.py"], 5) == ["m/big.py:1 Big: 6 lines"]
    assert long_classes(tmp_path, ["m/*.py"], 6) == []
