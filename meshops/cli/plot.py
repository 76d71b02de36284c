"""``meshops plot``: its options and examples; the picture is
:func:`meshops.runs.plot.plot_file`."""

from __future__ import annotations

from meshops.cli._common import RAW, wrap


def cmd_plot(args) -> int:
    """Draw the picture and say where it is."""
    from meshops.runs.plot import plot_file

    path = plot_file(args.mesh, args.output, field=args.field, truth=args.truth,
                     pred=args.pred, component=args.component, title=args.title,
                     compare=not args.no_compare)
    print(f"wrote {path}")
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
