"""``python -m benchmarks.tet_cube``: a tetrahedral box of ``s^3`` nodes, for the
end-to-end memory runs of ``meshops train`` and ``meshops predict`` on meshes of
engineering size (``benchmarks/results/scale-train-1m-predict-5m-cpu-loaded.txt``).

The box ``[0, 1]^2 x [0, height]`` on a uniform grid of ``s`` nodes per side, each grid
cube split into 6 tetrahedra (Kuhn's triangulation: the 6 monotone paths from one
corner to the opposite one, a conforming mesh), every tetrahedron positively oriented.
Point fields: an input ``a = sin(pi x + phase) cos(pi y) + z`` and two targets
``u = a (1 + x) + y^2 / 2`` and ``p = cos(2 x y + phase) (1 + z)``. Written with meshio
(``.vtu``: 100 nodes per side, 1M nodes and 5.8M cells, is 94 MB).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# Kuhn: the 6 monotone paths from corner 000 to corner 111 of a grid cube
PATHS = (((1, 0, 0), (1, 1, 0)), ((1, 0, 0), (1, 0, 1)), ((0, 1, 0), (1, 1, 0)),
         ((0, 1, 0), (0, 1, 1)), ((0, 0, 1), (1, 0, 1)), ((0, 0, 1), (0, 1, 1)))


def box(s: int, height: float = 1.0, phase: float = 0.0):
    """``(points [s^3, 3], tetrahedra [6 (s-1)^3, 4], {name: [s^3]})``."""
    g = np.linspace(0.0, 1.0, s)
    x, y, z = np.meshgrid(g, g, g * height, indexing="ij")
    pts = np.stack([x.ravel(), y.ravel(), z.ravel()], 1)
    idx = np.arange(s ** 3, dtype=np.int64).reshape(s, s, s)
    m = (s - 1) ** 3
    tets = np.empty((6 * m, 4), np.int64)
    for t, (a, b) in enumerate(PATHS):
        # the corner order with a positive volume (the same for every cube of the grid)
        a, b = (a, b) if np.linalg.det(np.array([a, b, (1, 1, 1)], float)) > 0 else (b, a)
        for col, (i, j, k) in enumerate(((0, 0, 0), a, b, (1, 1, 1))):
            tets[t * m:(t + 1) * m, col] = idx[i:s - 1 + i, j:s - 1 + j, k:s - 1 + k].ravel()
    X, Y, Z = pts.T
    a = np.sin(np.pi * X + phase) * np.cos(np.pi * Y) + Z
    fields = {"a": a, "u": a * (1 + X) + 0.5 * Y ** 2,
              "p": np.cos(2 * X * Y + phase) * (1 + Z)}
    return pts, tets, fields


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tet_cube", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", type=int, required=True, help="nodes per side (s)")
    p.add_argument("--height", type=float, default=1.0)
    p.add_argument("--phase", type=float, default=0.0)
    p.add_argument("--out", type=Path, required=True, help="the mesh file (.vtu)")
    args = p.parse_args(argv)
    if args.side < 2:
        p.error(f"--side must be at least 2, got {args.side}")
    import meshio

    pts, tets, fields = box(args.side, args.height, args.phase)
    meshio.write(args.out, meshio.Mesh(pts, [("tetra", tets)], point_data=fields))
    print(f"{args.out}: {len(pts):,} nodes, {len(tets):,} tetrahedra")
    return 0


if __name__ == "__main__":
    sys.exit(main())
