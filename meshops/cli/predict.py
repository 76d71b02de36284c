"""``meshops predict``: a trained model's predictions written into copies of meshes."""

from __future__ import annotations

from pathlib import Path

from meshops.cli._common import RAW, CLIError, optional_names, progress, wrap
from meshops.cli.folder import mesh_files
from meshops.inference import RunSpec, load_run


def _suffix(fmt: str | None, path: Path) -> str:
    if not fmt:
        return path.suffix
    return fmt if fmt.startswith(".") else "." + fmt


def cmd_predict(args) -> int:
    import torch

    from meshops import cli
    from meshops.io import read_mesh, write_mesh

    model, ckpt, meta = load_run(args.run, args.device)
    if args.rollout is not None or meta.get("series"):
        from meshops.cli.series import predict_series

        return predict_series(args, model, ckpt, meta)
    spec = RunSpec(model, ckpt, meta, optional_names(args.inputs), optional_names(args.targets))
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
    written = []
    for f in progress(files, desc="predicting", unit="mesh"):
        mesh = read_mesh(f)
        spec.check_mesh(mesh, f)
        # Looked up on meshops.cli when called, so that a replacement there is used
        # (the tests put in a model that predicts NaN).
        out = cli.predict_mesh(model, spec, mesh)
        bad = (~torch.isfinite(out)).nonzero()
        if bad.numel():  # the inputs are finite (checked above): the model is at fault
            raise CLIError(f"{f}: the model in {spec.ckpt} predicts a non-finite value "
                           f"({out[bad[0, 0], bad[0, 1]].item()}) at point {int(bad[0, 0])} "
                           f"although the inputs are finite; nothing written for this file")
        pred = spec.split(out)
        written.append(write_mesh(targets[f], mesh,
                                  point_data={f"{k}_pred": v for k, v in pred.items()}))
    fields = ", ".join(f"{k}_pred" for k in spec.targets)
    print(f"wrote {len(written)} file(s) with {fields} to {out_dir}/")
    return 0


PREDICT_EPILOG = """\
examples:
  meshops predict runs/poisson new/*.vtu -o predicted/
  meshops predict runs/poisson/last.pt case.msh -o predicted/ --format .vtu
  meshops plot predicted/case.vtu --field u -o case.png

Each output file is the input mesh with all its fields plus <target>_pred for
every target the model was trained on; open it in ParaView.

time-series runs (meshops train --series):
  meshops predict runs/heat heat/test/traj_003 --rollout 99 -o rollouts/
  meshops predict runs/heat heat/test --rollout 50 --start 10 -o rollouts/
  meshops predict runs/heat initial_state.vtu --rollout 20 -o rollouts/

Each series (a folder of numbered files, a .pvd, an .xdmf, or one mesh file holding
the initial state) is rolled out N steps from its time step --start and written as
OUTDIR/<name>.pvd with one .vtu per step in OUTDIR/<name>/ (the start and the N
predicted steps, <target>_pred, beside the series' own fields where it has that
step), completely or not at all.
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
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.add_argument("--targets", help="target names, for checkpoints that do not record them")
    p.add_argument("--rollout", type=int, metavar="N", help="time-series runs: roll each "
                   "series out N steps and write a .pvd series")
    p.add_argument("--start", type=int, default=0, metavar="K", help="with --rollout: start "
                   "from the series' time step K (default 0)")
    p.set_defaults(func=cmd_predict)
