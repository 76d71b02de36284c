"""The ``meshops`` command."""

from __future__ import annotations

import argparse
import json
import sys

from meshops.errors import MeshError


def mesh_summary(mesh) -> dict:
    """Plain-data summary of a :class:`MeshData` (what ``meshops info`` prints)."""
    pos = mesh.pos
    return {
        "file": str(getattr(mesh, "source", None)),
        "points": int(pos.shape[0]),
        "dimension": int(pos.shape[1]),
        "cells": mesh.cell_counts(),
        "measure": float(mesh.weight.sum()),
        "bounding_box": {"min": pos.min(0).values.tolist(), "max": pos.max(0).values.tolist()},
        "fields": {k: list(v.shape) for k, v in (getattr(mesh, "fields", None) or {}).items()},
    }


def _cmd_info(args) -> int:
    from meshops.io import read_mesh

    for path in args.files:
        info = mesh_summary(read_mesh(path))
        if args.json:
            print(json.dumps(info))
            continue
        name = {1: "length", 2: "area", 3: "volume"}[info["dimension"]]
        print(f"{info['file']}")
        print(f"  points     {info['points']}  (dimension {info['dimension']})")
        print("  cells      " + ", ".join(f"{n} {t}" for t, n in info["cells"].items()))
        print(f"  {name:<10} {info['measure']:.10g}  (sum of quadrature weights)")
        lo, hi = info["bounding_box"]["min"], info["bounding_box"]["max"]
        print("  bounds     " + "  ".join(f"[{a:.6g}, {b:.6g}]" for a, b in zip(lo, hi)))
        fields = info["fields"]
        print("  fields     " + (", ".join(f"{k} {s}" for k, s in fields.items())
                                 or "none"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshops", description="Mesh-agnostic neural operators on unstructured meshes.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="summarise mesh files (points, cells, measure, fields)",
                       description="Read mesh files (any meshio format) and print points, "
                       "dimension, cell counts by type, total measure (sum of quadrature "
                       "weights), bounding box and point fields.")
    p.add_argument("files", nargs="+", metavar="FILE", help="mesh file(s)")
    p.add_argument("--json", action="store_true", help="one JSON object per file")
    p.set_defaults(func=_cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MeshError as e:
        print(f"meshops: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
