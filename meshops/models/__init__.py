"""Neural-operator models: encoder -> processor -> decoder on meshes."""

from meshops.models.base import MODELS, NeuralOperator, get_model, register_model

__all__ = ["MODELS", "NeuralOperator", "get_model", "register_model"]
