"""``python -m benchmarks.slice_transplant``: which slice tokens make a trained slice
transformer depend on the mesh (issue 36).

A run trained on one kind of mesh predicts the same shapes on their test meshes and
re-meshed (a split of a family folder of :mod:`benchmarks.accuracy.datasets`). For each
shape, the slice tokens of every layer on the test mesh are recorded; the re-meshed
prediction is then made again with the tokens of the slices smaller than a threshold
(their fraction of the domain) carried over from the test mesh, and once more with the
tokens of all the *other* slices carried over. If the first brings the re-meshed error
back to the test-mesh error and the second does not, the small slices are what moves.
The layer's own steps are called here (its integrals, tokens and read-back), with the
tokens swapped between the first two. A diagnosis, not a speed or accuracy figure: it
runs on any load.

Example::

    python -m benchmarks.slice_transplant --run RUN --data $DATA_ROOT/obstacle \\
        --split test_ring64 --field p --samples 12 \\
        --out benchmarks/results/slice-transplant-obstacle.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.paths import command, portable

#: Swapping modes: record the tokens, carry the small slices' over, carry the others'.
RECORD, SMALL, LARGE = "record", "small", "large"


class Swap:
    """Replaces :meth:`SliceAttention._attend` while active; records or swaps tokens."""

    def __init__(self):
        self.mode, self.store, self.i, self.threshold = None, [], 0, 0.0

    def attend(self, layer, x_src, weight):
        """The layer's own steps (:meth:`SliceAttention.integrals`, ``tokens``, ``read``),
        the tokens recorded or swapped between the first two: a swapped token's moments
        are set to its recorded token times this mesh's mass, so that ``tokens`` divides
        back to the recorded value."""
        import torch

        weight = layer.fractions(weight, x_src.dtype, x_src.shape[1])
        s = layer.slice_weights(x_src, layer.lin_x)
        mass, moments = layer.integrals(x_src, weight, s)
        if self.mode == RECORD:
            self.store.append((moments / (mass + layer.EPS)[..., None], mass))
        elif self.mode in (SMALL, LARGE):
            z0, m0 = self.store[self.i]
            self.i += 1
            small = (m0 < self.threshold)[..., None]
            moments = torch.where(small if self.mode == SMALL else ~small,
                                  z0 * (mass + layer.EPS)[..., None], moments)
        return layer.read(x_src, layer.tokens(mass, moments), s)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.slice_transplant",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a slice transformer's run folder")
    p.add_argument("--data", type=Path, required=True, help="a family's data folder")
    p.add_argument("--split", default="test_ring64", help="the re-meshed split")
    p.add_argument("--field", default="p", help="the target scored")
    p.add_argument("--samples", type=int, default=12, help="the first test shapes")
    p.add_argument("--thresholds", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import numpy as np
    import torch

    import meshops
    from meshops.nn.slice import SliceAttention

    torch.set_num_threads(1)
    run = meshops.load_run(args.run)
    swap = Swap()
    real = SliceAttention._attend
    SliceAttention._attend = (lambda layer, x_src, x_dst, pos_src, pos_dst, weight, m_src,
                              m_dst: swap.attend(layer, x_src, weight))
    names = sorted(f.name for f in (args.data / "test").glob("*.vtu"))[:args.samples]

    def error(split, name, mode):
        swap.mode, swap.i = mode, 0
        mesh = meshops.read_mesh(args.data / split / name)
        pred = run.predict(mesh, verbose=False)[f"{args.field}_pred"].double().reshape(-1)
        true = mesh.fields[args.field].double().reshape(-1)
        w = mesh.weight.double()
        return float(torch.sqrt((w * (pred - true) ** 2).sum() / (w * true ** 2).sum()))

    roots = {"$DATA_ROOT": args.data.parent, "$WORK": args.run.parent}
    lines = [f"command: {command('benchmarks.slice_transplant', argv, roots)}",
             f"{len(names)} shapes; field {args.field}; mean relative L2 error"]
    try:
        for thr in args.thresholds:
            swap.threshold = thr
            rows = []
            for name in names:
                swap.store = []
                rows.append([error("test", name, RECORD), error(args.split, name, None),
                             error(args.split, name, SMALL), error(args.split, name, LARGE)])
            m = np.mean(rows, axis=0)
            lines.append(f"slices under {thr:g} of the domain: test meshes {m[0]:.4f}; "
                         f"{args.split} {m[1]:.4f}; with the small slices' tokens from the "
                         f"test meshes {m[2]:.4f}; with all other tokens from them {m[3]:.4f}")
            print(lines[-1], flush=True)
    finally:
        SliceAttention._attend = real
    if args.out is not None:
        from meshops.utils.atomic import atomic_write

        text = portable("\n".join(lines) + "\n", roots)
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
