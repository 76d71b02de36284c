"""Write the stand-ins in the Geo-FNO file layouts that both codes read.

The reference code reads the benchmark's ``.npy`` files (plus, for the airfoil,
its own ``shape_coords.npy``); meshops reads the same files through
:func:`data_adapters.load_naca` / :func:`data_adapters.load_elasticity`. Writing the
stand-ins in those layouts gives the two codes identical inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_adapters import elasticity as geo_elasticity
from data_adapters import naca as geo_naca
from meshops.utils.atomic import atomic_write

SHAPE_FILE = "shape_coords.npy"
"""The airfoil surface points the reference's NACA script reads as its input (its
repository ships them for the Geo-FNO data; Geo-FNO's files have no such array)."""
SHAPE_POINTS = 120
ELASTICITY_POINTS = 972
RR_ANGLES = 42
GAMMA = 1.4


def _save(path: Path, array: np.ndarray) -> None:
    atomic_write(path, lambda tmp: np.save(tmp, array))


def write_naca_files(root, X: np.ndarray, Y: np.ndarray, Q: np.ndarray,
                     shape_coords: np.ndarray | None = None) -> Path:
    """Write ``NACA_Cylinder_{X,Y,Q}.npy`` (and ``shape_coords.npy``) into ``root``.

    Each file is written completely or not at all.

    Args:
        root: Output folder (created).
        X, Y: Grid node coordinates ``[S, n0, n1]``.
        Q: Channels density, u, v, p, Mach ``[S, 5, n0, n1]``.
        shape_coords: Airfoil surface points ``[S, P, 2]`` for the reference code.

    Returns:
        ``root`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: arrays whose shapes disagree.

    Shapes:
        X ``[S, n0, n1]``, Y ``[S, n0, n1]``, Q ``[S, 5, n0, n1]``, shape_coords ``[S, P, 2]``
    """
    X, Y, Q = (np.asarray(a, dtype=np.float64) for a in (X, Y, Q))
    if X.ndim != 3 or Y.shape != X.shape:
        raise ValueError(f"X and Y must be [S, n0, n1] of one shape, got {X.shape}, {Y.shape}")
    want = (X.shape[0], len(geo_naca.CHANNELS), *X.shape[1:])
    if Q.shape != want:
        raise ValueError(f"Q must be {want} (channels {', '.join(geo_naca.CHANNELS)}), "
                         f"got {Q.shape}")
    if shape_coords is not None:
        shape_coords = np.asarray(shape_coords, dtype=np.float64)
        if shape_coords.ndim != 3 or shape_coords.shape[0] != X.shape[0] \
                or shape_coords.shape[2] != 2:
            raise ValueError(f"shape_coords must be [{X.shape[0]}, P, 2], "
                             f"got {shape_coords.shape}")
    root = Path(root)
    _save(root / geo_naca.X_FILE, X)
    _save(root / geo_naca.Y_FILE, Y)
    _save(root / geo_naca.Q_FILE, Q)
    if shape_coords is not None:
        _save(root / SHAPE_FILE, shape_coords)
    return root


def write_elasticity_files(root, xy: np.ndarray, sigma: np.ndarray,
                           rr: np.ndarray | None = None) -> Path:
    """Write ``Random_UnitCell_{XY,sigma,rr}_10.npy`` (points-first) into ``root``.

    Args:
        root: Output folder (created).
        xy: Points of every sample, ``[S, P, 2]`` (written as ``[P, 2, S]``).
        sigma: Von Mises stress ``[S, P]`` (written as ``[P, S]``).
        rr: Void radii ``[S, R]`` (written as ``[R, S]``).

    Returns:
        ``root`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: arrays whose shapes disagree.

    Shapes:
        xy ``[S, P, 2]``, sigma ``[S, P]``, rr ``[S, R]``
    """
    xy, sigma = np.asarray(xy, dtype=np.float64), np.asarray(sigma, dtype=np.float64)
    if xy.ndim != 3 or xy.shape[2] != 2 or sigma.shape != xy.shape[:2]:
        raise ValueError(f"xy must be [S, P, 2] and sigma [S, P], got {xy.shape}, "
                         f"{sigma.shape}")
    root = Path(root)
    _save(root / geo_elasticity.XY_FILE, np.ascontiguousarray(xy.transpose(1, 2, 0)))
    _save(root / geo_elasticity.SIGMA_FILE, np.ascontiguousarray(sigma.T))
    if rr is not None:
        rr = np.asarray(rr, dtype=np.float64)
        if rr.ndim != 2 or rr.shape[0] != xy.shape[0]:
            raise ValueError(f"rr must be [{xy.shape[0]}, R], got {rr.shape}")
        _save(root / geo_elasticity.RR_FILE, np.ascontiguousarray(rr.T))
    return root


def isentropic_state(mach: np.ndarray, mach_inf: float, gamma: float = GAMMA):
    """Density and pressure over their free-stream values at local Mach ``mach``
    (isentropic flow of a perfect gas: the stand-in has no density or pressure)."""
    t = (1 + 0.5 * (gamma - 1) * mach_inf ** 2) / (1 + 0.5 * (gamma - 1) * np.asarray(mach) ** 2)
    rho = t ** (1 / (gamma - 1))
    return rho, rho ** gamma


def naca_arrays_from_standin(samples, n_wake: int, mach_inf: float = 0.5,
                             shape_points: int = SHAPE_POINTS) -> dict[str, np.ndarray]:
    """Geo-FNO NACA arrays from airfoil stand-in samples.

    ``Q``'s channels: density and pressure from the local Mach number (isentropic,
    :func:`isentropic_state`), the stand-in's ``u``, ``v`` and ``mach``.
    ``shape_coords``: ``shape_points`` of the airfoil's surface nodes (grid line
    ``j = 0`` between the two wake cuts, trailing edge at both ends), picked at
    evenly spaced indices.

    Args:
        samples: :func:`data_adapters.make_airfoil_standin` samples (one grid shape).
        n_wake: Wake nodes per side of the stand-in's C-grid.
        mach_inf: Free-stream Mach number the stand-in was made with.
        shape_points: Surface points per sample in ``shape_coords``.

    Returns:
        ``{"X", "Y", "Q", "shape_coords"}`` for :func:`write_naca_files`.
    """
    n0, n1 = (int(v) for v in samples[0].grid_shape.view(-1))
    S = len(samples)
    X, Y = np.empty((S, n0, n1)), np.empty((S, n0, n1))
    Q = np.empty((S, len(geo_naca.CHANNELS), n0, n1))
    surface = np.arange(n_wake, n0 - n_wake)
    if shape_points > len(surface):
        raise ValueError(f"shape_points={shape_points} > {len(surface)} surface nodes")
    pick = surface[np.round(np.linspace(0, len(surface) - 1, shape_points)).astype(int)]
    for k, s in enumerate(samples):
        if tuple(int(v) for v in s.grid_shape.view(-1)) != (n0, n1):
            raise ValueError(f"sample {k}: grid {s.grid_shape.tolist()} is not {n0} x {n1}")
        pos = s.pos.double().numpy().reshape(n0, n1, 2)
        X[k], Y[k] = pos[..., 0], pos[..., 1]
        f = {name: s.fields[name].double().numpy().reshape(n0, n1) for name in ("u", "v", "mach")}
        rho, p = isentropic_state(f["mach"], mach_inf)
        Q[k] = np.stack([rho, f["u"], f["v"], p, f["mach"]])
    shape_coords = np.stack([X[:, pick, 0], Y[:, pick, 0]], axis=-1)
    return {"X": X, "Y": Y, "Q": Q, "shape_coords": shape_coords}


def elasticity_arrays_from_standin(samples, num_points: int = ELASTICITY_POINTS,
                                   num_angles: int = RR_ANGLES, seed: int = 0
                                   ) -> dict[str, np.ndarray]:
    """Geo-FNO Elasticity arrays from elasticity stand-in samples.

    The FEM stand-in's meshes have about 1,000 nodes each; the layout needs the same
    number in every sample, so ``num_points`` of each sample's nodes are kept (a
    seeded random subset, in node order). ``rr`` is the void radius at ``num_angles``
    angles ``2 pi k / num_angles`` (the open set) from the sample's shape parameters.

    Args:
        samples: :func:`data_adapters.make_elasticity_standin` samples, each with at
            least ``num_points`` nodes.
        num_points: Points per sample (972 in the benchmark).
        num_angles: Radii per sample (42 in the benchmark).
        seed: Seed of the subsets.

    Returns:
        ``{"xy", "sigma", "rr"}`` for :func:`write_elasticity_files`.

    Raises:
        ValueError: a sample with fewer than ``num_points`` nodes.
    """
    from data_adapters.standins import void_radius

    rng = np.random.default_rng(seed)
    theta = 2 * np.pi * np.arange(num_angles) / num_angles
    xy, sigma, rr = [], [], []
    for k, s in enumerate(samples):
        n = s.num_nodes
        if n < num_points:
            raise ValueError(f"sample {k} has {n} nodes, fewer than num_points={num_points}")
        keep = np.sort(rng.choice(n, num_points, replace=False))
        xy.append(s.pos.double().numpy()[keep])
        sigma.append(s.fields["sigma"].double().numpy()[keep])
        rr.append(void_radius(theta, s.params.double().numpy().ravel()))
    return {"xy": np.stack(xy), "sigma": np.stack(sigma), "rr": np.stack(rr)}
