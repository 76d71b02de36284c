"""The version of meshops (``meshops.__version__``), in a module of its own so that
the modules that record it (checkpoints) import it without importing the package."""

__version__ = "0.1.0"
