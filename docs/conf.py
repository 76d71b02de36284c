"""Sphinx configuration of the meshops docs.

Build (what ``.ci/run`` does; warnings are errors, the tutorials and the docstring
examples execute)::

    pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

Pages are Markdown (MyST). Pages with a ``jupytext`` header (the tutorials) are
executed while they are read, and their outputs and figures are what the reader sees;
a failing cell fails the build. The API reference (``api/``), the benchmark tables and
the tables of what options and models do (``_generated/``) are written from the code
and from ``benchmarks/results/`` before the pages are read (``_ext/``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

import bench_tables  # noqa: E402  (docs/_ext)
import api_pages  # noqa: E402
import option_tables  # noqa: E402

import meshops  # noqa: E402

project = "meshops"
author = "the meshops authors"
copyright = "the meshops authors"
release = version = meshops.__version__

extensions = [
    "myst_nb",                 # Markdown pages (MyST) and executed tutorials
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",     # the docstrings' Google style (Args:, Returns:, Shapes:)
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",      # runs the docstrings' >>> examples (-b doctest)
    "machine_paths",           # a page that shows an absolute path warns (_ext/)
]

# The absolute paths the guides show on purpose, as a reader's own folders (and Linux's
# /proc); any other absolute path on a page is a warning (_ext/machine_paths.py).
machine_paths_examples = ("/scratch/", "/local/scratch/", "/home/me/", "/bin/bash", "/proc/")

# Pages of topics, in the order of the navigation. A page listed here appears as soon as
# its file exists (the guides other branches add); a page in docs/ that is listed nowhere
# fails the build (-W), so a new page cannot be forgotten.
TOPICS = ["parametric", "your-data", "large-data", "distributed", "time-series",
          "training-and-deployment", "trust", "gpu", "accuracy", "architecture"]

exclude_patterns = ["_build", "_generated", "_ext", "**/.ipynb_checkpoints",
                    "jupyter_execute"]
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}
html_theme = "furo"
html_title = f"meshops {release}"
html_static_path: list[str] = []

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# The tutorials run in a scratch folder; their first (hidden) cell copies what they need
# from the repository, found through MESHOPS_DOCS_ROOT, so a build leaves no files behind.
nb_execution_mode = os.environ.get("MESHOPS_DOCS_EXECUTE", "auto")
nb_execution_in_temp = True
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True
os.environ["MESHOPS_DOCS_ROOT"] = str(ROOT)
# `meshops` and `python` in the tutorials' shell cells are this environment's; their
# kernels import docs/_ext's shell_cells (the %%bash the pages load: _ext/shell_cells.py).
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(DOCS / "_ext")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TQDM_DISABLE", "1")
# tqdm.auto in a kernel without ipywidgets warns on import; the pages show no bars anyway.
os.environ["PYTHONWARNINGS"] = "ignore:IProgress not found"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = ["Shapes", "Methods"]
napoleon_use_rtype = False

# The docstrings' examples are fragments of a session: they share these names, and run in a
# scratch copy of examples/ so that files they write land there.
doctest_global_setup = f"""
import os, shutil, tempfile
import torch
import meshops
from meshops import *
_doc_cwd, _doc_tmp = os.getcwd(), tempfile.mkdtemp(prefix="meshops-doctest-")
shutil.copytree({str(ROOT / "examples")!r}, os.path.join(_doc_tmp, "examples"))
os.chdir(_doc_tmp)
torch.manual_seed(0)
_mesh = meshops.read_mesh("examples/meshes/annulus.vtu")
pos = _mesh.pos.float()                       # [N, 2]
weight = _mesh.weight.float()                 # [N]
batch = torch.zeros(len(pos), dtype=torch.long)
x = torch.randn(len(pos), 64)                 # [N, 64]
h, c = x, 64
from meshops.nn import *
from meshops.mesh.surface import read_surface
from torch_geometric.nn import GCNConv
x_in, pos_in, w_in = x, pos, weight           # a mesh, and a latent mesh of every 4th point
pos_lat = pos[::4]
w_lat = torch.full((len(pos_lat),), float(weight.sum()) / len(pos_lat))
x_lat = torch.randn(2, len(pos_lat), 64)      # [B, N, 64]
import trimesh
trimesh.creation.box(extents=(4.0, 1.8, 1.4)).export("car.stl")
"""
doctest_global_cleanup = """
os.chdir(_doc_cwd)
shutil.rmtree(_doc_tmp, ignore_errors=True)
"""
doctest_test_doctest_blocks = "default"


def _topics_toctree() -> str:
    pages = [p for p in TOPICS if (DOCS / f"{p}.md").exists()]
    return "\n".join(["```{toctree}", ":caption: Topics", ":maxdepth: 1", ""] + pages
                     + ["```", ""])


def _generate(app) -> None:
    """Write the generated sources before any page is read."""
    gen = DOCS / "_generated"
    gen.mkdir(exist_ok=True)
    bench_tables.generate(gen / "tables")
    option_tables.generate(gen / "tables")
    # the benchmarks' plots the pages show (accuracy.md, large-data.md)
    for name in ("accuracy-cpu-1thread-10min.png", "step-scaling-cpu-1thread.png"):
        plot = DOCS.parent / "benchmarks" / "results" / name
        if plot.is_file():
            (gen / plot.name).write_bytes(plot.read_bytes())
    api_pages.generate(DOCS / "api")
    path = gen / "topics-toctree.md"
    text = _topics_toctree()
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def setup(app):
    app.connect("builder-inited", _generate)
