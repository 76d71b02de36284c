"""Pictures of fields on meshes (matplotlib, Agg; no display needed).

* :func:`plot_fields` - one or more point fields of a mesh side by side;
* :func:`plot_comparison` - truth, prediction and error side by side, with the
  relative L2 error in the titles;
* :func:`plot_comparisons` - several such rows (e.g. the median and the worst
  sample of a data set) in one picture;
* :func:`triangulate` - the :class:`matplotlib.tri.Triangulation` of a 2-D mesh.

On a 2-D domain at least :data:`STACK_ASPECT` times as wide as it is high (a channel, a
boundary layer) the panels are stacked instead, one above the other, each row becoming
a column, and the picture is sized to the domain.

How a mesh is drawn depends on its dimension:

* **2-D** (``pos [N, 2]``): smooth (Gouraud) colouring of the nodal values on the
  triangles of the mesh. Quadrilaterals are split into 2 triangles, polygons into a
  fan, higher-order cells use their corner nodes. A point cloud (no 2-D cells) is
  triangulated by Delaunay on its points; Delaunay fills the convex hull, so
  triangles that span holes or concave notches are masked: a triangle is dropped
  when its longest edge exceeds ``cloud_edge_factor`` (default 3) times the local
  point spacing of its vertices (the largest, over its 3 vertices, distance to the
  6th nearest neighbour). Holes narrower than about 3 spacings are filled in.
* **3-D** (``pos [N, 3]``): the surface cells (triangles, quads, polygons) coloured
  by the mean nodal value when the mesh has them and no volume cells (a surface mesh
  in 3-D), otherwise a scatter of the points (at most ``max_scatter`` of them, evenly
  thinned): the triangles of a tetra mesh are tagged boundary faces, a part of it.
* **1-D** (``pos [N, 1]``): the values against ``x``.

Pictures are written atomically (:func:`meshops.utils.atomic.atomic_write`): a failure
never leaves a half-written PNG. The functions build their own
:class:`matplotlib.figure.Figure` (no pyplot state), so they are safe in scripts,
notebooks and threads alike.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from meshops.errors import MeshError
from meshops.mesh.quadrature import CELL_DIMS
from meshops.utils.atomic import atomic_write

__all__ = ["check_picture_path", "plot_fields", "plot_comparison", "plot_comparisons",
           "triangulate", "relative_l2"]

# Cell types whose first k nodes are the corners of a triangle (3) or quad (4).
_TRI_TYPES = {"triangle": 3, "triangle6": 3, "triangle7": 3}
_QUAD_TYPES = {"quad": 4, "quad8": 4, "quad9": 4}
_POLY_TYPES = ("polygon",)

# Point clouds: the local spacing is the distance to this many-th nearest neighbour.
CLOUD_NEIGHBOURS = 6
PANEL_SIZE = (4.4, 3.7)  # inches per panel
DPI = 120
#: A 2-D domain at least this many times as wide as it is high has its panels stacked
#: (one above the other) rather than side by side: side by side, each panel of a 22 x 5
#: channel is a strip across a quarter of its height, and most of the picture is empty.
STACK_ASPECT = 2.0
#: Width of a stacked panel (inches), and the height it takes besides the domain (the
#: two-line title, the axis label and its numbers).
STACKED_WIDTH = 8.0
STACKED_EXTRA_HEIGHT = 1.0


# ------------------------------------------------------------------------ helpers
def _numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _values(v, n: int, name: str) -> np.ndarray:
    """A point field as ``[N]`` float64: vector fields ``[N, c]`` become their magnitude."""
    a = _numpy(v).astype(np.float64)
    if a.shape[:1] != (n,):
        raise MeshError(f"{name}: has {a.shape[0] if a.ndim else 0} values but the mesh has "
                        f"{n} points")
    if a.ndim > 1:
        a = a.reshape(n, -1)
        a = a[:, 0] if a.shape[1] == 1 else np.linalg.norm(a, axis=1)
    return a


def _cells(mesh) -> list[tuple[str, np.ndarray]]:
    return [(str(t), _numpy(c)) for t, c in (getattr(mesh, "cells", None) or [])]


def _surface_triangles(mesh) -> np.ndarray | None:
    """Triangles ``[T, 3]`` from the mesh's 2-D cells, or ``None`` when it has none."""
    tris = []
    for t, c in _cells(mesh):
        if t in _TRI_TYPES:
            tris.append(c[:, :3])
        elif t in _QUAD_TYPES:
            q = c[:, :4]
            tris += [q[:, [0, 1, 2]], q[:, [0, 2, 3]]]
        elif t in _POLY_TYPES or t.startswith("polygon"):
            k = c.shape[1]
            tris += [c[:, [0, i, i + 1]] for i in range(1, k - 1)]
    if not tris:
        return None
    return np.concatenate(tris).astype(np.int64)


def _cloud_triangulation(pos: np.ndarray, edge_factor: float):
    import matplotlib.tri as mtri
    from scipy.spatial import cKDTree

    tri = mtri.Triangulation(pos[:, 0], pos[:, 1])
    if edge_factor and len(pos) > 4:
        k = min(CLOUD_NEIGHBOURS + 1, len(pos))
        dist, _ = cKDTree(pos).query(pos, k=k)
        spacing = dist[:, -1]  # distance to the k-th nearest neighbour
        t = tri.triangles
        p = pos[t]  # [T, 3, 2]
        edges = np.linalg.norm(p - p[:, [1, 2, 0]], axis=2).max(axis=1)
        local = spacing[t].max(axis=1)
        mask = edges > edge_factor * local
        if mask.all():  # never mask everything (e.g. three collinear-ish clusters)
            mask[:] = False
        tri.set_mask(mask)
    return tri


def triangulate(mesh, cloud_edge_factor: float = 3.0):
    """The :class:`matplotlib.tri.Triangulation` of a 2-D mesh.

    Triangles of the mesh's cells (quads split into 2, polygons into a fan,
    higher-order cells by their corners); for a mesh without 2-D cells (a point
    cloud) a Delaunay triangulation of the points with the triangles masked whose
    longest edge is more than ``cloud_edge_factor`` times the local point spacing
    (distance to the 6th nearest neighbour, largest over the triangle's vertices),
    so that holes and concave boundaries are not filled in. Pass
    ``cloud_edge_factor=0`` to keep the full convex-hull triangulation.
    """
    import matplotlib.tri as mtri

    pos = _numpy(mesh.pos).astype(np.float64)
    if pos.ndim != 2 or pos.shape[1] != 2:
        raise MeshError(f"{getattr(mesh, 'source', None) or 'mesh'}: triangulate needs 2-D "
                        f"points, got shape {tuple(pos.shape)}")
    tris = _surface_triangles(mesh)
    if tris is None:
        return _cloud_triangulation(pos, cloud_edge_factor)
    return mtri.Triangulation(pos[:, 0], pos[:, 1], tris)


def relative_l2(truth, pred, weight=None) -> float:
    """``||pred - truth|| / ||truth||`` over all points and channels, with quadrature
    ``weight`` (``[N]``) when given."""
    t = _numpy(truth).astype(np.float64).reshape(len(_numpy(truth)), -1)
    p = _numpy(pred).astype(np.float64).reshape(t.shape)
    w = np.ones(len(t)) if weight is None else _numpy(weight).astype(np.float64)
    num = float(np.sqrt((w * ((p - t) ** 2).sum(1)).sum()))
    den = float(np.sqrt((w * (t ** 2).sum(1)).sum()))
    return num / max(den, 1e-300) if den > 0 else (0.0 if num == 0 else math.inf)


# ------------------------------------------------------------------------ panels
@dataclass
class _Panel:
    mesh: Any
    values: np.ndarray
    title: str
    cmap: str = "viridis"
    limits: tuple[float, float] | None = None
    label: str | None = None  # colour bar label


def _limits(*arrays: np.ndarray, symmetric: bool = False) -> tuple[float, float]:
    finite = [a[np.isfinite(a)] for a in arrays]
    finite = [a for a in finite if a.size]
    if not finite:
        return (-1.0, 1.0)
    lo = min(float(a.min()) for a in finite)
    hi = max(float(a.max()) for a in finite)
    if symmetric:
        m = max(abs(lo), abs(hi))
        lo, hi = -m, m
    if hi <= lo:  # constant field: a visible, centred range
        pad = max(abs(hi), 1.0) * 1e-6 if hi == 0 else abs(hi) * 1e-3
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _draw(fig, ax_spec, panel: _Panel, max_scatter: int, cloud_edge_factor: float,
          window=None):
    """One panel: a coloured surface or point scatter in 3-D, the coloured
    triangulation in 2-D, a line in 1-D; with its colour bar."""
    from matplotlib.colors import Normalize

    pos = _numpy(panel.mesh.pos).astype(np.float64)
    d = pos.shape[1]
    lo, hi = panel.limits or _limits(panel.values)
    norm = Normalize(vmin=lo, vmax=hi)
    if d == 3:
        ax = fig.add_subplot(*ax_spec, projection="3d")
        mappable = _draw_3d(ax, panel, pos, norm, max_scatter)
    elif d == 2:
        ax = fig.add_subplot(*ax_spec)
        tri = triangulate(panel.mesh, cloud_edge_factor)
        mappable = ax.tripcolor(tri, panel.values, shading="gouraud", cmap=panel.cmap,
                                norm=norm, rasterized=True)
        ax.set_aspect("equal")
        if window is not None:  # e.g. the body in a large far-field domain
            ax.set_xlim(*window[0])
            ax.set_ylim(*window[1])
        ax.set_xlabel("x")
        ax.set_ylabel("y")
    elif d == 1:
        ax = fig.add_subplot(*ax_spec)
        order = np.argsort(pos[:, 0], kind="stable")
        ax.plot(pos[order, 0], panel.values[order], lw=1.5)
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set_xlabel("x")
        ax.grid(alpha=0.3)
        mappable = None  # the y axis is the value scale
    else:
        raise MeshError(f"cannot plot points of dimension {d}")
    ax.set_title(panel.title, fontsize=10)
    if mappable is not None:
        cb = fig.colorbar(mappable, ax=ax, shrink=0.85, pad=0.08 if d == 3 else 0.03)
        if panel.label:
            cb.set_label(panel.label)
    return ax


def _draw_3d(ax, panel: _Panel, pos: np.ndarray, norm, max_scatter: int):
    """A 3-D panel on ``ax``: a surface mesh as its coloured surface, anything else as
    at most ``max_scatter`` points. Returns the colour mappable."""
    mesh, vals = panel.mesh, panel.values
    # A surface mesh is drawn as its surface; a volume mesh's triangles are tagged
    # boundary faces (a part of the boundary), so it is drawn as points.
    volume = any(len(c) and CELL_DIMS.get(t, 0) == 3 for t, c in _cells(mesh))
    tris = None if volume else _surface_triangles(mesh)
    if tris is not None:
        from mpl_toolkits.mplot3d.art3d import Poly3DCollection

        coll = Poly3DCollection(pos[tris], cmap=panel.cmap, norm=norm, linewidths=0)
        coll.set_array(vals[tris].mean(axis=1))
        ax.add_collection3d(coll)
        mappable = coll
    else:
        idx = np.arange(len(pos))
        if len(idx) > max_scatter:
            idx = idx[np.linspace(0, len(pos) - 1, max_scatter).astype(np.int64)]
        size = max(0.5, min(20.0, 4000.0 / len(idx)))
        mappable = ax.scatter(pos[idx, 0], pos[idx, 1], pos[idx, 2], c=vals[idx],
                              cmap=panel.cmap, norm=norm, s=size, depthshade=False)
    lo_b, hi_b = pos.min(0), pos.max(0)
    ax.set_xlim(lo_b[0], hi_b[0])
    ax.set_ylim(lo_b[1], hi_b[1])
    ax.set_zlim(lo_b[2], hi_b[2])
    try:
        ax.set_box_aspect(np.maximum(hi_b - lo_b, 1e-12 * max(float((hi_b - lo_b).max()), 1)))
    except Exception:  # older matplotlib
        pass
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_zlabel("z")
    return mappable


def _aspect(rows: Sequence[Sequence[_Panel | None]], window=None) -> float | None:
    """Width over height of the 2-D domain drawn (the ``window`` when one is given), or
    ``None`` for 1-D and 3-D panels."""
    panel = next((p for r in rows for p in r if p is not None), None)
    pos = _numpy(panel.mesh.pos) if panel is not None else np.zeros((0, 0))
    if pos.ndim != 2 or pos.shape[1] != 2 or not len(pos):
        return None
    (x0, x1), (y0, y1) = window if window is not None else zip(pos.min(0), pos.max(0))
    return float(x1 - x0) / float(y1 - y0) if y1 > y0 else math.inf


def _figure(rows: Sequence[Sequence[_Panel | None]], suptitle: str | None = None,
            max_scatter: int = 20000, cloud_edge_factor: float = 3.0, window=None,
            stack: bool | None = None):
    """The figure of ``rows`` of panels: as given, or with each row turned into a column
    (``stack``; by default when the 2-D domain is :data:`STACK_ASPECT` times as wide as
    high or more), the figure sized to the domain's shape."""
    from matplotlib.figure import Figure

    aspect = _aspect(rows, window)
    if stack is None:
        stack = aspect is not None and aspect >= STACK_ASPECT
    if stack:  # row i becomes column i
        depth = max((len(r) for r in rows), default=0)
        rows = [[r[j] if j < len(r) else None for r in rows] for j in range(depth)]
    nrows = len(rows)
    ncols = max((len(r) for r in rows), default=0)
    if not nrows or not ncols:
        raise MeshError("nothing to plot")
    width, height = PANEL_SIZE
    if stack and aspect is not None:  # the colour bar takes about a fifth of the width
        width = STACKED_WIDTH
        height = 0.8 * width / min(aspect, 1e3) + STACKED_EXTRA_HEIGHT
    fig = Figure(figsize=(width * ncols, height * nrows + (0.5 if suptitle else 0)),
                 layout="constrained")
    for i, row in enumerate(rows):
        for j, panel in enumerate(row):
            if panel is not None:
                _draw(fig, (nrows, ncols, i * ncols + j + 1), panel, max_scatter,
                      cloud_edge_factor, window)
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    return fig


def _render(rows: Sequence[Sequence[_Panel | None]], path, suptitle: str | None = None,
            max_scatter: int = 20000, cloud_edge_factor: float = 3.0, dpi: int = DPI,
            window=None, stack: bool | None = None) -> Path:
    fig = _figure(rows, suptitle, max_scatter, cloud_edge_factor, window, stack)
    path = check_picture_path(path)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format=_format(path), dpi=dpi))


def _format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".") or "png"
    return "jpeg" if fmt == "jpg" else fmt


def check_picture_path(path: str | os.PathLike) -> Path:
    """``path`` if a picture can be written there: a suffix matplotlib writes (.png,
    .pdf, .svg, ...; none means PNG) and not a folder. Call it before the work whose
    result is plotted.

    Raises:
        MeshError: naming the path and the formats matplotlib writes.
    """
    from matplotlib.figure import Figure

    path = Path(path)
    if path.is_dir():
        raise MeshError(f"{path}: is a folder; give a picture file, e.g. {path / 'plot.png'}")
    formats = Figure().canvas.get_supported_filetypes()
    if _format(path) not in formats:
        raise MeshError(f"{path}: matplotlib cannot write {path.suffix!r} pictures; use one "
                        f"of {', '.join('.' + f for f in sorted(formats))}")
    return path


def _source(mesh) -> str | None:
    src = getattr(mesh, "source", None)
    return Path(str(src)).name if src else None


def _comparison_row(mesh, truth, pred, name: str | None, label: str | None,
                    weight=None) -> list[_Panel]:
    n = int(mesh.pos.shape[0])
    t_raw, p_raw = _numpy(truth), _numpy(pred)
    if t_raw.shape != p_raw.shape:
        raise MeshError(f"{_source(mesh) or 'mesh'}: truth has shape {t_raw.shape} but prediction "
                        f"{p_raw.shape}")
    t, p = _values(t_raw, n, "truth"), _values(p_raw, n, "prediction")
    vector = t_raw.ndim > 1 and t_raw.reshape(n, -1).shape[1] > 1
    # The error of a vector field: the magnitude of the difference vector.
    diff = p_raw.astype(np.float64) - t_raw.astype(np.float64)
    err = _values(diff, n, "error") if vector else p - t
    w = _numpy(mesh.weight) if weight is None and getattr(mesh, "weight", None) is not None \
        else weight
    rel_w = relative_l2(t_raw, p_raw, w) if w is not None else None
    rel_u = relative_l2(t_raw, p_raw)
    name = name or "u"
    shown = f"|{name}|" if vector else name
    prefix = f"{label}\n" if label else ""
    lim = _limits(t, p)
    rel = (f"rel. L2 {rel_w:.3g} (unweighted {rel_u:.3g})" if rel_w is not None
           else f"rel. L2 {rel_u:.3g}")
    return [
        _Panel(mesh, t, f"{prefix}truth {shown}", "viridis", lim),
        _Panel(mesh, p, f"prediction {shown}\n{rel}", "viridis", lim),
        _Panel(mesh, err, f"|error| of {name}" if vector else "error (prediction - truth)",
               "magma" if vector else "RdBu_r",
               _limits(err) if vector else _limits(err, symmetric=True)),
    ]


# ------------------------------------------------------------------------ public
def plot_fields(mesh, fields: Sequence, titles: Sequence[str] | None = None,
                path: str | os.PathLike = "fields.png", *, cmaps: Sequence[str] | None = None,
                limits: Sequence[tuple[float, float] | None] | None = None,
                suptitle: str | None = None, ncols: int | None = None,
                shared_limits: bool = False, cloud_edge_factor: float = 3.0,
                max_scatter: int = 20000, dpi: int = DPI) -> Path:
    """Plot point fields of one mesh side by side and save the picture.

    Args:
        mesh: A :class:`~meshops.MeshData` (``pos``, and ``cells`` for meshes).
        fields: Point values, each ``[N]`` or ``[N, c]`` (tensors or arrays); a
            vector field is shown as its magnitude.
        titles: One title per field (default ``"field 0"``, ...).
        path: Output picture (PNG by the suffix; any format matplotlib writes),
            written atomically.
        cmaps: Colour map per field (default ``"viridis"``).
        limits: ``(vmin, vmax)`` per field, or ``None`` entries for the field's range.
        suptitle: Title over the whole figure.
        ncols: Panels per row (default: all in one row, or all in one column for a
            2-D domain :data:`STACK_ASPECT` times as wide as high or wider).
        shared_limits: One colour range for all fields (when ``limits`` is not given).
        cloud_edge_factor: Masking threshold for point clouds (see :func:`triangulate`).
        max_scatter: Most points drawn for 3-D meshes without surface cells.
        dpi: Resolution.

    Returns:
        The written path.
    """
    n = int(mesh.pos.shape[0])
    fields = list(fields)
    if not fields:
        raise MeshError("plot_fields: no fields to plot")
    titles = list(titles) if titles is not None else [f"field {i}" for i in range(len(fields))]
    if len(titles) != len(fields):
        raise MeshError(f"plot_fields: {len(fields)} fields but {len(titles)} titles")
    vals = [_values(f, n, t) for f, t in zip(fields, titles)]
    if limits is None:
        limits = [_limits(*vals)] * len(vals) if shared_limits else [None] * len(vals)
    cmaps = list(cmaps) if cmaps is not None else ["viridis"] * len(vals)
    panels = [_Panel(mesh, v, t, c, lim) for v, t, c, lim in zip(vals, titles, cmaps, limits)]
    stack = None if ncols is None else False  # a layout asked for is kept
    ncols = ncols or len(panels)
    rows = [panels[i:i + ncols] for i in range(0, len(panels), ncols)]
    return _render(rows, path, suptitle, max_scatter, cloud_edge_factor, dpi, stack=stack)


def plot_comparison(mesh, truth, pred, path: str | os.PathLike = "comparison.png", *,
                    name: str | None = None, title: str | None = None, weight=None,
                    cloud_edge_factor: float = 3.0, max_scatter: int = 20000,
                    dpi: int = DPI) -> Path:
    """Truth, prediction and error side by side, with the relative L2 in the titles.

    Truth and prediction share one colour range; the error ``prediction - truth``
    has a symmetric, diverging one (for vector fields: magnitudes, and the
    magnitude of the error vector). The relative L2 error is quadrature-weighted
    with ``weight`` (default: the mesh's ``weight``) and also given unweighted.

    Args:
        mesh: The mesh both fields live on.
        truth, pred: ``[N]`` or ``[N, c]`` values (same shape).
        path: Output picture, written atomically.
        name: Field name for the titles (default ``"u"``).
        title: Title over the figure (default: the mesh's file name).

    Returns:
        The written path.
    """
    row = _comparison_row(mesh, truth, pred, name, None, weight)
    return _render([row], path, title if title is not None else _source(mesh), max_scatter,
                   cloud_edge_factor, dpi)


def plot_comparisons(items: Sequence[tuple], path: str | os.PathLike, *,
                     name: str | None = None, title: str | None = None,
                     cloud_edge_factor: float = 3.0, max_scatter: int = 20000,
                     dpi: int = DPI, window=None) -> Path:
    """Several :func:`plot_comparison` rows in one picture.

    Args:
        items: ``(mesh, truth, pred, label)`` or ``(mesh, truth, pred, label, name)``
            per row, e.g. the median and the worst sample of a data set (``label``
            heads the row's first title, ``name`` is the row's field name, default
            ``name``).
        path: Output picture, written atomically.
        name: Field name for the titles.
        title: Title over the figure.
        window: ``((xmin, xmax), (ymin, ymax))`` to zoom 2-D panels (the relative L2
            in the titles is still over the whole mesh).
    """
    rows = []
    for item in items:
        if len(item) not in (4, 5):
            raise MeshError("plot_comparisons: items are (mesh, truth, pred, label[, name])")
        m, t, p, lab = item[:4]
        rows.append(_comparison_row(m, t, p, item[4] if len(item) == 5 else name, lab))
    return _render(rows, path, title, max_scatter, cloud_edge_factor, dpi, window)
