"""Data-parallel training across GPUs and nodes through ``torchrun`` + DDP.

Launch the same training script (``your_script.py`` below, one that builds a
:class:`~meshops.training.Trainer` and calls ``fit``) on every process with ``torchrun``::

    torchrun --nproc_per_node=4 your_script.py              # one node, 4 GPUs
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d \\
             --rdzv_endpoint=HOST:29500 your_script.py        # two nodes

:class:`~meshops.training.Trainer` detects the ``WORLD_SIZE`` / ``RANK`` /
``LOCAL_RANK`` variables torchrun sets and then initialises the process group
(NCCL on CUDA, Gloo on CPU), gives each process the GPU ``LOCAL_RANK``, shards the
training set with a :class:`~torch.utils.data.DistributedSampler`, wraps the model
in :class:`~torch.nn.parallel.DistributedDataParallel`, all-reduces the metrics,
and writes checkpoints, logs and progress bars on rank 0 only. Nothing in the
training script changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from meshops.errors import UsageError

# Whether the live process group was created by setup(): a later setup() (the Trainer's,
# after meshops train read its data shard through the group) then owns it as well, and
# its cleanup() destroys it.
_CREATED_HERE = False


def torchrun_env() -> tuple[int, int, int] | None:
    """``(world_size, rank, local_rank)`` from the environment torchrun sets, or
    ``None`` when this process was not started by it."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    return world, rank, local


@dataclass
class DistContext:
    """Where this process stands in a data-parallel run.

    Attributes:
        world_size: Number of processes (1 without torchrun).
        rank: Global rank of this process.
        local_rank: Rank on this node; the GPU index on CUDA.
        owns_group: Whether :func:`setup` created the process group (and so
            :func:`cleanup` destroys it).
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = False

    @property
    def active(self) -> bool:
        """Whether collectives are needed: several processes and a live process group."""
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files, logs and progress bars."""
        return self.rank == 0


def check_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a :class:`torch.device` that exists here (``None``: CUDA when
    available, else the CPU).

    Raises:
        ValueError: not a device name (``"foo"``), or a device this machine does not
            have (``"cuda"`` without CUDA, ``"cuda:3"`` on one GPU, ``"mps"`` off a Mac),
            saying which there are.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{device!r} is not a device name; use cpu, cuda or cuda:N "
                         f"(an index)") from None
    have = "cpu" + (f", cuda:0..{torch.cuda.device_count() - 1}"
                    if torch.cuda.is_available() else "")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise ValueError(f"{device!r}: CUDA is not available ({why}); this machine "
                             f"has: {have}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{device!r}: there is no such GPU; this machine has: {have}")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{device!r}: MPS is not available; this machine has: {have}")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{device!r}: meshops runs on cpu, cuda or mps")
    return dev


def setup(device: str | torch.device | None = None) -> tuple[DistContext, torch.device]:
    """Join the torchrun process group, if launched by torchrun, and pick the device.

    Args:
        device: ``"cpu"``, ``"cuda"`` (this process's GPU is chosen from
            ``LOCAL_RANK``), an explicit device, or ``None`` for CUDA when available.

    Returns:
        ``(context, device)``. Without torchrun (or with ``WORLD_SIZE=1``) the
        context is the single-process one and no process group is created. A
        process group the caller initialised already is used as it is (and left to
        the caller, unless an earlier call of this function created it).

    Raises:
        ValueError: a device this machine does not have (see :func:`check_device`).
    """
    device = check_device(device)
    env = torchrun_env()
    if env is None or env[0] <= 1:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return DistContext(), device

    world, rank, local = env
    if device.type == "cuda":
        # One GPU per process; set before init so NCCL binds to the right one.
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    global _CREATED_HERE
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                init_method="env://", world_size=world, rank=rank)
        _CREATED_HERE = True
    return DistContext(world, rank, local, _CREATED_HERE), device


def cleanup(ctx: DistContext) -> None:
    """Destroy the process group if :func:`setup` created it (after a last barrier,
    so that no rank leaves while another still waits on a collective)."""
    global _CREATED_HERE
    if ctx.owns_group and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        ctx.owns_group = _CREATED_HERE = False


def wrap_model(model: nn.Module, ctx: DistContext, device: torch.device,
               find_unused_parameters: bool = False) -> nn.Module:
    """``DistributedDataParallel(model)`` in a data-parallel run, else ``model``.

    DDP broadcasts rank 0's parameters and buffers (the fitted normalisers
    included) when it wraps the model, so every rank starts from the same state.
    """
    if not ctx.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused_parameters)


def all_reduce_sum(t: Tensor, ctx: DistContext) -> Tensor:
    """Sum of ``t`` over all ranks (``t`` itself in a single process)."""
    if ctx.active:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` in a single process)."""
    if not ctx.active:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def shard(n: int, ctx: DistContext) -> list[int]:
    """Indices ``rank, rank + world, ...`` of ``n`` items: an even split without the
    padding of :class:`~torch.utils.data.DistributedSampler`, for evaluation, where
    a duplicated sample would bias the metrics."""
    if not ctx.active:
        return list(range(n))
    return list(range(ctx.rank, n, ctx.world_size))


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op in a single process)."""
    if ctx.active:
        dist.barrier()


class ShardSampler(torch.utils.data.Sampler):
    """The training samples dealt into fixed parts, one per process of a data-parallel
    run, so that each process reads only its own part (e.g. the files on its node).

    Sample ``i`` belongs to part ``i % parts``. Each epoch permutes every part (from
    ``(seed, epoch, part)`` alone, so a resumed run draws the same order), and a part
    shorter than the longest repeats its first samples to even them out (every process
    takes the same number of steps). With ``part`` the sampler yields that part's
    sequence (the process of rank ``part``); with ``part=None`` it yields the parts'
    sequences interleaved ``batch`` at a time (part 0's first ``batch`` samples, part
    1's, ..., then everyone's second), so that one process with ``parts * batch``
    samples per step takes the steps of all the processes together: the same
    gradients as the data-parallel run, up to rounding.

    Args:
        n: Training samples.
        parts: Number of parts (the processes of the data-parallel run).
        part: This process's part, or None for one process taking them all.
        batch: Samples per step of one part (with ``part=None``).
        shuffle: Permute each part every epoch.
        seed: Seed of the permutations.
    """

    def __init__(self, n: int, parts: int, part: int | None = None, batch: int = 1,
                 shuffle: bool = True, seed: int = 0) -> None:
        if parts < 1 or n < parts:
            raise ValueError(f"ShardSampler: {n} samples cannot be dealt into {parts} parts")
        if part is not None and not 0 <= part < parts:
            raise ValueError(f"ShardSampler: part {part} of {parts}")
        self.n, self.parts, self.part, self.batch = n, parts, part, max(int(batch), 1)
        self.shuffle, self.seed, self.epoch = shuffle, int(seed), 0
        self.size = -(-n // parts)  # the longest part

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def sequence(self, part: int) -> list[int]:
        """Part ``part``'s samples in this epoch's order, padded to :attr:`size`."""
        from meshops.training.seed import epoch_seed

        idx = list(range(part, self.n, self.parts))
        if self.shuffle:
            g = torch.Generator().manual_seed(
                (epoch_seed(self.seed, self.epoch) * 1_000_003 + part) % 2 ** 63)
            idx = [idx[k] for k in torch.randperm(len(idx), generator=g).tolist()]
        while len(idx) < self.size:
            idx += idx[:self.size - len(idx)]
        return idx

    def __iter__(self):
        if self.part is not None:
            return iter(self.sequence(self.part))
        seqs = [self.sequence(p) for p in range(self.parts)]
        return iter([i for a in range(0, self.size, self.batch) for s in seqs
                     for i in s[a:a + self.batch]])

    def __len__(self) -> int:
        return self.size if self.part is not None else self.size * self.parts


def is_main_rank() -> bool:
    env = torchrun_env()
    return env is None or env[1] == 0


def device_or_error(device: str | None, what: str = "--device") -> str | None:
    """``device`` if this machine has it, else :class:`UsageError` saying which it has."""
    if device is None:
        return None
    try:
        check_device(device)
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None
    return device
