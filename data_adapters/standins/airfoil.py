"""**Stand-in** for the Geo-FNO NACA airfoil benchmark, generated offline.

NOT the benchmark (transonic Euler CFD at Mach 0.8): synthetic potential-flow data
on the same kind of grid, so that examples and tests run without the
(non-redistributable) Geo-FNO files. Each sample is:

* **Geometry**: a NACA 4-digit airfoil (:mod:`data_adapters.standins.naca4`) with
  maximum camber ``m ~ U(0, 0.06)`` at ``p ~ U(0.3, 0.6)``, thickness
  ``t ~ U(0.08, 0.18)``, chord 1, at an angle of attack ``alpha ~ U(-5, 10)`` degrees
  (the free stream turns; the airfoil and grid stay put).
* **Mesh**: an algebraic C-grid (:mod:`data_adapters.standins.cgrid`) laid out like
  the benchmark's 221 x 51 grid (wake-cut nodes doubled at ``j = 0``), 121 x 31 =
  3751 nodes by default (``n_side=41`` points per airfoil surface, ``n_wake=20`` per
  wake side, ``n1=31`` towards a far field 5 chords away), quad cells from
  :func:`meshops.mesh.quadrature.structured_grid_cells`, weights from the quads.
* **Flow**: incompressible potential flow from the Hess-Smith panel method
  (:mod:`data_adapters.standins.panel`) with the airfoil's surface nodes as panel
  ends; velocities at the grid nodes are sums of all panel influences (on the
  airfoil surface: the mean of the two adjacent panels' surface velocities).
* **Fields** (velocities in units of ``V_inf``): ``u``, ``v``, ``speed`` ``= |V|``,
  ``cp = 1 - |V|^2 / V_inf^2`` (incompressible), ``mach``: an *approximate* local
  Mach number at free-stream Mach ``mach_inf`` (0.5 by default; see
  :func:`local_mach`), the inputs ``u_inf``, ``v_inf`` (the free-stream direction
  ``(cos alpha, sin alpha)``, constant over the grid, since the angle of attack
  varies; ``x = [u_inf, v_inf]`` by default) and ``wall_distance``, the distance to
  the airfoil (its NACA curve sampled finely, :data:`WALL_POINTS` points a side, not
  the grid's own wall nodes: the same function of space on every grid of a shape).
  Target ``y``: ``mach`` by default, to mirror the benchmark.

``params [1, 4] = [m, p, t, alpha in degrees]``, ``cl`` (``[1]``, Kutta-Joukowski lift
coefficient of the panel solution), ``standin=True`` and a ``source`` that says
"stand-in" are attached to every sample.
"""

from __future__ import annotations

import numpy as np
import torch

from data_adapters.standins._cache import describe, generate_or_load
from data_adapters.standins.cgrid import c_grid
from data_adapters.standins.naca4 import naca4, naca4_name
from data_adapters.standins.panel import solve_panels
from meshops.datasets.folder import add_inputs_targets, as_float_dtype
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays
from meshops.mesh.quadrature import structured_grid_cells
from meshops.utils.progress import progress as progress_bar

GENERATOR = "airfoil"
VERSION = 1
FIELDS = ("u", "v", "speed", "cp", "mach")
INPUT_FIELDS = ("u_inf", "v_inf")
#: Fields of the shape alone, for use as inputs.
GEOMETRY_FIELDS = ("wall_distance",)
#: Points a side of the curve ``wall_distance`` measures to (its distances agree with
#: those to 40,001 points a side within 5e-5 chords: the stand-ins' tests).
WALL_POINTS = 1001
#: Nearest vertices of that curve whose segments ``wall_distance`` searches.
_CANDIDATES = 8
GAMMA = 1.4


def local_mach(speed_ratio, mach_inf: float, gamma: float = GAMMA,
               max_fraction: float = 0.95) -> np.ndarray:
    """Approximate local Mach number from an incompressible speed ratio ``q = |V|/V_inf``.

    An approximation, not a compressible solution (no shocks):

    1. Prandtl-Glauert correction of the speed perturbation,
       ``q_c = 1 + (q - 1) / sqrt(1 - M_inf^2)``, clipped to
       ``[0, max_fraction * q_max]`` where ``q_max = sqrt(1 + 2 / ((gamma - 1) M_inf^2))``
       is the speed ratio at which the isentropic temperature reaches zero (the clip
       is reached only at extreme suction peaks, where the correction has broken
       down anyway);
    2. isentropic energy equation, ``M = M_inf q_c / sqrt(1 + (gamma - 1)/2 M_inf^2 (1 - q_c^2))``.

    Args:
        speed_ratio: ``|V| / V_inf`` (any shape).
        mach_inf: Free-stream Mach number, ``0 <= mach_inf < 1``.
        gamma: Ratio of specific heats.
        max_fraction: Clip of ``q_c`` as a fraction of ``q_max``.

    Returns:
        Local Mach number, same shape, non-decreasing in ``q``; equals ``mach_inf``
        where ``q = 1`` and 0 near stagnation points (``q <= 1 - sqrt(1 - M_inf^2)``,
        where the corrected speed is clipped at 0).
    """
    if not 0 <= mach_inf < 1:
        raise MeshError(f"mach_inf must be in [0, 1), got {mach_inf}")
    q = np.asarray(speed_ratio, dtype=np.float64)
    if mach_inf == 0:
        return np.zeros_like(q)
    beta = np.sqrt(1 - mach_inf ** 2)
    q_max = np.sqrt(1 + 2 / ((gamma - 1) * mach_inf ** 2))
    qc = np.clip(1 + (q - 1) / beta, 0.0, max_fraction * q_max)
    return mach_inf * qc / np.sqrt(1 + 0.5 * (gamma - 1) * mach_inf ** 2 * (1 - qc ** 2))


def flow_on_grid(X: np.ndarray, Y: np.ndarray, contour: np.ndarray, n_wake: int,
                 alpha: float, mach_inf: float):
    """Panel-method flow at the nodes of a C-grid built on ``contour``.

    Args:
        X, Y: C-grid ``[n0, n1]`` from :func:`data_adapters.standins.cgrid.c_grid` (its
            ``j = 0`` airfoil nodes are ``contour``).
        contour: Closed airfoil contour ``[n_a, 2]`` (panel ends).
        n_wake: Wake points per side in the grid.
        alpha: Angle of attack (radians).
        mach_inf: Free-stream Mach number for the ``mach`` field.

    Returns:
        ``(fields [5, n0, n1]`` in the order of ``FIELDS``, ``cl)``.
    """
    sol = solve_panels(contour, alpha)
    n0, n1 = X.shape
    pts = np.stack([X.ravel(), Y.ravel()], axis=1)
    on_body = np.zeros((n0, n1), bool)
    on_body[n_wake:n0 - n_wake, 0] = True
    vel = np.empty_like(pts)
    flat = on_body.ravel()
    vel[~flat] = sol.velocity(pts[~flat])
    vel[flat] = sol.surface_velocity()
    speed = np.hypot(vel[:, 0], vel[:, 1])
    cp = 1.0 - speed ** 2
    mach = local_mach(speed, mach_inf)
    fields = np.stack([vel[:, 0], vel[:, 1], speed, cp, mach]).reshape(len(FIELDS), n0, n1)
    return fields, sol.cl


def wall_distance(points: np.ndarray, m: float, p: float, t: float) -> np.ndarray:
    """The distance of ``points`` to the NACA 4-digit airfoil ``(m, p, t)``: to its
    contour of :data:`WALL_POINTS` cosine-spaced points a side.

    Shapes:
        points ``[N, 2]`` -> ``[N]``
    """
    from scipy.spatial import cKDTree

    curve = naca4(m, p, t, WALL_POINTS)
    a, ab = curve[:-1], curve[1:] - curve[:-1]
    # the closest point lies on a segment at one of the nearest vertices: searching
    # those, not all 2,000 segments, takes 0.4 s a 2,275-node grid down to milliseconds
    near = cKDTree(curve).query(points, k=min(_CANDIDATES, len(curve)))[1]
    seg = np.clip(np.concatenate([near - 1, near], 1), 0, len(a) - 1)          # [N, 2k]
    ap = points[:, None] - a[seg]
    u = np.clip((ap * ab[seg]).sum(-1) / np.maximum((ab[seg] ** 2).sum(-1), 1e-300), 0, 1)
    return np.sqrt(((ap - u[..., None] * ab[seg]) ** 2).sum(-1)).min(1)


def _generate(num_samples: int, seed: int, cfg: dict, progress: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    m = rng.uniform(*cfg["m_range"], num_samples)
    p = rng.uniform(*cfg["p_range"], num_samples)
    t = rng.uniform(*cfg["t_range"], num_samples)
    alpha = rng.uniform(*cfg["aoa_range"], num_samples)
    first = cfg.get("first", 0)
    m, p, t, alpha = m[first:], p[first:], t[first:], alpha[first:]
    num_samples -= first
    n0 = 2 * cfg["n_side"] - 1 + 2 * cfg["n_wake"]
    n1 = cfg["n1"]
    X = np.zeros((num_samples, n0, n1))
    Y = np.zeros((num_samples, n0, n1))
    F = np.zeros((num_samples, len(FIELDS), n0, n1))
    W = np.zeros((num_samples, n0 * n1))
    cl = np.zeros(num_samples)
    quads = structured_grid_cells((n0, n1))
    for k in progress_bar(range(num_samples), desc="airfoil STAND-IN (panel method, not Geo-FNO)",
                          enabled=progress, leave=False):
        contour = naca4(m[k], p[k], t[k], cfg["n_side"])
        X[k], Y[k] = c_grid(contour, cfg["n_wake"], n1, cfg["radius"], cfg["wake_length"],
                            cfg["first_height"])
        F[k], cl[k] = flow_on_grid(X[k], Y[k], contour, cfg["n_wake"], np.radians(alpha[k]),
                                   cfg["mach_inf"])
        # Validated once here (every cell non-degenerate, untangled) and cached.
        W[k] = mesh_from_arrays(np.stack([X[k].ravel(), Y[k].ravel()], axis=1),
                                [("quad", quads)], source=f"airfoil stand-in sample {k}").weight
    return {"X": X, "Y": Y, "fields": F, "weight": W, "cl": cl,
            "params": np.stack([m, p, t, alpha], axis=1)}


def _build(arrays: dict, seed: int, inputs, targets, dtype, first: int = 0) -> list[MeshData]:
    X, Y, F = arrays["X"], arrays["Y"], arrays["fields"]
    out = []
    if not len(X):
        return out
    n0, n1 = X.shape[1:]
    quads = torch.from_numpy(structured_grid_cells((n0, n1)))
    for j in range(len(X)):
        k = first + j  # the sample's place in the draw
        m, p, t, alpha = arrays["params"][j]
        points = np.stack([X[j].ravel(), Y[j].ravel()], axis=1)
        fields = {name: F[j, c].ravel() for c, name in enumerate(FIELDS)}
        a = np.radians(alpha)
        fields["u_inf"] = np.full(n0 * n1, np.cos(a))
        fields["v_inf"] = np.full(n0 * n1, np.sin(a))
        fields["wall_distance"] = wall_distance(points, m, p, t)
        source = (f"stand-in:airfoil v{VERSION} seed={seed} sample={k} ({naca4_name(m, p, t)}, "
                  f"alpha={alpha:.2f} deg; panel method, not Geo-FNO)")
        mesh = MeshData(pos=torch.from_numpy(points), weight=torch.from_numpy(arrays["weight"][j]),
                        fields={k_: torch.from_numpy(v) for k_, v in fields.items()},
                        cells=[("quad", quads)], cell_data={}, source=source)
        out.append(add_inputs_targets(mesh, inputs, targets, dtype, sample_id=k, standin=True,
                                      params=torch.from_numpy(arrays["params"][j].copy())[None],
                                      cl=torch.tensor([float(arrays["cl"][j])]),
                                      grid_shape=torch.tensor([[n0, n1]])))
    return out


def make_airfoil_standin(num_samples: int = 200, seed: int = 0, cache_dir=None,
                         progress: bool = True, *, target="mach", inputs=INPUT_FIELDS,
                         dtype=torch.float32, n_side: int = 41, n_wake: int = 20, n1: int = 31,
                         radius: float = 5.0, wake_length: float = 5.0,
                         first_height: float = 0.01, mach_inf: float = 0.5,
                         aoa_range=(-5.0, 10.0), m_range=(0.0, 0.06), p_range=(0.3, 0.6),
                         t_range=(0.08, 0.18), first: int = 0) -> list[MeshData]:
    """Generate (or load from the cache) the NACA airfoil **stand-in** data set.

    See the module docstring. Deterministic in ``seed`` and the generation
    arguments (the same arguments give byte-identical cache files); ``target``,
    ``inputs`` and ``dtype`` only select what ``x``/``y`` hold and are not part of the
    cache key. Generating takes far longer than loading the cache (about half of the
    generation computes and validates the quadrature weights of the quads).

    Args:
        num_samples: Number of airfoils.
        seed: Seed of the random shapes and angles.
        cache_dir: Cache folder; ``None``: ``$MESHOPS_CACHE/standins`` or
            ``~/.cache/meshops/standins``; ``False``: no cache.
        progress: Print what was generated/loaded (stderr), with a tqdm bar on a terminal.
        target: Field name(s) for ``y`` (``"mach"``; any of ``u, v, speed, cp, mach``).
        inputs: Field names for ``x`` (default the free-stream direction
            ``u_inf, v_inf``; ``()`` for geometry only, as in the benchmark, which is
            then ill-posed unless ``aoa_range`` is a single angle; ``wall_distance``
            gives the shape as a field).
        dtype: Floating dtype of the returned tensors.
        n_side, n_wake, n1: C-grid size ``(2 n_side - 1 + 2 n_wake) x n1``
            (``n_side=71, n_wake=40, n1=51`` is the benchmark's 221 x 51).
        radius, wake_length, first_height: C-grid far field, wake length and first
            cell height (chords).
        mach_inf: Free-stream Mach number of the approximate ``mach`` field.
        aoa_range: Angle of attack range in degrees.
        m_range, p_range, t_range: NACA 4-digit parameter ranges.
        first: Only the samples ``first..num_samples - 1`` of the same draw (e.g. the
            test shapes alone on finer grids).

    Returns:
        ``list[MeshData]``: ``pos [n0 n1, 2]``, ``weight``, ``cells = [("quad", ...)]``,
        ``fields`` (``u, v, speed, cp, mach, u_inf, v_inf, wall_distance``), ``x [n0 n1, 2]``,
        ``y [n0 n1, 1]``, ``params [1, 4]``, ``cl [1]``, ``grid_shape [1, 2]``,
        ``standin=True``, ``sample_id``, ``source``.

    Shapes:
        item: pos ``[n0 n1, 2]``, weight ``[n0 n1]``, x ``[n0 n1, C_in]``, y ``[n0 n1, C_out]``
    """
    dtype = as_float_dtype(dtype)
    names = FIELDS + INPUT_FIELDS + GEOMETRY_FIELDS
    targets = [target] if isinstance(target, str) else list(target)
    for name in list(targets) + list(inputs):
        if name not in names:
            raise MeshError(f"unknown field {name!r}; the airfoil stand-in has "
                            f"{', '.join(names)}")
    cfg = {"n_side": int(n_side), "n_wake": int(n_wake), "n1": int(n1), "radius": float(radius),
           "wake_length": float(wake_length), "first_height": float(first_height),
           "mach_inf": float(mach_inf), "aoa_range": [float(a) for a in aoa_range],
           "m_range": [float(a) for a in m_range], "p_range": [float(a) for a in p_range],
           "t_range": [float(a) for a in t_range]}
    if not 0 <= first <= num_samples:
        raise ValueError(f"make_airfoil_standin: need 0 <= first <= num_samples, got "
                         f"first={first}")
    cfg.update({"first": int(first)} if first else {})  # plain sets keep their cache keys
    meta = describe(GENERATOR, VERSION, cfg, seed, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(num_samples, seed, cfg, progress),
                                 cache_dir, progress, "airfoil")
    return _build(arrays, seed, list(inputs), targets, dtype, first)
