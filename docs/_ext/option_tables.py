"""The docs' tables of what an option or a model does, generated from the code that
decides it, so that a page cannot say what the code does not do.

Run by the docs build (``docs/conf.py``) before the pages are read, or by hand:
``python docs/_ext/option_tables.py OUT_DIR``. Written files (Markdown, included by the
pages with ``{include}``):

* ``resume.md`` (docs/trust.md): every option of ``meshops train``
  (:class:`meshops.fitting.config.TrainConfig`) under ``--resume``: those of
  ``meshops.fitting.out_folder.RESUME_MAY_CHANGE`` may change, every other one is refused;
* ``field-formats.md`` (docs/trust.md): the components per point each mesh format
  keeps (``meshops.mesh.io._COMPONENTS``, evaluated);
* ``export.md`` (docs/training-and-deployment.md): what ``meshops export`` makes of
  each registered model (``meshops.inference.export.FIXED_MESH`` and ``REFUSED``).

A rule of the code that a table has no words for (a new option that may change under
``--resume``, a new format) stops the build with an error naming it, rather than
leaving the page behind the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_tables import md_table, write_pages  # docs/_ext, on the path of conf.py and tests

ROOT = Path(__file__).resolve().parents[2]

#: Why each option of RESUME_MAY_CHANGE may change (``out`` is the run folder itself).
RESUME_WHY = {
    "epochs": "may change only without a learning-rate schedule (`--scheduler none`): a "
              "cosine or one-cycle schedule is laid out over the epochs the run started with",
    "minutes": "may change (it only picks the epoch count of a new run)",
    "device": "may change (continue a GPU run on another GPU, or on the CPU)",
    "out": None,
}
#: What each format's rule comes from (the round trip through meshio).
FORMAT_NOTES = {"vtk": "meshio pads 2-vectors to 3"}
FORMAT_NAMES = {"vtu": "`.vtu`", "vtk": "`.vtk` (legacy)", "xdmf": "`.xdmf`",
                "gmsh22": "`.msh` (Gmsh)", "gmsh": None}  # gmsh: the same suffix and rule
#: Components tried per point (the code's comment: a round trip of 1..12 components).
MAX_COMPONENTS = 12


def _flag(key: str) -> str:
    return "`--" + key.replace("_", "-") + "`"


def resume_md() -> str:
    """The options under ``--resume``."""
    from meshops.fitting.config import TrainConfig
    from meshops.fitting.out_folder import RESUME_MAY_CHANGE

    unknown = [k for k in RESUME_MAY_CHANGE if k not in RESUME_WHY]
    if unknown:
        raise ValueError(f"option_tables: RESUME_MAY_CHANGE has {unknown}, which RESUME_WHY "
                         f"does not explain (docs/_ext/option_tables.py)")
    rows = [[_flag(k), RESUME_WHY[k]] for k in RESUME_MAY_CHANGE if RESUME_WHY[k]]
    refused = [_flag(k) for k in TrainConfig.keys() if k not in RESUME_MAY_CHANGE]
    rows.append([f"every other option: {', '.join(refused)}",
                 "refused when it differs, naming the flag, the `--config` file or the "
                 "edited `config.yaml` that changed it"])
    return ("Generated from `meshops.fitting.out_folder.RESUME_MAY_CHANGE` and the options of "
            "`meshops.fitting.config.TrainConfig`.\n\n"
            + md_table(["option", "under `--resume`"], rows) + "\n")


def _components(fits) -> str:
    """A format's rule in words: ``any``, ``any but 2`` or the list."""
    ok = [c for c in range(1, MAX_COMPONENTS + 1) if fits(c)]
    bad = [c for c in range(1, MAX_COMPONENTS + 1) if not fits(c)]
    if not bad:
        return "any"
    if len(bad) <= 2:
        return "any but " + ", ".join(map(str, bad))
    return ", ".join(map(str, ok))


def field_formats_md() -> str:
    """The components per point each format keeps."""
    from meshops.mesh.io import _COMPONENTS

    unknown = [f for f in _COMPONENTS if f not in FORMAT_NAMES]
    if unknown:
        raise ValueError(f"option_tables: formats {unknown} have no name in FORMAT_NAMES "
                         f"(docs/_ext/option_tables.py)")
    rows = []
    for fmt, fits in _COMPONENTS.items():
        if FORMAT_NAMES[fmt] is None:
            continue
        note = FORMAT_NOTES.get(fmt)
        rows.append([FORMAT_NAMES[fmt], _components(fits) + (f" ({note})" if note else "")])
    return ("Generated from `meshops.mesh.io` (the formats' round trips of 1 to "
            f"{MAX_COMPONENTS} components).\n\n"
            + md_table(["format", "components per point"], rows) + "\n")


def _export_row(name: str) -> list[str]:
    from meshops.inference.export import FIXED_MESH, REFUSED
    from meshops.nn.galerkin import BLOCK_ABOVE

    if name in REFUSED:
        return [f"`{name}`", "-", f"refused: {REFUSED[name]}"]
    params = ", then `params [1, K]` for a run with parameters"
    if name in FIXED_MESH:
        inputs = ("`x [N, C_in]` (the constant input fields) or `params [1, K]`, or both"
                  if name == "reduced_basis" else f"`x [N, C_in]`{params}")
        return [f"`{name}`", inputs, f"fixed: the example mesh's {FIXED_MESH[name]} are "
                                     f"built into the program; export once per mesh"]
    top = f" (`N <= {BLOCK_ABOVE}`)" if name == "galerkin_transformer" else ""
    return [f"`{name}`", f"`x [N, C_in]`, `pos [N, d]`, `weight [N]`{params}",
            f"fixed, or any `N >= 2` with `--dynamic`{top}"]


def export_md() -> str:
    """What ``meshops export`` makes of each registered model."""
    from meshops.models import MODELS

    rows = [_export_row(name) for name in sorted(MODELS) if not name.startswith("_")]
    return ("Generated from the registered models and `meshops.inference.export.FIXED_MESH` and "
            "`REFUSED`.\n\n" + md_table(["model", "inputs of the program", "sizes"], rows)
            + "\n")


def generate(out_dir: Path) -> list[Path]:
    """Write every table into ``out_dir``; returns the written files."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_pages(out_dir, {"resume.md": resume_md(), "field-formats.md":
                                 field_formats_md(), "export.md": export_md()})


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/_generated/tables")):
        print(p)
