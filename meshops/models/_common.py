"""Former home of pieces now in their own modules; kept so that old imports work.

* :class:`~meshops.nn.MLP`, :func:`~meshops.nn.mlp.make_activation`: :mod:`meshops.nn.mlp`;
* :class:`~meshops.nn.FourierFeatures`: :mod:`meshops.nn.fourier_features`;
* :func:`~meshops.nn.knn_interpolate`: :mod:`meshops.nn.interpolate`;
* :func:`~meshops.search.measure_ball_graph`,
  :func:`~meshops.search.knn_interpolation_weights`: :mod:`meshops.search.graph`;
* :func:`fps_latent`, :func:`grid_latent`, :func:`voronoi_weights`:
  :mod:`meshops.models.latent`;
* :class:`MeshInputs`, :func:`read_inputs`, :func:`sample_ptr`: :mod:`meshops.models.inputs`;
* :func:`count_parameters`, :func:`check_model_sizes`, :func:`check_positive_int`:
  :mod:`meshops.models.base`.

New code imports from those modules.
"""

from meshops.models.base import check_model_sizes, check_positive_int, count_parameters
from meshops.models.inputs import MeshInputs, read_inputs, sample_ptr
from meshops.models.latent import fps_latent, grid_latent, voronoi_weights
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.interpolate import knn_interpolate
from meshops.nn.mlp import MLP, make_activation
from meshops.search.graph import measure_ball_graph

__all__ = ["MLP", "FourierFeatures", "make_activation", "MeshInputs", "read_inputs",
           "knn_interpolate", "measure_ball_graph", "fps_latent", "grid_latent",
           "voronoi_weights", "sample_ptr", "count_parameters", "check_model_sizes",
           "check_positive_int"]
