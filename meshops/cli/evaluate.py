"""``meshops evaluate``: its options and examples; the evaluation is
:func:`meshops.runs.evaluate.evaluate_run`."""

from __future__ import annotations

from meshops.cli._common import RAW, wrap


def cmd_evaluate(args) -> int:
    """Load the run, evaluate it, print the table or the JSON."""
    from meshops.inference.plot import check_picture_path
    from meshops.runs import load_run
    from meshops.training.distributed import device_or_error

    if args.plot:  # a picture that cannot be written is said before anything is loaded
        check_picture_path(args.plot)
    run = load_run(args.run, device_or_error(args.device))
    report = run.evaluate(args.data, plot=args.plot, refine=args.refine,
                          integrals=args.integral or (), baselines=not args.no_baselines,
                          inputs=args.inputs, targets=args.targets, horizon=args.horizon,
                          start=args.start)
    print(report.to_json() if args.json else report.table())
    return 0


EVALUATE_EPILOG = """\
examples:
  meshops evaluate runs/poisson --data test/
  meshops evaluate runs/poisson --data test/ --plot test.png --json > test.json
  # integrals over tagged boundaries, predicted vs true: the lift-and-drag force
  # of the pressure p on the wall, the flux of a velocity u through the inlet
  meshops evaluate runs/flow --data test/ --integral 'wall:p*n' --integral 'inlet:u.n'

Each mesh needs the input and target fields the model was trained with, with
finite values. The relative L2 error of a sample is ||pred - truth|| / ||truth||
over the mesh, with the norms integrated with the mesh's quadrature weights
("quad") or summed over the points ("plain", the convention of published
benchmarks), for each target field (a vector's components together; the fields
of training's --targets, e.g. u+v,p) and, with several fields, their mean ("fields
mean", the error training minimises and validation picks by); the absolute L2
error is sqrt(sum_i w_i |pred_i - truth_i|^2). A sample whose target is zero
everywhere has no relative error: it is named in a warning and left out of the
relative statistics (its absolute error counts; in the JSON output its relative
errors are null). A mesh on which the model predicts a non-finite value although
its inputs are finite is a failure of the model: named in a warning and in
"failed", its errors are inf, and so are the mean and worst (null in the JSON
output). The JSON output also lists every sample's errors.

time-series runs (meshops train --series): --data holds test series; each is rolled
out from its time step --start to its end (or --horizon steps) and the relative L2
error of every step is reported (mean, median, worst over the series) beside
persistence (the start state held) and the nearest training trajectory (by the
parameters, else by the start state):
  meshops evaluate runs/heat --data heat/test --plot horizon.png
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "evaluate", help="relative L2 errors of a trained model on a folder of meshes",
        description=wrap("Predict on every mesh of DIR and print the relative L2 error "
        "per target field (mean, median, worst sample), quadrature-weighted and "
        "unweighted, next to three baselines that need no training, on the same meshes "
        "and metric: the mean of the training targets (when all meshes are one fixed "
        "mesh or structured grids of one shape), the targets of the nearest "
        "training sample (by the mean of each input field, or by the geometry when the "
        "model has no inputs) and POD + RBF, the classical reduced-order model (when "
        "the meshes correspond and every sample has a parameter vector or constant "
        "input fields)."),
        epilog=EVALUATE_EPILOG, formatter_class=RAW)
    p.add_argument("run", metavar="RUN", help="run folder (uses best.pt) or checkpoint file")
    p.add_argument("--data", required=True, metavar="DIR", help="folder of meshes with the "
                   "input and target fields")
    p.add_argument("--plot", metavar="FILE.png", help="save truth/prediction/error of the "
                   "median and the worst sample")
    p.add_argument("--json", action="store_true", help="print one JSON object (with the "
                   "per-sample errors)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--refine", action="store_true",
                   help="mesh-independence check: predict again on a uniformly refined and "
                   "a coarsened copy of each mesh (fields interpolated) and report how far "
                   "the prediction moves (meshops.inference.refine); meshes with cells and runs "
                   "whose targets are point data")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.add_argument("--targets", help="target fields, for checkpoints that do not record them")
    p.add_argument("--integral", action="append", metavar="TAG:FIELD",
                   help="also report the integral of a target over a tagged boundary, "
                   "predicted vs true (repeatable): TAG:FIELD integrates the field, "
                   "TAG:FIELD*n a scalar times the outward normal (a force), TAG:FIELD.n a "
                   "vector's normal component (a flux); TAG is a Gmsh physical name or "
                   "ARRAY=VALUE of an integer cell array")
    p.add_argument("--no-baselines", action="store_true", dest="no_baselines",
                   help="skip the baselines that need no training (the training mean "
                   "field, the nearest training sample and POD + RBF), which read the "
                   "run's training files")
    p.add_argument("--horizon", type=int, metavar="N", help="time-series runs: roll out at "
                   "most N steps (default: to the end of each series)")
    p.add_argument("--start", type=int, default=0, metavar="K", help="time-series runs: "
                   "start the rollouts from time step K (default 0)")
    p.set_defaults(func=cmd_evaluate)
