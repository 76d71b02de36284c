"""A 3-D **stand-in** family of geometries: a steel block with one or two ellipsoidal
cavities, clamped at one end and pulled at the other, each sample its own tetrahedral
mesh.

Synthetic data, made to stand for the solid mechanics users' ordinary 3-D case.
Sample ``s`` solves linear elasticity (small strains, isotropic steel: ``E = 200 GPa``,
``nu = 0.3``) in the block ``[0, L] x [0, W] x [0, H]`` (``L = 2 m``, ``W = H = 1 m``)
minus one or two ellipsoids, with

    u = 0                         on x = 0 (clamped),
    sigma . n = t                 on x = L (a uniform traction),
    sigma . n = 0                 on the other faces and the cavities,

``t = load * (cos(angle) cos(elevation), sin(angle) cos(elevation), sin(elevation))``:
``load`` uniform in ``[1, 10] MPa``, ``angle`` (from ``+x`` towards ``+y``) and
``elevation`` (towards ``+z``) uniform in ``[-pi/2, pi/2]``, so every direction with a
pulling component occurs, from pure tension to pure shear.

A cavity has a centre, semi-axes ``a, b, c`` uniform in ``[0.08, 0.25] m`` and an
orientation ``R = Rz(yaw) Ry(pitch) Rx(roll)`` (each angle uniform in
``[-pi/2, pi/2]``); its bounding box stays ``MARGIN`` inside the lateral faces and
``END_MARGIN`` from the clamped and loaded ends, and two cavities' bounding spheres stay
``GAP`` apart (rejection sampling). A sample has two cavities with probability 1/2.

The mesh (gmsh, OpenCASCADE kernel: the box minus the ellipsoids; one thread, fixed
seed, so the same arguments give the same mesh) has tetrahedra of edge about
``h_cavity`` on the cavities growing linearly to ``h`` at ``GROW`` from them; 3,000 to
6,000 nodes by default. The equations are solved with P1 tetrahedra (scikit-fem); the
von Mises stress is that of the element stresses projected onto the continuous P1
space (consistent mass matrix, component by component).

Each sample is a :class:`meshops.MeshData` on the tetrahedral mesh with ``fields``
``sdf`` (distance to the nearest cavity surface, m: the geometry input), ``load`` (Pa),
``angle`` and ``elevation`` (rad) as constant fields (the global inputs), the targets
``ux, uy, uz`` (m) and ``vm`` (Pa, about ``5e10`` times the displacement), ``x [N, 4]``,
``y [N, 4]``, ``params [1, 22]`` (:data:`PARAMS`: the number of cavities, each cavity's
nine parameters, the second a copy of the first when there is one cavity, and the load's
three, for the nearest-sample baseline) and ``standin=True``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from data_adapters.standins._cache import describe, generate_or_load
from data_adapters.standins._meshes import pack_meshes, unpack_meshes
from data_adapters.standins.fem import lame
from meshops.datasets.folder import as_float_dtype
from meshops.errors import MeshError

GENERATOR = "cavity3d"
VERSION = 1
LENGTH, WIDTH, HEIGHT = 2.0, 1.0, 1.0
YOUNG, POISSON = 200e9, 0.3
INPUTS = ("sdf", "load", "angle", "elevation")
TARGETS = ("ux", "uy", "uz", "vm")
#: The fields of the targets: the displacement (one vector field) and the stress.
FIELDS = ("ux+uy+uz", "vm")
CAVITY = ("x", "y", "z", "a", "b", "c", "yaw", "pitch", "roll")
PARAMS = ("cavities", *(f"{k}{i}" for i in (1, 2) for k in CAVITY),
          "load", "angle", "elevation")
AXES = (0.08, 0.25)
LOAD = (1e6, 1e7)
MARGIN, END_MARGIN, GAP = 0.08, 0.25, 0.1
#: Default mesh sizes (m) away from and on the cavities, and the distance over which the
#: size grows from one to the other.
H, H_CAVITY, GROW = 0.095, 0.035, 0.3
#: Width (m) of the band around the cavities that a graded re-mesh refines: half the
#: default ``h_cavity``, about one layer of the training meshes' tetrahedra.
RING_BAND = 0.0175
#: How much faster than the plain mesh's the sizes grow back out of a refined band.
RING_GROWTH = 4.0
EXTRA = "standins3d"


def rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    """``Rz(yaw) Ry(pitch) Rx(roll)`` ``[3, 3]``: its columns are a cavity's axes."""
    cz, sz, cy, sy = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
    cx, sx = math.cos(roll), math.sin(roll)
    rz = np.array([[cz, -sz, 0.0], [sz, cz, 0.0], [0.0, 0.0, 1.0]])
    ry = np.array([[cy, 0.0, sy], [0.0, 1.0, 0.0], [-sy, 0.0, cy]])
    rx = np.array([[1.0, 0.0, 0.0], [0.0, cx, -sx], [0.0, sx, cx]])
    return rz @ ry @ rx


def traction(load: float, angle: float, elevation: float) -> np.ndarray:
    """The traction vector ``[3]`` (Pa) of the module docstring."""
    return load * np.array([math.cos(angle) * math.cos(elevation),
                            math.sin(angle) * math.cos(elevation), math.sin(elevation)])


def _half_extent(cavity) -> np.ndarray:
    """Half the bounding box's sides ``[3]`` of a cavity ``[9]`` (exact for an ellipsoid:
    ``sqrt(sum_j (R_ij a_j)^2)``)."""
    return np.sqrt(((rotation(*cavity[6:9]) * cavity[3:6]) ** 2).sum(1))


def _fits(cavity) -> bool:
    lo = np.array([END_MARGIN, MARGIN, MARGIN])
    hi = np.array([LENGTH - END_MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN])
    e = _half_extent(cavity)
    return bool((cavity[:3] - e >= lo).all() and (cavity[:3] + e <= hi).all())


def _draw_cavity(rng) -> np.ndarray:
    axes = rng.uniform(*AXES, 3)
    angles = rng.uniform(-math.pi / 2, math.pi / 2, 3)
    while True:
        centre = rng.uniform([0.0, 0.0, 0.0], [LENGTH, WIDTH, HEIGHT])
        cavity = np.r_[centre, axes, angles]
        if _fits(cavity):
            return cavity


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 22]`` parameters (:data:`PARAMS`) drawn from ``seed`` (module docstring)."""
    rng = np.random.default_rng(seed)
    out = np.empty((num_samples, len(PARAMS)))
    for s in range(num_samples):
        n = int(rng.integers(1, 3))
        first = second = _draw_cavity(rng)
        while n == 2:
            second = _draw_cavity(rng)
            apart = np.linalg.norm(first[:3] - second[:3]) - first[3:6].max() - second[3:6].max()
            if apart >= GAP:
                break
        load = rng.uniform(*LOAD)
        angle, elevation = rng.uniform(-math.pi / 2, math.pi / 2, 2)
        out[s] = np.r_[n, first, second, load, angle, elevation]
    return out


def cavities_of(params) -> list[np.ndarray]:
    """The cavities ``[9]`` (centre, semi-axes, yaw, pitch, roll) of a sample's params."""
    params = np.asarray(params, np.float64).reshape(-1)
    return [params[1 + 9 * k:10 + 9 * k] for k in range(int(params[0]))]


def ellipsoid_distance(points, cavity, iterations: int = 100) -> np.ndarray:
    """Distance from points outside (or on) an ellipsoid to its surface; 0 inside.

    The closest point of the axis-aligned ellipsoid to ``y`` (in the cavity's frame) is
    ``a_i^2 y_i / (a_i^2 + t)`` with ``t >= 0`` the root of ``sum_i (a_i y_i /
    (a_i^2 + t))^2 = 1``, found by bisection in ``[0, a_max |y|]`` (the left side
    decreases in ``t``, and at ``t = a_max |y|`` it is at most 1).

    Args:
        points: ``[N, 3]``.
        cavity: ``[9]``: centre, semi-axes ``a, b, c``, yaw, pitch, roll.

    Shapes:
        points ``[N, 3]`` -> ``[N]``
    """
    cavity = np.asarray(cavity, np.float64)
    y = (np.asarray(points, np.float64) - cavity[:3]) @ rotation(*cavity[6:9])
    a2 = cavity[3:6] ** 2
    lo = np.zeros(len(y))
    hi = cavity[3:6].max() * np.linalg.norm(y, axis=1)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        outside = ((cavity[3:6] * y / (a2 + mid[:, None])) ** 2).sum(1) > 1.0
        lo, hi = np.where(outside, mid, lo), np.where(outside, hi, mid)
    t = 0.5 * (lo + hi)
    return np.linalg.norm(y - a2 * y / (a2 + t[:, None]), axis=1)


def cavity_distance(points, params) -> np.ndarray:
    """``sdf``: the distance to the nearest cavity surface of a sample's params.

    Shapes:
        points ``[N, 3]`` -> ``[N]``
    """
    return np.min([ellipsoid_distance(points, c) for c in cavities_of(params)], axis=0)


@contextmanager
def _gmsh():
    try:
        import gmsh
    except ImportError as e:
        raise ImportError(f"the 3-D stand-ins mesh with gmsh: pip install 'meshops[{EXTRA}]' "
                          f"(or pip install gmsh==4.15.2)") from e
    gmsh.initialize(readConfigFiles=False, interruptible=False)
    try:
        for name, value in (("General.Terminal", 0), ("General.Verbosity", 0),
                            ("General.NumThreads", 1), ("Mesh.MaxNumThreads1D", 1),
                            ("Mesh.MaxNumThreads2D", 1), ("Mesh.MaxNumThreads3D", 1),
                            ("Mesh.RandomSeed", 1), ("Mesh.Algorithm", 5),
                            ("Mesh.Algorithm3D", 1), ("Mesh.MeshSizeFromPoints", 0),
                            ("Mesh.MeshSizeFromCurvature", 0),
                            ("Mesh.MeshSizeExtendFromBoundary", 0)):
            gmsh.option.setNumber(name, value)
        yield gmsh
    finally:
        gmsh.finalize()


def _size_field(gmsh, surfaces, h: float, h_cavity: float, ring: float, band: float) -> None:
    """Edges of ``h_cavity`` on the cavities growing to ``h`` over :data:`GROW`; with
    ``ring > 1`` the band of width ``band`` at them ``ring`` times finer in volume."""
    field = gmsh.model.mesh.field
    dist = field.add("Distance")
    field.setNumbers(dist, "SurfacesList", surfaces)
    field.setNumber(dist, "Sampling", 60)
    sizes = []
    # beyond the band the sizes grow back RING_GROWTH times as fast as the plain mesh's,
    # so that the band, not a wide shell, is what a graded re-mesh refines
    for size_min, reach, rate in [(h_cavity, 0.0, 1.0)] + (
            [(h_cavity / ring ** (1 / 3), band, RING_GROWTH)] if ring > 1 else []):
        f = field.add("Threshold")
        field.setNumber(f, "InField", dist)
        field.setNumber(f, "SizeMin", size_min)
        field.setNumber(f, "SizeMax", h)
        field.setNumber(f, "DistMin", reach)
        field.setNumber(f, "DistMax",
                        reach + GROW * (h - size_min) / max(h - h_cavity, 1e-12) / rate)
        sizes.append(f)
    least = field.add("Min")
    field.setNumbers(least, "FieldsList", sizes)
    field.setAsBackgroundMesh(least)


def mesh_block(cavities, h: float = H, h_cavity: float = H_CAVITY, ring: float = 1,
               band: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Tetrahedral mesh of the block minus the ellipsoidal ``cavities`` (gmsh, OCC).

    Args:
        cavities: ``[9]`` each (centre, semi-axes, yaw, pitch, roll); none: the block.
        h, h_cavity: Edge lengths away from and on the cavities.
        ring: A graded re-mesh: the band of width ``band`` at the cavities with
            tetrahedra about ``ring`` times smaller in volume (edges ``h_cavity /
            ring^(1/3)``), growing back to the plain mesh's sizes beyond it.
        band: Width of that band (m).

    Returns:
        ``(points [N, 3], tetrahedra [M, 4])``, positively oriented.

    Raises:
        ValueError: ``ring > 1`` without a band, or ``h_cavity`` not in ``(0, h]``.
        MeshError: gmsh made no tetrahedra.
    """
    if ring > 1 and not band > 0:
        raise ValueError(f"mesh_block: a refined ring needs a band width > 0, got {band!r}")
    if not 0 < h_cavity <= h:
        raise ValueError(f"mesh_block: need 0 < h_cavity <= h, got {h_cavity!r}, {h!r}")
    with _gmsh() as gmsh:
        occ = gmsh.model.occ
        block = occ.addBox(0.0, 0.0, 0.0, LENGTH, WIDTH, HEIGHT)
        holes = []
        for cav in cavities:
            tag = occ.addSphere(*cav[:3], 1.0)
            occ.dilate([(3, tag)], *cav[:3], *cav[3:6])
            for axis, angle in zip(((1, 0, 0), (0, 1, 0), (0, 0, 1)), cav[8:5:-1]):
                occ.rotate([(3, tag)], *cav[:3], *axis, float(angle))
            holes.append((3, tag))
        if holes:
            occ.cut([(3, block)], holes)
        occ.synchronize()
        surfaces = [tag for dim, tag in gmsh.model.getEntities(2) if not _on_box(gmsh, tag)]
        if surfaces:
            _size_field(gmsh, surfaces, h, h_cavity, ring, band)
        else:
            gmsh.option.setNumber("Mesh.MeshSizeMax", h)
        gmsh.model.mesh.generate(3)
        tags, coords, _ = gmsh.model.mesh.getNodes()
        _, nodes = gmsh.model.mesh.getElementsByType(4)
        if len(nodes) == 0:
            raise MeshError(f"mesh_block: gmsh made no tetrahedra for cavities "
                            f"{np.asarray(cavities).tolist()} (h={h}, h_cavity={h_cavity})")
    return _compact(tags, coords.reshape(-1, 3), nodes.reshape(-1, 4))


def _on_box(gmsh, tag: int) -> bool:
    """Whether surface ``tag`` is a face of the block (flat on one of its planes)."""
    lo, hi = np.reshape(gmsh.model.getBoundingBox(2, tag), (2, 3))
    box = np.array([LENGTH, WIDTH, HEIGHT])
    tol = 1e-5  # OpenCASCADE pads bounding boxes by 1e-7
    flat = np.abs(hi - lo) < tol
    return bool((flat & ((np.abs(lo) < tol) | (np.abs(lo - box) < tol))).any())


def _compact(tags, coords, tets) -> tuple[np.ndarray, np.ndarray]:
    """The nodes the tetrahedra use, numbered from 0; orientation made positive."""
    index = np.full(int(tags.max()) + 1, -1, np.int64)
    index[tags] = np.arange(len(tags))
    tets = index[tets]
    used = np.unique(tets)
    renum = np.full(len(tags), -1, np.int64)
    renum[used] = np.arange(len(used))
    points, tets = coords[used], renum[tets]
    e = points[tets[:, 1:]] - points[tets[:, :1]]
    flip = np.linalg.det(e) < 0
    tets[flip] = tets[flip][:, [0, 2, 1, 3]]
    return np.ascontiguousarray(points), tets


def solve_elasticity(points, tets, load, E: float = YOUNG, nu: float = POISSON,
                     support: str = "clamped") -> np.ndarray:
    """P1 displacement (m) of the block under the traction ``load [3]`` (Pa) on
    ``x = x_max``.

    Args:
        points, tets: The mesh (``[N, 3]``, ``[M, 4]``).
        load: The traction vector.
        E, nu: Young's modulus (Pa) and Poisson ratio.
        support: ``"clamped"`` (``u = 0`` on ``x = x_min``) or ``"roller"`` (``u_x = 0``
            there, plus ``u_y = u_z = 0`` at its node nearest ``(x_min, y_min, z_min)``
            and ``u_z = 0`` at its node nearest ``(x_min, y_max, z_min)``: no more than
            removes the rigid motions, so a uniform axial traction gives the uniaxial
            stress state).

    Shapes:
        points ``[N, 3]``, tets ``[M, 4]``, load ``[3]`` -> ``[N, 3]``
    """
    import skfem
    from skfem.helpers import dot
    from skfem.models.elasticity import linear_elasticity

    if support not in ("clamped", "roller"):
        raise ValueError(f"support must be 'clamped' or 'roller', got {support!r}")
    load = np.asarray(load, np.float64)
    if load.shape != (3,):
        raise ValueError(f"load must be a traction vector [3], got shape {load.shape}")
    mesh, basis = _basis(points, tets)
    K = linear_elasticity(*lame(E, nu)).assemble(basis)
    p = mesh.p
    lo, hi = p.min(1), p.max(1)
    tol = 1e-9 * (hi - lo).max()
    end = mesh.facets_satisfying(lambda x: np.abs(x[0] - hi[0]) <= tol)
    if len(end) == 0:
        raise MeshError("solve_elasticity: no boundary facets on the loaded end x = x_max")

    @skfem.LinearForm
    def pull(v, _):
        return dot(load, v)

    f = pull.assemble(skfem.FacetBasis(mesh, basis.elem, facets=end))
    dofs = basis.nodal_dofs                                    # [3, N]
    face = np.flatnonzero(np.abs(p[0] - lo[0]) <= tol)
    if support == "clamped":
        fixed = dofs[:, face].ravel()
    else:
        a = face[np.argmin(np.linalg.norm(p[1:, face].T - lo[1:], axis=1))]
        b = face[np.argmin(np.linalg.norm(p[1:, face].T - [hi[1], lo[2]], axis=1))]
        fixed = np.r_[dofs[0, face], dofs[1:, a], dofs[2, b]]
    u = skfem.solve(*skfem.condense(K, f, D=fixed))
    return np.ascontiguousarray(u[dofs].T)


def _basis(points, tets):
    import skfem

    mesh = skfem.MeshTet(np.asarray(points, np.float64).T.copy(),
                         np.asarray(tets, np.int64).T.copy())
    return mesh, skfem.Basis(mesh, skfem.ElementVector(skfem.ElementTetP1()))


def von_mises(points, tets, displacement, E: float = YOUNG, nu: float = POISSON) -> np.ndarray:
    """Nodal von Mises stress (Pa): the P1 element stresses projected onto continuous P1
    (consistent mass), component by component, then combined.

    Shapes:
        points ``[N, 3]``, tets ``[M, 4]``, displacement ``[N, 3]`` -> ``[N]``
    """
    import skfem
    from scipy.sparse.linalg import splu
    from skfem.helpers import sym_grad

    mesh, basis = _basis(points, tets)
    u = np.empty(basis.N)
    u[basis.nodal_dofs] = np.asarray(displacement, np.float64).T
    eps = sym_grad(basis.interpolate(u))
    lam, mu = lame(E, nu)
    sig = 2 * mu * eps + lam * (eps[0, 0] + eps[1, 1] + eps[2, 2]) * np.eye(3)[:, :, None, None]
    scalar = basis.with_element(skfem.ElementTetP1())

    @skfem.BilinearForm
    def mass(u, v, _):
        return u * v

    @skfem.LinearForm
    def moment(v, w):
        return w["s"] * v

    lu = splu(mass.assemble(scalar).tocsc())
    pairs = ((0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2))
    s = lu.solve(np.stack([moment.assemble(scalar, s=sig[i, j]) for i, j in pairs], 1))
    normal = (s[:, 0] - s[:, 1]) ** 2 + (s[:, 1] - s[:, 2]) ** 2 + (s[:, 2] - s[:, 0]) ** 2
    return np.sqrt(0.5 * normal + 3 * (s[:, 3:] ** 2).sum(1))


def _sample(prm, h: float, h_cavity: float, ring: int, band: float) -> dict:
    """One sample's mesh and fields."""
    p, t = mesh_block(cavities_of(prm), h, h_cavity, ring=ring, band=band)
    u = solve_elasticity(p, t, traction(*prm[-3:]))
    return {"points": p, "tetra": t.astype(np.int32), "sdf": cavity_distance(p, prm),
            **{k: np.full(len(p), v) for k, v in zip(INPUTS[1:], prm[-3:])},
            "ux": u[:, 0], "uy": u[:, 1], "uz": u[:, 2], "vm": von_mises(p, t, u)}


def _generate(params: np.ndarray, h: float, h_cavity: float, progress: bool, ring: int = 1,
              band: float = 0.0) -> dict:
    from meshops.utils.progress import progress as progress_bar

    done = [_sample(prm, h, h_cavity, ring, band)
            for prm in progress_bar(params, desc="cavity3d STAND-IN (FEM)", enabled=progress,
                                    leave=False)]
    return pack_meshes(done, "tetra", 4, (*INPUTS, *TARGETS), params)


def _check(num_samples, refine, ring, first, band) -> None:
    bad = [f"{name}={value!r}" for name, value, ok in (
        ("num_samples", num_samples, isinstance(num_samples, int) and num_samples >= 0),
        ("refine", refine, isinstance(refine, (int, float)) and refine >= 1),
        ("ring", ring, isinstance(ring, int) and ring >= 1),
        ("first", first, isinstance(first, int) and 0 <= first <= num_samples),
        ("band", band, isinstance(band, (int, float)) and band > 0)) if not ok]
    if bad:
        raise ValueError("make_cavity3d_standin: need num_samples >= 0, refine >= 1, an "
                         "integer ring >= 1, 0 <= first <= num_samples and band > 0; got "
                         + ", ".join(bad))


def make_cavity3d_standin(num_samples: int = 300, seed: int = 0, cache_dir=None,
                          progress: bool = True, *, refine: float = 1, h: float = H,
                          h_cavity: float = H_CAVITY, first: int = 0, ring: int = 1,
                          band: float = RING_BAND, dtype=torch.float32) -> list:
    """Generate (or load from the cache) the 3-D block-with-cavities stand-in.

    Args:
        num_samples: Number of samples (one mesh each).
        seed: Seed of the parameters.
        cache_dir: Cache folder (``None``: the default; ``False``: no cache).
        progress: Say what was generated/loaded (stderr).
        refine: Mesh sizes divided by ``refine`` (``1.5``: the same shapes on about 3.4x
            the nodes, for the zero-shot refinement check).
        h, h_cavity: Mesh sizes away from and on the cavities (before ``refine``).
        first: Only the samples ``first..num_samples - 1`` of the same draw (e.g. the
            test shapes alone, meshed again).
        ring: Graded re-mesh: the band of width ``band`` at the cavities refined ``ring``
            times in volume (:func:`mesh_block`).
        band: Width of that band (m).
        dtype: Floating dtype of the returned tensors.

    Returns:
        ``list[MeshData]`` (see the module docstring).

    Raises:
        ValueError: an argument out of range (the message names it).
        ImportError: gmsh is not installed (the message names the extra).

    Shapes:
        item: pos ``[N_s, 3]``, x ``[N_s, 4]``, y ``[N_s, 4]``, params ``[1, 22]``
    """
    dtype = as_float_dtype(dtype)
    _check(num_samples, refine, ring, first, band)
    params = sample_params(num_samples, seed)[first:]
    size = {"h": float(h) / refine, "h_cavity": float(h_cavity) / refine}
    # the keys of the plain sets' cache files do not depend on the options' defaults
    size.update({"first": first} if first else {})
    size.update({"ring": ring, "band": float(band)} if ring > 1 else {})
    meta = describe(GENERATOR, VERSION, size, seed, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(params, size["h"], size["h_cavity"],
                                                         progress, ring, band),
                                 cache_dir, progress, "cavity3d")
    how = f"refine {refine:g}" + (f", ring {ring} x{band:g} m" if ring > 1 else "")
    return unpack_meshes(arrays, "tetra", INPUTS, TARGETS, dtype, first,
                         lambda k: f"cavity3d STAND-IN sample {k} (seed {seed}, {how})")
