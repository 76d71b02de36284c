"""Small time series with an exact solution, for the time-series tests.

The heat equation ``u_t = kappa * laplace(u)`` on the unit square with ``u = 0`` on the
boundary has the solution

    u(x, y, t) = a * exp(-2 pi^2 kappa t) * sin(pi x) * sin(pi y),

so every step multiplies the state by ``exp(-2 pi^2 kappa dt)``: the relative L2 error
of persistence (the first state held) after ``h`` steps is ``exp(2 pi^2 kappa h dt) -
1`` whatever the quadrature, and that of another series' states follows likewise.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from _meshes import square_mesh


def decay(kappa: float, dt: float) -> float:
    """The factor one step multiplies the state by."""
    return math.exp(-2 * math.pi ** 2 * kappa * dt)


def heat_states(kappa: float, a: float, steps: int, dt: float, n: int = 6):
    """``(points, cells, times [T], u [T, N])`` of the exact solution on an ``n x n``
    triangle mesh."""
    pts, cells = square_mesh(n, "triangle")
    phi = np.sin(np.pi * pts[:, 0]) * np.sin(np.pi * pts[:, 1])
    t = dt * np.arange(steps)
    return pts, cells, t, a * np.exp(-2 * np.pi ** 2 * kappa * t)[:, None] * phi[None]


def series_params(count: int, seed: int = 0) -> np.ndarray:
    """``[count, 2]`` parameters ``(kappa, a)``: kappa in [0.05, 0.25], a in [0.5, 2]."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.uniform(0.05, 0.25, count), rng.uniform(0.5, 2.0, count)], 1)


def write_heat_series(root, params: np.ndarray, steps: int = 11, dt: float = 0.02,
                      n: int = 6, fmt: str = "folder", table: bool = True) -> list[Path]:
    """One series per row of ``params`` in ``root``: ``fmt`` "folder" (numbered .vtu
    files), "pvd" or "xdmf" (inline XML data); the parameters in ``root/params.csv``
    (columns file, kappa, a) when ``table``. Returns the series' paths."""
    import meshio

    from meshops.datasets.params import write_param_table
    from meshops.datasets.series import write_series
    from meshops.mesh.io import mesh_from_arrays, write_mesh

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out, rows = [], {}
    for i, (kappa, a) in enumerate(params):
        pts, cells, t, u = heat_states(kappa, a, steps, dt, n)
        name = f"s{i:02d}"
        if fmt == "folder":
            for k in range(steps):
                write_mesh(root / name / f"u_{k:04d}.vtu", mesh_from_arrays(pts, cells),
                           point_data={"u": u[k]})
            out.append(root / name)
        elif fmt == "pvd":
            out.append(write_series(root / f"{name}.pvd", mesh_from_arrays(pts, cells),
                                    [{"u": uk} for uk in u], t))
        else:
            path = root / f"{name}.xdmf"
            with meshio.xdmf.TimeSeriesWriter(path, data_format="XML") as w:
                w.write_points_cells(pts, cells)
                for k in range(steps):
                    w.write_data(float(t[k]), point_data={"u": u[k]})
            out.append(path)
        rows[out[-1].name] = [kappa, a]  # keyed by the series' folder or file name
    if table:
        write_param_table(root, ["kappa", "a"], rows)
    return out
