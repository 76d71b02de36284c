"""Elasticity: the von Mises stress in a unit cell with a void, from its geometry alone.

The input is the geometry: the points of the cell and, at each point, its distance
to the void's boundary, where the stress concentrates (``--no-void-distance``: the
points alone, as in the published benchmarks); the target is the von Mises stress
at every point. Without ``--data`` the example trains on the
offline STAND-IN (plane-strain linear elasticity solved by P1 finite elements on
random star-shaped voids, generated and cached on the first run); with ``--data``
it reads the Geo-FNO benchmark files ``Random_UnitCell_{XY,sigma}_10.npy``.

Run::

    python examples/elasticity.py                       # stand-in, 2-core CPU: ~8 min
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

from common import parser, run, sizes, split_blocks  # noqa: E402

from data_adapters import ElasticityDataset, make_elasticity_standin  # noqa: E402
from meshops.training.seed import seed_everything  # noqa: E402

# Model sizes for ~1000-point samples, small enough for a 2-core CPU by default
# (PiT: a 256-point farthest-point latent mesh; the reference model's latent mesh
# is all 972 input points: --full uses that). Measured default run (320 training /
# 40 test samples, 30 epochs, 2 idle cores): 8.2 min wall, test relative L2 0.124
# mean / 0.117 median / 0.191 worst -- but with the checkpoint then picked on those
# test samples; the default now fits 288 and picks on 32 held-out training samples,
# and prints the baselines beside it (not re-measured yet). A smaller run (width 32, 200 samples, 25
# epochs) gave 0.257 from the positions alone (--no-void-distance) and 0.19 with the
# distance to the void: the stress peaks on the void's boundary are what a model
# that cannot see the boundary misses.
# PiT's Elasticity model and batch size (Chen & Wu, ICLR 2024, Tables 6-9): the
# latent mesh is the 972 input points, encoding dimension 512, 8 heads, 4 processor
# blocks, count quantiles 2 % / 2 %, batch size 10; 6,586,929 parameters in the
# paper. The input is the geometry alone.
FULL_PIT = {"latent": "input", "width": 512, "heads": 8, "blocks": 4, "ball": "count",
            "quantile_in": 0.02, "quantile_out": 0.02}
FULL_BATCH_SIZE = 10
MODEL_CONFIG = {
    "pit": {"latent": "fps", "num_latent": 256, "width": 64},
    "transformer_no": {"width": 64, "layers": 3},
    "galerkin_transformer": {"width": 64},
    "patched_transformer": {"width": 64},
}


def main(argv=None):
    p = parser(__doc__.splitlines()[0], "runs/elasticity")
    p.add_argument("--no-void-distance", dest="void_distance", action="store_false",
                   default=None,
                   help="geometry from the point positions only (the published setting, "
                        "and the default with --full); otherwise each point also gets its "
                        "distance to the void, which with --data needs "
                        "Random_UnitCell_rr_10.npy")
    args = p.parse_args(argv)
    seed_everything(args.seed)  # before anything that may draw a random number
    args.num_train, args.num_test, args.epochs = sizes(
        args, default=(320, 40, 30), full=(1000, 200, 500), quick=(8, 4, 1),
        full_batch_size=FULL_BATCH_SIZE)
    if args.void_distance is None:
        args.void_distance = not args.full
    if args.full:
        MODEL_CONFIG["pit"] = dict(FULL_PIT)
    if args.data is not None:
        ds = ElasticityDataset(args.data, "all", void_distance=args.void_distance)
        # The published split: train [:1000], test [-200:].
        train_idx, test_idx = split_blocks(args.data, ds.num_samples, args.num_train,
                                           args.num_test, ds.num_samples - 200)
        train = [ds.sample(s) for s in train_idx]
        test = [ds.sample(s) for s in test_idx]
        title = "Geo-FNO Elasticity"
    else:
        samples = make_elasticity_standin(args.num_train + args.num_test, seed=args.seed,
                                          void_distance=args.void_distance)
        train, test = samples[:args.num_train], samples[args.num_train:]
        title = "Elasticity STAND-IN (P1 FEM)"
    inputs = ("void_distance",) if args.void_distance else ()
    if args.void_distance:
        title += ", input: distance to the void"
    return run(args, train, test, target="sigma", model_config=MODEL_CONFIG, title=title,
               inputs=inputs)


if __name__ == "__main__":
    main()
