"""Neural-operator models: encoder -> processor -> decoder on meshes.

Importing this package registers every model with :func:`get_model`.
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
