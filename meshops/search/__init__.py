"""Neighbour search, farthest point sampling and spatial partitions.

All functions follow PyG's conventions (``torch_geometric.nn.knn``, ``radius``,
``fps``): points are ``[N, d]`` tensors, samples of a batch are given by sorted batch
vectors, returned indices are global, and neighbours/samples never cross samples.

Several backends implement the same interface and return the same results (ties
between equal distances aside); the fastest available one is chosen per call from
the device of the inputs, or named with ``backend=``:

* ``torch_cluster`` - PyG's kernels, when installed (default on CUDA);
* ``scipy`` - ``cKDTree``, multi-threaded (CPU default for :func:`knn`, :func:`radius`);
* ``fpsample`` - QuickFPS (CPU default for :func:`fps`);
* ``torch`` - exact chunked brute force on any device.

:func:`available_backends` and :func:`default_backend` tell which is used.
:func:`partition` (k-d, voxel, k-means) needs no backend.

:func:`knn_graph` and :func:`radius_graph` are drop-ins for PyG's functions of the
same names (which need pyg-lib / torch-cluster), built on :func:`knn` / :func:`radius`
and returning PyG's orientation (row 0 source = neighbour for
``flow="source_to_target"``). :func:`cells_to_edge_index` and :func:`cells_to_face`
turn mesh cells into PyG's ``edge_index`` and ``face``. :func:`measure_ball_graph` and
:func:`knn_interpolation_weights` are the models' graphs from positions and weights;
:func:`local_graph` (with :func:`quantile_k`) the neighbourhoods of the local layers.

Imports only :mod:`meshops.utils` and :mod:`meshops.errors`: the mesh and the layers
build on it.
"""

from meshops.search.backends import available_backends, default_backend
from meshops.search.fps import fps
from meshops.search.graph import (
                                  cells_to_edge_index,
                                  cells_to_face,
                                  knn_graph,
                                  knn_interpolation_weights,
                                  measure_ball_graph,
                                  radius_graph,
)
from meshops.search.knn import knn, radius
from meshops.search.neighbourhoods import local_graph, quantile_k
from meshops.search.partition import partition

__all__ = ["knn", "radius", "fps", "partition", "available_backends", "default_backend",
           "knn_graph", "radius_graph", "cells_to_edge_index", "cells_to_face",
           "measure_ball_graph", "knn_interpolation_weights", "local_graph", "quantile_k"]
