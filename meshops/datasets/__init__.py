"""Data sets on disk: a folder of meshes as training samples.

:mod:`~meshops.datasets.folder` (a folder of meshes, :class:`MeshFolderDataset`),
:mod:`~meshops.datasets.samples` (a folder read as lean training samples, in memory),
:mod:`~meshops.datasets.lazy` (the same through the cache, for folders larger than
memory),
:mod:`~meshops.datasets.layout` (how a file becomes a sample: inputs, targets,
geometry features), :mod:`~meshops.datasets.cache` (parsed meshes, read lazily),
:mod:`~meshops.datasets.series` (time series), :mod:`~meshops.datasets.params`
(per-sample parameter vectors), :mod:`~meshops.datasets.fields` (target fields, each
with its own relative error), :mod:`~meshops.datasets.normalizer` (per-channel
normalisation) and :mod:`~meshops.datasets.descriptors` (the parameters and geometry
of a sample, for the trust report).

Imports :mod:`meshops.mesh`, :mod:`meshops.reduced` (the parameter vector of a sample)
and the packages below them; never the models, training or inference.
"""

from meshops.datasets.folder import MeshFolderDataset, export_to_folder, list_mesh_files
from meshops.datasets.normalizer import UnitGaussianNormalizer

__all__ = ["MeshFolderDataset", "UnitGaussianNormalizer", "export_to_folder",
           "list_mesh_files"]
