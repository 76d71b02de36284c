"""The real FEM development data of ``shared/data/`` as parametric sets (mesh folders).

Two published parametric finite-element data sets, stored as compressed NumPy
archives (keys ``params [S, K]``, ``points [N, 2]``, ``triangles [T, 3]`` and the
fields; one mesh shared by all samples; see ``shared/data/README.md``):

* :func:`navier_stokes_set`: steady flow over a backward-facing step
  (``navier_stokes_backstep.npz``): 500 samples, 1 parameter ``mu0``, targets
  ``vx, vy, p`` on 1,639 nodes. Split: ``permutation(500)`` with seed 0, the first
  400 for training, the other 100 for testing.
* :func:`heat_set`: transient heat transfer (``unsteady_heat.npz``) seen as a
  *parametric* set: 100 trajectories x 100 time steps of ``u`` on 441 nodes, 2
  parameters ``mu0, mu1``; the time-step index becomes a third parameter
  ``step`` (the archive stores no physical time), and every ``every``-th step
  (default 5: steps 0, 5, ..., 95, 20 per trajectory) is a sample. The split is by
  **trajectory**: ``permutation(100)`` with seed 0, the first 80 trajectories for
  training (1,600 samples) and the other 20 for testing (400), so that no test
  sample shares a trajectory with a training one.

Each sample is a :class:`meshops.MeshData` whose ``fields`` hold the parameters as
constant point fields and the targets; ``params [1, K]``. Write them as folders
with :func:`data_adapters.parametric.write_parametric_folders`, or from the shell::

    python -m data_adapters.fem_npz navier_stokes dev/navier_stokes
    python -m data_adapters.fem_npz heat dev/heat --every 5
    meshops train --data dev/navier_stokes/train --inputs mu0 --targets vx,vy,p

These data are for development and benchmarks; the project's tests generate their
own data and never read them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch

from data_adapters.parametric import (
    ParametricSet,
    parametric_sample,
    permutation_split,
    write_parametric_folders,
)
from meshops.datasets.folder import as_float_dtype
from meshops.errors import MeshError

#: Where the archives are looked for: ``$MESHOPS_DEV_DATA``, else ``shared/data`` beside
#: the repository (the layout of this project's work machines).
ENV_VAR = "MESHOPS_DEV_DATA"
FILES = {"navier_stokes": "navier_stokes_backstep.npz", "heat": "unsteady_heat.npz"}
VERSION = 1


def data_dir() -> Path:
    """The folder of the archives (see :data:`ENV_VAR`)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    here = Path(__file__).resolve()
    for parent in here.parents:  # /work/<tree>/data_adapters -> /work/shared/data
        cand = parent / "shared" / "data"
        if (cand / FILES["navier_stokes"]).is_file():
            return cand
    return Path("shared") / "data"


def _load(path, keys) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise MeshError(f"{path}: no such file (set ${ENV_VAR} to the folder of the archives)")
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in keys if k not in z.files]
        if missing:
            raise MeshError(f"{path}: missing array(s) {missing}; found {z.files}")
        return {k: z[k] for k in keys}


def navier_stokes_set(path=None, n_train: int = 400, seed: int = 0,
                      dtype=torch.float64) -> ParametricSet:
    """The backward-facing-step set (see the module docstring).

    Args:
        path: The archive (default ``data_dir() / "navier_stokes_backstep.npz"``).
        n_train: Training samples (the first of the permutation).
        seed: Seed of the permutation.
        dtype: Floating dtype of the samples' tensors.

    Returns:
        A :class:`ParametricSet` with inputs ``["mu0"]``, targets ``["vx", "vy", "p"]``.

    Shapes:
        item: pos ``[1639, 2]``, x ``[1639, 1]``, y ``[1639, 3]``, params ``[1, 1]``
    """
    path = Path(path) if path is not None else data_dir() / FILES["navier_stokes"]
    d = _load(path, ["params", "points", "triangles", "vx", "vy", "p"])
    dtype = as_float_dtype(dtype)
    names = [f"mu{k}" for k in range(d["params"].shape[1])]
    samples = [parametric_sample(d["points"], d["triangles"], names, d["params"][s],
                       {k: d[k][s] for k in ("vx", "vy", "p")},
                       f"{path.name} sample {s}", dtype, s)
               for s in range(len(d["params"]))]
    train, test = permutation_split(len(samples), n_train, seed)
    return ParametricSet(
        "navier_stokes", samples, names, ["vx", "vy", "p"], train, test,
        description=(f"Steady incompressible flow over a backward-facing step ({path.name}): "
                     f"{len(d['points'])} nodes, {len(d['triangles'])} P1 triangles, 1 "
                     f"parameter; split permutation(seed {seed}), first {n_train} train."),
        info={"source": path.name, "seed": seed, "n_train": n_train,
              "key": {"set": "navier_stokes", "version": VERSION, "source": path.name,
                      "n_train": n_train, "seed": seed}})


def heat_set(path=None, n_train: int = 80, seed: int = 0, every: int = 5, first: int = 0,
             dtype=torch.float64) -> ParametricSet:
    """The transient heat set as a parametric one (see the module docstring).

    Args:
        path: The archive (default ``data_dir() / "unsteady_heat.npz"``).
        n_train: Training trajectories (the first of the permutation).
        seed: Seed of the permutation of the trajectories.
        every: Keep every ``every``-th time step...
        first: ...starting at this one (steps ``first, first + every, ...``).
        dtype: Floating dtype of the samples' tensors.

    Returns:
        A :class:`ParametricSet` with inputs ``["mu0", "mu1", "step"]``, target
        ``["u"]``; sample ``traj * T + step`` is named by that number (``T`` = 100).

    Shapes:
        item: pos ``[441, 2]``, x ``[441, 3]``, y ``[441, 1]``, params ``[1, 3]``
    """
    path = Path(path) if path is not None else data_dir() / FILES["heat"]
    d = _load(path, ["params", "points", "triangles", "u"])
    n_traj, n_steps = d["u"].shape[:2]
    if every < 1 or not 0 <= first < n_steps:
        raise MeshError(f"every must be >= 1 and first in 0..{n_steps - 1}, got {every}, {first}")
    steps = list(range(first, n_steps, every))
    dtype = as_float_dtype(dtype)
    names = [f"mu{k}" for k in range(d["params"].shape[1])] + ["step"]
    train_traj, test_traj = permutation_split(n_traj, n_train, seed)
    samples, ids, pos = [], [], {}
    for traj in range(n_traj):
        for t in steps:
            pos[traj, t] = len(samples)
            ids.append(traj * n_steps + t)
            samples.append(parametric_sample(d["points"], d["triangles"], names,
                                   [*d["params"][traj], float(t)], {"u": d["u"][traj, t]},
                                   f"{path.name} trajectory {traj} step {t}", dtype, ids[-1]))
    train = [pos[tr, t] for tr in train_traj for t in steps]
    test = [pos[tr, t] for tr in test_traj for t in steps]
    return ParametricSet(
        "heat", samples, names, ["u"], train, test, ids=ids,
        description=(f"Transient heat transfer ({path.name}) as a parametric set: "
                     f"{len(d['points'])} nodes, {len(d['triangles'])} P1 triangles, parameters "
                     f"mu0, mu1 and the time-step index 'step' (every {every}th step from "
                     f"{first}: {len(steps)} per trajectory); split by trajectory, "
                     f"permutation(seed {seed}), first {n_train} trajectories train."),
        info={"source": path.name, "seed": seed, "n_train_trajectories": n_train,
              "steps": steps, "test_trajectories": test_traj,
              "key": {"set": "heat", "version": VERSION, "source": path.name,
                      "n_train": n_train, "seed": seed, "every": every, "first": first}})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_adapters.fem_npz",
        description="Write a shared FEM archive as train/ and test/ folders of .vtu files "
                    "(parameters as constant point fields and in params.json).")
    p.add_argument("dataset", choices=sorted(FILES))
    p.add_argument("out", type=Path, help="output folder (train/, test/, dataset.json)")
    p.add_argument("--archive", type=Path, help="the .npz (default: found in shared/data or "
                                                f"${ENV_VAR})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-train", type=int, default=None,
                   help="training samples (navier_stokes, default 400) or trajectories "
                        "(heat, default 80)")
    p.add_argument("--every", type=int, default=5, help="heat: keep every k-th step (default 5)")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.dataset == "navier_stokes":
            ds = navier_stokes_set(args.archive, args.n_train or 400, args.seed)
        else:
            ds = heat_set(args.archive, args.n_train or 80, args.seed, args.every)
        root = write_parametric_folders(ds, args.out, overwrite=args.overwrite)
    except MeshError as e:
        print(f"error: {e}", file=__import__("sys").stderr)
        return 2
    print(f"wrote {len(ds.train)} training and {len(ds.test)} test files to {root}/ "
          f"(inputs {','.join(ds.param_names)}; targets {','.join(ds.targets)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
