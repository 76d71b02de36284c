"""The memory of a training step, measured before training starts.

A step on a mesh of a million points can take more memory than the machine has, and the
kernel then ends the process without a word. :func:`step_memory` measures the peak of
one forward and backward pass on two random subsets of a sample's points (a few
thousand each), and :class:`StepMemory` extrapolates it to the largest sample of a run:
the global models of meshops are linear in the number of points (slices, latent
tokens, neighbourhoods of bounded size), so two sizes give the bytes per point and the
fixed part. ``meshops train`` checks the estimate against the free memory once the data
is read, before it builds the mesh structures and trains
(:func:`meshops.fitting.training_run.fit_memory`).

Peaks are read where they can be: the CUDA allocator's peak on a GPU; on the CPU, the
resident high-water mark on Linux (``/proc/self/clear_refs``, reset before each probe)
of a child process that has fixed glibc's threshold for mapping a block of its own at
:data:`MMAP_THRESHOLD`. With glibc's default, rising threshold, blocks freed inside a
step stay in the heap and the high-water mark of a step on a few thousand points
counts them (up to 2.3 times the live peak with checkpointed blocks); with the fixed
one the bytes per point are the same at 16k, 65k and 200k points
(``benchmarks/results/step-memory-cpu-1thread.txt``). The child keeps that setting from
the training process, where it costs time (a 1.5x slower step at 100k points).
Elsewhere nothing is measured and no estimate is made.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

__all__ = ["PROBE_POINTS", "StepMemory", "largest_sample", "step_memory", "subsample"]

#: The point counts of the two probes: large enough that the per-point part dominates
#: the fixed one, small enough to take a fraction of a second on a CPU.
PROBE_POINTS = (16384, 65536)
#: glibc's mmap threshold while the probes run (``mallopt(M_MMAP_THRESHOLD)``).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3


@dataclass(frozen=True)
class StepMemory:
    """Peak bytes of a training step ``fixed + per_point * points`` (forward and
    backward, batch of one), plus the optimiser's state (AdamW: the gradients and two
    moments, three times the parameters)."""

    fixed: float
    per_point: float
    optimizer: int

    def bytes(self, points: int, batch_size: int = 1) -> int:
        """The estimate for ``batch_size`` samples of ``points`` points each."""
        return int(max(self.fixed, 0.0) + self.per_point * points * batch_size
                   + self.optimizer)


def largest_sample(samples: Sequence) -> tuple[object, int]:
    """``(sample, points)``: the training sample with the most points among those this
    process reads (:func:`~meshops.training.dataset.own_part`; a lazy data set's sizes
    come from its records, and only that sample is read)."""
    from meshops.training.dataset import own_part

    pool = own_part(samples)
    records = getattr(pool, "records", None)
    sizes = ([int(r.meta["points"]) for r in records] if records is not None
             else [int(s.pos.shape[0]) for s in pool])
    index = max(range(len(sizes)), key=sizes.__getitem__)
    return pool[index], sizes[index]


def subsample(sample, points: int, seed: int = 0):
    """A copy of ``sample`` on ``points`` of its points drawn at random (its query points,
    when it has them, thinned by the same fraction), the weights scaled to keep the
    measure: a stand-in of the sample's size for a memory probe, not for training."""
    from meshops.mesh.data import MeshData

    g = torch.Generator().manual_seed(seed)
    n = int(sample.pos.shape[0])
    idx = torch.randperm(n, generator=g)[:points].sort().values
    w = sample.weight
    fields = {"pos": sample.pos[idx], "weight": w[idx] * (w.sum() / w[idx].sum().clamp_min(
        torch.finfo(w.dtype).tiny))}
    x = getattr(sample, "x", None)
    if x is not None:
        fields["x"] = x[idx]
    query = getattr(sample, "query_pos", None)
    if query is None:
        fields["y"] = sample.y[idx]
    else:
        m = max(1, int(query.shape[0] * points / n))
        q = torch.randperm(query.shape[0], generator=g)[:m].sort().values
        fields.update(query_pos=query[q], y=sample.y[q])
        if getattr(sample, "query_weight", None) is not None:
            fields["query_weight"] = sample.query_weight[q]
    if getattr(sample, "params", None) is not None:
        fields["params"] = sample.params
    return MeshData(**fields)


def _rss_peak(step: Callable[[], None]) -> Optional[int]:
    """Bytes the resident set grew to above its level before ``step()`` (Linux)."""
    _malloc("malloc_trim", 0)   # freed heap back: RSS is live memory
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")                             # the high-water mark := RSS
        before = _status_bytes("VmRSS:")
        step()
        return _status_bytes("VmHWM:") - before
    except (OSError, ValueError):
        return None


def _malloc(name: str, *args: int) -> None:
    """Call glibc's ``name(*args)`` where there is a glibc."""
    try:
        getattr(ctypes.CDLL("libc.so.6"), name)(*args)
    except (OSError, AttributeError):
        pass


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no {key} in /proc/self/status")


def _cuda_peak(step: Callable[[], None], device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def _probe_peaks(model, batches, checkpoint: bool, peak) -> list:
    """Peaks of a forward and backward pass of ``model`` on each of ``batches`` (after a
    warm-up pass on the first: the allocator's and kernels' first use), the blocks
    checkpointed or not; the model's gradients, mode and checkpointing left as they
    were."""
    from meshops.training.loss import RelativeLpLoss
    from meshops.training.trainer import targets_of

    loss_fn = RelativeLpLoss()
    was_training, was_checkpointing = model.training, getattr(model, "checkpoint_blocks", False)

    def step(batch):
        def run():
            loss_fn(model(batch), *targets_of(batch)).backward()
            model.zero_grad(set_to_none=True)
        return run

    model.train()
    if hasattr(model, "set_block_checkpointing"):
        model.set_block_checkpointing(checkpoint)
    try:
        step(batches[0])()
        return [peak(step(b)) for b in batches]
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        if hasattr(model, "set_block_checkpointing"):
            model.set_block_checkpointing(was_checkpointing)


def _child_peaks(model, batches, checkpoint: bool) -> Optional[list]:
    """:func:`_probe_peaks` with the resident high-water mark, in a child process
    (``python -m meshops.training.footprint FILE``) whose glibc maps every block of
    :data:`MMAP_THRESHOLD` or more on its own: the setting would slow this process's
    training (1.5x for the default model at 100k points); ``None`` when the child
    cannot measure."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    fd, path = tempfile.mkstemp(prefix="meshops-footprint-", suffix=".pt")
    os.close(fd)
    try:
        torch.save({"model": model, "batches": batches, "checkpoint": checkpoint}, path)
        done = subprocess.run([sys.executable, "-m", "meshops.training.footprint", path],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    finally:
        os.unlink(path)


#: Seconds the child process of the CPU probes may take.
CHILD_TIMEOUT_S = 600


def _child_main(path: str) -> None:
    """The child of :func:`_child_peaks`: the peaks as one JSON line (``null`` each when
    the high-water mark cannot be reset here)."""
    import json
    import sys

    job = torch.load(path, weights_only=False)
    torch.set_num_threads(1)
    _malloc("mallopt", _M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    peaks = _probe_peaks(job["model"], job["batches"], job["checkpoint"], _rss_peak)
    # The child's standard output is its answer to the parent (the protocol), not a
    # message to a user: written directly, as one JSON line.
    sys.stdout.write(json.dumps(peaks) + "\n")


def step_memory(model, sample, device=None, checkpoint: bool = False
                ) -> Optional[StepMemory]:
    """Measure :class:`StepMemory` of ``model`` (on ``device``, default its parameters')
    from a forward and backward pass on :data:`PROBE_POINTS` of ``sample``'s points,
    with the model's block checkpointing set to ``checkpoint`` for the probes: on a GPU
    here, from the CUDA allocator's peaks; on the CPU in a child process
    (:func:`_child_peaks`). ``None`` when the peak cannot be read, or the sample has
    fewer points than the larger probe. The model is left as it was."""
    from meshops.training.dataset import make_loader, prepare_batch

    if int(sample.pos.shape[0]) < PROBE_POINTS[-1]:
        return None
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batches = [prepare_batch(next(iter(make_loader([subsample(sample, k)], 1))), device)
               for k in PROBE_POINTS]
    if device.type == "cuda":
        peaks = _probe_peaks(model, batches, checkpoint, lambda run: _cuda_peak(run, device))
    else:
        peaks = _child_peaks(model, batches, checkpoint)
    if peaks is None or any(p is None for p in peaks):
        return None
    (n1, n2), (p1, p2) = PROBE_POINTS, peaks
    per_point = max(p2 - p1, 0) / (n2 - n1)
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return StepMemory(fixed=p1 - per_point * n1, per_point=per_point, optimizer=3 * params)


if __name__ == "__main__":
    import sys

    _child_main(sys.argv[1])
