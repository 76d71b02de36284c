"""``meshops predict``: its options and examples; the prediction is
:func:`meshops.runs.predict.predict_files`."""

from __future__ import annotations

from meshops.cli._common import RAW, wrap


def cmd_predict(args) -> int:
    """Load the run (and an ensemble's members), predict, say what was written."""
    from meshops.runs import load_run
    from meshops.training.distributed import device_or_error

    run = load_run(args.run, device_or_error(args.device))
    report = run.predict_files(args.meshes, args.output, format=args.format,
                               overwrite=args.overwrite, chunk_size=args.chunk_size,
                               inputs=args.inputs, targets=args.targets,
                               rollout=args.rollout, start=args.start)
    print(report.table())
    return 0


PREDICT_EPILOG = """\
examples:
  meshops predict runs/poisson new/*.vtu -o predicted/
  meshops predict runs/poisson/last.pt case.msh -o predicted/ --format .vtu
  meshops plot predicted/case.vtu --field u -o case.png
  # a 5-million-point mesh: 65,536 output points at a time (the default)
  meshops predict runs/big huge.vtu -o predicted/ --chunk-size 65536

Each output file is the input mesh with all its fields plus <target>_pred for
every target the model was trained on (as cell data when the targets were cell
data; NaN on boundary cells); open it in ParaView. Parameters and boundary tags
are read as in training (field_data or params.csv / params.json beside the mesh).
A file that exists in OUTDIR is not replaced without --overwrite. Each file also
gets the mesh's distance to the training set (train_distance, and its parameter
and geometry parts train_distance_params, train_distance_geometry; constant
fields, in units of the training spread, see meshops.inference.trust), with a warning when
the model extrapolates there. A run trained with --ensemble K writes the mean of
its K members as <target>_pred and their standard deviation as <target>_std.

time-series runs (meshops train --series):
  meshops predict runs/heat heat/test/traj_003 --rollout 99 -o rollouts/
  meshops predict runs/heat heat/test --rollout 50 --start 10 -o rollouts/
  meshops predict runs/heat initial_state.vtu --rollout 20 -o rollouts/

Each series (a folder of numbered files, a .pvd, an .xdmf, or one mesh file holding
the initial state) is rolled out N steps from its time step --start and written as
OUTDIR/<name>.pvd with one .vtu per step in OUTDIR/<name>/ (the start and the N
predicted steps, <target>_pred, beside the series' own fields where it has that
step), completely or not at all. An earlier rollout there is replaced only with
--overwrite; a folder OUTDIR/<name>/ that holds anything else (the input series
itself, files of yours) is never replaced.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "predict", help="predict on meshes and write them with <target>_pred fields",
        description=wrap("Load a trained model (RUN/best.pt, or a .pt file), predict on "
        "each mesh and write it to OUTDIR with the predicted fields added as "
        "<target>_pred, in the input's format (or --format)."), epilog=PREDICT_EPILOG,
        formatter_class=RAW)
    p.add_argument("run", metavar="RUN", help="run folder (uses best.pt) or checkpoint file")
    p.add_argument("meshes", nargs="+", metavar="MESH", help="mesh files or folders of them")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output folder")
    p.add_argument("--format", metavar=".EXT", help="output format by suffix, e.g. .vtu")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files that already exist in OUTDIR (never the input files)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.add_argument("--targets", help="target names, for checkpoints that do not record them")
    p.add_argument("--chunk-size", type=int, metavar="N", dest="chunk_size",
                   help="predict meshes of more than N points N output points at a time, "
                   "the model's global context computed once: the same values in a "
                   "bounded memory (default 65536; 0: always in one piece)")
    p.add_argument("--rollout", type=int, metavar="N", help="time-series runs: roll each "
                   "series out N steps and write a .pvd series")
    p.add_argument("--start", type=int, default=0, metavar="K", help="with --rollout: start "
                   "from the series' time step K (default 0)")
    p.set_defaults(func=cmd_predict)
