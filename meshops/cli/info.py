"""``meshops info``: what a mesh file holds."""

from __future__ import annotations

import json

import numpy as np


def mesh_summary(mesh) -> dict:
    """Plain-data summary of a :class:`MeshData` (what ``meshops info`` prints)."""
    from meshops.mesh.quadrature import CELL_DIMS

    pos = mesh.pos
    counts = mesh.cell_counts()
    # The measure is of the highest-dimensional cells (a surface's area in 3-D);
    # a point cloud's weights estimate the volume of the space it fills.
    tdim = max((CELL_DIMS.get(t, 0) for t, n in counts.items() if n), default=0)
    return {
        "file": str(getattr(mesh, "source", None)),
        "points": int(pos.shape[0]),
        "dimension": int(pos.shape[1]),
        "cell_dimension": tdim or int(pos.shape[1]),
        "cells": counts,
        "measure": float(mesh.weight.sum()),
        "bounding_box": {"min": pos.min(0).values.tolist(), "max": pos.max(0).values.tolist()},
        "fields": {k: list(v.shape) for k, v in (getattr(mesh, "fields", None) or {}).items()},
        # per-cell shape of each cell field; field data as stored (Gmsh: [tag, dim] of
        # a physical name, usable with --tags; VTK: parameters, usable with --params)
        "cell_fields": {k: list(v[0].shape[1:]) if len(v) else []
                        for k, v in (getattr(mesh, "cell_data", None) or {}).items()},
        "field_data": {k: np.asarray(v).reshape(-1).tolist()
                       for k, v in (getattr(mesh, "field_data", None) or {}).items()},
    }


def cmd_info(args) -> int:
    from meshops.mesh.io import read_mesh

    for path in args.files:
        info = mesh_summary(read_mesh(path))
        if args.json:
            print(json.dumps(info))
            continue
        name = {1: "length", 2: "area", 3: "volume"}[info["cell_dimension"]]
        print(f"{info['file']}")
        print(f"  points     {info['points']}  (dimension {info['dimension']})")
        print("  cells      " + ", ".join(f"{n} {t}" for t, n in info["cells"].items()))
        print(f"  {name:<10} {info['measure']:.10g}  (sum of quadrature weights)")
        lo, hi = info["bounding_box"]["min"], info["bounding_box"]["max"]
        print("  bounds     " + "  ".join(f"[{a:.6g}, {b:.6g}]" for a, b in zip(lo, hi)))
        fields = info["fields"]
        print("  fields     " + (", ".join(f"{k} {s}" for k, s in fields.items())
                                 or "none"))
        if info["cell_fields"]:
            print("  cell data  " + ", ".join(f"{k} {s or 'scalar'}"
                                               for k, s in info["cell_fields"].items()))
        if info["field_data"]:
            print("  field data " + ", ".join(f"{k} {v}" for k, v in info["field_data"].items()))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="summarise mesh files (points, cells, measure, fields)",
                       description="Read mesh files (any meshio format) and print points, "
                       "dimension, cell counts by type, total measure (sum of quadrature "
                       "weights), bounding box, point fields, cell fields and field data "
                       "(Gmsh physical names for --tags, VTK parameters for --params).")
    p.add_argument("files", nargs="+", metavar="FILE", help="mesh file(s)")
    p.add_argument("--json", action="store_true", help="one JSON object per file")
    p.set_defaults(func=cmd_info)
