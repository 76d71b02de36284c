"""``meshops export``: its options and examples; the export is
:func:`meshops.runs.export.export_run`."""

from __future__ import annotations

from meshops.cli._common import RAW, wrap


def cmd_export(args) -> int:
    """Export the run, checked, and say what was written."""
    from meshops.runs.export import ExportOptions, export_run

    report = export_run(args.run, ExportOptions(args.output, args.overwrite, args.mesh,
                                                args.dynamic, args.inputs))
    print(report.table())
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
