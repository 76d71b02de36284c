"""Using a trained model: predictions on new meshes and what comes with them.

:mod:`~meshops.inference.predict` (a run's checkpoint and its spec,
:func:`predict_mesh`), :mod:`~meshops.inference.chunked` (huge meshes in bounded
memory), :mod:`~meshops.inference.export` (``torch.export`` and ONNX),
:mod:`~meshops.inference.trust` (how far a mesh is from the training set),
:mod:`~meshops.inference.plot` (pictures) and :mod:`~meshops.inference.refine`
(the mesh-independence check).

Imports :mod:`meshops.models` and the packages below it; never the training (the
whole job, training included, is :mod:`meshops.runs`).
"""

from meshops.inference.predict import RunSpec, load_model, predict_mesh

__all__ = ["RunSpec", "load_model", "predict_mesh"]
