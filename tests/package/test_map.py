"""``help(meshops)`` maps the package (issue 29, items 2 and 5): the root holds only
``errors``, ``version`` and subpackages, its docstring names every subpackage once and
nothing that does not exist, every subpackage says in its own docstring what it holds
and what it may import, and the entry points named are importable from ``meshops``."""

import importlib
import pkgutil
import re

import meshops

ROOT_MODULES = {"errors", "version", "__main__"}  # __main__: ``python -m meshops``


def _map_section() -> str:
    doc = meshops.__doc__
    return doc[doc.index("The package, by concept"):]


def test_the_root_holds_only_errors_version_and_subpackages():
    modules = {m.name for m in pkgutil.iter_modules(meshops.__path__) if not m.ispkg}
    assert modules == ROOT_MODULES


def test_the_map_names_every_subpackage_once_and_no_other():
    packages = {m.name for m in pkgutil.iter_modules(meshops.__path__) if m.ispkg}
    # a subpackage heads its own paragraph: ``name`` alone on a line
    named = re.findall(r"^``(\w+)``$", _map_section(), flags=re.M)
    assert sorted(named) == sorted(packages)
    assert len(named) == len(set(named))


def test_every_subpackage_says_what_it_holds_and_what_it_may_import():
    for m in pkgutil.iter_modules(meshops.__path__):
        if not m.ispkg:
            continue
        doc = importlib.import_module(f"meshops.{m.name}").__doc__ or ""
        assert len(doc.split()) >= 25, m.name           # a paragraph, not a title
        assert re.search(r"\bImports\b", doc), m.name    # the allowed direction


def test_the_entry_points_named_are_importable_from_meshops():
    start = meshops.__doc__[meshops.__doc__.index("Where to start:"):
                            meshops.__doc__.index("The package, by concept")]
    for name in ("fit", "load_run", "read_mesh", "write_mesh", "load_model", "predict_mesh"):
        assert f"``{name}``" in start and name in meshops.__all__
        assert callable(getattr(meshops, name))
    assert "``Run``" in start and meshops.Run is meshops.runs.Run
    assert "``meshops.training.Trainer``" in start
    from meshops.training import Trainer  # noqa: F401
