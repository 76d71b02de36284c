"""Dependencies between the packages: the core package never imports the benchmark
adapters, and the models do not import the trainer (issue 14 item 5)."""

import ast
from pathlib import Path

import meshops
import meshops.datasets.folder
import meshops.datasets.normalizer

ROOT = Path(meshops.__file__).parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import statement in a file, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_no_module_under_meshops_imports_data_adapters():
    """Every import statement in meshops/**.py, also those inside functions (the CLI
    imported the folder data set lazily), is checked."""
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 20
    offenders = [f"{path.relative_to(ROOT.parent)}:{line}: import {module}"
                 for path in files for line, module in _imported_modules(path)
                 if module == "data_adapters" or module.startswith("data_adapters.")]
    assert offenders == []


def test_the_scan_sees_a_lazy_import_inside_a_function(tmp_path):
    """Control: the scan above finds an import of data_adapters hidden in a function."""
    f = tmp_path / "m.py"
    f.write_text("def load():\n    from data_adapters.folder import MeshFolderDataset\n")
    assert _imported_modules(f) == [(2, "data_adapters.folder")]


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file of every module of the package at ``root`` (meshops)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_closure(start: str, modules: dict[str, Path]) -> set[str]:
    """The meshops modules that importing ``start`` can import, by the import
    statements in the sources (also those inside functions): a static, fast
    stand-in for importing it and looking at ``sys.modules``."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        # importing a.b.c runs a/__init__ and a/b/__init__ first; not the root's: the
        # root re-exports the whole job (fit, load_run) and no package imports it
        # (tests/package/test_import_graph.py), so it is the top of every closure, not a path
        parents = [".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)]
        todo += parents
        tree = ast.parse(modules[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                todo.append(node.module)
                todo += [f"{node.module}.{alias.name}" for alias in node.names]
    return seen


def test_importing_the_models_does_not_import_the_trainer():
    """By the import statements (also those inside functions), and in a fresh process
    by what ``import meshops.models`` leaves in ``sys.modules``."""
    import subprocess
    import sys

    code = ("import sys, meshops.models; "
            "print(sorted(m for m in sys.modules if m.startswith('meshops.training')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    modules = package_modules()
    closure = _import_closure("meshops.models", modules)
    assert {"meshops.models.base", "meshops.datasets.normalizer", "meshops.nn"} <= closure
    assert sorted(m for m in closure if m.startswith("meshops.training")) == []
    # Control: the trainer's closure does reach the models (it loads checkpoints).
    assert "meshops.models.base" in _import_closure("meshops.training", modules)


def test_old_names_are_the_same_objects():
    import data_adapters
    import data_adapters.folder
    import meshops.training
    from meshops.training.dataset import check_finite_fields

    normalizer = meshops.datasets.normalizer
    assert meshops.training.UnitGaussianNormalizer is normalizer.UnitGaussianNormalizer
    for name in ("MeshFolderDataset", "export_to_folder", "list_mesh_files"):
        assert getattr(data_adapters, name) is getattr(meshops.datasets.folder, name)
        assert getattr(data_adapters.folder, name) is getattr(meshops, name)
    assert check_finite_fields is meshops.datasets.folder.check_finite_fields


def long_functions(root: Path = ROOT, limit: int = 60) -> list[str]:
    """``file:line name (lines)`` of every function (nested ones and methods too) longer
    than ``limit`` lines, its docstring included, but the parsers' ``add_parser`` of
    ``meshops/cli`` (argparse declarations, one option after another)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > limit and not (path.parent.name == "cli" and node.name == "add_parser"):
                out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                           f"({lines})")
    return out


def test_no_function_is_longer_than_60_lines():
    """Issue 29: a function of more than a screen is several steps; each gets a name."""
    assert long_functions() == []


def test_the_length_scan_sees_a_long_method(tmp_path):
    """Control: a 61-line method is found, a 60-line function and a 61-line
    ``add_parser`` of a ``cli`` folder are not."""
    (tmp_path / "pkg" / "cli").mkdir(parents=True)
    method = "class A:\n    def m(self):\n" + "        x = 1\n" * 60
    function = "def f():\n" + "    x = 1\n" * 59
    (tmp_path / "pkg" / "a.py").write_text(method + "\n\n" + function)
    (tmp_path / "pkg" / "cli" / "b.py").write_text("def add_parser():\n" + "    x = 1\n" * 60)
    assert long_functions(tmp_path / "pkg") == ["pkg/a.py:2 m (61)"]
