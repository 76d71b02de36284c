"""``meshops plot``: pictures of point fields (truth, prediction, error)."""

from __future__ import annotations

from pathlib import Path

from meshops.cli._common import RAW, wrap
from meshops.errors import UsageError
from meshops.inference.predict import available_fields
from meshops.runs.common import names


def cmd_plot(args) -> int:
    from meshops.inference.plot import (
        check_picture_path,
        plot_comparison,
        plot_comparisons,
        plot_fields,
    )
    from meshops.mesh.io import read_mesh

    check_picture_path(args.output)
    mesh = read_mesh(args.mesh)
    fields = getattr(mesh, "fields", None) or {}

    def get(name):
        if name not in fields:
            raise UsageError(f"{args.mesh}: point field {name!r} not found; available point "
                           f"fields: {available_fields(mesh)}")
        v = fields[name]
        if args.component is not None:
            n = v.shape[0]
            flat = v.reshape(n, -1)
            if not 0 <= args.component < flat.shape[1]:
                raise UsageError(f"{args.mesh}: field {name!r} has {flat.shape[1]} component(s); "
                               f"--component {args.component} is out of range")
            v = flat[:, args.component]
        return v

    suffix = f"[{args.component}]" if args.component is not None else ""
    title = args.title if args.title is not None else Path(args.mesh).name
    if args.truth or args.pred:
        if not (args.truth and args.pred):
            raise UsageError("plot: --truth and --pred go together")
        plot_comparison(mesh, get(args.truth), get(args.pred), args.output,
                        name=args.truth + suffix, title=title)
    else:
        if not args.field:
            raise UsageError("plot: give --field NAME[,NAME...] or --truth NAME --pred NAME")
        chosen = names(args.field, "--field")
        pairs = [f"{n}_pred" in fields for n in chosen]
        if all(pairs) and not args.no_compare:
            if len(chosen) == 1:
                plot_comparison(mesh, get(chosen[0]), get(f"{chosen[0]}_pred"), args.output,
                                name=chosen[0] + suffix, title=title)
            else:
                plot_comparisons([(mesh, get(n), get(f"{n}_pred"), None, n + suffix)
                                  for n in chosen],
                                 args.output, title=title)
        else:
            plot_fields(mesh, [get(n) for n in chosen], [n + suffix for n in chosen],
                        args.output, suptitle=title)
    print(f"wrote {args.output}")
    return 0


PLOT_EPILOG = """\
examples:
  meshops plot predicted/case.vtu --field u -o case.png        # u vs u_pred, error
  meshops plot case.vtu --truth u --pred u_fem -o cmp.png
  meshops plot case.vtu --field f,u -o fields.png               # side by side
  meshops plot case.vtu --field velocity --component 0 -o vx.png

2-D meshes are coloured on their cells (quads split into 2 triangles); point
clouds are Delaunay-triangulated with triangles masked whose longest edge is
more than 3x the local point spacing (so holes stay empty). 3-D surface meshes
are drawn as coloured surfaces, volume meshes and 3-D clouds as point scatters.
Vector fields are shown as their magnitude unless --component is given.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plot", help="picture of fields on a mesh (truth, prediction, error)",
        description=wrap("Plot point fields of a mesh to a PNG: one field or several "
        "side by side, or truth, prediction and error with the relative L2 error."),
        epilog=PLOT_EPILOG, formatter_class=RAW)
    p.add_argument("mesh", metavar="MESH", help="mesh file")
    p.add_argument("--field", metavar="NAME[,NAME]",
                   help="field(s) to plot; a field with a NAME_pred partner in the file "
                   "(from meshops predict) is compared with it")
    p.add_argument("--truth", metavar="NAME", help="reference field (with --pred)")
    p.add_argument("--pred", metavar="NAME", help="predicted field (with --truth)")
    p.add_argument("--no-compare", action="store_true", dest="no_compare",
                   help="plot --field as it is even if NAME_pred exists")
    p.add_argument("--component", type=int, metavar="K",
                   help="component K of vector fields (default: the magnitude)")
    p.add_argument("--title", help="figure title (default: the file name)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png", help="output picture")
    p.set_defaults(func=cmd_plot)
