"""``meshops export``: a run's model as a ``torch.export`` (``.pt2``) or ONNX file, checked
against the run's own prediction."""

from __future__ import annotations

from pathlib import Path

from meshops.cli._common import RAW, CLIError, optional_names, wrap
from meshops.inference.predict import RunSpec, load_run, mesh_sample

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


def _check_output(path: Path, overwrite: bool) -> None:
    """Refuse, before any work, what would end without a checked file at ``path``."""
    from meshops.inference.export import ExportError, check_path

    try:
        check_path(path)
    except ExportError as e:
        raise CLIError(str(e)) from None
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise CLIError(f"{path}: exists; export does not replace a file without --overwrite "
                       f"(or choose another -o FILE)")
    if path.suffix == ".onnx":
        try:
            import onnxruntime  # noqa: F401  (the check below loads the file with it)
        except ImportError:
            raise CLIError(f"{path}: an ONNX file is kept only once onnxruntime has run it "
                           f"against the run's prediction, and onnxruntime is not installed "
                           f"(pip install onnxruntime, or meshops[onnx]); nothing written") \
                from None


def _example_sample(args, model, spec, meta: dict, ckpt):
    """The example mesh as training read it (at the cells for cell targets, with the tag
    channels and the parameters): ``(mesh path, sample)``."""
    from meshops.datasets.layout import SampleLayout
    from meshops.mesh.io import read_mesh

    mesh_path = _example_mesh(args, meta)
    layout = SampleLayout.from_run(meta, spec.inputs, spec.targets, model, ckpt)
    view = layout.view(read_mesh(mesh_path), mesh_path, need_targets=False)
    spec.check_mesh(view, mesh_path)
    return mesh_path, mesh_sample(model, spec, view)


def _export_checked(model, sample, tmp: Path, args, meta: dict, what: str) -> tuple[dict, float]:
    """Export to ``tmp`` and load it back as a user would: ``(info, largest difference
    from the run's prediction, relative)``; above :data:`TOLERANCE` a CLIError."""
    import torch

    from meshops.inference.export import ExportError, export_model, load_exported

    try:
        info = export_model(model, sample, tmp, dynamic=args.dynamic, metadata=meta)
    except ExportError as e:
        raise CLIError(str(e)) from None
    ref = model.predict(sample).to(torch.float64)
    with torch.no_grad():
        out = load_exported(tmp)(*(getattr(sample, k) for k in info["inputs"]))
    diff = float((out.to(torch.float64) - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
    if not diff <= TOLERANCE:
        raise CLIError(f"{what} by {diff:.2e} (relative), over {TOLERANCE:g}; nothing written")
    return info, diff


def _signature(info: dict) -> str:
    k = len(info.get("param_fields") or [])
    size = {"x": f"x [N, {info['in_channels']}]", "pos": f"pos [N, {info['pos_dim']}]",
            "weight": "weight [N]", "params": f"params [1, {k}]"}
    return ", ".join(size[name] for name in info["inputs"])


def cmd_export(args) -> int:
    from meshops.utils.atomic import atomic_write

    path = Path(args.output)
    _check_output(path, args.overwrite)
    from meshops.inference.export import ExportError, check_exportable

    model, ckpt, meta = load_run(args.run, "cpu")
    try:
        check_exportable(model)
    except ExportError as e:
        raise CLIError(f"{ckpt}: {e}") from None
    spec = RunSpec(model, ckpt, meta, optional_names(args.inputs), None)
    mesh_path, sample = _example_sample(args, model, spec, meta, ckpt)
    # Written beside path and renamed over it only once checked: a file that fails the
    # check, or an export that fails, leaves path as it was.
    done = {}
    what = f"{path}: the exported program differs from {ckpt} on {mesh_path}"
    atomic_write(path, lambda tmp: done.update(result=_export_checked(
        model, sample, Path(tmp), args, meta, what)))
    info, diff = done["result"]
    where = info["location"]
    size = f"any number of {where} (N >= 2)" if info["points"] is None else \
        f"{info['points']} {where}"
    print(f"wrote {path}: {info['model']}, inputs {_signature(info)} -> y [N, "
          f"{info['out_channels']}] ({info['dtype']}), {size}"
          + ("; the targets are cell data: pos holds the cells' centroids, weight their "
             "measures" if where == "cells" else "")
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

x holds the input fields in the order of the run (RUN/config.yaml's inputs, then
the channels of its boundary tags), pos the point coordinates, weight the
quadrature weights (meshops.mesh.quadrature, or the mesh's meshops_weight field), params
[1, K] the parameters of a --params run; the output is in physical units. For a run
whose targets are cell data the points are the cells: pos their centroids, weight
their measures. PiT's latent mesh and neighbour graphs come from searches no
exporter traces, and a reduced basis's modes are evaluated at the mesh's points:
their programs hold the example mesh and take x (and params) alone (export once per
mesh). The file is written only once it has passed the check: an existing FILE is
replaced only with --overwrite, and .onnx needs onnxruntime for the check. See
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
    p.add_argument("--overwrite", action="store_true",
                   help="replace FILE if it exists (kept otherwise)")
    p.add_argument("--mesh", metavar="FILE", help="example mesh with the input fields "
                   "(default: the run's first training file)")
    p.add_argument("--dynamic", action="store_true",
                   help="any number of points (transformer_no, galerkin_transformer); "
                   "default: the example mesh's")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.set_defaults(func=cmd_export)
