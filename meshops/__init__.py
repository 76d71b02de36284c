"""meshops: mesh-agnostic neural operators.

A function on a mesh is a set of sample points with values and quadrature weights
(:class:`MeshData`); every layer in :mod:`meshops.nn` approximates an integral
operator with those weights, so it gives (nearly) the same answer on any mesh of
the same geometry.
"""

from meshops.errors import MeshError
from meshops.data import MeshData

__version__ = "0.1.0"

__all__ = ["MeshError", "MeshData", "__version__"]
