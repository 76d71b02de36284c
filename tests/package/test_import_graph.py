"""The import graph of the package (issue 23): every module imports, no import cycle
inside ``meshops``, and no module imports another's private names.

The graph is read from the sources (every import statement, also those inside
functions, which run later but still tie the modules together; not those under
``if TYPE_CHECKING:``, which never run). ``from meshops.search import knn_module``
counts as an import of ``meshops.search.knn_module`` where that is a module, and of
the package otherwise (a name its ``__init__`` defines or re-exports)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from test_layout import package_modules

import meshops

ROOT = Path(meshops.__file__).resolve().parent
PROJECT = ROOT.parent


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST):
    """The import statements of a module, not those under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo += list(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
            edges |= subs
            if base in modules and len(subs) < len(node.names):
                edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (``[a, b, ..., a]``), or ``[]`` when there is none."""
    state: dict[str, int] = {}        # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def test_every_module_imports():
    """Every module but the command's entry points (``__main__``, which run it); a
    backend of an optional package that is not installed (torch-cluster) may fail for
    that package only."""
    names = sorted(n for n in package_modules(ROOT) if not n.endswith("__main__"))
    assert len(names) > 100
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] in ("meshops", "torch", "torch_geometric"):
                raise


def test_no_import_cycle_inside_meshops():
    assert find_cycle(import_graph(package_modules(ROOT))) == []


def test_the_scan_finds_a_cycle_through_a_lazy_import_and_skips_type_checking(tmp_path):
    """Control: a cycle closed by an import inside a function (as nn/base.py ->
    nn/local.py -> nn/position.py -> nn/base.py was) is found; one closed only under
    ``if TYPE_CHECKING:`` is not a cycle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n")
    (pkg / "b.py").write_text("from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg.e import E\n")
    (pkg / "e.py").write_text("from pkg.d import x\n")
    graph = import_graph(package_modules(pkg))
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.d"}


def private_imports(paths) -> list[str]:
    """``file:line: name`` of every ``from meshops... import _name`` in ``paths``."""
    out = []
    for path in paths:
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("meshops"):
                out += [f"{path}:{node.lineno}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_private_names():
    """The library, its benchmarks, examples and data adapters import only public names
    of meshops' modules (a module's own private names stay its own)."""
    files = [p for d in ("meshops", "benchmarks", "examples", "data_adapters")
             for p in sorted((PROJECT / d).rglob("*.py"))]
    assert len(files) > 150
    assert private_imports(files) == []


def test_the_private_import_scan_sees_one_inside_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from meshops.training.trainer import Trainer, _make_logger\n")
    assert private_imports([f]) == [f"{f}:2: meshops.training.trainer._make_logger"]


#: The packages from the bottom up (issue 29, item 2): a package imports only those on
#: lower layers or to its left on its own layer, so the whole is one order; a layer
#: groups packages that import neither of each other today (``nn`` may come to import
#: ``mesh``, never the reverse). ``errors`` and ``version`` are below everything; the
#: root ``meshops`` (its re-exports) above everything.
LAYERS = [
    ["utils"],
    ["search", "kernels"],
    ["mesh", "nn"],
    ["reduced"],
    ["datasets"],
    ["models"],
    ["inference"],
    ["training"],
    ["runs"],
    ["fitting"],
    ["cli"],
]
RANK = {pkg: (i, j) for i, layer in enumerate(LAYERS) for j, pkg in enumerate(layer)}


def _package(module: str) -> str:
    """``meshops.mesh.io`` -> ``mesh``; ``meshops.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "meshops"


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a module ``b`` in a package that ``a``'s package
    may not import (a higher layer, or one to its right on the same layer)."""
    out = []
    for a, targets in sorted(graph.items()):
        pa = _package(a)
        for b in sorted(targets):
            pb = _package(b)
            if pa == pb or pb in ("errors", "version") or pa in ("meshops", "__main__"):
                continue
            if pa in ("errors", "version") or pb == "meshops" or RANK[pb] > RANK[pa]:
                out.append(f"{a} -> {b}")
    return out


def test_every_package_has_a_layer():
    packages = {_package(n) for n in package_modules(ROOT)} - {"meshops"}
    assert packages - {"errors", "version", "__main__"} == set(RANK)


def test_the_packages_import_only_downwards():
    assert layering_violations(import_graph(package_modules(ROOT))) == []


def test_the_layering_scan_sees_an_upward_import():
    """Control: the inference importing the training (a layer up), the mesh importing
    the layers (same layer, to its right) and a package importing the root are found."""
    graph = {"meshops.inference.predict": {"meshops.training.trainer", "meshops.errors"},
             "meshops.mesh.io": {"meshops.nn.mlp", "meshops.utils.atomic"},
             "meshops.nn.mlp": {"meshops.mesh.io"},
             "meshops.datasets.cache": {"meshops"}}
    assert layering_violations(graph) == [
        "meshops.datasets.cache -> meshops",
        "meshops.inference.predict -> meshops.training.trainer",
        "meshops.mesh.io -> meshops.nn.mlp"]


def fitting_imports(graph: dict[str, set[str]], user: str = "runs",
                    fitter: str = "fitting") -> list[str]:
    """``a -> b`` for every module ``a`` of the package that uses a trained run
    (``user``) importing a module ``b`` of the package that fits one (``fitter``), or
    the root, which re-exports it."""
    return [f"{a} -> {b}" for a, targets in sorted(graph.items()) if _package(a) == user
            for b in sorted(targets) if _package(b) in (fitter, "meshops")]


def test_using_a_trained_run_never_imports_the_fitting():
    """Issue 39, item 3: predicting, evaluating and exporting with a run need nothing of
    how it was fitted, so a deployment can drop the fitting (``fit()`` may import and
    return a ``Run``, not the reverse). Checked on the graph itself, not only through
    the layers, so that reordering ``LAYERS`` cannot lose it."""
    graph = import_graph(package_modules(ROOT))
    assert any(_package(a) == "fitting" and any(_package(b) == "runs" for b in t)
               for a, t in graph.items())            # the other direction is there
    assert fitting_imports(graph) == []


def test_the_fitting_scan_sees_a_lazy_import_of_the_fitting(tmp_path):
    """Control: a module of ``runs`` importing the fitting inside a function, or through
    the root, is found; the fitting importing ``runs`` is not a finding."""
    pkg = tmp_path / "meshops"
    for sub in ("runs", "fitting"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "runs" / "run.py").write_text("def f():\n    from meshops.fitting.fit import fit\n")
    (pkg / "runs" / "report.py").write_text("import meshops\n")
    (pkg / "fitting" / "fit.py").write_text("from meshops.runs.run import f\n")
    graph = import_graph(package_modules(pkg))
    assert fitting_imports(graph) == ["meshops.runs.report -> meshops",
                                      "meshops.runs.run -> meshops.fitting.fit"]
