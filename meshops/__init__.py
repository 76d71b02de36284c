"""meshops: mesh-agnostic neural operators.

A function on a mesh is a set of sample points with values and quadrature weights
(:class:`MeshData`); every layer in :mod:`meshops.nn` approximates an integral
operator with those weights, so it gives (nearly) the same answer on any mesh of
the same geometry.
"""

from meshops.allocator import keep_freed_memory
from meshops.data import MeshData
from meshops.datasets import MeshFolderDataset, export_to_folder, list_mesh_files
from meshops.errors import CheckpointError, MeshError
from meshops.inference import RunSpec, load_run, predict_mesh
from meshops.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.normalizer import UnitGaussianNormalizer
from meshops.pointcloud import point_cloud_weights
from meshops.quadrature import grid_weights, quadrature_weights, structured_grid_cells
from meshops.search import (
                            available_backends,
                            cells_to_edge_index,
                            default_backend,
                            fps,
                            knn,
                            knn_graph,
                            partition,
                            radius,
                            radius_graph,
)
from meshops.version import __version__

__all__ = [
    "CheckpointError", "MeshData", "MeshError", "MeshFolderDataset", "RunSpec",
    "UnitGaussianNormalizer", "__version__", "available_backends", "cells_to_edge_index",
    "default_backend", "export_to_folder", "fps", "grid_weights", "keep_freed_memory", "knn",
    "knn_graph", "list_mesh_files", "load_run", "mesh_from_arrays", "partition",
    "point_cloud_weights", "predict_mesh", "quadrature_weights", "radius", "radius_graph",
    "read_mesh",
    "structured_grid_cells", "write_mesh",
]
