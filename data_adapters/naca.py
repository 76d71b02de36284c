"""Reader for the Geo-FNO **NACA airfoil** benchmark (transonic Euler flow on a C-grid).

Files (Geo-FNO format, not redistributable; the user downloads them)::

    NACA_Cylinder_X.npy  (N, 221, 51)     x of the C-grid nodes of sample s: X[s]
    NACA_Cylinder_Y.npy  (N, 221, 51)     y of the C-grid nodes
    NACA_Cylinder_Q.npy  (N, 5, 221, 51)  channels density, u, v, p, Mach

Standard split: train ``[:1000]``, test ``[1000:1200]``; target Mach, ``Q[:, 4]``.

Each sample becomes a :class:`meshops.MeshData` on the C-grid: node ``(i, j)`` is
point ``i * n1 + j`` (C order, as ``X[s].ravel()``), the cells are the grid's quads
(:func:`meshops.mesh.quadrature.structured_grid_cells`), and the quadrature weights come
from those quads (row sums of the bilinear mass matrix), through
:func:`meshops.mesh.io.mesh_from_arrays`, which validates the grid.

**Wake cut.** On a C-grid the first grid line ``j = 0`` runs along the wake, round
the airfoil and back along the wake, so the wake-cut nodes exist twice (the two
grid lines coincide) and the trailing-edge node twice. Every copy is used by
cells (those below and above the cut), so the weights are right and nothing is
merged: a function may even jump across the cut.

**Degenerate cells.** Cells whose four corners are collinear or coincide (zero
area, e.g. a collapsed row at a blunt trailing edge or a repeated grid line) carry
no measure; with ``degenerate="drop"`` (the default) they are removed from
``cells`` before the weights are computed, which leaves the weights unchanged
(a zero-area cell adds zero to every weight), and a warning says how many and
where. ``degenerate="raise"`` makes them an error. Tangled cells (the Jacobian
changes sign: folded or non-convex quads) always raise :class:`MeshError` naming
the sample and the grid cell ``(i, j)``, since their weights would be wrong. The
reader accepts any grid size ``(n0, n1)``; the benchmark's is 221 x 51.

**Speed.** All samples share the grid's cells, whose corners are four shifted slices
of the node arrays: a grid without degenerate or tangled cells gets its weights (the
same Gauss rule as :func:`meshops.mesh.quadrature.quadrature_weights`, equal to rounding)
and its checks from whole-array operations (``python -m benchmarks.loading`` times
it); only grids with bad cells take the per-cell path above.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from data_adapters._npy import check_finite, check_shape, open_npy
from data_adapters.splits import split_indices
from meshops.datasets.folder import add_inputs_targets, as_float_dtype
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays
from meshops.mesh.quadrature import cell_basis, cube_corners, gauss_cube, structured_grid_cells

X_FILE = "NACA_Cylinder_X.npy"
Y_FILE = "NACA_Cylinder_Y.npy"
Q_FILE = "NACA_Cylinder_Q.npy"
CHANNELS = ("density", "u", "v", "p", "mach")
# Same relative tolerance as meshops.mesh.quadrature for "zero measure": area <= rtol * h^2.
_DEGENERATE_RTOL = 1e-10


def _tri_area2(a, b, c):
    """Twice the signed area of triangles ``[..., 2]``."""
    return (b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1]) - \
        (b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0])


def classify_quads(points: np.ndarray, quads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flag zero-area and tangled bilinear quads.

    A quad is *degenerate* when all four corner triangles (each corner with its
    two neighbours) have zero area relative to ``h^2`` (``h`` the longest side or
    diagonal): its corners are collinear or coincide. It is *tangled* when the
    corner triangles have both signs beyond that tolerance: the bilinear Jacobian
    changes sign inside (a non-convex, folded or bow-tie quad), as in
    :func:`meshops.mesh.quadrature.quadrature_weights`. A quad with one collapsed side
    (a triangle) is neither.

    Args:
        points: ``[N, 2]``.
        quads: ``[M, 4]`` node indices, counter-clockwise or clockwise.

    Returns:
        ``(degenerate [M], tangled [M])`` boolean masks.

    Shapes:
        points ``[N, 2]``, quads ``[M, 4]`` -> ``[M]``, ``[M]``
    """
    x = points[quads]  # [M, 4, 2]
    corner = np.stack([_tri_area2(x[:, (k - 1) % 4], x[:, k], x[:, (k + 1) % 4])
                       for k in range(4)], axis=1)
    diff = x[:, :, None, :] - x[:, None, :, :]
    h2 = (diff ** 2).sum(-1).reshape(len(x), -1).max(axis=1)
    tol = _DEGENERATE_RTOL * np.maximum(h2, np.finfo(float).tiny)
    degenerate = (np.abs(corner) <= tol[:, None]).all(axis=1)
    tangled = (corner < -tol[:, None]).any(axis=1) & (corner > tol[:, None]).any(axis=1)
    return degenerate, tangled & ~degenerate


class _GridQuadRule:
    """The bilinear-quad quadrature of :func:`meshops.mesh.quadrature.quadrature_weights`
    (3 x 3 Gauss points, Jacobians also checked at the 4 corners) and the checks of
    :func:`classify_quads`, set up once for structured 2-D grids, where the corners of
    all cells are four shifted slices of the node arrays (no gathers, no scatter-add)."""

    def __init__(self) -> None:
        qp, qw = gauss_cube(2, 3)
        N, dN = cell_basis("quad", qp)
        _, dNc = cell_basis("quad", cube_corners(2))
        self.num_gauss = len(qw)
        dN = np.concatenate([dN, dNc])                  # [Q + 4, 4 nodes, 2 (a, b)]
        self.dNa, self.dNb = dN[..., 0].copy(), dN[..., 1].copy()
        self.NW = (N * qw[:, None]).T.copy()            # [4, Q]: N_n(q) times the weight

    def weights(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray | None:
        """Nodal weights ``[n0*n1]`` of the grid with node coordinates ``X, Y [n0, n1]``
        from all its quads (cells and nodes in the order of
        :func:`meshops.mesh.quadrature.structured_grid_cells`), or None when a cell is
        degenerate or tangled by the criteria of :func:`classify_quads` or of
        :func:`meshops.mesh.quadrature.quadrature_weights` (the caller then takes the
        per-cell path, which drops, warns or raises)."""
        n0, n1 = X.shape
        x = [c.reshape(-1) for c in (X[:-1, :-1], X[1:, :-1], X[1:, 1:], X[:-1, 1:])]
        y = [c.reshape(-1) for c in (Y[:-1, :-1], Y[1:, :-1], Y[1:, 1:], Y[:-1, 1:])]
        # classify_quads: corner triangles against h^2 (longest side or diagonal)
        h2 = np.zeros(len(x[0]))
        for i in range(4):
            for j in range(i + 1, 4):
                h2 = np.maximum(h2, (x[i] - x[j]) ** 2 + (y[i] - y[j]) ** 2)
        tol = _DEGENERATE_RTOL * np.maximum(h2, np.finfo(float).tiny)
        corner = np.stack([(x[k] - x[k - 1]) * (y[(k + 1) % 4] - y[k - 1])
                           - (y[k] - y[k - 1]) * (x[(k + 1) % 4] - x[k - 1]) for k in range(4)])
        lo, hi = corner.min(axis=0), corner.max(axis=0)
        if (np.maximum(hi, -lo) <= tol).any() or ((lo < -tol) & (hi > tol)).any():
            return None
        # Jacobians at the Gauss points and the corners, [Q + 4, M]
        xs, ys = np.stack(x), np.stack(y)
        signed = (self.dNa @ xs) * (self.dNb @ ys) - (self.dNb @ xs) * (self.dNa @ ys)
        w_node = self.NW @ np.abs(signed[:self.num_gauss])         # [4, M]
        # quadrature_weights: measure against (longest edge)^2, sign changes
        qtol = _DEGENERATE_RTOL * np.maximum(np.sqrt(h2), np.finfo(float).tiny) ** 2
        lo, hi = signed.min(axis=0), signed.max(axis=0)
        if (~(w_node.sum(axis=0) > qtol)).any() or ((lo < -qtol) & (hi > qtol)).any():
            return None
        # A structured grid that is not folded maps with one orientation: a cell turned
        # over as a whole (a grid line pushed past its neighbour) passes the per-cell
        # tests above but overlaps its neighbours, which the per-cell path's overlap
        # check refuses.
        if (hi > qtol).any() and (lo < -qtol).any():
            return None
        # every node sums its cells' shares in the order np.add.at takes them (cells in
        # index order), as the per-cell path does
        w = w_node.reshape(4, n0 - 1, n1 - 1)
        W = np.zeros((n0, n1))
        W[1:, 1:] += w[2]
        W[1:, :-1] += w[1]
        W[:-1, 1:] += w[3]
        W[:-1, :-1] += w[0]
        return W.reshape(-1)


_GRID_RULE = _GridQuadRule()


class NacaDataset(torch.utils.data.Dataset):
    """Geo-FNO NACA airfoil samples, built lazily from memory-mapped ``.npy`` files.

    Item ``k`` is sample ``indices[k]`` of the files, a :class:`meshops.MeshData` with:

    * ``pos [n0*n1, 2]``: ``(X[s].ravel(), Y[s].ravel())``,
    * ``cells = [("quad", [(n0-1)(n1-1), 4])]`` (degenerate cells dropped, see the
      module docstring) and ``weight [n0*n1]`` from them,
    * ``fields``: ``density, u, v, p, mach`` (``Q[s, c].ravel()``), each ``[n0*n1]``,
    * ``x [n0*n1, 0]`` (the input is the geometry, ``pos``), ``y [n0*n1, C]`` (the
      target channels, Mach by default),
    * ``grid_shape`` (LongTensor ``[1, 2]`` = ``(n0, n1)``, batches to ``[B, 2]``),
      ``sample_id``, ``standin=False``, ``source``.

    Args:
        root: Folder with the three ``.npy`` files.
        split: ``"train"`` (``[:n_train]``), ``"test"`` (``[n_train:n_train+n_test]``)
            or ``"all"``.
        target: Channel name(s) or index(es) for ``y``: ``"mach"`` (default), any of
            ``density, u, v, p, mach``, or a list of them.
        dtype: Floating dtype of every returned tensor (float32 by default).
        n_train, n_test: Split sizes (benchmark: 1000 and 200).
        degenerate: ``"drop"`` (default) or ``"raise"`` for zero-area cells.
        validate: Scan the split's samples for NaN/inf once at construction.

    Raises:
        MeshError: missing files, wrong shapes (e.g. a channel count other than 5),
            dtypes, object arrays, NaN/inf values (naming sample, channel and grid
            node), tangled cells, splits larger than the files.

    Shapes:
        item: pos ``[n0*n1, 2]``, weight ``[n0*n1]``, x ``[n0*n1, 0]``, y ``[n0*n1, C]``
    """

    def __init__(self, root, split: str = "train", target: str | int | Sequence = "mach",
                 dtype=torch.float32, n_train: int = 1000, n_test: int = 200,
                 degenerate: str = "drop", validate: bool = True) -> None:
        self.root = Path(root)
        self.split = split
        self.dtype = as_float_dtype(dtype)
        if degenerate not in ("drop", "raise"):
            raise MeshError(f"degenerate must be 'drop' or 'raise', got {degenerate!r}")
        self.degenerate = degenerate
        self.targets = self._targets(target)
        if not self.root.is_dir():
            raise MeshError(f"{self.root}: no such folder (expected {X_FILE}, {Y_FILE}, "
                            f"{Q_FILE})")
        self.x_path, self.y_path, self.q_path = (self.root / f for f in (X_FILE, Y_FILE, Q_FILE))
        self.X = open_npy(self.x_path)
        check_shape(self.x_path, self.X, (None, None, None), "(samples, n0, n1)")
        n, n0, n1 = self.X.shape
        if n0 < 2 or n1 < 2:
            raise MeshError(f"{X_FILE}: grid {n0} x {n1} needs at least 2 x 2 nodes "
                            f"[{self.x_path}]")
        self.Y = open_npy(self.y_path)
        check_shape(self.y_path, self.Y, (n, n0, n1),
                    f"(samples, n0, n1) to match {X_FILE} {tuple(self.X.shape)}")
        self.Q = open_npy(self.q_path)
        check_shape(self.q_path, self.Q, (n, len(CHANNELS), n0, n1),
                    f"(samples, channels, n0, n1) with channels {', '.join(CHANNELS)}, "
                    f"to match {X_FILE} {tuple(self.X.shape)}")
        self.num_samples, self.grid_shape = n, (n0, n1)
        self.indices = split_indices(n, split, n_train, n_test, test_at_end=False)
        self.quads = np.ascontiguousarray(structured_grid_cells((n0, n1)), dtype=np.int64)
        self._warned = False
        if validate and len(self.indices):
            self._check_finite(self.indices.start, self.indices.stop)

    def _check_finite(self, a: int, b: int) -> None:
        node = lambda p: f"grid node (i={p[0]}, j={p[1]})"  # noqa: E731
        check_finite(self.x_path, self.X, 0, a, b, node)
        check_finite(self.y_path, self.Y, 0, a, b, node)
        check_finite(self.q_path, self.Q, 0, a, b,
                     lambda p: f"channel {p[0]} ({CHANNELS[p[0]]}), grid node (i={p[1]}, j={p[2]})")

    @staticmethod
    def _targets(target) -> list[str]:
        items = [target] if isinstance(target, (str, int)) else list(target)
        out = []
        for t in items:
            if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
                if not 0 <= t < len(CHANNELS):
                    raise MeshError(f"target channel {t} out of range; Q has channels "
                                    f"0..{len(CHANNELS) - 1}: {', '.join(CHANNELS)}")
                out.append(CHANNELS[t])
            elif t in CHANNELS:
                out.append(t)
            else:
                raise MeshError(f"unknown target {t!r}; channels are {', '.join(CHANNELS)}")
        return out

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> MeshData:
        if not -len(self) <= k < len(self):
            raise IndexError(f"index {k} out of range for {len(self)} samples")
        return self.sample(self.indices[k])

    def sample(self, s: int) -> MeshData:
        """Build sample ``s`` (index along the files' first axis, not into the split)."""
        if not 0 <= s < self.num_samples:
            raise IndexError(f"sample {s} out of range for {self.num_samples} samples")
        n0, n1 = self.grid_shape
        X = np.array(self.X[s], dtype=np.float64)
        Y = np.array(self.Y[s], dtype=np.float64)
        Q = np.array(self.Q[s], dtype=np.float64)
        if not (np.isfinite(X).all() and np.isfinite(Y).all() and np.isfinite(Q).all()):
            self._check_finite(s, s + 1)
        points = np.stack([X.ravel(), Y.ravel()], axis=1)
        source = f"{self.root / 'NACA_Cylinder_{X,Y,Q}.npy'} sample {s}"
        weight = _GRID_RULE.weights(X, Y)
        if weight is not None:
            # a valid grid: the weights of mesh_from_arrays (the same quadrature on the
            # same cells) without its per-cell gathers and checks, which took 0.1-0.3 s
            # a sample (issue 13)
            mesh = MeshData(pos=torch.from_numpy(points), weight=torch.from_numpy(weight),
                            fields={name: torch.from_numpy(Q[c].ravel().copy())
                                    for c, name in enumerate(CHANNELS)},
                            cells=[("quad", torch.from_numpy(self.quads))], cell_data={},
                            source=source)
            return self._finish(mesh, s)
        return self._sample_per_cell(s, points, Q, source)

    def _sample_per_cell(self, s: int, points: np.ndarray, Q: np.ndarray,
                         source: str) -> MeshData:
        """The general path: classify every cell, drop degenerate ones (or raise),
        raise on tangled ones, weights from :func:`meshops.mesh.io.mesh_from_arrays`."""
        n0, n1 = self.grid_shape
        quads = self.quads
        degenerate, tangled = classify_quads(points, quads)
        if tangled.any():
            m = int(np.flatnonzero(tangled)[0])
            raise MeshError(f"{source}: grid cell (i={m // (n1 - 1)}, j={m % (n1 - 1)}) with "
                            f"nodes {quads[m].tolist()} is tangled (its Jacobian changes sign: "
                            f"a folded or non-convex quad); {int(tangled.sum())} such cells")
        if degenerate.any():
            m = int(np.flatnonzero(degenerate)[0])
            where = (f"{int(degenerate.sum())} zero-area cells, the first at grid cell "
                     f"(i={m // (n1 - 1)}, j={m % (n1 - 1)})")
            if self.degenerate == "raise":
                raise MeshError(f"{source}: {where}; pass degenerate='drop' to drop them")
            if not self._warned:
                warnings.warn(f"{source}: dropping {where} (they carry no measure; weights "
                              "are unchanged); further samples are not reported", stacklevel=2)
                self._warned = True
            quads = quads[~degenerate]
        fields = {name: Q[c].ravel() for c, name in enumerate(CHANNELS)}
        mesh = mesh_from_arrays(points, [("quad", quads)], fields, source=source)
        return self._finish(mesh, s)

    def _finish(self, mesh: MeshData, s: int) -> MeshData:
        n0, n1 = self.grid_shape
        return add_inputs_targets(mesh, [], self.targets, self.dtype, sample_id=int(s),
                                  standin=False, grid_shape=torch.tensor([[n0, n1]]))


def load_naca(root, split: str = "train", target: str | int | Sequence = "mach",
              **kwargs) -> list[MeshData]:
    """All samples of a split of the Geo-FNO NACA airfoil benchmark as a list.

    Args:
        root: Folder with ``NACA_Cylinder_X.npy``, ``NACA_Cylinder_Y.npy``,
            ``NACA_Cylinder_Q.npy``.
        split: ``"train"`` (``[:1000]``), ``"test"`` (``[1000:1200]``) or ``"all"``.
        target: Channel(s) for ``y`` (default ``"mach"``).
        **kwargs: Passed to :class:`NacaDataset` (``dtype``, ``n_train``, ``n_test``,
            ``degenerate``, ...).

    Returns:
        ``list[MeshData]``, see :class:`NacaDataset`. About 0.4 GB for the 1000
        training samples in float32; iterate a :class:`NacaDataset` to stay lazy.
    """
    ds = NacaDataset(root, split, target=target, **kwargs)
    return [ds[k] for k in range(len(ds))]
