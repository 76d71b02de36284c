"""``meshops info``: what a mesh file holds."""

from __future__ import annotations

import json


def cmd_info(args) -> int:
    from meshops.mesh.io import read_mesh
    from meshops.mesh.summary import mesh_summary

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
