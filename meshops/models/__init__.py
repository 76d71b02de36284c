"""Neural-operator models: encoder -> processor -> decoder on meshes.

Importing this package registers every model with :func:`get_model`.

Each model is an :class:`~meshops.models.base.NeuralOperator`: it saves and loads with
its config, chooses its own input transform (latent meshes, graphs) and predicts on
any mesh. The reduced basis (:class:`ReducedBasis`, :class:`TrajectoryBasis`) is one
of them, built from :mod:`meshops.reduced`.

Imports :mod:`meshops.nn`, :mod:`meshops.reduced`, :mod:`meshops.mesh`,
:mod:`meshops.datasets` (normalisers) and below; never the training or inference.
"""

from meshops.models.base import MODELS, NeuralOperator, count_parameters, get_model, register_model
from meshops.models.galerkin_transformer import GalerkinTransformer
from meshops.models.next_step import NextStep
from meshops.models.patched import PatchedTransformer
from meshops.models.pit import PiT
from meshops.models.reduced_basis import ReducedBasis
from meshops.models.slice_transformer import SliceTransformer
from meshops.models.trajectory_basis import TrajectoryBasis
from meshops.models.transformer_no import TransformerNO

__all__ = ["MODELS", "GalerkinTransformer", "NeuralOperator", "NextStep", "PatchedTransformer",
           "PiT", "ReducedBasis", "SliceTransformer", "TrajectoryBasis", "TransformerNO",
           "count_parameters", "get_model", "register_model"]
