"""`Trainer`: fit a :class:`~meshops.models.NeuralOperator` on meshes, resumably and
on one or many devices."""

from __future__ import annotations

import copy
import logging
import math
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DistributedSampler

from meshops.datasets.fields import TargetFields
from meshops.datasets.normalizer import (
    UnitGaussianNormalizer,
    decode_outputs,
    encode_inputs,
    output_scale,
)
from meshops.models.conditioning import fit_param_normalizer
from meshops.training import callbacks, distributed, state
from meshops.training.callbacks import LAST, Callback, Checkpoints, EpochLog
from meshops.training.dataset import first_sample, fit_normalizers, make_loader, prepare_batch
from meshops.training.loss import (
    RelativeLpLoss,
    lp_errors,
    summarize_errors,
    warn_failed,
    warn_zero_targets,
)
from meshops.training.optim import (
    check_optimizer_arguments,
    check_scheduler,
    is_scheduler_object,
    make_optimizer,
    make_scheduler,
    name_of,
)
from meshops.training.seed import MAX_SEED, epoch_seed, seed_everything, set_rng_state
from meshops.utils.checkpoint import check_weights_fit
from meshops.utils.progress import progress as progress_bar

if TYPE_CHECKING:
    from meshops.models.base import NeuralOperator



def targets_of(batch) -> tuple[Tensor, Tensor | None, Tensor]:
    """Targets of a batch with the quadrature weights and batch vector of their points.

    Without query points the targets live at the mesh points (``weight``,
    ``batch``); with ``query_pos`` they live at the queries, weighted by
    ``query_weight`` when the samples carry it and uniformly otherwise (equal
    weights: the relative error is then the plain one over the queries).

    Shapes:
        -> y ``[M, C_out]``, weight ``[M]``, batch ``[M]``
    """
    y = batch.y
    if getattr(batch, "query_pos", None) is not None:
        w = getattr(batch, "query_weight", None)
        if w is None:
            w = torch.ones(y.shape[0], dtype=y.dtype, device=y.device)
        return y, w, batch.query_batch
    return y, batch.weight, batch.batch


def _make_logger(log) -> Callable[[str], None]:
    if log is None:
        return lambda msg: None
    if isinstance(log, logging.Logger):
        return log.info
    return log


#: Bytes of mesh structures (``mesh_transform``) the Trainer keeps for a dataset; over
#: it, the model builds them per step (large meshes times many samples, such as the
#: full NACA recipe's).
STRUCTURE_BUDGET = 4 * 2**30


def _mesh_key(sample) -> tuple | None:
    """Identity of the tensors a mesh transform reads; ``None`` when ``pos`` is absent."""
    key = []
    for name in ("pos", "weight", "query_pos"):
        t = getattr(sample, name, None)
        # the storage, offset, strides, shape and dtype: two views of one storage
        # (P[:100], P[::2]) are different meshes
        key.append(None if t is None else (t.untyped_storage().data_ptr(), t.storage_offset(),
                                           t.stride(), tuple(t.shape), t.dtype))
    return None if key[0] is None else tuple(key)


def with_mesh_structures(model, data, what: str, progress: bool):
    """``data`` with ``model.mesh_transform()`` applied to shallow copies of its samples.

    Only lists and tuples are transformed: a lazily loading dataset would rebuild the
    structures on every read anyway, and the model builds them itself when absent.
    Samples whose ``pos``, ``weight`` and ``query_pos`` are the very same tensors (one
    shared mesh) reuse the first one's structures; all samples are alive in ``data``
    during the pass, so a tensor's address cannot be reused by another mesh.
    """
    make = getattr(model, "mesh_transform", None)
    transform = make() if callable(make) else None
    if transform is None or not isinstance(data, (list, tuple)) or not data:
        return data
    keys = [_mesh_key(s) for s in data]
    meshes = len({k for k in keys if k is not None}) + sum(k is None for k in keys)
    done: dict[tuple, dict] = {}
    out = []
    bar = progress_bar(data, desc=f"mesh structures ({what})", unit="sample", leave=False,
                       enabled=progress)
    for sample, key in zip(bar, keys):
        copied = copy.copy(sample)
        if key is not None and key in done:
            for name, value in done[key].items():
                setattr(copied, name, value)
        else:
            before = set(copied.keys())
            copied = transform(copied)
            added = {k: copied[k] for k in copied.keys() if k not in before}
            if not out:
                # The structures of one mesh times the number of meshes: kept for the
                # whole run, so they must not crowd out the training itself.
                size = sum(v.numel() * v.element_size() for v in added.values()
                           if isinstance(v, Tensor))
                if size * meshes > STRUCTURE_BUDGET:
                    warnings.warn(
                        f"meshops: the {what} samples' mesh structures would take "
                        f"{size * meshes / 1e9:.1f} GB ({meshes} meshes x {size / 1e6:.1f} "
                        f"MB), over the {STRUCTURE_BUDGET / 1e9:.1f} GB budget "
                        f"(meshops.training.trainer.STRUCTURE_BUDGET); the model builds them "
                        f"in every step instead", UserWarning, stacklevel=4)
                    return data
            if key is not None:
                done[key] = added
        out.append(copied)
    return out


def _check_arguments(train_data, val_data, epochs, batch_size, val_batch_size, seed, resume,
                     out_dir, loss, time_limit, compile, callbacks) -> None:
    """The Trainer's arguments that can be checked before anything is built."""
    for name, value in (("epochs", epochs), ("batch_size", batch_size),
                        ("val_batch_size", val_batch_size)):
        # 2.5 would be truncated to 2 without a word
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"Trainer: {name} must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"Trainer: seed must be an integer in 0..{MAX_SEED}, got {seed!r}")
    if len(train_data) == 0:
        raise ValueError("Trainer: train_data is empty")
    if val_data is not None and len(val_data) == 0:
        # it would fail after the first epoch, with nothing to validate on
        raise ValueError("Trainer: val_data is empty; pass val_data=None to train without "
                         "validation")
    if resume and out_dir is None:
        raise ValueError("Trainer: resume=True needs out_dir")
    if loss is not None and not callable(loss):
        raise TypeError(f"loss must be a callable (pred, target, weight, batch) -> "
                        f"scalar, got {type(loss).__name__}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be positive seconds, got {time_limit}")
    if not isinstance(compile, (bool, dict)):
        raise TypeError(f"compile must be True, False or a dict of torch.compile "
                        f"arguments, got {compile!r}")
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks must be meshops.training.callbacks.Callback "
                            f"objects, got {type(cb).__name__}")


def _statistics(values: np.ndarray, name: str) -> dict[str, float]:
    """``{name_mean, name_median, name_max}`` of per-sample errors (NaN when none is
    defined), from :func:`~meshops.training.loss.summarize_errors`."""
    st = summarize_errors(values)
    return {f"{name}_{k}": math.nan if st[k] is None else st[k]
            for k in ("mean", "median", "max")}


class Trainer:
    """Train a neural operator with a relative L2 loss, checkpoints and resumption.

    The optimiser, learning-rate schedule and loss are the common ones by name
    (``optimizer="adamw"``, ``scheduler="cosine"``, :class:`RelativeLpLoss`) or
    objects you build: a :class:`torch.optim.Optimizer` over the model's parameters
    (or a factory ``params -> Optimizer``), a learning-rate scheduler on that
    optimiser (or a factory ``(optimizer, total_steps) -> scheduler``) and any loss
    callable. The trainer uses them as given; their states go into ``last.pt``.

    The model is trained in physical units: when it carries normalisers (fitted
    here on the training split if ``normalize`` and it has none yet, and then
    saved with it), it sees normalised inputs, its raw outputs are decoded with
    the output normaliser, and the loss compares the decoded prediction with the
    raw target, exactly as :meth:`NeuralOperator.predict` will be used. The
    training loss and the validation metric are then the same relative L2.

    Samples with ``query_pos`` have their targets ``y`` at the query points; the
    loss and metrics then weight them with the samples' ``query_weight`` when
    present and uniformly otherwise (see :func:`targets_of`), and the output
    normaliser is fitted with the same weights.

    Every epoch the model is evaluated on ``val_data`` (mean, median and max of
    the per-sample relative L2 error, quadrature-weighted and unweighted). With
    ``out_dir`` the trainer writes, atomically:

    * ``last.pt`` after every epoch: a model checkpoint (loadable with
      :meth:`NeuralOperator.from_checkpoint`) plus the full training state
      (optimizer, scheduler, grad scaler, epoch, every rank's RNG states,
      history; see :mod:`meshops.training.state`), so a killed run loses at most
      one epoch;
    * ``best.pt`` whenever the validation error improves, through
      :meth:`NeuralOperator.save` with ``epoch``, ``metric`` and the validation
      metrics (and ``metadata``) as metadata; without ``val_data`` no ``best.pt``
      is written;
    * ``history.json``: the per-epoch history that :meth:`fit` returns.

    ``resume=True`` continues from ``out_dir/last.pt`` (and starts afresh, with a
    log line, when there is none yet, so that the same command can be relaunched
    after a pre-emption). With the same seed a resumed run ends with the same
    weights as an uninterrupted one: the data order of an epoch depends only on
    ``(seed, epoch)`` and the global generators (dropout) are restored. A run
    with a learning-rate schedule resumes only for the ``epochs`` it was started
    with (the schedule is laid out over them; another count raises ``ValueError``,
    see :func:`meshops.training.state.check_resume_epochs`); with ``scheduler=None``
    it may be extended or cut short.

    Under ``torchrun`` the trainer trains data-parallel (see
    :mod:`meshops.training.distributed`): ``batch_size`` is per process, so the
    global batch is ``batch_size * world_size``; each epoch's permutation is the
    one a single process would draw, dealt out to the ranks, so a run on ``W``
    processes takes the same steps as a single process with ``W`` times the batch
    (when the number of training samples is a multiple of ``W``; otherwise the
    sampler repeats a few samples to even the shards out).

    Args:
        model: The model; its parameters' dtype decides the training precision
            (e.g. ``model.double()`` with samples assembled in float64).
        train_data: Sequence of samples (:func:`~meshops.training.assemble`) with
            ``x``, ``y``, ``pos``, ``weight`` and optionally ``query_pos``,
            ``query_weight``.
        val_data: Validation samples, or ``None``.
        epochs: Number of epochs.
        batch_size: Samples per step (per process under torchrun).
        val_batch_size: Samples per evaluation step (default ``batch_size``).
        lr: Learning rate of the ``"adamw"``/``"adam"`` optimiser (default 1e-3).
            ``"onecycle"`` peaks at the optimiser's rate.
        weight_decay: Decoupled weight decay for ``"adamw"``, L2 penalty for
            ``"adam"`` (default 1e-4). ``lr`` and ``weight_decay`` configure the
            optimisers named by a string: with an optimiser object or factory, set
            them there (passing them here too is an error).
        optimizer: ``"adamw"``, ``"adam"``, a :class:`torch.optim.Optimizer` over
            parameters of ``model`` (all or some: the others stay fixed), or a
            callable ``params -> Optimizer`` called with the model's trainable
            parameters.
        scheduler: ``"cosine"`` (cosine decay to 0 over the run), ``"onecycle"``,
            ``None`` (constant rate), a learning-rate scheduler built on the
            ``optimizer`` object passed here, or a callable ``(optimizer,
            total_steps) -> scheduler``. Schedulers are stepped after every batch
            (not every epoch), so that runs of a few epochs still get a smooth
            schedule; ``ReduceLROnPlateau``, which needs a metric, is refused.
        grad_clip: Maximum total gradient norm, or ``None``.
        loss: ``loss(pred, target, weight, batch) -> scalar tensor`` (a module or
            any callable); default :class:`RelativeLpLoss` with quadrature weights
            (``RelativeLpLoss(quadrature=False)`` for numbers comparable with
            published benchmarks). Its value is the logged ``train_loss``. The
            validation metric that picks ``best.pt`` follows its ``quadrature``
            attribute (weighted when absent).
        seed: Seeds the global generators (rank ``r`` uses ``seed + r``, so that
            dropout differs across ranks) and the data order. The model exists
            before the trainer does: for reproducible initial weights, call
            :func:`~meshops.training.seed.seed_everything` before building it (as
            ``meshops train`` and the examples do).
        device: ``"cpu"``, ``"cuda"``, a device, or ``None`` for CUDA when available.
        amp: Mixed precision (:func:`torch.autocast`) for a float32 model:
            ``"bf16"``, ``"fp16"`` (with a gradient scaler) or ``True`` (bfloat16 on
            CPU and on GPUs that support it, else float16). The loss, the decoding
            and the optimiser stay in float32. On CPU both run: bfloat16 is faster
            than float32 on CPUs with AVX512-BF16 or AMX, float16 slower (measured
            figures in ``docs/training-and-deployment.md``). A float64 model, or
            bfloat16 on a GPU without it, is refused with ``ValueError``.
        out_dir: Folder for ``last.pt``, ``best.pt`` and ``history.json``, or ``None``.
        normalize: Fit input/output normalisers on ``train_data`` when the model
            has none. Normalisers the model already has are always used. An int: also
            scale the outputs by that input channel, a global input the targets are
            proportional to (a load; :func:`~meshops.training.dataset.fit_normalizers`).
        shuffle: Shuffle the training data each epoch.
        progress: Show a tqdm bar per epoch (running loss, ETA); rank 0 only, and only
            on a terminal (redirected output gets the one line per epoch).
        log: ``print``, a :class:`logging.Logger`, any ``str -> None`` callable, or
            ``None``; rank 0 only.
        resume: Continue from ``out_dir/last.pt`` (see above), with the same
            ``epochs`` when the run has a learning-rate schedule.
        metadata: Extra metadata for ``best.pt`` (e.g. field names).
        num_workers: DataLoader worker processes.
        find_unused_parameters: Passed to DDP, for models with parameters that a
            forward pass may not use.
        precompute: Apply the model's :meth:`~meshops.models.NeuralOperator.mesh_transform`
            once to ``train_data`` and ``val_data`` when they are lists or tuples, so that
            no epoch repeats work that depends only on a mesh (PiT: neighbour search,
            farthest-point sampling, latent weights). The structures go on shallow
            copies of the samples: the caller's objects are not changed. Samples that
            share one mesh (the same ``pos`` tensor) share one computation. Skipped,
            with a warning, when the structures of all meshes would exceed
            ``STRUCTURE_BUDGET`` (4 GiB).
        time_limit: Seconds: :meth:`fit` stops after the epoch past which one more
            epoch (at the mean epoch time so far) would not end within this many
            seconds of its start; ``best.pt`` is then the best validated epoch so far.
        compile: Train (and validate) through :func:`torch.compile`: ``True`` or a
            dict of its arguments (e.g. ``{"mode": "max-autotune"}``). The first steps
            of each new mesh size compile; a fixed-mesh dataset with precomputed
            structures compiles once (see the README's torch.compile section).
        checkpoint_blocks: Activation checkpointing of the model's processor blocks
            (:meth:`~meshops.models.NeuralOperator.set_block_checkpointing`): their
            activations are recomputed in the backward pass instead of kept, for
            less peak memory at the cost of one more forward of the blocks.
        callbacks: :class:`~meshops.training.callbacks.Callback` objects whose hooks
            run at the start and end of :meth:`fit` and after every epoch (e.g.
            :class:`~meshops.training.loggers.TensorBoardLogger`).
        fields: The target fields (:class:`~meshops.datasets.fields.TargetFields`):
            every relative error (the default loss, the validation metric that picks
            ``best.pt``) is the weighted mean of the fields' relative errors, and
            :meth:`evaluate` reports each field. Default: the ``fields`` of ``loss``
            when it has them, else all channels pooled into one field.
        shards: Deal the training samples into this many fixed parts
            (:class:`~meshops.training.distributed.ShardSampler`): under torchrun one per
            process, each process reading only its own part (a lazily read data set
            that owns one part, :class:`meshops.datasets.cache.CachedMeshDataset`); in one process,
            the steps of such a run (``batch_size`` is then ``shards`` times a part's).
            Default: every epoch's permutation dealt out to the processes.
    """

    def __init__(self, model: "NeuralOperator", train_data: Sequence,
                 val_data: Sequence | None = None, *, epochs: int, batch_size: int = 8,
                 val_batch_size: int | None = None,
                 lr: float | None = None, weight_decay: float | None = None,
                 optimizer: str | torch.optim.Optimizer | Callable = "adamw",
                 scheduler: str | LRScheduler | Callable | None = "cosine",
                 grad_clip: float | None = None,
                 loss: Callable | None = None, seed: int = 0,
                 device: str | torch.device | None = None, amp: bool | str = False,
                 out_dir: str | Path | None = None, normalize: bool | int = True,
                 shuffle: bool = True, progress: bool = True, log: Any = print,
                 resume: bool = False, metadata: dict | None = None, num_workers: int = 0,
                 find_unused_parameters: bool = False, precompute: bool = True,
                 time_limit: float | None = None, compile: bool | dict = False,
                 checkpoint_blocks: bool = False, callbacks: Sequence = (),
                 fields: TargetFields | None = None,
                 shards: int | None = None) -> None:
        # Every argument is checked before a process group exists that an error would
        # leave behind.
        _check_arguments(train_data, val_data, epochs, batch_size, val_batch_size, seed,
                         resume, out_dir, loss, time_limit, compile, callbacks)
        self._check_optimization(model, optimizer, scheduler, lr, weight_decay)
        self._check_dtype(first_sample(train_data))
        if checkpoint_blocks:
            model.set_block_checkpointing(True)
        if precompute:
            train_data = with_mesh_structures(model, train_data, "training", progress)
            val_data = with_mesh_structures(model, val_data, "validation", progress)
        self.train_data, self.val_data = train_data, val_data
        self.epochs, self.batch_size = int(epochs), int(batch_size)
        self.val_batch_size = int(val_batch_size or batch_size)
        self.grad_clip, self.seed, self.normalize = grad_clip, int(seed), normalize
        self.time_limit, self.compile = time_limit, compile
        self.shuffle, self.progress, self.resume = shuffle, progress, resume
        self.metadata = dict(metadata or {})
        self.num_workers, self.find_unused_parameters = num_workers, find_unused_parameters
        self.shards = shards
        self.out_dir = Path(out_dir) if out_dir is not None else None
        # The target fields of the validation errors: given, or the loss's.
        self.fields = fields if fields is not None else getattr(loss, "fields", None)
        self.loss_fn = loss if loss is not None else RelativeLpLoss(fields=self.fields)
        # The metric that picks best.pt: the one the loss optimises.
        self.metric = ("l2_mean" if getattr(self.loss_fn, "quadrature", True)
                       else "l2_unweighted_mean")
        self._setup_devices(model, device, log, amp)
        self._make_loader()
        self._make_optimization(optimizer, scheduler, lr, weight_decay)
        # the Trainer's own hooks first (files, then the log line), then the ones given
        self.callbacks = list(callbacks)
        self._hooks = ([Checkpoints(self.out_dir)] if self.out_dir is not None else []
                       ) + [EpochLog(self._log)] + self.callbacks
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"value": math.inf, "epoch": None}
        self.epoch = 0  # completed epochs
        self._net: nn.Module | None = None  # the (DDP-wrapped) model, built in fit()

    # ------------------------------------------------------------------ set-up
    def _check_optimization(self, model, optimizer, scheduler, lr, weight_decay) -> None:
        """A given optimiser (and a scheduler object) is checked now, and the arguments
        of the others; named ones and factories are built once the model is on its
        device (fused optimisers check it)."""
        params = list(model.parameters())
        if not params:
            raise ValueError("Trainer: the model has no parameters")
        if isinstance(optimizer, torch.optim.Optimizer):
            self.optimizer = make_optimizer(model, optimizer, lr, weight_decay)
        else:
            check_optimizer_arguments(optimizer, lr, weight_decay)
            self.optimizer = None
        if is_scheduler_object(scheduler):
            check_scheduler(scheduler, self.optimizer)
        elif isinstance(scheduler, str) and scheduler not in ("cosine", "onecycle"):
            raise ValueError(f"scheduler must be 'cosine', 'onecycle', None, a scheduler or "
                             f"a callable, got {scheduler!r}")
        self.dtype = params[0].dtype

    def _setup_devices(self, model, device, log, amp) -> None:
        """The process group (under torchrun), the device, the log, the seeds, the model
        on its device and the mixed precision."""
        self.dist, self.device = distributed.setup(device)
        self._log = _make_logger(log) if self.dist.is_main else (lambda msg: None)
        seed_everything(self.seed + self.dist.rank)
        self.model = model.to(self.device)
        self.amp_dtype = self._amp_dtype(amp)
        self.scaler = (torch.amp.GradScaler(self.device.type)
                       if self.amp_dtype == torch.float16 else None)

    def _make_loader(self) -> None:
        """The training sampler and loader.

        The sampler is a DistributedSampler in a single process too (one replica): the
        permutation of an epoch then depends only on (seed, epoch), and a run on W
        processes deals out exactly the permutation a single process would use. The
        loader draws its workers' base seed from its own generator rather than the
        global one, so iterating it does not shift the dropout stream."""
        if self.shards:
            self.sampler = self._shard_sampler()
        else:
            self.sampler = DistributedSampler(
                self.train_data, num_replicas=self.dist.world_size if self.dist.active else 1,
                rank=self.dist.rank if self.dist.active else 0, shuffle=self.shuffle,
                seed=epoch_seed(self.seed, 0), drop_last=False)
        self._loader_gen = torch.Generator()
        self.train_loader = make_loader(self.train_data, self.batch_size, sampler=self.sampler,
                                        generator=self._loader_gen,
                                        num_workers=self.num_workers)
        self.steps_per_epoch = len(self.train_loader)

    def _shard_sampler(self) -> distributed.ShardSampler:
        """``shards``: fixed parts of the training set (see
        :class:`~meshops.training.distributed.ShardSampler`), one per process of a
        data-parallel run, or all of them in one process with ``shards`` times the
        batch of one."""
        parts, world = int(self.shards), self.dist.world_size if self.dist.active else 1
        if world > 1 and parts != world:
            raise ValueError(f"Trainer: shards={parts} but the run has {world} processes")
        if world == 1 and self.batch_size % parts:
            raise ValueError(f"Trainer: batch_size {self.batch_size} is not a multiple of "
                             f"shards={parts} (one process takes each part's batch)")
        return distributed.ShardSampler(
            len(self.train_data), parts, self.dist.rank if world > 1 else None,
            self.batch_size if world > 1 else self.batch_size // parts, self.shuffle,
            self.seed)

    def _make_optimization(self, optimizer, scheduler, lr, weight_decay) -> None:
        """The optimiser (unless given) and the learning-rate schedule, on the model on
        its device; an error leaves no process group behind."""
        try:
            if self.optimizer is None:
                self.optimizer = make_optimizer(self.model, optimizer, lr, weight_decay)
            self.scheduler = make_scheduler(scheduler, self.optimizer,
                                            self.epochs * self.steps_per_epoch)
        except Exception:
            distributed.cleanup(self.dist)
            raise

    def _check_dtype(self, sample) -> None:
        for key in ("x", "pos"):
            t = getattr(sample, key, None)
            if t is not None and t.is_floating_point() and t.dtype != self.dtype:
                raise ValueError(
                    f"train_data[0].{key} is {t.dtype} but the model's parameters are "
                    f"{self.dtype}; assemble the samples with dtype={self.dtype} or cast "
                    f"the model")

    def _amp_dtype(self, amp) -> torch.dtype | None:
        from meshops.training.precision import amp_dtype

        return amp_dtype(amp, self.device, self.dtype)

    def _attach_normalizers(self, norm_in: UnitGaussianNormalizer | None,
                            norm_out: UnitGaussianNormalizer | None) -> None:
        # Statistics in the model's dtype and on its device, like its own buffers.
        cast = (lambda n: n.to(device=self.device, dtype=self.dtype) if n is not None else None)
        self.model.set_normalizers(input=cast(norm_in), output=cast(norm_out))

    @property
    def _scale_by(self) -> int | None:
        """The input channel the outputs scale by (``normalize`` given as an int)."""
        n = self.normalize
        return None if isinstance(n, bool) else int(n)

    def _has_normalizers(self) -> bool:
        return any(getattr(self.model, f"{k}_normalizer", None) is not None
                   for k in ("input", "output"))

    def _prepare(self, resume: bool) -> None:
        """Normalisers, resumed state and the DDP wrapper, once, before the first epoch."""
        if self._net is not None:
            return
        last = self.out_dir / LAST if self.out_dir is not None else None
        if resume and last is not None and last.exists():
            self._load_state(last)
        else:
            if resume:
                self._log(f"resume: no {last} yet, starting from scratch")
            if self.normalize and not self._has_normalizers():
                # Training split only: statistics that have seen the validation data
                # would leak it into the model.
                self._attach_normalizers(*fit_normalizers(self.train_data, self._scale_by))
            if self.normalize:  # the parameters' statistics, when the model takes some
                fit_param_normalizer(self.model, self.train_data)
        # Wrapped after the normalisers are attached: DDP registers the buffers it
        # broadcasts when it is built.
        self._net = distributed.wrap_model(self.model, self.dist, self.device,
                                           self.find_unused_parameters)
        self._eval_net = self.model
        if self.compile is not False:
            kw = self.compile if isinstance(self.compile, dict) else {}
            # DDP before compile: the compiler then splits the graph at DDP's buckets.
            self._net = torch.compile(self._net, **kw)
            self._eval_net = (torch.compile(self.model, **kw) if self.dist.active
                              else self._net)

    def _precision_hint(self) -> str:
        """Why a loss may have overflowed when the training data are of a magnitude
        near the limits of the model's dtype (said instead of "lower lr")."""
        if self.dtype == torch.float64 or not isinstance(self.train_data, (list, tuple)):
            return ""
        top = max((float(t.abs().max()) for s in self.train_data for t in
                   (getattr(s, "x", None), getattr(s, "y", None))
                   if t is not None and t.numel()), default=0.0)
        limit = torch.finfo(self.dtype).max
        if top < limit ** 0.5:
            return ""
        return (f"the training data reach {top:.3g}, within a factor {limit / top:.3g} of the "
                f"largest {self.dtype} ({limit:.3g}): {self.dtype} is the limit here; train "
                f"in float64 (model.double() and float64 samples; meshops train --dtype "
                f"float64)")

    # ------------------------------------------------------------------ forward
    def _forward(self, net: nn.Module, batch) -> Tensor:
        """Decoded predictions (physical units) of ``net`` on a prepared batch."""
        # the batch is a fresh collation: safe to edit
        raw = batch.x
        batch.x = encode_inputs(self.model, batch.x)
        if self.amp_dtype is not None:
            with torch.autocast(device_type=self.device.type, dtype=self.amp_dtype):
                out = net(batch)
            # Decode and compute the loss in full precision.
            out = out.to(self.dtype)
        else:
            out = net(batch)
        scale = output_scale(self.model, raw, out.shape[0], getattr(batch, "batch", None),
                             getattr(batch, "query_pos_batch", None))
        return decode_outputs(self.model, out, scale)

    # ------------------------------------------------------------------ training
    def _train_epoch(self, epoch: int) -> float:
        net = self._net
        net.train()
        self.sampler.set_epoch(epoch)
        self._loader_gen.manual_seed(epoch_seed(self.seed, epoch))
        total = torch.zeros(2, dtype=torch.float64)  # sum of per-sample losses, samples
        # An iterator, not the loader: tqdm.auto's bar calls iter() on what it is given
        # when it is made and again to iterate, and a second iter() of a loader with
        # workers starts a second set of worker processes that read batches for nothing.
        bar = progress_bar(iter(self.train_loader), total=self.steps_per_epoch, unit="batch",
                           desc=f"epoch {epoch + 1}/{self.epochs}", leave=False,
                           enabled=self.progress and self.dist.is_main)
        for step, batch in enumerate(bar):
            batch = prepare_batch(batch, self.device)
            self.optimizer.zero_grad(set_to_none=True)
            pred = self._forward(net, batch)
            y, w, b = targets_of(batch)
            loss = self.loss_fn(pred, y, w, b)
            if not (isinstance(loss, Tensor) and loss.dim() == 0):
                got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, Tensor)
                       else f"a {type(loss).__name__}")
                raise ValueError(f"the loss {name_of(self.loss_fn)} returned {got}; it must "
                                 f"return a scalar tensor (reduce over the samples)")
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"non-finite training loss {value} at epoch {epoch + 1}, step {step + 1}; "
                    f"{self._precision_hint() or 'lower lr, set grad_clip, or check the data'}")
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                if self.grad_clip is not None:
                    self.scaler.unscale_(self.optimizer)  # clip the true gradients
                    nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                if self.grad_clip is not None:
                    nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
                self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            n = int(batch.num_graphs)
            total += torch.tensor([value * n, n], dtype=torch.float64)
            bar.set_postfix(loss=f"{total[0] / total[1]:.3e}", refresh=False)
        bar.close()
        total = distributed.all_reduce_sum(total.to(self.device), self.dist).cpu()
        return float(total[0] / total[1])

    @torch.no_grad()
    def evaluate(self, data: Sequence | None = None) -> dict[str, float]:
        """Per-sample relative L2 errors of the model on ``data`` (default ``val_data``).

        Predictions are decoded to physical units as in training. Under torchrun
        every rank evaluates its share and the errors are gathered, so all ranks
        return the same numbers.

        A sample whose target is zero everywhere has no relative error
        (:func:`~meshops.training.loss.zero_target`): it is left out of the relative
        statistics, counted in ``l2_undefined`` and named in a warning; its absolute
        error still counts in ``abs_l2_*``. A sample on which the model predicts a
        non-finite value (its inputs are finite) is a failure: its errors are ``inf``,
        so the means and maxima are ``inf``; it is counted in ``failed`` and named in
        a warning.

        With several target fields (``fields``) a sample's relative error is the
        weighted mean of its fields' relative errors, and ``fields`` reports each.

        Returns:
            ``l2_mean``, ``l2_median``, ``l2_max`` (quadrature-weighted),
            ``l2_unweighted_mean``, ``..._median``, ``..._max`` (NaN when no sample
            has a defined relative error), ``abs_l2_mean``, ``..._median``, ``..._max``
            (quadrature-weighted absolute error ``sqrt(sum_i w_i |pred_i - y_i|^2)``),
            ``l2_undefined`` (samples with an all-zero target), ``failed`` (samples with
            a non-finite prediction), ``n`` (samples) and, with more than one target
            field, ``fields``: ``{field: {"l2_mean", "l2_median", "l2_max"}}``.
        """
        data = self.val_data if data is None else data
        if data is None or len(data) == 0:
            raise ValueError("evaluate: no data (and no val_data)")
        if self._net is None and self.normalize and not self._has_normalizers():
            self._attach_normalizers(*fit_normalizers(self.train_data, self._scale_by))
        if self._net is None and self.normalize:
            fit_param_normalizer(self.model, self.train_data)
        idx = distributed.shard(len(data), self.dist)
        local = self._errors_of(torch.utils.data.Subset(data, idx))
        gathered = distributed.all_gather_objects((idx, local), self.dist)
        order = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in gathered])
        values = torch.cat([e for _, e in gathered]).numpy()[np.argsort(order, kind="stable")]
        # Per sample, for callbacks (the median sample's figure): columns l2,
        # l2_unweighted, abs_l2, then each field's l2, in the order of ``data``.
        self.last_errors = values
        return self._error_statistics(values, data)

    def _errors_of(self, subset) -> torch.Tensor:
        """``[n, 3 + fields]`` float64 errors of this rank's samples: relative L2
        (weighted, plain), absolute L2, then each field's relative L2."""
        # A Subset, not a list of the samples: a lazily read data set stays on disk.
        loader = make_loader(subset, self.val_batch_size, generator=torch.Generator(),
                             num_workers=self.num_workers)
        # The bare model, not DDP: ranks may hold different numbers of batches, and a
        # DDP forward would wait for the others (it broadcasts buffers).
        model = self.model
        net = getattr(self, "_eval_net", None)
        net = model if net is None else net
        was_training = model.training
        model.eval()
        errs = []
        try:
            for batch in loader:
                batch = prepare_batch(batch, self.device)
                pred = self._forward(net, batch).to(torch.float64)
                y, w, b = targets_of(batch)
                y = y.to(torch.float64)
                weighted = lp_errors(pred, y, w, b, fields=self.fields)
                plain = lp_errors(pred, y, None, b, fields=self.fields)
                errs.append(torch.cat([torch.stack([weighted["relative"], plain["relative"],
                                                    weighted["absolute"]], 1),
                                       weighted["fields"]], 1))
        finally:
            model.train(was_training)
        width = 3 + (1 if self.fields is None else len(self.fields))
        return torch.cat(errs).cpu() if errs else torch.zeros(0, width, dtype=torch.float64)

    def _error_statistics(self, values: np.ndarray, data) -> dict[str, Any]:
        """:meth:`evaluate`'s statistics of the per-sample errors ``values``; warnings
        name the samples with an all-zero target and those the model failed on."""
        out: dict[str, Any] = {"n": int(values.shape[0])}
        for j, name in enumerate(("l2", "l2_unweighted", "abs_l2")):
            out.update(_statistics(values[:, j], name))
        if self.fields is not None and len(self.fields) > 1:
            out["fields"] = {f: _statistics(values[:, 3 + j], "l2")
                             for j, f in enumerate(self.fields.names)}
        undefined = np.flatnonzero(np.isnan(values[:, 0]))
        out["l2_undefined"] = int(undefined.size)
        failed = np.flatnonzero(np.isinf(values[:, 0]))
        out["failed"] = int(failed.size)
        name = (lambda i: getattr(data[int(i)], "source", None) or f"sample {int(i)}")
        # stacklevel 3: the caller of evaluate(), through this helper
        if undefined.size and self.dist.is_main:
            warn_zero_targets([name(i) for i in undefined], stacklevel=3)
        if failed.size and self.dist.is_main:
            warn_failed([name(i) for i in failed], stacklevel=3)
        return out

    def fit(self, resume: bool | None = None) -> list[dict[str, Any]]:
        """Train to ``epochs`` (from ``out_dir/last.pt`` when resuming).

        Returns:
            The history: one dict per epoch with ``epoch`` (1-based),
            ``train_loss`` (mean per-sample loss over the epoch), ``val_l2`` (the
            metric that picks ``best.pt``, ``None`` without ``val_data``), ``val``
            (all metrics of :meth:`evaluate`), ``lr`` (at the end of the epoch) and
            ``time_s``.
        """
        resume = self.resume if resume is None else resume
        if resume and self.out_dir is None:
            raise ValueError("fit: resume=True needs out_dir")
        try:
            self._prepare(resume)
            callbacks.call(self._hooks, "on_fit_start", self)
            if self.epoch >= self.epochs:
                self._log(f"already trained {self.epoch}/{self.epochs} epochs")
            start, first = time.perf_counter(), self.epoch
            while self.epoch < self.epochs:
                self._run_epoch(self.epoch)
                if self.time_limit is not None and self.epoch < self.epochs:
                    spent = time.perf_counter() - start
                    stop = spent * (1 + 1 / (self.epoch - first)) > self.time_limit
                    # Every rank stops when one would: they must run the same epochs.
                    if any(distributed.all_gather_objects(stop, self.dist)):
                        self._log(f"stopped after epoch {self.epoch}/{self.epochs}: another "
                                  f"epoch would pass the {self.time_limit:g} s time limit")
                        break
        finally:
            try:
                callbacks.call(self._hooks, "on_fit_end", self)
            finally:
                distributed.cleanup(self.dist)
        return self.history

    def _run_epoch(self, epoch: int) -> None:
        t0 = time.perf_counter()
        train_loss = self._train_epoch(epoch)
        val = self.evaluate() if self.val_data is not None else None
        entry = {"epoch": epoch + 1, "train_loss": train_loss,
                 "val_l2": val[self.metric] if val is not None else None, "val": val,
                 "lr": float(self.optimizer.param_groups[0]["lr"]),
                 "time_s": time.perf_counter() - t0}
        self.history.append(entry)
        self.epoch = epoch + 1
        if val is not None and val[self.metric] < self.best["value"]:
            self.best = {"value": val[self.metric], "epoch": epoch + 1}
        # the checkpoints and the log line, then the callbacks given
        callbacks.call(self._hooks, "on_epoch_end", self, entry)

    # ------------------------------------------------------------------ state
    def _load_state(self, path: Path) -> None:
        saved = state.read_training_state(path)
        tr = saved["training"]
        m = self.model
        if saved["model"] != m.model_name or saved["config"] != dict(m.config):
            raise ValueError(f"{path}: saved for {saved['model']} {saved['config']}, "
                             f"cannot resume {m.model_name} {dict(m.config)}")
        state.check_resume_epochs(path, tr, self.epochs, self.scheduler is not None)
        norms = saved.get("normalizers", {})
        self._attach_normalizers(
            UnitGaussianNormalizer(norms["input"]) if "input" in norms else None,
            UnitGaussianNormalizer(norms["output"]) if "output" in norms else None)
        check_weights_fit(m, saved["state_dict"], path, f"this {m.model_name} model")
        m.load_state_dict(saved["state_dict"])
        state.load_optimizer_states(path, tr, self.optimizer, self.scheduler, self.scaler)
        rng = state.rank_rng_state(path, tr, self.dist.rank,
                                   self.dist.world_size if self.dist.active else 1)
        if rng is None:
            # Different ranks now; a per-(seed, rank, epoch) seed keeps it deterministic.
            seed_everything(epoch_seed(self.seed + self.dist.rank, tr["epoch"]))
        else:
            with state.checkpoint_errors(path, "malformed random-generator state"):
                set_rng_state(rng)
        self.history = list(tr["history"])
        self.best = dict(tr["best"])
        self.epoch = int(tr["epoch"])
        self._log(f"resumed from {path} after epoch {self.epoch}/{self.epochs}")
