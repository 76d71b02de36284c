"""Reader for the Geo-FNO **Elasticity** benchmark (hyperelastic unit cell with a void).

Files (Geo-FNO format, not redistributable; the user downloads them)::

    Random_UnitCell_XY_10.npy     (972, 2, 2000)  points-first: XY[:, :, s] = points of sample s
    Random_UnitCell_sigma_10.npy  (972, 2000)     von Mises stress at those points
    Random_UnitCell_rr_10.npy     (42, 2000)      optional: the void's radius r(theta)

Each sample is a point cloud (no cells) on the unit cell ``[0, 1]^2`` minus a
star-shaped void centred at ``(0.5, 0.5)``; the standard split is train ``[:1000]``,
test ``[-200:]`` (sample index along the last axis).

**Quadrature weights.** The files carry no cells, so the weights are estimated with
:func:`meshops.mesh.pointcloud.point_cloud_weights` (``"knn"`` by default: the benchmark
points are much denser near the void, and the kNN estimate gives those points
proportionally smaller weights, where the Monte Carlo ``"uniform"`` rule would not).
The weights are normalised to the measure of the domain, ``|D| = 1 - |void|``. The
convex hull (the estimator's default) would be the whole unit square, about 30 %
too large, so the void area is computed (``measure="auto"``):

* from ``rr`` when that file is present: ``rr[:, s]`` holds the void radius at 42
  equally spaced angles (in the Geo-FNO data ``r = 0.2 + 0.2 / (1 + exp(r~))``, so
  ``0.2 <= r <= 0.4``); when ``rr[0] == rr[-1]`` the samples are taken as the closed
  set ``theta_k = 2 pi k / 41`` (first = last), otherwise ``theta_k = 2 pi k / 42``.
  The area ``(1/2) int r^2 dtheta`` is the periodic trapezoid rule, spectrally
  accurate for a smooth radius (:func:`void_area_from_rr`);
* otherwise from the points (:func:`void_area_from_points`): the point closest to
  the centre in each of 32 angular sectors is taken as a node of the void's
  boundary, and the area is that of the star polygon through them. Accurate to
  about a per cent when the void boundary carries more nodes than there are
  sectors, as in the benchmark.

``measure=`` also takes ``"rr"``, ``"points"``, ``"hull"`` or a number. If ``rr`` does
not look like radii (values outside ``(0, 0.5)``), ``"auto"`` falls back to the points
with a warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from data_adapters._geometry import periodic_radius, polygon_distance, star_polygon
from data_adapters._npy import check_finite, check_shape, open_npy
from data_adapters.splits import split_indices
from meshops.datasets.folder import add_inputs_targets, as_float_dtype
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.pointcloud import point_cloud_weights

XY_FILE = "Random_UnitCell_XY_10.npy"
SIGMA_FILE = "Random_UnitCell_sigma_10.npy"
RR_FILE = "Random_UnitCell_rr_10.npy"
CENTER = (0.5, 0.5)
_MEASURES = ("auto", "rr", "points", "hull")


def void_area_from_rr(rr) -> float:
    """Area of a star-shaped void from its radius at equally spaced angles.

    Args:
        rr: Radii ``[R]`` at ``theta_k = 2 pi k / (R - 1)`` (closed: ``rr[0] == rr[-1]``)
            or ``2 pi k / R`` (open).

    Returns:
        ``(1/2) int_0^{2 pi} r(theta)^2 dtheta`` by the periodic trapezoid rule.

    Shapes:
        rr ``[R]`` -> float
    """
    r = np.asarray(rr, dtype=np.float64).ravel()
    if len(r) > 2 and abs(r[0] - r[-1]) <= 1e-9 * max(np.abs(r).max(), 1e-300):
        r = r[:-1]
    return float(np.pi * np.mean(r ** 2))


def void_area_from_points(pos, center=CENTER, sectors: int = 32) -> float:
    """Estimate the area of a star-shaped void around ``center`` from the points.

    In each of ``sectors`` equal angular sectors around ``center`` the point closest
    to the centre is taken as a point of the void's boundary; the estimate is the
    area of the star polygon through those points (sorted by angle; empty sectors
    are skipped): ``sum (1/2) r_b r_{b+1} sin(theta_{b+1} - theta_b)``.

    Args:
        pos: Points ``[N, 2]`` of the domain (unit cell minus the void).
        center: Centre of the void.
        sectors: Number of angular sectors; use fewer than the number of nodes on the
            void's boundary.

    Returns:
        Estimated void area (an inscribed polygon: slightly low for a convex void).

    Shapes:
        pos ``[N, 2]`` -> float
    """
    p = np.asarray(pos, dtype=np.float64) - np.asarray(center, dtype=np.float64)
    d = np.hypot(p[:, 0], p[:, 1])
    ang = np.arctan2(p[:, 1], p[:, 0])
    b = np.clip(np.floor((ang + np.pi) / (2 * np.pi) * sectors).astype(int), 0, sectors - 1)
    order = np.lexsort((d, b))  # by sector, then distance
    first = order[np.r_[True, b[order][1:] != b[order][:-1]]]  # closest point per sector
    if len(first) < 3:
        raise MeshError(f"void_area_from_points: points in only {len(first)} of {sectors} "
                        "sectors around the centre")
    th, r = ang[first], d[first]
    k = np.argsort(th)
    th, r = th[k], r[k]
    dth = np.diff(np.r_[th, th[0] + 2 * np.pi])
    return float(0.5 * np.sum(r * np.roll(r, -1) * np.sin(dth)))


def _looks_like_radii(rr: np.ndarray) -> bool:
    return bool(np.all(rr > 0) and np.all(rr < 0.5))


class ElasticityDataset(torch.utils.data.Dataset):
    """Geo-FNO Elasticity samples, built lazily from memory-mapped ``.npy`` files.

    Item ``k`` is sample ``indices[k]`` of the files, a :class:`meshops.MeshData`
    point cloud (no cells) with:

    * ``pos [P, 2]``: ``XY[:, :, s]`` (972 points in the benchmark),
    * ``weight [P]``: estimated quadrature weights summing to ``1 - |void|`` (see the
      module docstring),
    * ``fields = {"sigma": [P]}``: the von Mises stress, ``sigma[:, s]``,
    * ``x [P, 0]`` (the input is the geometry, ``pos``), ``y [P, 1]`` (sigma),
    * ``params [1, 42]``: ``rr[:, s]``, when ``with_params=True``,
    * with ``void_distance=True``: ``fields["void_distance"]``, each point's distance
      to the void's boundary (the periodic cubic spline through ``rr``), and
      ``x [P, 1]`` = that distance (needs the rr file with radii),
    * ``sample_id`` (``s``), ``standin=False`` and ``source``.

    Args:
        root: Folder with the ``.npy`` files.
        split: ``"train"`` (``[:n_train]``), ``"test"`` (``[-n_test:]``) or ``"all"``.
        with_params: Attach ``rr`` as ``params`` (needs the rr file).
        void_distance: Add the distance to the void's boundary as the input channel
            (needs the rr file with radii).
        measure: Domain measure for the weights: ``"auto"``, ``"rr"``, ``"points"``,
            ``"hull"`` or a number (see the module docstring).
        weights: ``"knn"`` (default) or ``"uniform"`` (:func:`meshops.point_cloud_weights`).
        k: Neighbour rank of the kNN estimate.
        dtype: Floating dtype of every returned tensor (float32 by default).
        n_train, n_test: Split sizes (benchmark: 1000 and 200).
        validate: Scan the split's samples for NaN/inf once at construction
            (chunked; each sample is checked again when it is built).

    Raises:
        MeshError: missing files, wrong shapes or dtypes, object arrays, NaN/inf
            values (naming the sample and point), splits larger than the files.

    Shapes:
        item: pos ``[P, 2]``, weight ``[P]``, x ``[P, 0]``, y ``[P, 1]``, params ``[1, R]``

    Example:
        >>> train = ElasticityDataset("data/elasticity", "train")
        >>> len(train), train[0].pos.shape
        (1000, torch.Size([972, 2]))
    """

    def __init__(self, root, split: str = "train", with_params: bool = False,
                 void_distance: bool = False, measure: float | str = "auto",
                 weights: str = "knn", k: int = 8,
                 dtype=torch.float32, n_train: int = 1000, n_test: int = 200,
                 validate: bool = True) -> None:
        self.root = Path(root)
        self.split = split
        self.with_params = with_params
        self.void_distance = void_distance
        self.weights = weights
        self.k = int(k)
        self.dtype = as_float_dtype(dtype)
        if not (isinstance(measure, (int, float)) or measure in _MEASURES):
            raise MeshError(f"measure must be a number or one of {', '.join(_MEASURES)}, "
                            f"got {measure!r}")
        if isinstance(measure, (int, float)) and not measure > 0:
            raise MeshError(f"measure must be positive, got {measure}")
        if weights not in ("knn", "uniform"):
            raise MeshError(f"weights must be 'knn' or 'uniform', got {weights!r}")
        if not self.root.is_dir():
            raise MeshError(f"{self.root}: no such folder (expected {XY_FILE}, {SIGMA_FILE} "
                            f"and optionally {RR_FILE})")

        self.xy_path = self.root / XY_FILE
        self.sigma_path = self.root / SIGMA_FILE
        self.rr_path = self.root / RR_FILE
        self.xy = open_npy(self.xy_path)
        hint = ""
        if self.xy.ndim == 3 and self.xy.shape[-1] == 2 and self.xy.shape[1] != 2:
            hint = ("this looks samples-first (samples, points, 2); the Geo-FNO file is "
                    "points-first, XY[:, :, s] = points of sample s")
        check_shape(self.xy_path, self.xy, (None, 2, None), "(points, xy, samples)", hint)
        num_points, _, num_samples = self.xy.shape
        self.sigma = open_npy(self.sigma_path)
        check_shape(self.sigma_path, self.sigma, (num_points, num_samples),
                    f"(points, samples) to match {XY_FILE} {tuple(self.xy.shape)}")
        self.rr = None
        if self.rr_path.is_file():
            self.rr = open_npy(self.rr_path)
            check_shape(self.rr_path, self.rr, (None, num_samples),
                        f"(radius samples, samples) to match {XY_FILE} {tuple(self.xy.shape)}")
        elif with_params or void_distance or measure == "rr":
            need = ("with_params=True" if with_params else "void_distance=True"
                    if void_distance else "measure=rr")
            raise MeshError(f"{self.rr_path}: no such file (needed for {need})")
        self.num_points, self.num_samples = num_points, num_samples
        self.measure = measure
        self.indices = split_indices(num_samples, split, n_train, n_test, test_at_end=True)
        self._warned = False
        if validate and len(self.indices):
            self._check_finite(self.indices.start, self.indices.stop)

    def _check_finite(self, a: int, b: int) -> None:
        check_finite(self.xy_path, self.xy, 2, a, b, lambda p: f"point {p[0]}")
        check_finite(self.sigma_path, self.sigma, 1, a, b, lambda p: f"point {p[0]}")
        if self.rr is not None:
            check_finite(self.rr_path, self.rr, 1, a, b, lambda p: f"rr entry {p[0]}")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> MeshData:
        if not -len(self) <= k < len(self):
            raise IndexError(f"index {k} out of range for {len(self)} samples")
        return self.sample(self.indices[k])

    def _measure(self, s: int, pos: np.ndarray, rr: np.ndarray | None) -> float | None:
        m = self.measure
        if isinstance(m, (int, float)):
            return float(m)
        if m == "hull":
            return None
        if pos.min() < -1e-6 or pos.max() > 1 + 1e-6:
            raise MeshError(f"{self.xy_path.name}: sample {s} has points outside the unit cell "
                            f"[0, 1]^2 (range {pos.min():.4g}..{pos.max():.4g}), so 1 - void "
                            "area is not its measure; pass measure='hull' or a number")
        if m in ("auto", "rr") and rr is not None:
            if _looks_like_radii(rr):
                return 1.0 - void_area_from_rr(rr)
            if m == "rr":
                raise MeshError(f"{self.rr_path.name}: sample {s} has rr values in "
                                f"[{rr.min():.4g}, {rr.max():.4g}], not void radii in (0, 0.5); "
                                "pass measure='points'")
            if not self._warned:
                warnings.warn(f"{self.rr_path}: values are not void radii in (0, 0.5); "
                              "estimating the void area from the points", stacklevel=3)
                self._warned = True
        return 1.0 - void_area_from_points(pos)

    def sample(self, s: int) -> MeshData:
        """Build sample ``s`` (index along the files' last axis, not into the split)."""
        if not 0 <= s < self.num_samples:
            raise IndexError(f"sample {s} out of range for {self.num_samples} samples")
        pos = np.array(self.xy[:, :, s], dtype=np.float64)
        sigma = np.array(self.sigma[:, s], dtype=np.float64)
        rr = None if self.rr is None else np.array(self.rr[:, s], dtype=np.float64)
        if not (np.isfinite(pos).all() and np.isfinite(sigma).all()
                and (rr is None or np.isfinite(rr).all())):
            self._check_finite(s, s + 1)
        source = f"{self.xy_path} sample {s}"
        measure = self._measure(s, pos, rr)
        weight = point_cloud_weights(pos, self.weights, measure=measure, k=self.k,
                                     source=source)
        fields = {"sigma": torch.from_numpy(sigma)}
        if self.void_distance:
            if not _looks_like_radii(rr):
                raise MeshError(f"{self.rr_path.name}: sample {s} has rr values in "
                                f"[{rr.min():.4g}, {rr.max():.4g}], not void radii in (0, 0.5), "
                                "so the distance to the void cannot be computed; pass "
                                "void_distance=False")
            polygon = star_polygon(periodic_radius(rr), CENTER)
            fields["void_distance"] = torch.from_numpy(polygon_distance(pos, polygon))
        mesh = MeshData(pos=torch.from_numpy(pos), weight=weight, fields=fields, source=source)
        attrs = {"sample_id": int(s), "standin": False}
        if self.with_params:
            attrs["params"] = torch.from_numpy(rr)[None]
        inputs = ["void_distance"] if self.void_distance else []
        return add_inputs_targets(mesh, inputs, ["sigma"], self.dtype, **attrs)


def load_elasticity(root, split: str = "train", with_params: bool = False,
                    **kwargs) -> list[MeshData]:
    """All samples of a split of the Geo-FNO Elasticity benchmark as a list.

    Args:
        root: Folder with ``Random_UnitCell_XY_10.npy``, ``Random_UnitCell_sigma_10.npy``
            and optionally ``Random_UnitCell_rr_10.npy``.
        split: ``"train"`` (``[:1000]``), ``"test"`` (``[-200:]``) or ``"all"``.
        with_params: Attach ``rr[:, s]`` as ``params [1, 42]``.
        **kwargs: Passed to :class:`ElasticityDataset` (``void_distance``, ``measure``, ``weights``,
            ``dtype``, ``n_train``, ``n_test``, ...).

    Returns:
        ``list[MeshData]``, see :class:`ElasticityDataset`.
    """
    ds = ElasticityDataset(root, split, with_params=with_params, **kwargs)
    return [ds[k] for k in range(len(ds))]
