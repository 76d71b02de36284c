"""How a fit reads its training data: in memory, or through an on-disk cache for data
larger than memory (:mod:`meshops.datasets.lazy`).

When the parsed data would not fit comfortably in memory (or with ``lazy=True`` /
``cache=DIR``) a fit reads every mesh file once into an on-disk cache and trains on a
:class:`~meshops.datasets.cache.CachedMeshDataset`, which DataLoader worker processes
read one sample at a time. :func:`data_loader` decides; under torchrun each process
reads its own part (:func:`data_parts`). Every sample is checked by
:class:`NonzeroTargets`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from meshops.datasets.folder import MeshFolderDataset
from meshops.datasets.lazy import load_folder_cached
from meshops.datasets.samples import load_folder, read_sample
from meshops.errors import UsageError

#: Without ``--lazy``/``--no-lazy``, the data are read lazily when their parsed size
#: (estimated from the first file) exceeds this fraction of the available memory: the
#: samples' mesh structures, the model and the training itself need the rest.
AUTO_FRACTION = 0.25


def default_workers(cores: int | None) -> int:
    """DataLoader workers for lazily read data on a machine of ``cores`` cores: two,
    leaving two cores to the training step; none on 2 cores or fewer, where workers take
    the step's cores (profile of a 30k-point mesh batch on 2 cores: 84 ms per step
    reading in the main process, 119 ms with two workers, 71 ms in memory;
    ``benchmarks/results/large-data-profile-100-cpu-2core.txt``)."""
    return max(0, min(2, (cores or 1) - 2))


@dataclass(frozen=True)
class NonzeroTargets:
    """The check of every training sample (``check`` of
    :func:`~meshops.datasets.samples.load_folder`): refuse a sample (``y [N, C]``, the
    ``targets`` stacked) where a target field (of ``fields``, the specs ``u+v, p``;
    ``None``: all targets as one) is zero everywhere, with or without its quadrature
    weights: the loss is the mean of the fields' relative errors, and this one's is
    undefined (UsageError naming the file and the field). Its repr keys the cache."""

    targets: tuple
    fields: tuple | None = None

    def __call__(self, s, path, sh: dict) -> None:
        import torch

        from meshops.datasets.fields import TargetFields
        from meshops.inference.predict import field_channels
        from meshops.training.loss import lp_norms, zero_target

        channels = {k: field_channels(sh[k]) for k in self.targets}
        groups = (TargetFields.from_specs(self.fields, channels) if self.fields else
                  TargetFields.single(sum(channels.values()), ", ".join(self.targets)))
        y, w = s.y.to(torch.float64), s.weight.to(torch.float64)
        for name, part in groups.slices().items():
            zero = torch.zeros_like(y[:, part])
            if bool(zero_target(lp_norms(zero, y[:, part], w)[1])
                    | zero_target(lp_norms(zero, y[:, part])[1])):
                hint = (f", or join {name} with the other components of its vector field "
                        f"(--targets u+v,p makes u+v one field)" if len(groups) > 1 else "")
                raise UsageError(f"{path}: the target field(s) {name} are zero everywhere (or "
                                 f"at every point of positive weight); the relative L2 loss "
                                 f"and error are undefined for this mesh: leave it out of "
                                 f"the training data{hint}")


# ------------------------------------------------------- data-parallel runs
def _split_owner(val_fraction: float, seed: int, world: int) -> Callable[[int, int], int]:
    """``owner(i, n)``: the process of file ``i`` of a folder of ``n`` split into
    training and validation files as ``meshops train`` splits it: the ``j``-th training
    (or validation) file belongs to process ``j % world``, as the run's
    :class:`~meshops.training.distributed.ShardSampler` and validation shards deal them."""
    from meshops.training.splits import validation_split

    memo: dict[int, dict[int, int]] = {}

    def owner(i: int, n: int) -> int:
        if n not in memo:
            try:
                train, val = validation_split(n, val_fraction, seed)
            except ValueError:  # the split's own error comes later, with the folder
                train, val = list(range(n)), []
            memo[n] = {f: j % world for part in (train, val) for j, f in enumerate(part)}
        return memo[n][i]

    return owner


def data_parts(cfg) -> Optional[Callable]:
    """Under torchrun: join the process group and give ``parts(root) -> Part``, this
    process's part of each folder's files (see :func:`_split_owner`); None otherwise."""
    from meshops.datasets.cache import Part
    from meshops.training import distributed

    env = distributed.torchrun_env()
    if env is None or env[0] <= 1:
        return None
    if cfg.shards is not None and cfg.shards != env[0]:
        raise UsageError(f"--shards {cfg.shards}, but torchrun started {env[0]} processes: a "
                       f"data-parallel run has one part per process (leave --shards out)")
    try:
        ctx, _ = distributed.setup(cfg.device)
    except ValueError as e:
        raise UsageError(str(e)) from None

    def gather(obj):
        return distributed.all_gather_objects(obj, ctx)

    split = _split_owner(cfg.val_fraction or 0.0, cfg.seed, ctx.world_size)

    def parts(root) -> Part:
        same = not cfg.val_data and os.path.abspath(root) == os.path.abspath(cfg.data)
        return Part(ctx.rank, ctx.world_size, gather, split if same else None)

    return parts


def shards_of(cfg, samples, source: str = "command line") -> Optional[int]:
    """The Trainer's ``shards``: ``--shards``, else one per process when each process
    owns a part of the lazily read data, else None.

    Raises:
        UsageError: ``--shards`` more than the training files, or (in one process) not
            a divisor of the batch, which takes one part's batch from each part; in the
            words of ``source`` (:func:`~meshops.fitting.config.option_name`).
    """
    from meshops.fitting.config import option_name
    from meshops.training import distributed

    env = distributed.torchrun_env()
    if cfg.shards is not None:
        n, parts = len(samples), cfg.shards
        given = option_name("shards", source, str(parts))
        if parts > n:
            raise UsageError(f"{given}: the training set has {n} file(s) of {cfg.data}, and "
                             f"each part needs one at least; give "
                             f"{option_name('shards', source, str(n))} or fewer")
        if (env is None or env[0] <= 1) and cfg.batch_size % parts:
            raise UsageError(f"{given}: the batch of {cfg.batch_size} samples is not a "
                             f"multiple of it (each step takes the same number from every "
                             f"part); give {option_name('batch_size', source)} a multiple "
                             f"of {parts}")
        return parts
    return env[0] if env and getattr(samples, "owned", None) is not None else None


# ---------------------------------------------------------------- the decision
def available_memory() -> Optional[int]:
    """Bytes of memory available to a new allocation (``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def parsed_size(root, inputs: Sequence[str], targets: Sequence[str], dtype,
                layout=None) -> int:
    """Estimated bytes of a folder's parsed samples: the first file's sample, scaled by
    the folder's file bytes over the first file's."""
    ds = MeshFolderDataset(root, inputs=inputs, targets=targets, dtype=dtype, layout=layout)
    sample, _, _ = read_sample(ds, 0, targets)
    one = sum(v.numel() * v.element_size() for _, v in sample.items() if hasattr(v, "numel"))
    sizes = [os.stat(p).st_size for p in ds.files]
    return int(one * sum(sizes) / max(sizes[0], 1))


def data_loader(cfg, dtype, layout=None, source: str = "command line"
                ) -> tuple[Callable, int, str]:
    """How ``meshops train`` reads its folders: ``(load, workers, why)`` with ``load``
    :func:`load_folder` (in memory) or :func:`load_folder_cached`, the DataLoader worker
    processes, and a line saying so (empty when in memory).

    ``--lazy`` or ``--cache DIR`` read lazily, ``--no-lazy`` in memory; otherwise lazily
    when the estimated parsed size of ``--data`` and ``--val-data`` exceeds
    :data:`AUTO_FRACTION` of the available memory. ``--workers`` defaults to 2 worker
    processes for lazily read data where the machine has cores to spare for them
    (:func:`default_workers`), none in memory. ``source``: whose words the errors use
    (:func:`~meshops.fitting.config.option_name`).
    """
    from functools import partial

    from meshops.datasets.cache import default_cache_dir
    from meshops.fitting.config import FIT, option_name
    from meshops.training.distributed import torchrun_env

    lazy = cfg.lazy
    if lazy is False and cfg.cache:
        cache = option_name("cache", source, "DIR")
        raise UsageError(f"{FIT if source == FIT else 'train'}: {cache} reads the data "
                         f"lazily through the cache; it cannot be combined with "
                         f"{'lazy=False' if source == FIT else '--no-lazy'}")
    why = ""
    if lazy is None and not cfg.cache:
        need = sum(parsed_size(root, cfg.inputs, cfg.targets, dtype, layout)
                   for root in (cfg.data, cfg.val_data) if root)
        have = available_memory()
        lazy = have is not None and need > AUTO_FRACTION * have
        if lazy:
            why = (f": the parsed data would take about {need / 1e9:.1f} GB, over "
                   f"{AUTO_FRACTION:.0%} of the {have / 1e9:.1f} GB of available memory "
                   f"(--no-lazy reads it into memory anyway)")
    if not lazy and not cfg.cache:
        return partial(load_folder, layout=layout), cfg.workers or 0, ""
    workers = cfg.workers if cfg.workers is not None else default_workers(os.cpu_count())
    cache = Path(cfg.cache) if cfg.cache else default_cache_dir()
    parts = data_parts(cfg)
    if parts is not None:
        env = torchrun_env()
        why += (f"; process {env[1]} of {env[0]} checks, caches and reads only its part "
                f"of the files")
    return (partial(load_folder_cached, layout=layout, cache=cache, workers=workers,
                    parts=parts), workers,
            f"reading the data lazily through the cache {cache}/ with {workers} worker "
            f"process(es){why}")
