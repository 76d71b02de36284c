"""What a mesh holds, as plain data: points, cells, measure, bounds, fields (what
``meshops info`` prints)."""

from __future__ import annotations

import numpy as np


def mesh_summary(mesh) -> dict:
    """Plain-data summary of a :class:`MeshData` (what ``meshops info`` prints)."""
    from meshops.mesh.quadrature import CELL_DIMS

    pos = mesh.pos
    counts = mesh.cell_counts()
    # The measure is of the highest-dimensional cells (a surface's area in 3-D);
    # a point cloud's weights estimate the volume of the space it fills.
    tdim = max((CELL_DIMS.get(t, 0) for t, n in counts.items() if n), default=0)
    return {
        "file": str(getattr(mesh, "source", None)),
        "points": int(pos.shape[0]),
        "dimension": int(pos.shape[1]),
        "cell_dimension": tdim or int(pos.shape[1]),
        "cells": counts,
        "measure": float(mesh.weight.sum()),
        "bounding_box": {"min": pos.min(0).values.tolist(), "max": pos.max(0).values.tolist()},
        "fields": {k: list(v.shape) for k, v in (getattr(mesh, "fields", None) or {}).items()},
        # per-cell shape of each cell field; field data as stored (Gmsh: [tag, dim] of
        # a physical name, usable with --tags; VTK: parameters, usable with --params)
        "cell_fields": {k: list(v[0].shape[1:]) if len(v) else []
                        for k, v in (getattr(mesh, "cell_data", None) or {}).items()},
        "field_data": {k: np.asarray(v).reshape(-1).tolist()
                       for k, v in (getattr(mesh, "field_data", None) or {}).items()},
    }
