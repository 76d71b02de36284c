"""``help(meshops)`` maps the package (issue 29, item 5): its docstring names every
public module and subpackage once, nothing that does not exist, and entry points that
``import meshops`` gives."""

import pkgutil
import re

import meshops


def _map_section() -> str:
    doc = meshops.__doc__
    return doc[doc.index("The package, by concept:"):]


def test_the_map_names_every_public_module_and_no_other():
    public = {m.name for m in pkgutil.iter_modules(meshops.__path__)
              if not m.name.startswith("_")}
    # the modules are the names outside brackets (inside: what each holds)
    outside = re.sub(r"\([^()]*\)", "", _map_section().split("Modules whose names")[0])
    named = re.findall(r"``(\w+)``", outside)
    assert sorted(named) == sorted(public)   # each once, and only modules that exist
    assert len(named) == len(set(named))


def test_the_map_calls_the_underscored_modules_private_and_they_exist():
    private = {m.name for m in pkgutil.iter_modules(meshops.__path__)
               if m.name.startswith("_") and m.name != "__main__"}
    said = set(re.findall(r"``(_\w+)``", meshops.__doc__))
    assert said and said <= private
    assert "private" in _map_section()


def test_the_entry_points_named_are_importable_from_meshops():
    start = meshops.__doc__[meshops.__doc__.index("Where to start:"):
                            meshops.__doc__.index("The package, by concept:")]
    for name in ("read_mesh", "write_mesh", "load_run", "predict_mesh"):
        assert f"``{name}``" in start and name in meshops.__all__
        assert callable(getattr(meshops, name))
    assert "``meshops.training.Trainer``" in start
    from meshops.training import Trainer  # noqa: F401
