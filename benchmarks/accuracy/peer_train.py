"""Train one neural peer (Transolver or GINO) under a wall-clock budget and predict
the test files once: ``python -m benchmarks.accuracy.peer_train JOB.json``.

Runs in the peers' virtual environment (``pip install -e .[peers]``; see
``docs/accuracy.md``), not in meshops': it imports numpy, meshio, torch, the peer
library and the benchmark's own reader and metric, nothing of meshops.

The job (JSON, written by :mod:`benchmarks.accuracy`) names the data folder, the
input and target fields, the train / validation / test file names (the validation
files are the ones ``meshops train`` held out), the budget in minutes, the threads,
the seed and the output file. The recipe, the same for both peers:

* positions scaled to the training meshes' bounding box: to ``[0, 1]^2`` for
  Transolver, by one factor (the longest side to 1, the aspect ratio kept) for GINO,
  whose latent grid covers the box at one spacing along both axes; inputs and targets
  standardised per channel over the training nodes (GINO's distance inputs also on its
  latent grid, its latent features, as in neuraloperator's car example);
* the loss is the benchmark's metric: per-sample relative L2 with the P1 lumped-mass
  weights, in physical units, of each target field (the job's ``fields``), averaged
  over the fields;
* with the job's ``epochs``, that many epochs (a fixed amount of work, whatever the
  load of the machine); otherwise the number of steps that fit the budget is estimated
  from the first steps and a timed validation pass (the budget is wall time, or CPU
  seconds of the process with the job's ``"clock": "cpu"``, for validation probes on a
  shared machine), and training stops at the budget in any case; the steps set the
  schedule's length (one-cycle for Transolver, halving steps for GINO, as in their
  examples);
* the validation files are scored about ten times over the run, evenly spaced (fewer
  when ten passes would take more than a quarter of the budget), and the
  best-scoring weights are kept; the test files are predicted once, with those
  weights.

Writes ``OUT.npz`` (one ``[N, C]`` array per test file name), ``OUT-SPLIT.npz`` for each
split of the job's ``extra`` (the test shapes re-meshed, predicted with the same weights)
and ``OUT.json`` (the configuration, parameter count, steps, epochs, validation
history).
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.accuracy.folder import read_split, same_mesh

#: Printed when training ends and predicting begins: the benchmark's deadline
#: (``grace x budget + allowance``) holds until this line, not over the predicting.
TRAINED = "trained, predicting"

#: The peers' configurations: their own examples' architectures, scaled to a budget of
#: minutes on 2 CPU cores (stated in every result).
CONFIGS = {
    "transolver": {
        "library": "nvidia-physicsnemo", "class": "physicsnemo.models.transolver.Transolver",
        "model": {"n_layers": 4, "n_hidden": 64, "n_head": 4, "slice_num": 32,
                  "mlp_ratio": 1, "dropout": 0.0, "unified_pos": False, "use_te": False},
        # the recipe chosen on the obstacle family's validation samples by the probes that
        # chose meshops' (benchmarks/peer_probe.py; 8 recipes of 3 CPU minutes, stored in
        # benchmarks/results/peer-probes-cpu-3min.jsonl): batch 1, one-cycle 1e-3, 0.0694;
        # batch 2 at the same rate 0.0705; every cosine schedule 0.18-0.20
        "optimizer": "AdamW", "lr": 1e-3, "weight_decay": 1e-5, "schedule": "onecycle",
        "batch": 1,
    },
    # neuraloperator's GINO examples (2.0.0): the car-CFD one (config/gino_carcfd_config.py,
    # config/models.py GINO_Small3d, scripts/train_gino_carcfd.py) feeds the signed
    # distance on the latent grid as latent features; the 2-D one (GINO_Poisson2d,
    # scripts/train_poisson.py) gives the radii in a 2-D domain. docs/accuracy.md says
    # which figure comes from which; "shrunk" what the CPU budget changed.
    "gino": {
        "library": "neuraloperator", "class": "neuralop.models.GINO",
        # no normalisation in the FNO: the car's instance norm (0.249) and the Poisson
        # example's group norm (0.202) lost to none (0.158) in the probes below
        "model": {"fno_hidden_channels": 64, "fno_n_layers": 4, "fno_norm": None,
                  "fno_channel_mlp_expansion": 1.0, "fno_factorization": "tucker",
                  "fno_rank": 0.4, "in_gno_pos_embed_type": "nerf",
                  "out_gno_pos_embed_type": "nerf",
                  "in_gno_channel_mlp_hidden_layers": [80, 80, 80],
                  "out_gno_channel_mlp_hidden_layers": [512, 256]},
        # the latent grid: about this many points over the training bounding box, the
        # same spacing along both axes; FNO modes this fraction of the points per axis;
        # both GNO radii this many latent spacings
        "latent_points": 1024, "modes_per_point": 0.5, "radius_spacings": 2.0,
        # inputs that are distance fields: interpolated onto the latent grid as its
        # latent features (the car example's SDF), not fed to the input GNO
        "distance_inputs": ["sdf", "void_distance", "wall_distance"],
        # the schedule is the car example's; the rate, 3e-3 for its 1e-3, the one the
        # probes that chose Transolver's recipe chose (peer-probes-cpu-3min.jsonl, 8 GINO
        # recipes of 3 CPU minutes on obstacle's validation samples: 0.249; the car's own
        # 0.287; batch 1 one-cycle 1e-3, Transolver's, 0.258; every batch of 2 0.28-0.30)
        "optimizer": "AdamW", "lr": 3e-3, "weight_decay": 1e-4, "schedule": "step",
        "step_fraction": 50 / 301, "gamma": 0.5, "batch": 1,
        "shrunk": {
            "latent grid": "32 x 32 x 32 (car, 3-D) and 64 x 64 (Poisson 2-D) -> 1,024 "
                           "points in 2-D (64 x 16 on a 4 x 1 box)",
            "embedding frequencies": "16 (car) -> the largest count below the Nyquist "
                                     "bound of the latent grid (neuralop's embedding "
                                     "docstring): 5 for 64 points on an axis",
            "epochs": "301 (car, step every 50, halving) -> what the budget allows, the "
                      "same halving every 50/301 of the steps",
        },
    },
}


def configured(name: str, changes: dict) -> dict:
    """A copy of ``CONFIGS[name]`` with ``changes`` (a job's recipe, a probe's shrink), each
    key set where the configuration has it: in its ``model``, else at the top.

    Raises:
        ValueError: a key the configuration has nowhere (a typo would otherwise train the
            unchanged peer under a changed name).
    """
    cfg = copy.deepcopy(CONFIGS[name])
    unknown = [k for k in changes if k not in cfg and k not in cfg["model"]]
    if unknown:
        raise ValueError(f"{unknown} are not keys of {name}'s configuration "
                         f"({sorted({*cfg, *cfg['model']} - {'model', 'shrunk'})})")
    for k, v in changes.items():
        (cfg["model"] if k in cfg["model"] else cfg)[k] = v
    return cfg


def _load_torch():
    """Import torch with the workaround the CPU build needs for torchvision.

    physicsnemo imports timm, which imports torchvision; PyPI's torchvision wheels
    are linked against CUDA torch, so with the CPU build their compiled operators do
    not load and the import stops at registering fake kernels for ``torchvision::nms``
    and ``qnms``. Declaring those two (unused) operators first lets it import.
    """
    import torch

    for op in ("nms", "qnms"):
        try:
            torch.library.define(f"torchvision::{op}",
                                 "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:  # already there (a torchvision whose ops load)
            pass
    return torch


def _fast_segment_csr(torch):
    """neuraloperator's ``segment_csr`` without torch_scatter (which has no wheel for
    this torch) loops over the output rows in Python (its docstring: "mainly
    intended for running tests on CPU-only CI"); the same sum/mean by ``index_add_``
    in one call, so that GINO's speed is not a harness artefact."""

    def segment_csr(src, indptr, reduction, use_scatter=True):
        if reduction not in ("mean", "sum"):
            raise ValueError("reduce must be one of 'mean', 'sum'")
        batched = src.ndim == 3
        ptr = indptr[0] if indptr.ndim == 2 else indptr
        counts = ptr[1:] - ptr[:-1]
        seg = torch.repeat_interleave(torch.arange(len(counts), device=src.device), counts)
        dim = 1 if batched else 0
        shape = list(src.shape)
        shape[dim] = len(counts)
        out = torch.zeros(shape, dtype=src.dtype, device=src.device)
        out = out.index_add(dim, seg, src.narrow(dim, 0, len(seg)))
        if reduction == "mean":
            c = counts.clamp(min=1).to(src.dtype)
            out = out / (c[None, :, None] if batched else c[:, None])
        return out

    return segment_csr


class Data:
    """The samples of one split as tensors, normalised with the training statistics;
    with a GINO ``layout`` (:func:`gino_layout`) whose ``latent_columns`` are distance
    inputs, also those inputs on its latent grid (:func:`distance_on_grid`),
    standardised as on the nodes."""

    def __init__(self, torch, samples, stats, layout=None):
        cols = layout["latent_columns"] if layout else []
        # a surface in space has no inside to interpolate a distance in
        flat = [s for s in samples if cols and s.cells.shape[1] != s.points.shape[1] + 1]
        if flat:
            raise ValueError(f"GINO's latent distance features are interpolated in the "
                             f"mesh's cells; {flat[0].name} does not fill its domain (points "
                             f"[N, {flat[0].points.shape[1]}], cells [M, "
                             f"{flat[0].cells.shape[1]}]): give the distance as an ordinary "
                             f"input")
        self.names = [s.name for s in samples]
        self.pos = [torch.tensor((s.points - stats["p_lo"]) / stats["p_span"],
                                 dtype=torch.float32) for s in samples]
        self.x = [torch.tensor((s.inputs - stats["x_mu"]) / stats["x_sd"], dtype=torch.float32)
                  for s in samples]
        self.y = [torch.tensor(s.targets, dtype=torch.float32) for s in samples]
        self.w = [torch.tensor(s.weight / s.weight.sum(), dtype=torch.float32) for s in samples]
        self.fixed = bool(samples) and same_mesh(samples)
        self.lat = None
        if cols:
            axes = [lo + t * sp for lo, t, sp in  # physical units
                    zip(stats["p_lo"], layout["axes"], stats["p_span"])]
            mu, sd = stats["x_mu"][cols], stats["x_sd"][cols]
            self.lat = [torch.tensor((distance_on_grid(s.points, s.cells, s.inputs[:, cols],
                                                       axes) - mu) / sd, dtype=torch.float32)
                        for s in samples]

    def __len__(self):
        return len(self.names)

    def batch(self, idx):
        """Stacked ``[B, N, .]`` tensors (the samples share one mesh, or ``B = 1``): positions,
        inputs, targets, weights, and the latent features ``[B, n_1, n_2, L]`` or None."""
        import torch

        return tuple(None if t is None else torch.stack([t[i] for i in idx])
                     for t in (self.pos, self.x, self.y, self.w, self.lat))


def statistics(samples, keep_aspect: bool = False) -> dict:
    """The training statistics: positions map to ``(points - p_lo) / p_span``, the
    bounding box to ``[0, 1]`` along every axis, or (``keep_aspect``) its longest side
    to ``[0, 1]`` with one factor for all axes; inputs and targets per channel."""
    pts = np.concatenate([s.points for s in samples])
    x = np.concatenate([s.inputs for s in samples])
    y = np.concatenate([s.targets for s in samples])
    lo, span = pts.min(0), np.ptp(pts, axis=0)
    span[~(span > 0)] = 1.0
    if keep_aspect:
        span = np.full_like(span, span.max())
    x_sd, y_sd = x.std(0), y.std(0)
    x_sd[~(x_sd > 0)] = 1.0
    y_sd[~(y_sd > 0)] = 1.0
    return {"p_lo": lo, "p_span": span, "x_mu": x.mean(0), "x_sd": x_sd, "y_mu": y.mean(0),
            "y_sd": y_sd}


def latent_axes(extent, points: int) -> list[np.ndarray]:
    """The coordinates along each axis of a latent grid over the box ``[0, extent_i]``:
    about ``points`` in all, as many per axis as the extent takes at one spacing for
    all axes (at least 2), so a 4 x 1 box gets 64 x 16 for 1,024."""
    extent = np.asarray(extent, np.float64)
    if extent.ndim != 1 or not (extent > 0).all() or points < 2 ** len(extent):
        raise ValueError(f"latent grid: need positive extents and at least 2 points per "
                         f"axis; got extent {extent.tolist()}, {points} points")
    h = (np.prod(extent) / points) ** (1.0 / len(extent))
    return [np.linspace(0.0, e, max(2, round(e / h))) for e in extent]


def distance_on_grid(points, cells, values, axes) -> np.ndarray:
    """Distance fields given at the nodes of a mesh of simplices (triangles in the plane,
    tetrahedra in space), evaluated on the grid of ``axes`` (``ij`` order): linear (P1)
    inside the mesh (:func:`benchmarks.accuracy.classical.p1_search`); at a grid point
    outside it (in a hole, a cavity or a body), the nearest node's value less the
    distance to that node, the field continued as a signed distance (negative inside a
    body, as neuraloperator's car example's SDF).

    Shapes:
        points ``[N, d]``, cells ``[M, d + 1]``, values ``[N, K]``, axes ``d`` arrays
        ``[n_i]`` -> ``[n_1, ..., n_d, K]``.
    """
    from scipy.spatial import cKDTree

    from benchmarks.accuracy.classical import p1_search

    points, values = np.asarray(points, np.float64), np.asarray(values, np.float64)
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))
    out, found = p1_search(points, np.asarray(cells), values, grid)
    if not found.all():
        dist, near = cKDTree(points).query(grid[~found])
        out[~found] = values[near] - dist[:, None]
    return out.reshape(*(len(t) for t in axes), values.shape[1])


def gino_layout(cfg: dict, extent, inputs: list, k_in: int) -> dict:
    """GINO's latent grid and constructor arguments for positions in the box
    ``[0, extent_i]`` and the job's ``inputs`` (``k_in`` channels): the grid
    (:func:`latent_axes`, ``cfg["latent_points"]``), FNO modes ``cfg["modes_per_point"]``
    of its points per axis, both radii ``cfg["radius_spacings"]`` of its spacing, NeRF
    frequencies below the grid's Nyquist bound; the distance inputs
    (``cfg["distance_inputs"]``) as latent features, the other inputs to the input GNO
    (the 2-D example's ``in_channels == fno_in_channels``), or, without other inputs,
    its kernel alone into 3 channels (the car example).

    Returns ``axes`` (:func:`latent_axes`), ``grid [G, 2]`` (their points, ``ij``
    order), ``shape``, ``x_columns``, ``latent_columns`` and ``kwargs`` for ``GINO``.
    """
    axes = latent_axes(extent, int(cfg["latent_points"]))
    shape = [len(t) for t in axes]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))
    dist = [i for i, n in enumerate(inputs) if n in cfg["distance_inputs"]]
    if dist and k_in != len(inputs):
        raise ValueError(f"GINO: distance inputs {[inputs[i] for i in dist]} among inputs "
                         f"{inputs} of {k_in} channels: cannot tell their columns")
    x_cols = [i for i in range(k_in) if i not in dist]
    spacing = max(float(t[1] - t[0]) for t in axes)
    radius = float(cfg["radius_spacings"]) * spacing
    kwargs = dict(cfg["model"], in_channels=len(x_cols), gno_coord_dim=len(axes),
                  fno_n_modes=tuple(max(2, round(cfg["modes_per_point"] * n)) for n in shape),
                  in_gno_radius=radius, out_gno_radius=radius,
                  gno_embed_channels=max(1, math.ceil(math.log2(max(shape) / 2))),
                  fno_in_channels=len(x_cols) or 3,
                  latent_feature_channels=len(dist) or None,
                  gno_use_open3d=False, gno_use_torch_scatter=False)
    return {"axes": axes, "grid": grid, "shape": shape, "x_columns": x_cols,
            "latent_columns": dist, "kwargs": kwargs}


def build(torch, name: str, cfg: dict, k_in: int, c_out: int, layout=None, dim: int = 2):
    """The peer's network (``dim``: the points' dimension, 2 or 3); GINO's arguments from
    ``layout`` (:func:`gino_layout`)."""
    if name == "transolver":
        from physicsnemo.models.transolver import Transolver

        return Transolver(functional_dim=k_in, out_dim=c_out, embedding_dim=dim,
                          **cfg["model"])
    import neuralop.layers.integral_transform as it
    from neuralop.models import GINO

    it.segment_csr = _fast_segment_csr(torch)
    kw = dict(layout["kwargs"])
    # GNOBlock adds the kernel's input and output widths to these lists in place: copies,
    # so that the recorded configuration keeps the hidden widths
    kw["in_gno_channel_mlp_hidden_layers"] = list(kw["in_gno_channel_mlp_hidden_layers"])
    kw["out_gno_channel_mlp_hidden_layers"] = list(kw["out_gno_channel_mlp_hidden_layers"])
    return GINO(out_channels=c_out, **kw)


class Peer:
    """A peer model with the benchmark's normalisation around it."""

    def __init__(self, torch, name, cfg, stats, k_in, c_out, layout=None):
        self.torch, self.name, self.layout = torch, name, layout
        self.net = build(torch, name, cfg, k_in, c_out, layout, dim=len(stats["p_lo"]))
        self.y_mu = torch.tensor(stats["y_mu"], dtype=torch.float32)
        self.y_sd = torch.tensor(stats["y_sd"], dtype=torch.float32)
        if layout is not None:
            self.latent = torch.tensor(layout["grid"].reshape(*layout["shape"], -1),
                                       dtype=torch.float32)[None]

    def __call__(self, pos, x, lat=None):
        """Physical-unit prediction ``[B, N, C]`` of ``pos [B, N, 2]``, ``x [B, N, K]`` and,
        for GINO, the latent features ``lat [B, n_1, n_2, L]`` (or None)."""
        if self.name == "transolver":
            return self.net(x, pos) * self.y_sd + self.y_mu
        cols = self.layout["x_columns"]
        if not cols and len(pos) > 1:  # the kernel-only input GNO is one sample's
            return self.torch.cat([self(pos[i:i + 1], x[i:i + 1],
                                        None if lat is None else lat[i:i + 1])
                                   for i in range(len(pos))])
        # GINO batches samples of one geometry
        out = self.net(input_geom=pos[:1], latent_queries=self.latent, output_queries=pos[:1],
                       x=x[..., cols] if cols else None, latent_features=lat)
        return out * self.y_sd + self.y_mu


def rel_l2(pred, y, w, columns: list):
    """Per-sample weighted relative L2 of each field (``columns``: the channels of each),
    averaged over the fields: ``[B]``, the benchmark's metric
    (:func:`benchmarks.accuracy.metric.field_errors`)."""
    per = []
    for cols in columns:
        num = (w[..., None] * (pred[..., cols] - y[..., cols]) ** 2).sum((1, 2))
        den = (w[..., None] * y[..., cols] ** 2).sum((1, 2)).clamp(min=1e-30)
        per.append((num / den).sqrt())
    return sum(per) / len(per)


def evaluate(torch, peer, data: Data, columns: list, chunk: int = 16) -> tuple[float, list]:
    """Mean error and ``[N, C]`` predictions of every sample (``chunk`` samples per
    forward on a shared mesh, one at a time otherwise)."""
    errs, preds = [], []
    step = chunk if data.fixed else 1
    with torch.no_grad():
        for start in range(0, len(data), step):
            pos, x, y, w, lat = data.batch(list(range(start, min(start + step, len(data)))))
            p = peer(pos, x, lat)
            errs += rel_l2(p, y, w, columns).tolist()
            preds += [q.double().numpy() for q in p]
    return float(np.mean(errs)), preds


def schedule(torch, opt, cfg: dict, total: int):
    """The learning-rate schedule over ``total`` steps: one-cycle (Transolver), cosine,
    or halving (``cfg["gamma"]``) every ``cfg["step_fraction"]`` of the steps (GINO's
    car example: every 50 of 301 epochs)."""
    lr = torch.optim.lr_scheduler
    if cfg["schedule"] == "onecycle":
        return lr.OneCycleLR(opt, max_lr=cfg["lr"], total_steps=total)
    for g in opt.param_groups:
        g["lr"] = cfg["lr"]
    if cfg["schedule"] == "step":
        return lr.StepLR(opt, step_size=max(1, round(cfg["step_fraction"] * total)),
                         gamma=cfg["gamma"])
    if cfg["schedule"] == "cosine":
        return lr.CosineAnnealingLR(opt, T_max=total)
    raise ValueError(f"schedule {cfg['schedule']!r}: expected onecycle, step or cosine")


def run(job: dict) -> dict:
    torch = _load_torch()
    torch.set_num_threads(int(job["threads"]))
    torch.manual_seed(int(job["seed"]))
    rng = np.random.default_rng(int(job["seed"]))
    name = job["model"]
    cfg = configured(name, job.get("config") or {})
    budget = 60.0 * float(job["minutes"])
    # the budget's clock: wall time, or (validation probes on a shared machine, see
    # benchmarks/family_probe.py) CPU seconds of the process
    clock = time.process_time if job.get("clock") == "cpu" else time.perf_counter
    t_read = time.perf_counter()
    args = (job["data"], job["inputs"], job["targets"])
    train_s = read_split(*args[:1], "train", *args[1:], names=job["train"])
    val_s = read_split(*args[:1], "train", *args[1:], names=job["val"])
    # no test files: a validation probe (benchmarks/family_probe.py), which never reads them
    test_s = read_split(*args[:1], "test", *args[1:], names=job["test"]) if job["test"] else []
    # GINO: one scale for both axes (its latent grid keeps the domain's aspect ratio)
    stats = statistics(train_s, keep_aspect=name == "gino")
    k_in = train_s[0].inputs.shape[1]
    layout = None
    if name == "gino":
        layout = gino_layout(cfg, np.ptp(np.concatenate([s.points for s in train_s]), 0)
                             / stats["p_span"], list(job["inputs"]), k_in)
        cfg["derived"] = {k: v for k, v in layout["kwargs"].items() if k not in cfg["model"]}
        cfg["derived"].update(latent_grid=layout["shape"], fno_n_modes=list(
            layout["kwargs"]["fno_n_modes"]), latent_inputs=[job["inputs"][i] for i in
                                                             layout["latent_columns"]])
    train, val, test = (Data(torch, s, stats, layout) for s in (train_s, val_s, test_s))
    columns = list((job.get("fields") or {"all": list(range(train_s[0].targets.shape[1]))})
                   .values())
    read_s = time.perf_counter() - t_read
    print(f"{name}: read {len(train_s)} + {len(val_s)} + {len(test_s)} files in {read_s:.0f} s",
          flush=True)
    t_start = clock()  # the budget is for training: from here to the test
    peer = Peer(torch, name, cfg, stats, k_in, train_s[0].targets.shape[1], layout)
    n_params = sum(p.numel() for p in peer.net.parameters())
    opt = torch.optim.AdamW(peer.net.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    bs = cfg["batch"] if train.fixed else 1
    accumulate = 1 if train.fixed else cfg["batch"]  # the same samples per update either way
    steps_per_epoch = max(1, len(train) // (bs * accumulate))

    def batches():
        while True:
            order = rng.permutation(len(train))
            for s in range(steps_per_epoch):
                chunk = order[s * bs * accumulate:(s + 1) * bs * accumulate]
                yield [chunk[a * bs:(a + 1) * bs] for a in range(accumulate)]

    def step(groups):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for idx in groups:
            pos, x, y, w, lat = train.batch(list(idx))
            loss = rel_l2(peer(pos, x, lat), y, w, columns).mean() / len(groups)
            loss.backward()
            total += loss.item()
        opt.step()
        return total

    # The first steps (at a tenth of the learning rate; the first one, which pays for
    # lazy initialisation, untimed) time a step; one validation pass times the
    # evaluation; then the schedule is laid over the steps that fit.
    it = batches()
    for g in opt.param_groups:
        g["lr"] = cfg["lr"] / 10
    probe = 3
    losses = [step(next(it))]
    t0 = clock()
    losses += [step(next(it)) for _ in range(probe - 1)]
    t_step = (clock() - t0) / (probe - 1)
    t1 = clock()
    best_val, _ = evaluate(torch, peer, val, columns)
    t_val = clock() - t1
    best_state, best_at = copy.deepcopy(peer.net.state_dict()), probe
    if job.get("epochs"):  # a fixed amount of work: the clock decides nothing
        budget = math.inf
        total = max(1, int(job["epochs"]) * steps_per_epoch - probe)
        n_val = min(10, total)
    else:
        left = budget - (clock() - t_start)
        # About ten validations, evenly spaced, taking at most a quarter of the budget.
        n_val = max(1, min(10, int(0.25 * left / max(t_val, 1e-9))))
        total = max(1, int((left - n_val * t_val) / t_step))
    val_every = max(1, math.ceil(total / n_val))
    sched = schedule(torch, opt, cfg, total)
    print(f"{name}: {n_params:,} parameters; {t_step:.3f} s per step of {bs * accumulate}, "
          f"{t_val:.1f} s per validation; {total} more steps "
          + (f"({job['epochs']} epochs)" if job.get("epochs") else
             f"fit the {budget / 60:g}-minute budget")
          + f", validating every {val_every}", flush=True)
    history = [{"step": probe, "val": best_val, "s": round(clock() - t_start, 1)}]
    done, stopped = 0, False
    while done < total:
        losses.append(step(next(it)))
        done += 1
        if done < total:
            sched.step()
        if done % val_every == 0 or done == total:
            if clock() - t_start > budget:
                stopped = True
                break
            v, _ = evaluate(torch, peer, val, columns)
            history.append({"step": probe + done, "train": float(np.mean(losses[-val_every:])),
                            "val": v, "s": round(clock() - t_start, 1)})
            print(f"{name}: step {probe + done}/{probe + total} train {history[-1]['train']:.4f} "
                  f"val {v:.4f} ({history[-1]['s']:.0f} s)", flush=True)
            if v < best_val:
                best_val, best_state, best_at = v, copy.deepcopy(peer.net.state_dict()), \
                    probe + done
        if clock() - t_start > budget:
            stopped = True
            break
    train_s_wall = clock() - t_start
    extra = job.get("extra") or {}
    print(f"{name}: {TRAINED}: {len(test)} test and "
          f"{sum(len(v) for v in extra.values())} re-meshed files", flush=True)
    peer.net.load_state_dict(best_state)
    _, preds = evaluate(torch, peer, test, columns) if len(test) else (None, [])
    out = Path(job["out"])
    np.savez(out.with_suffix(".npz"), **dict(zip(test.names, preds)))
    for split, names in extra.items():
        samples = Data(torch, read_split(job["data"], split, *args[1:], names=names), stats,
                       layout)
        _, preds = evaluate(torch, peer, samples, columns)
        np.savez(out.with_name(f"{out.name}-{split}.npz"), **dict(zip(samples.names, preds)))
    summary = {"model": name, "config": cfg, "parameters": int(n_params),
               "torch": torch.__version__, "threads": torch.get_num_threads(),
               "batch": bs, "accumulate": accumulate, "steps": probe + done,
               "planned_steps": probe + total, "epochs": round((probe + done) / steps_per_epoch, 2),
               "validate_every": val_every, "best_step": best_at, "best_val": best_val,
               "stopped_at_budget": stopped, "read_s": round(read_s, 1),
               "train_wall_s": round(train_s_wall, 1), "history": history}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.accuracy.peer_train JOB.json", file=sys.stderr)
        return 2
    summary = run(json.loads(Path(argv[0]).read_text()))
    print(f"{summary['model']}: {summary['parameters']:,} parameters, {summary['steps']} steps "
          f"({summary['epochs']} epochs) in {summary['train_wall_s']:.0f} s; best validation "
          f"{summary['best_val']:.4f} at step {summary['best_step']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

