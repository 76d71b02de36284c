"""Seeding and random-number-generator state, for reproducible and resumable training."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

# Multiplier that spreads run seeds apart before the epoch is added, so that
# (seed=0, epoch=1) and (seed=1, epoch=0) do not give the same shuffle.
_SEED_STRIDE = 1_000_003

#: The largest run seed: seeds are 0 .. 2**63 - 1, so that seed + rank and the epoch
#: seeds stay inside torch's generators (which take up to 2**64 - 1).
MAX_SEED = 2**63 - 1


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and all GPUs).

    Call it before building the model, so that its initial weights are
    reproducible too; :class:`~meshops.training.Trainer` calls it again with its own
    ``seed`` when it is created.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the data order of ``epoch`` in a run seeded with ``seed``.

    It depends on nothing else (not on the global generators), so a resumed run
    draws the same order as an uninterrupted one. Taken modulo 2**63, so that any seed
    up to :data:`MAX_SEED` gives a valid generator seed (the same value as before for
    seeds below 9e12, so older runs resume unchanged).
    """
    return (int(seed) * _SEED_STRIDE + int(epoch)) % 2**63


def get_rng_state() -> dict[str, Any]:
    """Snapshot of every global generator a training step may draw from.

    The NumPy state is stored as a tensor and Python's as nested tuples of ints, so
    the snapshot loads with ``torch.load(..., weights_only=True)``.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a snapshot taken by :func:`get_rng_state`."""
    version, internal, gauss = state["python"]
    # torch.load gives lists where tuples were saved; random.setstate wants tuples.
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = [s.cpu() for s in state["cuda"]]
        # A run resumed on fewer GPUs restores the ones it has.
        for i, s in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)
