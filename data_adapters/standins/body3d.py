"""A 3-D **stand-in** surface family: potential flow past random closed bodies, the
pressure coefficient and velocity on the body's surface, each sample its own triangle
mesh in space.

Synthetic data, made to stand for the surface fields of external aerodynamics (the
pressure on a car or a fuselage). Sample ``s`` is the body

    x(d) = r(d) R (a d_x, b d_y, c d_z),    d on the unit sphere,

with semi-axes ``a`` uniform in ``[0.5, 1.5]`` (along the stream) and ``b, c`` in
``[0.2, 0.5]``, a small rotation ``R = Rz(yaw) Ry(pitch) Rx(roll)`` (each angle uniform
in ``[-10, 10]`` degrees) and ``BUMPS`` smooth bumps ``r(d) = 1 + sum_k A_k exp(kappa_k
(d . c_k - 1))`` (centres ``c_k`` uniform on the sphere, ``A_k`` uniform in ``[-0.15,
0.15]``, ``kappa_k`` in ``[4, 12]``: 0.3-0.5 rad wide). Such a body is star-shaped and
embedded for any ``r > 0`` (it is a radial graph over the directions ``R D d / |R D d|``);
draws with ``r < R_MIN`` or a slope ``|grad_S r| / r > SLOPE`` are rejected so the bodies
stay blunt bumps on an ellipsoid. The free stream has unit speed and direction

    U = (cos alpha cos beta, sin beta, sin alpha cos beta),

angle of attack ``alpha`` and sideslip ``beta`` uniform in ``[-15, 15]`` degrees. The
flow is solved by the panel method of :mod:`.panel3d` (total potential, constant
panels, exact solid angles; the velocity from a quadratic least-squares fit per
vertex), ``cp = 1 - |v|^2``. On the default meshes the panel solution is within about
1 % (velocity) and 2-4 % (``cp``) of the exact flow past ellipsoids of these proportions,
relative L2 over the surface.

The mesh: gmsh's triangulation of the unit sphere (edge ``h``, 1,543 nodes by default),
turned by a random rotation drawn per sample (so node placement differs from sample to
sample) and mapped by ``x(d)``. Mapping the sphere rather than meshing each body keeps
the node count fixed and puts the nodes where the flow varies: a slender body's
triangles are stretched along it, where the velocity changes slowly, and fine round
its nose (an isotropic mesh of the body would spend its nodes on the long sides).

Re-meshed splits of the same bodies: ``refine`` divides ``h`` (``refine=2``: about 4x
the nodes), and ``ring`` refines a cap of the sphere (chord radius ``cap``) round the
preimage of the front stagnation point of the body's ellipsoid (``d ~ -D R^T U``, the
point where its normal faces the stream) by ``ring`` in area, the sizes growing back to
``h`` over ``CAP_GROW``: the same function ``x(d)`` on another mesh.

Each sample is a :class:`meshops.MeshData` on the triangle mesh (its weights: a third
of the area of the triangles round each node) with ``fields`` ``nx, ny, nz`` (the exact
outward unit normal: the geometry input), ``alpha`` and ``beta`` (rad, constant: the
global inputs), the targets ``cp`` and ``vx, vy, vz`` (in units of the stream's speed),
``x [N, 5]``, ``y [N, 4]``, ``params [1, 23]`` (:data:`PARAMS`: the shape's 21 and the
stream's two, for the nearest-sample baseline) and ``standin=True``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data_adapters.standins._cache import describe, generate_or_load
from data_adapters.standins._meshes import pack_meshes, unpack_meshes
from data_adapters.standins.cavity3d import _gmsh, rotation
from data_adapters.standins.panel3d import surface_flow
from meshops.datasets.folder import as_float_dtype
from meshops.errors import MeshError

GENERATOR = "body3d"
VERSION = 1
INPUTS = ("nx", "ny", "nz", "alpha", "beta")
TARGETS = ("cp", "vx", "vy", "vz")
#: The fields of the targets: the pressure coefficient and the velocity (one vector).
FIELDS = ("cp", "vx+vy+vz")
BUMPS = 3
BUMP = ("cx", "cy", "cz", "amp", "kappa")
PARAMS = ("a", "b", "c", "yaw", "pitch", "roll",
          *(f"{k}{i}" for i in range(1, BUMPS + 1) for k in BUMP), "alpha", "beta")
LENGTH, WIDTH = (0.5, 1.5), (0.2, 0.5)
TILT = math.radians(10)
AMPLITUDE, KAPPA = 0.15, (4.0, 12.0)
STREAM = math.radians(15)
#: Rejection bounds: the least radius factor and the largest slope ``|grad_S r| / r``.
R_MIN, SLOPE = 0.75, 0.6
#: Edge length of the unit sphere's mesh (1,543 nodes).
H = 0.1
#: Chord radius of the refined cap of a graded re-mesh and the distance over which its
#: sizes grow back to ``h`` (on the unit sphere; about 2.5 edges each).
CAP, CAP_GROW = 0.25, 0.25


def _fibonacci(n: int) -> np.ndarray:
    """``n`` nearly uniform unit vectors ``[n, 3]``."""
    k = np.arange(n) + 0.5
    z = 1 - 2 * k / n
    phi = math.pi * (1 + 5 ** 0.5) * k
    s = np.sqrt(1 - z * z)
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], 1)


def _bumps(prm) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(centres [B, 3], amplitudes [B], kappas [B])`` of a sample's params."""
    b = np.asarray(prm, np.float64)[6:6 + 5 * BUMPS].reshape(BUMPS, 5)
    return b[:, :3], b[:, 3], b[:, 4]


def radius(d, prm) -> tuple[np.ndarray, np.ndarray]:
    """``r(d)`` and its tangential gradient on the unit sphere.

    Shapes:
        d ``[N, 3]`` (unit), prm ``[23]`` -> ``([N], [N, 3])``
    """
    d = np.asarray(d, np.float64)
    centres, amp, kappa = _bumps(prm)
    e = amp * np.exp(kappa * (d @ centres.T - 1))                # [N, B]
    grad = (e * kappa) @ centres
    return 1 + e.sum(1), grad - d * np.einsum("nd,nd->n", grad, d)[:, None]


def _frame(prm) -> np.ndarray:
    """``R D`` ``[3, 3]``: the ellipsoid's map."""
    prm = np.asarray(prm, np.float64)
    return rotation(*prm[3:6]) * prm[:3]


def body_points(d, prm) -> np.ndarray:
    """``x(d)`` of the module docstring.

    Shapes:
        d ``[N, 3]`` (unit), prm ``[23]`` -> ``[N, 3]``
    """
    r, _ = radius(d, prm)
    return (r[:, None] * np.asarray(d, np.float64)) @ _frame(prm).T


def body_normals(d, prm) -> np.ndarray:
    """The exact outward unit normals at ``x(d)``: the gradient of ``|y| - r(y / |y|)``,
    ``y = D^-1 R^T x``, is ``d - grad_S r / r`` in ``y``, and ``R D^-1`` times that in ``x``.

    Shapes:
        d ``[N, 3]`` (unit), prm ``[23]`` -> ``[N, 3]``
    """
    prm = np.asarray(prm, np.float64)
    r, grad = radius(d, prm)
    n = (np.asarray(d, np.float64) - grad / r[:, None]) / prm[:3] @ rotation(*prm[3:6]).T
    return n / np.linalg.norm(n, axis=1, keepdims=True)


def stream(alpha: float, beta: float) -> np.ndarray:
    """The unit free stream ``[3]`` of the module docstring."""
    return np.array([math.cos(alpha) * math.cos(beta), math.sin(beta),
                     math.sin(alpha) * math.cos(beta)])


def stagnation_direction(prm) -> np.ndarray:
    """The direction ``d`` ``[3]`` whose point on the body's ellipsoid (bumps left out)
    faces the stream: ``-D R^T U``, normalised."""
    prm = np.asarray(prm, np.float64)
    d = -(_frame(prm).T @ stream(*prm[-2:]))
    return d / np.linalg.norm(d)


def _acceptable(prm, directions) -> bool:
    r, grad = radius(directions, prm)
    return bool(r.min() >= R_MIN and (np.linalg.norm(grad, axis=1) / r).max() <= SLOPE)


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 23]`` parameters (:data:`PARAMS`) drawn from ``seed`` (module docstring)."""
    rng = np.random.default_rng(seed)
    directions = _fibonacci(4000)
    out = np.empty((num_samples, len(PARAMS)))
    for s in range(num_samples):
        while True:
            axes = np.r_[rng.uniform(*LENGTH), rng.uniform(*WIDTH, 2)]
            angles = rng.uniform(-TILT, TILT, 3)
            centres = rng.normal(size=(BUMPS, 3))
            centres /= np.linalg.norm(centres, axis=1, keepdims=True)
            bumps = np.c_[centres, rng.uniform(-AMPLITUDE, AMPLITUDE, BUMPS),
                          rng.uniform(*KAPPA, BUMPS)]
            prm = np.r_[axes, angles, bumps.ravel(), 0.0, 0.0]
            if _acceptable(prm, directions):
                break
        prm[-2:] = rng.uniform(-STREAM, STREAM, 2)
        out[s] = prm
    return out


def mesh_sphere(h: float = H, centre=None, ring: float = 1, cap: float = CAP,
                grow: float = CAP_GROW) -> tuple[np.ndarray, np.ndarray]:
    """Triangle mesh of the unit sphere (gmsh, OCC, Frontal-Delaunay; one thread, fixed
    seed: the same arguments give the same mesh), normals outward.

    Args:
        h: Edge length.
        centre: With ``ring > 1``: the unit vector at the middle of the refined cap.
        ring: Triangles about ``ring`` times smaller in area (edges ``h / sqrt(ring)``)
            within chord ``cap`` of ``centre``, growing back to ``h`` over ``grow``.

    Returns:
        ``(points [N, 3], triangles [T, 3])``, the points exactly on the sphere.

    Raises:
        ValueError: ``h`` not in ``(0, 1]``, or ``ring > 1`` without a unit ``centre``.
        MeshError: gmsh made no triangles.
    """
    if not 0 < h <= 1:
        raise ValueError(f"mesh_sphere: need 0 < h <= 1, got h={h!r}")
    if ring > 1 and (centre is None or abs(np.linalg.norm(centre) - 1) > 1e-9):
        raise ValueError(f"mesh_sphere: a refined cap needs a unit centre, got {centre!r}")
    with _gmsh() as gmsh:
        gmsh.option.setNumber("Mesh.Algorithm", 6)
        gmsh.model.occ.addSphere(0.0, 0.0, 0.0, 1.0)
        gmsh.model.occ.synchronize()
        gmsh.option.setNumber("Mesh.MeshSizeMax", h)
        if ring > 1:
            field = gmsh.model.mesh.field
            ball = field.add("Ball")
            for key, value in zip(("XCenter", "YCenter", "ZCenter"), centre):
                field.setNumber(ball, key, float(value))
            for key, value in (("Radius", cap), ("Thickness", grow),
                               ("VIn", h / math.sqrt(ring)), ("VOut", h)):
                field.setNumber(ball, key, value)
            field.setAsBackgroundMesh(ball)
        gmsh.model.mesh.generate(2)
        tags, coords, _ = gmsh.model.mesh.getNodes()
        _, nodes = gmsh.model.mesh.getElementsByType(2)
        if len(nodes) == 0:
            raise MeshError(f"mesh_sphere: gmsh made no triangles (h={h}, ring={ring})")
    index = np.full(int(tags.max()) + 1, -1, np.int64)
    index[tags] = np.arange(len(tags))
    tri = index[nodes.reshape(-1, 3)]
    used, tri = np.unique(tri, return_inverse=True)
    points = coords.reshape(-1, 3)[used]
    return points / np.linalg.norm(points, axis=1, keepdims=True), tri.reshape(-1, 3)


def mesh_rotation(seed: int, sample: int) -> np.ndarray:
    """The random rotation ``[3, 3]`` that turns sample ``sample``'s sphere mesh (the
    same for all its re-meshes)."""
    from scipy.spatial.transform import Rotation

    return Rotation.random(random_state=np.random.default_rng([seed, sample])).as_matrix()


def body_mesh(prm, turn, h: float = H, ring: float = 1,
              cap: float = CAP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A body's mesh: the sphere's (turned by ``turn``, refined at the stagnation cap
    for ``ring > 1``) mapped by ``x(d)``.

    Returns:
        ``(points [N, 3], triangles [T, 3], directions d [N, 3])``.
    """
    centre = turn.T @ stagnation_direction(prm) if ring > 1 else None
    s, tri = mesh_sphere(h, centre, ring, cap)
    d = s @ turn.T
    return body_points(d, prm), tri, d


def _sample(prm, turn, h: float, ring: float, cap: float) -> dict:
    """One sample's mesh and fields."""
    points, tri, d = body_mesh(prm, turn, h, ring, cap)
    normals = body_normals(d, prm)
    flow = surface_flow(points, tri, stream(*prm[-2:]), normals)
    return {"points": points, "triangle": tri.astype(np.int32),
            **{k: normals[:, i] for i, k in enumerate(INPUTS[:3])},
            **{k: np.full(len(points), v) for k, v in zip(INPUTS[3:], prm[-2:])},
            "cp": flow.cp, **{k: flow.velocity[:, i] for i, k in enumerate(TARGETS[1:])}}


def _generate(params: np.ndarray, ids, seed: int, h: float, ring: float, cap: float,
              progress: bool) -> dict:
    from meshops.utils.progress import progress as progress_bar

    done = [_sample(prm, mesh_rotation(seed, s), h, ring, cap)
            for prm, s in progress_bar(list(zip(params, ids)), desc="body3d STAND-IN (panels)",
                                       enabled=progress, leave=False)]
    return pack_meshes(done, "triangle", 3, (*INPUTS, *TARGETS), params)


def _check(num_samples, refine, ring, first, cap, h) -> None:
    bad = [f"{name}={value!r}" for name, value, ok in (
        ("num_samples", num_samples, isinstance(num_samples, int) and num_samples >= 0),
        ("refine", refine, isinstance(refine, (int, float)) and refine >= 1),
        ("ring", ring, isinstance(ring, (int, float)) and ring >= 1),
        ("first", first, isinstance(first, int) and 0 <= first <= num_samples),
        ("cap", cap, isinstance(cap, (int, float)) and 0 < cap < 2),
        ("h", h, isinstance(h, (int, float)) and 0 < h <= 1)) if not ok]
    if bad:
        raise ValueError("make_body3d_standin: need num_samples >= 0, refine >= 1, ring >= "
                         "1, 0 <= first <= num_samples, 0 < cap < 2 and 0 < h <= 1; got "
                         + ", ".join(bad))


def make_body3d_standin(num_samples: int = 300, seed: int = 0, cache_dir=None,
                        progress: bool = True, *, refine: float = 1, h: float = H,
                        first: int = 0, ring: float = 1, cap: float = CAP,
                        dtype=torch.float32) -> list:
    """The 3-D surface stand-in of bodies in a stream, generated or read from the cache.

    Args:
        num_samples: How many bodies (each on its own mesh).
        seed: Draws the parameters and the turns of the meshes.
        cache_dir: Where the cache lives (``None``: the default place; ``False``: none).
        progress: Report on stderr what was generated or read.
        refine: Divides the sphere's edge ``h`` (``2``: the same bodies on about 4x the
            nodes, for the zero-shot refinement check).
        h: Edge of the unit sphere's mesh (before ``refine``).
        first: Keep the bodies ``first..num_samples - 1`` of the draw alone (the test
            bodies, meshed again).
        ring: Graded re-mesh: the cap round the front stagnation point refined ``ring``
            times in area (:func:`mesh_sphere`).
        cap: Chord radius of that cap on the unit sphere.
        dtype: The returned tensors' floating dtype.

    Returns:
        ``list[MeshData]``, as the module docstring says.

    Raises:
        ValueError: an argument out of its range, named in the message.
        ImportError: without gmsh (the message names the extra to install).

    Shapes:
        item: pos ``[N_s, 3]``, x ``[N_s, 5]``, y ``[N_s, 4]``, params ``[1, 23]``
    """
    dtype = as_float_dtype(dtype)
    _check(num_samples, refine, ring, first, cap, h)
    params = sample_params(num_samples, seed)[first:]
    size = {"h": float(h) / refine}
    # the keys of the plain sets' cache files do not depend on the options' defaults
    size.update({"first": first} if first else {})
    size.update({"ring": float(ring), "cap": float(cap)} if ring > 1 else {})
    meta = describe(GENERATOR, VERSION, size, seed, num_samples)
    ids = range(first, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(params, ids, seed, size["h"], ring,
                                                         cap, progress),
                                 cache_dir, progress, "body3d")
    how = f"refine {refine:g}" + (f", ring {ring:g} in a cap of {cap:g}" if ring > 1 else "")
    return unpack_meshes(arrays, "triangle", INPUTS, TARGETS, dtype, first,
                         lambda k: f"body3d STAND-IN sample {k} (seed {seed}, {how})")
