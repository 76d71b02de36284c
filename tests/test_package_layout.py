"""Dependencies between the packages: the core package never imports the benchmark
adapters, and the models do not import the trainer (issue 14 item 5)."""

import ast
import pickle
import subprocess
import sys
from pathlib import Path

import meshops
import meshops.datasets
import meshops.normalizer

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


def test_importing_the_models_does_not_import_the_trainer():
    code = ("import sys, meshops.models, meshops.datasets, meshops.normalizer; "
            "print(sorted(m for m in sys.modules if m.startswith(('meshops.training', "
            "'data_adapters'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_old_names_are_the_same_objects():
    import data_adapters
    import data_adapters.folder
    import meshops.training
    import meshops.training.normalizer
    from meshops.training.dataset import check_finite_fields

    assert meshops.training.normalizer.UnitGaussianNormalizer is meshops.UnitGaussianNormalizer
    assert meshops.training.UnitGaussianNormalizer is meshops.normalizer.UnitGaussianNormalizer
    for name in ("MeshFolderDataset", "export_to_folder", "list_mesh_files"):
        assert getattr(data_adapters, name) is getattr(meshops.datasets, name)
        assert getattr(data_adapters.folder, name) is getattr(meshops, name)
    assert check_finite_fields is meshops.datasets.check_finite_fields


def test_a_pickle_naming_the_old_normaliser_module_loads():
    """A pickle written before the move names ``meshops.training.normalizer``; it
    must still unpickle, to the class now in :mod:`meshops.normalizer`."""
    norm = meshops.UnitGaussianNormalizer(2)
    norm.mean.copy_(meshops.normalizer.torch.tensor([1.5, -2.0]))
    blob = pickle.dumps(norm, protocol=2)
    new, old = b"meshops.normalizer", b"meshops.training.normalizer"
    assert blob.count(new) == 1
    old_blob = blob.replace(new, old)  # what the old code wrote (protocol 2 has no lengths)
    loaded = pickle.loads(old_blob)
    assert type(loaded) is meshops.normalizer.UnitGaussianNormalizer
    assert loaded.mean.tolist() == [1.5, -2.0] and loaded.channels == 2
