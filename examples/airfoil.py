"""Airfoil: the Mach number of the flow around NACA airfoils, on their C-grids.

Each sample is a structured C-grid around one airfoil (quad cells, so the
quadrature weights come from the cells); the target is the Mach number at every
grid point. Without ``--data`` the example trains on the offline STAND-IN
(NACA 4-digit airfoils at random angles of attack, Hess-Smith panel-method flow
with a compressibility-corrected Mach number, generated and cached on the first
run; the free-stream direction is the input field). With ``--data`` it reads the
Geo-FNO benchmark files ``NACA_Cylinder_{X,Y,Q}.npy`` (geometry only as input).

Run::

    python examples/airfoil.py                          # stand-in, 2-core CPU: ~8 min
    python examples/airfoil.py --data ~/geofno/naca --full --device cuda

Writes ``runs/airfoil/``: ``best.pt``, ``history.json``, ``test_samples.png``,
``predictions/*.vtu`` and ``summary.json``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import parser, run, sizes, split_blocks  # noqa: E402

from data_adapters import NacaDataset, make_airfoil_standin  # noqa: E402
from meshops.training.seed import seed_everything  # noqa: E402

# The published NACA split: train [:1000], test [1000:1200].
PUBLISHED_TEST_START = 1000
# PiT's NACA model and batch size (Chen & Wu, ICLR 2024, Tables 6-9): encoding
# dimension 256, 2 heads, 4 processor blocks, the 221 x 51 C-grid pooled to a
# 111 x 26 latent grid (stride 2), count quantiles 0.5 % (encoder) / 2 % (decoder),
# batch size 8; 1,250,061 parameters in the paper.
FULL_PIT = {"width": 256, "heads": 2, "blocks": 4, "stride": 2, "ball": "count",
            "quantile_in": 0.005, "quantile_out": 0.02}
FULL_BATCH_SIZE = 8


def model_config(grid_shape, full: bool = False):
    """Model sizes for one C-grid.

    PiT's latent mesh is the grid with stride 4 (``--full``: the paper's model,
    :data:`FULL_PIT`). Its encoder/decoder balls hold a fixed fraction of the *points*
    (``ball="count"``, PiT's rule) rather than of the area: a C-grid's spacing grows
    about a hundredfold from the wall to the far field, so a ball holding 1 % of the
    area would hold thousands of points near the airfoil (29 s per training step on
    2 cores instead of 0.5 s).
    """
    pit = {"stride": 4, "width": 64, "ball": "count", "quantile_in": 0.01, "quantile_out": 0.02}
    return {
        "pit": {"latent": "grid", "grid_shape": list(grid_shape), **(FULL_PIT if full else pit)},
        "transformer_no": {"width": 64, "layers": 3},
        "galerkin_transformer": {"width": 64},
        "patched_transformer": {"width": 64},
    }


def main(argv=None):
    args = parser(__doc__.splitlines()[0], "runs/airfoil").parse_args(argv)
    seed_everything(args.seed)  # before anything that may draw a random number
    args.num_train, args.num_test, args.epochs = sizes(
        args, default=(200, 40, 30), full=(1000, 200, 500), quick=(8, 4, 1),
        full_batch_size=FULL_BATCH_SIZE)
    if args.data is not None:
        ds = NacaDataset(args.data, "all")
        train_idx, test_idx = split_blocks(args.data, ds.num_samples, args.num_train,
                                           args.num_test, PUBLISHED_TEST_START)
        train = [ds.sample(s) for s in train_idx]
        test = [ds.sample(s) for s in test_idx]
        title = "Geo-FNO NACA airfoil"
    else:
        samples = make_airfoil_standin(args.num_train + args.num_test, seed=args.seed)
        train, test = samples[:args.num_train], samples[args.num_train:]
        title = "Airfoil STAND-IN (panel method)"
    grid_shape = [int(n) for n in train[0].grid_shape.view(-1)]
    return run(args, train, test, target="mach", model_config=model_config(grid_shape, args.full),
               title=title, window=((-0.5, 1.5), (-0.6, 0.6)))


if __name__ == "__main__":
    main()
