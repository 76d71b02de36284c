"""``meshops export``: a run's model as a ``torch.export`` (``.pt2``) or ONNX file, checked
against the run's own prediction."""

from __future__ import annotations

from pathlib import Path

from meshops.cli._common import RAW, CLIError, optional_names, wrap
from meshops.inference import RunSpec, load_run, mesh_sample

#: Largest difference allowed between the exported program and the run on the example
#: mesh, relative to the prediction's largest magnitude (float32 reassociation is ~1e-7).
TOLERANCE = 1e-5


def _example_mesh(args, meta: dict) -> Path:
    """``--mesh``, else the first training file the run records."""
    if args.mesh:
        return Path(args.mesh)
    root, train = meta.get("data"), (meta.get("split") or {}).get("train")
    if root and train and (Path(root) / train[0]).is_file():
        return Path(root) / train[0]
    raise CLIError(f"{args.run}: the run's training files are not here; pass --mesh FILE "
                   f"(a mesh with the input fields {', '.join(meta.get('inputs') or []) or '-'})")


def cmd_export(args) -> int:
    import torch

    from meshops.export import ExportError, export_model, load_exported
    from meshops.io import read_mesh

    model, ckpt, meta = load_run(args.run, "cpu")
    spec = RunSpec(model, ckpt, meta, optional_names(args.inputs), None)
    path = Path(args.output)
    mesh_path = _example_mesh(args, meta)
    mesh = read_mesh(mesh_path)
    spec.check_mesh(mesh, mesh_path)
    sample = mesh_sample(model, spec, mesh)
    try:
        info = export_model(model, sample, path, dynamic=args.dynamic, metadata=meta)
    except ExportError as e:
        raise CLIError(str(e)) from None
    # The file, loaded as a user would, against the run's prediction on the same mesh.
    ref = model.predict(sample).to(torch.float64)
    try:
        run = load_exported(path)
    except ImportError as e:
        print(f"wrote {path}; not checked ({e})")
        return 0
    inputs = (sample.x,) if info["fixed_mesh"] else (sample.x, sample.pos, sample.weight)
    with torch.no_grad():
        out = run(*inputs).to(torch.float64)
    diff = float((out - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
    if not diff <= TOLERANCE:
        path.unlink()
        raise CLIError(f"{path}: the exported program differs from {ckpt} by {diff:.2e} "
                       f"(relative) on {mesh_path}, over {TOLERANCE:g}; nothing written")
    size = "any number of points (N >= 2)" if info["points"] is None else \
        f"{info['points']} points"
    sig = ", ".join(f"{k} [N, {info['in_channels']}]" if k == "x" else
                    (f"pos [N, {info['pos_dim']}]" if k == "pos" else "weight [N]")
                    for k in info["inputs"])
    print(f"wrote {path}: {info['model']}, inputs {sig} -> y [N, {info['out_channels']}] "
          f"({info['dtype']}), {size}"
          + (f"; the mesh of {mesh_path.name} is built in" if info["fixed_mesh"] else ""))
    print(f"checked on {mesh_path.name}: largest difference {diff:.1e} of the prediction's "
          f"magnitude (tolerance {TOLERANCE:g})")
    return 0


EXPORT_EPILOG = """\
examples:
  meshops export runs/poisson -o poisson.pt2 --dynamic
  meshops export runs/poisson -o poisson.onnx --mesh case.vtu

Loading (no meshops needed):
  .pt2:  torch.export.load("poisson.pt2").module()(x, pos, weight)
  .onnx: onnxruntime.InferenceSession("poisson.onnx").run(None,
             {"x": x, "pos": pos, "weight": weight})

x holds the input fields in the order of the run (RUN/config.yaml's inputs), pos
the point coordinates, weight the quadrature weights (meshops.quadrature, or the
mesh's meshops_weight field); the output is in physical units. PiT's latent mesh
and neighbour graphs come from searches no exporter traces: its program holds the
example mesh and takes x alone (export once per mesh). See
docs/training-and-deployment.md.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="export a trained model to torch.export (.pt2) or ONNX (.onnx)",
        description=wrap("Export the model of RUN (its best.pt, normalisers included) as a "
        "program of tensors that runs without meshops: torch.export for .pt2, ONNX (opset "
        "18, attention through SDPA) for .onnx. The file is checked against the run's "
        "prediction on the example mesh and kept only within 1e-5."),
        epilog=EXPORT_EPILOG, formatter_class=RAW)
    p.add_argument("run", metavar="RUN", help="run folder (uses best.pt) or checkpoint file")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="model.pt2 or model.onnx")
    p.add_argument("--mesh", metavar="FILE", help="example mesh with the input fields "
                   "(default: the run's first training file)")
    p.add_argument("--dynamic", action="store_true",
                   help="any number of points (transformer_no, galerkin_transformer); "
                   "default: the example mesh's")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.set_defaults(func=cmd_export)
