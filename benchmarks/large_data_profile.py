"""Where a lazy epoch's time goes (``python -m benchmarks.large_data profile``).

On a folder's cached samples (with the mesh structures of the model of
:mod:`benchmarks.large_data`), per batch of its size:

1. reading the entries, split into the entry's file with its checks (one read, the
   CRC-32, the JSON header) and unpacking the tensors;
2. collating the batch (PyG's ``Batch.from_data_list``), the same for samples read
   lazily or held in memory;
3. a DataLoader over the cached samples with 0, 1 and 2 worker processes, no model;
4. the model's training step (forward, loss, backward) on a collated batch;
5. the loader and the step together, as a lazy epoch runs them.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.paths import portable

BATCH = 4
BATCHES = 12


def _model():
    from meshops.models import get_model

    torch.manual_seed(0)
    return get_model("pit", in_channels=1, out_channels=1, pos_dim=2, width=16, blocks=1,
                     num_latent=64)


def _dataset(data: Path, cache: Path, model, workers: int):
    from meshops.datasets.layout import SampleLayout
    from meshops.datasets.lazy import load_folder_cached, with_structures

    layout = SampleLayout(["f"], ["u"], [], [])
    _, ds, _, _ = load_folder_cached(data, ["f"], ["u"], torch.float32, layout=layout,
                                     cache=cache, workers=workers)
    return with_structures(ds, model, workers)


def _read_parts(ds, n: int) -> dict[str, float]:
    """Seconds per sample: reading the entry's file with its checks
    (:func:`meshops.datasets.entry.read_entry`: one read, the CRC, the JSON header) and
    the rest of :meth:`MeshCache.read` (header checks, unpacking the tensors)."""
    from meshops.datasets.cache import STRUCTURED
    from meshops.datasets.entry import read_entry

    out = {"entry": 0.0, "read": 0.0}
    for i in range(n):
        key = ds.records[i].structured
        path = ds.cache.path(STRUCTURED, key)
        t0 = time.perf_counter()
        read_entry(path)
        t1 = time.perf_counter()
        ds.cache.read(STRUCTURED, key)
        t2 = time.perf_counter()
        out["entry"] += t1 - t0
        out["read"] += t2 - t1
    parts = {k: v / n for k, v in out.items()}
    parts["rest"] = max(parts.pop("read") - parts["entry"], 0.0)
    return parts


def _step(model, batch) -> float:
    from meshops.training.loss import RelativeLpLoss
    from meshops.training.trainer import targets_of

    t0 = time.perf_counter()
    RelativeLpLoss()(model(batch), *targets_of(batch)).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def profile(data: Path, cache: Path, workers: int, roots=None) -> None:
    """Print the timings; ``roots`` names the folders the printed paths are written against
    (:func:`benchmarks.paths.portable`)."""
    from torch_geometric.data import Batch

    from meshops.training.dataset import make_loader, prepare_batch

    model = _model()
    ds = _dataset(data, cache, model, workers)
    n = BATCH * BATCHES
    print(portable(f"# {len(ds)} cached samples of {data}; {ds[0].pos.shape[0]} points "
                   f"each; batch {BATCH}, {BATCHES} batches", roots))
    parts = _read_parts(ds, n)
    print("read one entry: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in parts.items())
          + f" (total {1e3 * sum(parts.values()):.1f} ms per sample)")
    t0 = time.perf_counter()
    samples = [ds[i] for i in range(n)]
    read = (time.perf_counter() - t0) / BATCHES
    t0 = time.perf_counter()
    batches = [prepare_batch(Batch.from_data_list(samples[i:i + BATCH]))
               for i in range(0, n, BATCH)]
    collate = (time.perf_counter() - t0) / BATCHES
    print(f"per batch: read {1e3 * read:.0f} ms, collate {1e3 * collate:.0f} ms")
    model.train()
    _step(model, batches[0])  # warm-up
    step = sum(_step(model, b) for b in batches[1:]) / (BATCHES - 1)
    print(f"per batch: model step {1e3 * step:.0f} ms (forward, loss, backward; "
          f"{torch.get_num_threads()} threads)")
    sub = ds.subset(list(range(n)))
    for w in sorted({0, 1, workers}):
        loader = make_loader(sub, BATCH, num_workers=w)
        t0 = time.perf_counter()
        for b in loader:
            prepare_batch(b)
        print(f"DataLoader, {w} workers, no model: {1e3 * (time.perf_counter() - t0) / BATCHES:.0f}"
              f" ms per batch")
        t0 = time.perf_counter()
        for b in make_loader(sub, BATCH, num_workers=w):
            _step(model, prepare_batch(b))
        print(f"DataLoader, {w} workers, with the step: "
              f"{1e3 * (time.perf_counter() - t0) / BATCHES:.0f} ms per batch "
              f"(in memory: collate and step, {1e3 * (collate + step):.0f} ms)", flush=True)
