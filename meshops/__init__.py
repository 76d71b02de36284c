"""meshops: mesh-agnostic neural operators.

A function on a mesh is a set of sample points with values and quadrature weights
(``MeshData``); every layer in ``meshops.nn`` approximates an integral operator with
those weights, so it gives (nearly) the same answer on any mesh of the same geometry.

Where to start:

* The main job, in Python or on the command line: ``fit`` (a folder of meshes to a run
  folder; ``meshops train``; its options a ``TrainConfig``), ``load_run`` and its
  ``Run``: ``run.predict(mesh)``, ``run.predict_files`` (``meshops predict``,
  ``PredictOptions``), ``run.evaluate`` (``meshops evaluate``, ``EvaluateOptions``),
  ``run.export`` (``meshops export``, ``ExportOptions``), each a ``Report``; a fitted
  run's ``history`` and ``choice`` (``Choice``); ``meshops --help``. Progress is logged
  (the ``meshops`` loggers, INFO; the package adds no handler but a ``NullHandler``).
* Meshes as functions: ``read_mesh`` / ``write_mesh``, ``MeshData``.
* A model of your own: ``meshops.nn`` (the layers in your PyG model),
  ``meshops.models``, ``meshops.training.Trainer`` (training a model on samples),
  ``load_model`` and ``predict_mesh`` (a checkpoint's model on new meshes).

The package, by concept (each subpackage's docstring says what it holds and what it
may import; ``tests/package/test_import_graph.py`` checks that direction):

``utils``
    helpers for all: files written completely or not at all, progress bars, memory.
``search``
    neighbours, farthest-point sampling, partitions (several backends).
``kernels``
    the fused CPU attention kernel.
``mesh``
    meshes as functions: ``read_mesh``, ``write_mesh``, ``MeshData``, quadrature
    weights, cells, point clouds, surfaces, boundaries, distance to the boundary.
``nn``
    the layers, each a quadrature of an integral operator (for your own PyG model).
``reduced``
    the mathematics of reduced bases: POD, thin-plate splines, Gaussian processes.
``datasets``
    data sets on disk: a folder of meshes, caches read lazily, time series, parameter
    files, target fields, normalisers.
``models``
    neural operators (PiT, the slice transformer, ...) and the reduced basis.
``inference``
    using a trained model: ``load_model``, ``predict_mesh``, huge meshes in bounded
    memory, ``torch.export`` and ONNX, the trust report, plots.
``training``
    the engine: ``Trainer``, losses, optimisers, callbacks and loggers, the baselines
    every model is compared with, rollouts of time series, torchrun/DDP.
``runs``
    the use of a trained run: ``load_run``, ``Run`` (predict, evaluate, export), its
    ``Report``, trust reports, where a model stands against the baselines.
``fitting``
    fitting a run: ``fit``, ``TrainConfig``, the choice of model from the data, the
    neural, reduced and time-series fits, the run folder a fit writes.
``cli``
    the ``meshops`` command, a thin shell over ``fitting`` and ``runs``.

The root holds only these, ``errors`` (``MeshError``, ``CheckpointError``) and
``version``.
"""

import logging

from meshops.datasets.folder import MeshFolderDataset, export_to_folder, list_mesh_files
from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.errors import CheckpointError, MeshError, UsageError
from meshops.fitting import TrainConfig, Training, fit
from meshops.inference.predict import RunSpec, load_model, predict_mesh
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.mesh.pointcloud import point_cloud_weights
from meshops.mesh.quadrature import grid_weights, quadrature_weights, structured_grid_cells
from meshops.runs import (
                            Choice,
                            EvaluateOptions,
                            ExportOptions,
                            PredictOptions,
                            Report,
                            Run,
                            load_run,
)
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
from meshops.utils.allocator import keep_freed_memory
from meshops.version import __version__

# A library says what it does through logging and leaves the output to the application:
# nothing is printed unless the user's logging configuration (or the command) shows it.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "CheckpointError", "Choice", "EvaluateOptions", "ExportOptions", "MeshData", "MeshError",
    "MeshFolderDataset", "PredictOptions", "Report", "Run", "RunSpec", "TrainConfig",
    "Training", "UsageError", "fit", "load_run",
    "UnitGaussianNormalizer", "__version__", "available_backends", "cells_to_edge_index",
    "default_backend", "export_to_folder", "fps", "grid_weights", "keep_freed_memory", "knn",
    "knn_graph", "list_mesh_files", "load_model", "mesh_from_arrays", "partition",
    "point_cloud_weights", "predict_mesh", "quadrature_weights", "radius", "radius_graph",
    "read_mesh",
    "structured_grid_cells", "write_mesh",
]
