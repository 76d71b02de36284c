"""meshops: mesh-agnostic neural operators.

A function on a mesh is a set of sample points with values and quadrature weights
(``MeshData``); every layer in ``meshops.nn`` approximates an integral operator with
those weights, so it gives (nearly) the same answer on any mesh of the same geometry.

Where to start:

* The command line does the main job: ``meshops train`` (a folder of meshes to a run
  folder), ``meshops evaluate``, ``meshops predict``, ``meshops plot``; see ``meshops
  --help`` and ``meshops.cli``.
* In Python: ``read_mesh`` / ``write_mesh`` (meshes as functions), ``load_run`` and
  ``predict_mesh`` (a trained run on new meshes), ``meshops.training.Trainer`` (training
  a model from ``meshops.models`` on samples), ``meshops.nn`` (the layers in your own
  PyG model).

The package, by concept:

Meshes and their quadrature
    ``io`` (read, write), ``data`` (``MeshData``), ``quadrature`` (nodal weights),
    ``cells`` (cell-centred samples), ``pointcloud`` (weights of bare clouds),
    ``surface`` (STL and other surfaces), ``boundary`` (tagged boundaries),
    ``geometry`` (distance and direction to the boundary), ``layout`` (how a file
    becomes a sample), ``refine`` (mesh-independence check).
Data sets on disk
    ``datasets`` (a folder of meshes), ``cache`` (parsed meshes, read lazily),
    ``series`` (time series), ``params`` (per-sample parameter vectors),
    ``fields`` (target fields, each with its own relative error), ``normalizer``
    (per-channel normalisation).
Models and their training
    ``nn`` (layers), ``models`` (neural operators and the reduced basis), ``reduced``
    (POD and regressions for parametric studies), ``training`` (Trainer, losses,
    defaults, baselines), ``search`` (neighbours, sampling), ``kernels`` (the fused
    CPU attention kernel).
Using a trained run
    ``inference`` (``load_run``, ``predict_mesh``), ``chunked`` (huge meshes in bounded
    memory), ``export`` (``torch.export`` and ONNX), ``trust`` (distance to the training
    set), ``plot`` (pictures).
The command line and the rest
    ``cli`` (the ``meshops`` command), ``errors`` (``MeshError``, ``CheckpointError``),
    ``allocator`` (``keep_freed_memory``), ``version``.

Modules whose names begin with an underscore (``_atomic``, ``_checks``, ...) are private
helpers: no part of the API, free to change.
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
