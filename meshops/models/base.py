"""`NeuralOperator`: the base of every meshops model (config, normalisers, checkpoints)."""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from meshops.datasets.normalizer import (
    UnitGaussianNormalizer,
    decode_outputs,
    encode_inputs,
    output_scale,
)
from meshops.errors import CheckpointError
from meshops.utils.atomic import atomic_write
from meshops.utils.checkpoint import (
    check_finite,
    check_model_keys,
    check_normalizer_scales,
    check_weights_fit,
    first_line,
    read_checkpoint,
)
from meshops.utils.memory import module_bytes, skeleton, too_big
from meshops.version import __version__

CHECKPOINT_FORMAT = "meshops-checkpoint-1"

#: name -> class, filled by @register_model
MODELS: dict[str, type["NeuralOperator"]] = {}


def register_model(name: str):
    """Class decorator: make a model available to :func:`get_model` and checkpoints."""
    def deco(cls):
        if name in MODELS and MODELS[name] is not cls:
            raise ValueError(f"model name {name!r} is already registered to {MODELS[name]}")
        MODELS[name] = cls
        cls.model_name = name
        return cls
    return deco


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """``value`` if it is an integer ``>= minimum`` (bool refused), else ``ValueError``
    naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_model_sizes(in_channels, out_channels, pos_dim, width) -> None:
    """The sizes every model takes: ``in_channels >= 0`` (0: geometry only), the others
    ``>= 1``."""
    check_positive_int(in_channels, "in_channels", minimum=0)
    check_positive_int(out_channels, "out_channels")
    check_positive_int(pos_dim, "pos_dim")
    check_positive_int(width, "width")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (lazy, unmaterialised parameters excluded)."""
    return sum(p.numel() for p in model.parameters()
               if p.requires_grad and not isinstance(p, nn.parameter.UninitializedParameter))


def get_model(name: str, **config: Any) -> "NeuralOperator":
    """Build a registered model by name, e.g.
    ``get_model("pit", in_channels=1, out_channels=1)``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; available: {sorted(MODELS)}")
    return MODELS[name](**config)


class NeuralOperator(nn.Module):
    """Base class: an encoder -> processor -> decoder from fields on one mesh to
    fields at query points.

    Subclasses implement ``forward(data) -> Tensor[M, out_channels]`` on a PyG
    batch of :class:`~meshops.MeshData` with

    * ``x [N, in_channels]`` input features (``[N, 0]`` for geometry-only problems),
    * ``pos [N, d]``, ``weight [N]``, ``batch [N]`` (``batch`` absent for one sample),
    * optional ``query_pos [M, d]`` and ``query_batch [M]``: where the output is
      wanted; without them the output is at the input points (``M = N``).

    The constructor's arguments are recorded as :attr:`config` automatically, so
    ``Model.from_checkpoint`` can rebuild the model. Normalisers for inputs and
    outputs (fitted on the training split) are part of the model and its
    checkpoint; :meth:`predict` applies them.
    """

    model_name = "neural_operator"
    # Named default configurations per benchmark size, e.g. {"elasticity": {...}}.
    PRESETS: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_preset(cls, preset: str, **kwargs: Any) -> "NeuralOperator":
        """Build with the defaults of a benchmark size (:attr:`PRESETS`) and ``kwargs``."""
        if preset not in cls.PRESETS:
            raise ValueError(f"unknown preset {preset!r}; available: {sorted(cls.PRESETS)}")
        return cls(**{**cls.PRESETS[preset], **kwargs})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def recording_init(self, *args, **kw):
            init(self, *args, **kw)
            if type(self) is cls:  # the concrete class records its own arguments
                bound = inspect.signature(init).bind(self, *args, **kw)
                bound.apply_defaults()
                config = dict(bound.arguments)
                config.pop("self")
                extra = config.pop("kwargs", None)
                if isinstance(extra, dict):
                    config.update(extra)
                self.config = config

        cls.__init__ = recording_init

    # ------------------------------------------------- activation checkpointing
    #: Whether :meth:`run_block` recomputes the processor blocks in the backward pass
    #: (:meth:`set_block_checkpointing`); a training setting, not saved with the model.
    checkpoint_blocks: bool = False

    def set_block_checkpointing(self, enabled: bool = True) -> "NeuralOperator":
        """Activation checkpointing of the processor blocks: in training, each block
        keeps only its input and recomputes its activations (attention weights, MLP
        hidden layers) in the backward pass, so the peak memory of a step holds one
        block's activations instead of all of them, for about one more forward pass
        of the blocks (``torch.utils.checkpoint``, non-reentrant, random state
        preserved: dropout draws the same masks). Gradients are unchanged.
        Measured figures: ``benchmarks/results/checkpoint-blocks-*.txt``."""
        self.checkpoint_blocks = bool(enabled)
        return self

    def run_block(self, block: Callable, *args: Any, **kwargs: Any):
        """``block(*args, **kwargs)``, checkpointed when :attr:`checkpoint_blocks` is
        set, the model is training and gradients are on (models call their processor
        blocks through this)."""
        if self.checkpoint_blocks and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(block, *args, use_reentrant=False, **kwargs)
        return block(*args, **kwargs)

    # ------------------------------------------------------------ normalisers
    def set_normalizers(self, input: UnitGaussianNormalizer | None = None,
                        output: UnitGaussianNormalizer | None = None) -> "NeuralOperator":
        """Attach fitted normalisers; they are saved with the model."""
        self.input_normalizer = input
        self.output_normalizer = output
        return self

    def mesh_transform(self) -> Callable | None:
        """A transform that stores with one sample what this model derives from the
        sample's mesh alone (neighbour graphs, latent meshes and their weights,
        partitions, query-point interpolation weights), so that a training epoch on a
        fixed dataset does not rebuild them; ``None`` when the model has no such
        structures (see :mod:`meshops.models.structures`).
        :class:`~meshops.training.Trainer` applies it once to its in-memory samples; the
        model builds the structures itself for samples that lack them.
        """
        return None

    @torch.no_grad()
    def predict(self, data) -> Tensor:
        """Outputs in physical units: normalise ``data.x``, run, de-normalise."""
        was_training = self.training
        self.eval()
        try:
            raw = data.x
            x = encode_inputs(self, raw)
            if x is not raw:
                data = data.clone()
                data.x = x
            out = self(data)
            return decode_outputs(self, out, output_scale(self, raw, out.shape[0]))
        finally:
            self.train(was_training)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_state(self, **metadata: Any) -> dict[str, Any]:
        """The dict :meth:`save` writes: weights, config, normalisers, ``metadata`` and
        the meshops version (the Trainer adds its training state to it)."""
        norms = {k: getattr(self, f"{k}_normalizer").channels
                 for k in ("input", "output") if getattr(self, f"{k}_normalizer", None) is not None}
        return {
            "format": CHECKPOINT_FORMAT,
            "version": __version__,
            "model": self.model_name,
            "config": dict(self.config),
            "normalizers": norms,
            "metadata": metadata,
            "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()},
        }

    def save(self, path: str | os.PathLike, **metadata: Any) -> Path:
        """Save :meth:`checkpoint_state` to ``path``, atomically."""
        state = self.checkpoint_state(**metadata)
        return atomic_write(path, lambda tmp: torch.save(state, tmp))

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, map_location: Any = "cpu"
                        ) -> "NeuralOperator":
        """Rebuild a model saved with :meth:`save` (on CPU by default).

        Called on the base class it builds whichever registered model the file
        holds; called on a subclass it checks that the file holds that model.
        The checkpoint's metadata is available as ``model.metadata``.

        Nothing is trusted before it is checked: every member of the archive must
        match its recorded CRC-32 (a truncated or damaged file is refused), the
        pickle must hold only tensors and plain data (``weights_only``: nothing in
        it is imported or run), every floating-point weight and normaliser
        statistic must be finite (normaliser scales positive), and the weights must
        have exactly the names and shapes of the model that the saved config builds.
        That model is first built on the ``meta`` device (no storage), so a config
        that does not describe the weights, or that would not fit in memory, is
        refused before anything is allocated.

        Raises:
            FileNotFoundError: No such file.
            CheckpointError: (a ``ValueError``) the file fails one of the checks
                above; the message names the file and the damaged member, parameter
                or key.
        """
        path = Path(path)
        state = read_checkpoint(path, map_location)
        check_model_keys(state, path, CHECKPOINT_FORMAT)
        name, model_cls = state["model"], _saved_class(cls, state, path)
        if state["version"] != __version__:
            warnings.warn(f"{path}: saved by meshops {state['version']}, loading with "
                          f"{__version__}", UserWarning, stacklevel=2)
        # Before building anything: a damaged weight must not reach a prediction.
        check_finite(state["state_dict"], path)
        check_normalizer_scales(state["state_dict"], path)
        norms = state.get("normalizers", {})
        for role in norms:
            UnitGaussianNormalizer.complete_state(state["state_dict"], f"{role}_normalizer.")

        def build():
            model = model_cls(**state["config"])
            return model.set_normalizers(
                input=UnitGaussianNormalizer(norms["input"]) if "input" in norms else None,
                output=UnitGaussianNormalizer(norms["output"]) if "output" in norms else None)

        _check_buildable(build, state, path, name, map_location)
        model = build()
        model.load_state_dict(state["state_dict"])
        model.metadata = state.get("metadata", {})
        return model.to(map_location) if isinstance(map_location, (str, torch.device)) else model


def _saved_class(cls, state: dict, path: Path) -> type:
    """The registered class of the model a checkpoint holds, which must be ``cls`` or
    a subclass of it (``NeuralOperator``: any)."""
    name = state["model"]
    if name not in MODELS:
        raise CheckpointError(f"{path}: unknown model {name!r}; available: {sorted(MODELS)}")
    model_cls = MODELS[name]
    if cls is not NeuralOperator and not issubclass(model_cls, cls):
        raise CheckpointError(f"{path}: holds a {model_cls.__name__}, not a {cls.__name__}")
    return model_cls


def _check_buildable(build, state: dict, path: Path, name: str, map_location) -> None:
    """Build the model on the meta device first (shapes, no storage): a config that does
    not describe the saved weights, or that would not fit in memory, is refused before
    anything is allocated (an edited config in a 35 KB file could ask for gigabytes)."""
    try:
        shapes = skeleton(build)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: its config cannot build a {name} model "
                              f"({first_line(e)})") from None
    what = f"the {name} model its config describes"
    check_weights_fit(shapes, state["state_dict"], path, what)
    device = map_location if isinstance(map_location, (str, torch.device)) else None
    why = too_big(module_bytes(shapes), device, what)
    if why:
        raise CheckpointError(f"{path}: {why}")
