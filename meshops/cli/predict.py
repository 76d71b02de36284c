"""``meshops predict``: a trained model's predictions written into copies of meshes."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from meshops.cli import trust_reports
from meshops.cli._common import RAW, CLIError, device_or_error, optional_names, progress, wrap
from meshops.cli.folder import mesh_files
from meshops.datasets.layout import SampleLayout
from meshops.inference import predict as inference  # tests replace predict_mesh there
from meshops.inference.predict import RunSpec, load_run, mesh_sample
from meshops.inference.trust import ensemble_members, predict_ensemble


def _suffix(fmt: str | None, path: Path) -> str:
    if not fmt:
        return path.suffix
    return fmt if fmt.startswith(".") else "." + fmt


def cmd_predict(args) -> int:
    import torch

    from meshops.mesh.io import read_mesh, write_mesh

    model, ckpt, meta = load_run(args.run, device_or_error(args.device))
    if args.rollout is not None or meta.get("series"):
        from meshops.cli.series import predict_series

        return predict_series(args, model, ckpt, meta)
    spec = RunSpec(model, ckpt, meta, optional_names(args.inputs), optional_names(args.targets))
    train_set, why = trust_reports.training_set_of(meta, spec.inputs, spec.targets)
    # an ensemble run (meshops train --ensemble K): every member predicts
    members = [model] + [load_run(m, device_or_error(args.device))[0]
               for m in ensemble_members(args.run)[1:]]
    if train_set is None:
        print(f"meshops: note: no distance to the training set ({why})", file=sys.stderr)
    # as in training: points or cells, parameters, boundary tags
    layout = SampleLayout.from_run(meta, spec.inputs, spec.targets, model, ckpt)
    files = mesh_files(args.meshes)
    out_dir = Path(args.output)
    targets = {}
    for f in files:
        dest = out_dir / (f.stem + _suffix(args.format, f))
        if dest.resolve() == f.resolve():
            raise CLIError(f"{f}: the output would overwrite the input; choose another -o "
                           f"folder or --format")
        if dest in targets.values():
            raise CLIError(f"{f}: two inputs would both be written to {dest}")
        targets[f] = dest
    # Checked for every file before the first is written: only files this run writes
    # are replaced, unless the user says so.
    existing = [d for d in targets.values() if d.exists() or d.is_symlink()]
    if existing and not args.overwrite:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise CLIError(f"{existing[0]}: exists{more}; predict does not replace files it did "
                       f"not write: pass --overwrite to replace them, or choose another -o "
                       f"folder")
    chunking = _chunking(args)
    written = []
    for f in progress(files, desc="predicting", unit="mesh"):
        mesh = read_mesh(f)
        sample = layout.view(mesh, f, need_targets=False)
        spec.check_mesh(sample, f)
        if len(members) > 1:
            out, std = predict_ensemble(members, spec, sample)
        else:
            out, std = inference.predict_mesh(model, spec, sample, **chunking), None
        bad = (~torch.isfinite(out)).nonzero()
        if bad.numel():  # the inputs are finite (checked above): the model is at fault
            raise CLIError(f"{f}: the model in {spec.ckpt} predicts a non-finite value "
                           f"({out[bad[0, 0], bad[0, 1]].item()}) at {layout.location[:-1]} "
                           f"{int(bad[0, 0])} although the inputs are finite; nothing written "
                           f"for this file")
        fields = {f"{k}_pred": v for k, v in spec.split(out).items()}
        if std is not None:
            fields.update({f"{k}_std": v for k, v in spec.split(std).items()})
        # a cell target's prediction is written as cell data
        point_data, cell_data = layout.prediction_data(mesh, fields)
        if train_set is not None:
            dist = train_set.distance(mesh_sample(model, spec, sample).cpu())
            trust_reports.warn_extrapolation(f, dist)
            n = int(mesh.pos.shape[0])
            point_data.update({name: torch.full((n,), dist[key], dtype=torch.float64)
                               for key, name in trust_reports.DISTANCE_FIELDS.items()})
        if cell_data:
            mesh = copy.copy(mesh)
            mesh.cell_data = {**(getattr(mesh, "cell_data", None) or {}), **cell_data}
        written.append(write_mesh(targets[f], mesh, point_data=point_data))
    fields = ", ".join([f"{k}_pred" for k in spec.targets]
                       + ([f"{k}_std" for k in spec.targets] if len(members) > 1 else [])
                       + (list(trust_reports.DISTANCE_FIELDS.values()) if train_set else []))
    print(f"wrote {len(written)} file(s) with {fields} to {out_dir}/"
          + (f" (mean and standard deviation of {len(members)} ensemble members)"
             if len(members) > 1 else ""))
    return 0


def _chunking(args) -> dict:
    """``predict_mesh``'s chunk options where they differ from its defaults: meshes of
    more than --chunk-size points (0: none) are predicted in chunks, with a progress bar
    on a terminal."""
    import sys

    from meshops.utils.progress import on_terminal

    kw = {}
    if args.chunk_size is not None:
        if args.chunk_size < 0:
            raise CLIError(f"--chunk-size must be >= 0 (0: no chunks), got {args.chunk_size}")
        kw["chunk_size"] = args.chunk_size or None
    if on_terminal(sys.stderr):
        kw["progress"] = True
    return kw


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
