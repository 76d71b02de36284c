"""Elasticity: the von Mises stress in a unit cell with a void, from its geometry alone.

The input is the geometry (the points of the cell, no input fields); the target is
the von Mises stress at every point. Without ``--data`` the example trains on the
offline STAND-IN (plane-strain linear elasticity solved by P1 finite elements on
random star-shaped voids, generated and cached on the first run); with ``--data``
it reads the Geo-FNO benchmark files ``Random_UnitCell_{XY,sigma}_10.npy``.

Run::

    python examples/elasticity.py                       # stand-in, CPU, a few minutes
    python examples/elasticity.py --data ~/geofno/elasticity --full --device cuda
    python examples/elasticity.py --model transformer_no --epochs 50

Writes ``runs/elasticity/``: ``best.pt`` (load with
``meshops.models.NeuralOperator.from_checkpoint``), ``history.json``,
``test_samples.png`` (truth / prediction / error for the median and the worst test
sample), ``predictions/*.vtu`` (open in ParaView) and ``summary.json``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import parser, run, sizes  # noqa: E402

from data_adapters import load_elasticity, make_elasticity_standin  # noqa: E402

# Model sizes for ~1000-point samples, small enough for a 2-core CPU by default
# (PiT: a 256-point farthest-point latent mesh; the reference model's latent mesh
# is all 972 input points: --full uses that).
MODEL_CONFIG = {
    "pit": {"latent": "fps", "num_latent": 256, "width": 32},
    "transformer_no": {"width": 64, "layers": 3},
    "galerkin_transformer": {"width": 64},
    "patched_transformer": {"width": 64},
}


def main(argv=None):
    args = parser(__doc__.splitlines()[0], "runs/elasticity").parse_args(argv)
    args.num_train, args.num_test, args.epochs = sizes(
        args, default=(200, 40, 25), full=(1000, 200, 500), quick=(8, 4, 1))
    if args.full:
        MODEL_CONFIG["pit"] = {"latent": "input", "width": 128}
    if args.data is not None:
        train = load_elasticity(args.data, "train")[:args.num_train]
        test = load_elasticity(args.data, "test")[:args.num_test]
        title = "Geo-FNO Elasticity"
    else:
        samples = make_elasticity_standin(args.num_train + args.num_test, seed=args.seed)
        train, test = samples[:args.num_train], samples[args.num_train:]
        title = "Elasticity STAND-IN (P1 FEM)"
    return run(args, train, test, target="sigma", model_config=MODEL_CONFIG, title=title)


if __name__ == "__main__":
    main()
