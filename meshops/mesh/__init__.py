"""Meshes as functions: reading and writing them, their quadrature weights and their
geometry.

A mesh file becomes a :class:`~meshops.mesh.data.MeshData` (points, values, quadrature
weights): :mod:`~meshops.mesh.io` (read, write), :mod:`~meshops.mesh.quadrature` (nodal
weights), :mod:`~meshops.mesh.cells` (cell-centred samples),
:mod:`~meshops.mesh.pointcloud` (weights of bare clouds), :mod:`~meshops.mesh.surface`
(STL and other surfaces), :mod:`~meshops.mesh.boundary` (tagged boundaries),
:mod:`~meshops.mesh.geometry` (distance and direction to the boundary) and
:mod:`~meshops.mesh.digest` (one hash per mesh).

Imports only :mod:`meshops.utils`, :mod:`meshops.search` and :mod:`meshops.errors`.
"""

from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.mesh.pointcloud import point_cloud_weights
from meshops.mesh.quadrature import grid_weights, quadrature_weights, structured_grid_cells

__all__ = ["MeshData", "grid_weights", "mesh_from_arrays", "point_cloud_weights",
           "quadrature_weights", "read_mesh", "structured_grid_cells", "write_mesh"]
