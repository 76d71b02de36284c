"""The API reference pages, generated from the packages' ``__all__`` at each docs build.

Each public object is documented once, under the name users import it by, on the page of
the first package in :data:`PAGES` that exports it (``meshops.knn`` is
``meshops.search.knn``): no duplicate descriptions, and a name added to or removed from an
``__all__`` appears in or leaves the reference without editing the docs. The top-level
page lists the re-exports with links to where they are described.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

#: (package, title, blurb), in the order their pages appear.  ``meshops.mesh.io`` and
#: ``meshops.mesh.quadrature`` have no ``__all__``: their own public functions are taken.
PAGES = [
    ("meshops.mesh.io", "Reading and writing meshes",
     "Any meshio format in, checked; fields out, atomically."),
    ("meshops.mesh.quadrature", "Quadrature weights",
     "The weights that make every layer an integral: meshes, structured grids, clouds."),
    ("meshops.mesh.surface", "Surfaces",
     "STL/OBJ/PLY/GLB surfaces through trimesh: areas, sampling, signed distance."),
    ("meshops.fitting", "Fitting a run",
     "A folder of meshes to a trained run: ``fit`` and its ``TrainConfig``."),
    ("meshops.runs", "Using a trained run",
     "Open a run and predict, evaluate and export with it: what the commands do."),
    ("meshops.datasets", "Data sets on disk",
     "A folder of meshes as samples, normalisers."),
    ("meshops.inference", "Using a trained model",
     "A checkpoint's model and its predictions on new meshes."),
    ("meshops.search", "Neighbour search and sampling",
     "PyG's signatures and batch conventions over the fastest installed backend."),
    ("meshops.nn", "Layers",
     "Discretisation-consistent attention layers, called PyG-style on flat batches."),
    ("meshops.models", "Models",
     "Neural operators that save and load with their config."),
    ("meshops.reduced", "Reduced bases",
     "POD modes and the regression of their coefficients for parametric studies."),
    ("meshops.training", "Training",
     "The engine: the Trainer, losses, normalisers and errors."),
    ("meshops", "Top level",
     "What ``import meshops`` gives that the pages above do not describe."),
]


def _public_of_module(mod) -> list[str]:
    return sorted(n for n, o in vars(mod).items()
                  if not n.startswith("_") and getattr(o, "__module__", None) == mod.__name__
                  and (inspect.isclass(o) or inspect.isfunction(o)))


def _data_doc(package: str, name: str, obj) -> str:
    """The ``#:`` comment above a module-level constant, from the module that defines it."""
    from sphinx.pycode import ModuleAnalyzer

    for modname, mod in sorted(sys.modules.items()):
        if (modname == package or modname.startswith(package + ".")) and \
                vars(mod).get(name, None) is obj:
            doc = ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", name))
            if doc:
                return "\n".join("   " + line for line in doc)
    raise ValueError(f"{package}.{name}: a constant in __all__ needs a '#:' comment above "
                     f"its definition (the docs describe it with that comment)")


def _directive(full: str, obj) -> str:
    if inspect.ismodule(obj):
        return f".. automodule:: {full}\n   :members:\n   :no-index:\n"
    if inspect.isclass(obj):
        return f".. autoclass:: {full}\n   :members:\n   :show-inheritance:\n"
    if callable(obj):
        return f".. autofunction:: {full}\n"
    package, name = full.rsplit(".", 1)
    return f".. py:data:: {full}\n\n{_data_doc(package, name, obj)}\n"


def _summarised(obj) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)


def page_text(package: str, title: str, blurb: str, names: list[str], seen: dict) -> str:
    """One page: a summary table, then each object not described on an earlier page."""
    mod = importlib.import_module(package)
    own, elsewhere = [], []
    for name in names:
        obj = getattr(mod, name)
        home = seen.get(id(obj))
        if home is None or inspect.ismodule(obj):
            seen.setdefault(id(obj), f"{package}.{name}")
            own.append(name)
        else:
            elsewhere.append((name, home))
    lines = [f"# `{package}`: {title}", "", blurb, "", "```{eval-rst}",
             f".. currentmodule:: {package}", "",
             ".. autosummary::", ""]
    lines += [f"   {n}" for n in own if _summarised(getattr(mod, n))]
    lines += ["```", ""]
    if elsewhere:
        lines += ["Also exported here, described on the page of their package:", ""]
        lines += [f"- `{package}.{n}`: {{py:obj}}`{home}`" for n, home in elsewhere]
        lines += [""]
    for name in own:
        obj = getattr(mod, name)
        lines += ["```{eval-rst}", _directive(f"{package}.{name}", obj), "```", ""]
    return "\n".join(lines)


def generate(out_dir: Path) -> list[Path]:
    """Write ``index.md`` and one page per package into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: dict[int, str] = {}
    written = []
    toc = []
    for package, title, blurb in PAGES:
        mod = importlib.import_module(package)
        names = [n for n in getattr(mod, "__all__", None) or _public_of_module(mod)
                 if not n.startswith("_")]
        text = page_text(package, title, blurb, names, seen)
        path = out_dir / f"{package}.md"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
        toc.append(package)
    index = ["# API reference", "",
             "Generated from the docstrings at each build. Every object is described once, "
             "under the name it is imported by; tensor shapes are in each entry's *Shapes* "
             "section.", "", "```{toctree}", ":maxdepth: 1", ""] + toc + ["```", ""]
    path = out_dir / "index.md"
    text = "\n".join(index)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return written + [path]
