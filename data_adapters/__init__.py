"""Data adapters for meshops: benchmark readers, a folder-of-meshes data set and
offline stand-ins.

* :class:`ElasticityDataset` / :func:`load_elasticity`: Geo-FNO Elasticity
  (``Random_UnitCell_*_10.npy``; point clouds with estimated quadrature weights).
* :class:`NacaDataset` / :func:`load_naca`: Geo-FNO NACA airfoil
  (``NACA_Cylinder_{X,Y,Q}.npy``; C-grid quads, weights from the cells).
* :class:`MeshFolderDataset` / :func:`export_to_folder`: one mesh file per sample
  (any meshio format), inputs and targets in the point data; defined in
  :mod:`meshops.datasets.folder` and re-exported here.
* :func:`make_elasticity_standin` / :func:`make_airfoil_standin`: synthetic
  **stand-ins** for the two benchmarks (FEM and panel-method data, generated and
  cached offline; labelled ``standin=True``).

Every sample is a :class:`meshops.MeshData` with ``pos``, ``weight``, ``fields``,
``x [N, C_in]`` and ``y [N, C_out]``, all floating tensors in one dtype (float32 by
default; see :mod:`meshops.datasets.folder`), so examples can switch between the adapters.
"""

from data_adapters.elasticity import ElasticityDataset, load_elasticity
from data_adapters.folder import MeshFolderDataset, export_to_folder, list_mesh_files
from data_adapters.naca import NacaDataset, load_naca
from data_adapters.splits import split_indices
from data_adapters.standins import make_airfoil_standin, make_elasticity_standin

__all__ = [
    "ElasticityDataset", "load_elasticity",
    "NacaDataset", "load_naca",
    "MeshFolderDataset", "export_to_folder", "list_mesh_files",
    "make_elasticity_standin", "make_airfoil_standin",
    "split_indices",
]
