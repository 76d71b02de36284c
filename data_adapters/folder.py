"""Old home of the mesh-folder data set, kept importable.

:class:`MeshFolderDataset`, :func:`list_mesh_files` and :func:`export_to_folder`
moved to :mod:`meshops.datasets.folder` (the core package does not import
``data_adapters``); these names stay so that existing imports keep working.
"""

from meshops.datasets.folder import (
    DEFAULT_SUFFIXES,
    MeshFolderDataset,
    export_to_folder,
    list_mesh_files,
)

__all__ = ["DEFAULT_SUFFIXES", "MeshFolderDataset", "export_to_folder", "list_mesh_files"]
