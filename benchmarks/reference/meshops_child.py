"""Times meshops PiT training steps on the files the reference reads (one process).

    python -m benchmarks.reference.meshops_child CASE DATA_DIR THREADS WARMUP STEPS BATCH
        NTRAIN NTEST PRECISION DEVICE OUT_JSON

The step is the reference's, with meshops' model: ``zero_grad``, forward, unweighted
relative L2 loss summed over the batch (the reference's ``RelLpNorm``), ``backward``,
Adam ``step``, cosine ``scheduler.step``, ``loss.item()``. Batches are collated
before the timed steps, as the reference's are drawn from its loader beforehand; on
CUDA each step copies its batch to the device (as the reference's step does) and
ends with a synchronisation.
The samples carry the mesh-only structures that ``Trainer`` stores once per sample
(``model.mesh_transform()``), built during set-up (``structures_s``), not in a step.
``MESHOPS_PROFILE_TRACE`` / ``MESHOPS_PROFILE_STEPS``: as for the reference's driver
(:mod:`benchmarks.reference.profiling`).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def _samples(case: str, root: str, ntrain: int, ntest: int, indices):
    if case == "airfoil":
        from data_adapters.naca import NacaDataset
        ds = NacaDataset(root, "train", target="mach", n_train=ntrain, n_test=ntest)
        return [ds[int(i)] for i in indices]
    from data_adapters.elasticity import ElasticityDataset
    ds = ElasticityDataset(root, "train", with_params=True, n_train=ntrain, n_test=ntest)
    out = []
    for i in indices:
        s = ds[int(i)]
        # the reference's input function: the 42 void radii, 5 rr - 1, at every point
        s.x = (5 * s.params - 1).to(s.pos.dtype).expand(s.num_nodes, -1).contiguous()
        out.append(s)
    return out


def main(argv) -> None:
    case, root, threads, warmup, steps, batch, ntrain, ntest, precision, device, out = argv
    threads, warmup, steps, batch = int(threads), int(warmup), int(steps), int(batch)
    ntrain, ntest = int(ntrain), int(ntest)
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
    from benchmarks.reference import CASES, meshops_kwargs, profiling
    from meshops.models import PiT
    from meshops.training import RelativeLpLoss
    from meshops.training.dataset import make_loader, prepare_batch

    trace = os.environ.get("MESHOPS_PROFILE_TRACE")
    profiled = int(os.environ.get("MESHOPS_PROFILE_STEPS", "0")) if trace else 0
    t0 = time.perf_counter()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    need = (warmup + steps + profiled) * batch
    order = torch.cat([torch.randperm(ntrain, generator=g)
                       for _ in range(-(-need // ntrain))])[:need]
    uniq = sorted(set(order.tolist()))
    built = dict(zip(uniq, _samples(case, root, ntrain, ntest, uniq)))
    s = built[uniq[0]]
    model = PiT(in_channels=s.x.shape[1], out_channels=s.y.shape[1], pos_dim=2,
                **meshops_kwargs(CASES[case])).to(device)
    # What meshops' Trainer does once per sample when the data are loaded: store the
    # mesh-only structures (latent mesh, its weights, the encoder/decoder graphs).
    t1 = time.perf_counter()
    transform = model.mesh_transform()
    built = {i: transform(d) for i, d in built.items()}
    structures_s = time.perf_counter() - t1
    samples = [built[int(i)] for i in order]
    batches = [prepare_batch(b) for b in make_loader(samples, batch_size=batch)]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    iterations = 500 * (ntrain // batch)  # the reference's T_max (epochs 500)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=iterations)
    loss_fn = RelativeLpLoss(quadrature=False, reduction="sum")
    setup_s = time.perf_counter() - t0

    cuda = device.startswith("cuda")
    model.train()

    def step(b):
        b = b.to(device, non_blocking=True) if cuda else b
        optimizer.zero_grad()
        pred = model(b)
        loss = loss_fn(pred, b.y, None, b.batch)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss.item()
        return loss

    times = []
    for b in batches[:warmup + steps]:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step(b)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    profile = None
    if profiled:
        profile = profiling.profile_steps(lambda i: step(batches[warmup + steps + i]),
                                          profiled, device, trace)
    params = list(model.parameters())
    result = {
        "side": "meshops", "warmup_s": times[:warmup], "step_s": times[warmup:],
        "setup_s": setup_s, "structures_s": structures_s, "threads": torch.get_num_threads(),
        "dtype": str(params[0].dtype),
        "parameters": sum(p.numel() for p in params),
        "matmul_precision": torch.get_float32_matmul_precision(), "compiled": False,
        "batch_size": int(batches[0].num_graphs), "loss": float(loss.detach()),
        "torch": torch.__version__, "device": device,
        "max_memory_gib": (torch.cuda.max_memory_allocated() / 2**30) if cuda else None,
        "profile": profile,
    }
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
