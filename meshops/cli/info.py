"""``meshops info``: what a mesh file holds, or what the meshes of a folder have in
common."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_info(args) -> int:
    from meshops.mesh.io import read_mesh
    from meshops.mesh.summary import mesh_summary

    for path in args.files:
        if Path(path).is_dir():
            info = folder_summary(path)
            print(json.dumps(info) if args.json else _folder_text(info))
            continue
        info = mesh_summary(read_mesh(path))
        print(json.dumps(info) if args.json else _mesh_text(info))
    return 0


def _mesh_text(info: dict) -> str:
    """The lines printed for one mesh file."""
    name = {1: "length", 2: "area", 3: "volume"}[info["cell_dimension"]]
    lo, hi = info["bounding_box"]["min"], info["bounding_box"]["max"]
    lines = [f"{info['file']}",
             f"  points     {info['points']}  (dimension {info['dimension']})",
             "  cells      " + ", ".join(f"{n} {t}" for t, n in info["cells"].items()),
             f"  {name:<10} {info['measure']:.10g}  (sum of quadrature weights)",
             "  bounds     " + "  ".join(f"[{a:.6g}, {b:.6g}]" for a, b in zip(lo, hi)),
             "  fields     " + (", ".join(f"{k} {s}" for k, s in info["fields"].items())
                                or "none")]
    if info["cell_fields"]:
        lines.append("  cell data  " + ", ".join(f"{k} {s or 'scalar'}"
                                                 for k, s in info["cell_fields"].items()))
    if info["field_data"]:
        lines.append("  field data " + ", ".join(f"{k} {v}"
                                                 for k, v in info["field_data"].items()))
    return "\n".join(lines)


def folder_summary(root) -> dict:
    """What the mesh files directly in the folder ``root`` have in common: their number,
    points per mesh, dimensions, and the point and cell fields every mesh has with the
    same shape per point (or cell); the fields only some have, with their counts.

    Raises:
        UsageError: a folder without mesh files.
    """
    from meshops.datasets.folder import list_mesh_files
    from meshops.errors import UsageError
    from meshops.mesh.io import read_mesh
    from meshops.mesh.summary import mesh_summary
    from meshops.utils.progress import progress

    files = list_mesh_files(root)
    if not files:
        raise UsageError(f"{root}: a folder without mesh files (any meshio format: .vtu, "
                         f".msh, ...); give mesh files, or a folder that holds them")
    infos = [mesh_summary(read_mesh(f)) for f in progress(files, desc="reading", unit="mesh")]
    points = [i["points"] for i in infos]
    out = {"folder": str(root), "meshes": len(files),
           "points": {"min": min(points), "max": max(points)},
           "dimensions": sorted({i["dimension"] for i in infos})}
    for key in ("fields", "cell_fields"):
        # per point (cell) shapes: a point field's first axis is the mesh's points
        shapes = [{k: s[1:] if key == "fields" else s for k, s in i[key].items()}
                  for i in infos]
        every = {k: s for k, s in shapes[0].items() if all(x.get(k) == s for x in shapes)}
        some = sorted({k for x in shapes for k in x} - set(every))
        out[key] = every
        out[f"{key}_in_some"] = {k: sum(k in x for x in shapes) for k in some}
    return out


def _folder_text(info: dict) -> str:
    """The lines printed for a folder."""
    n, pts = info["meshes"], info["points"]
    span = f"{pts['min']}" if pts["min"] == pts["max"] else f"{pts['min']} to {pts['max']}"
    lines = [f"{info['folder']}: a folder of {n} mesh file(s)",
             f"  points     {span} per mesh (dimension "
             f"{', '.join(str(d) for d in info['dimensions'])})"]
    for key, label in (("fields", "fields"), ("cell_fields", "cell data")):
        every = ", ".join(f"{k} {s}" if s else k for k, s in info[key].items())
        some = ", ".join(f"{k} ({c} of {n})" for k, c in info[f"{key}_in_some"].items())
        if every or key == "fields":
            lines.append(f"  {label:<10} in every mesh: {every or 'none'}")
        if some:
            lines.append(f"  {'':<10} in some: {some}")
    lines.append(f"  (meshops info {info['folder']}/FILE for one mesh's details)")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="summarise mesh files (points, cells, measure, fields) "
                       "or folders of them",
                       description="Read mesh files (any meshio format) and print points, "
                       "dimension, cell counts by type, total measure (sum of quadrature "
                       "weights), bounding box, point fields, cell fields and field data "
                       "(Gmsh physical names for --tags, VTK parameters for --params). For "
                       "a folder: its number of meshes, points per mesh, and the fields "
                       "every mesh has (those only some have, with their counts).")
    p.add_argument("files", nargs="+", metavar="PATH", help="mesh file(s) or folder(s)")
    p.add_argument("--json", action="store_true", help="one JSON object per file or folder")
    p.set_defaults(func=cmd_info)
