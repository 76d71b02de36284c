"""The transient heat data of ``shared/data/unsteady_heat.npz`` as time-series folders.

The archive (see :mod:`data_adapters.fem_npz`, which reads it as a parametric set, and
the data folder's README) holds 100 trajectories of 100 time steps of a temperature
``u`` on one P1 mesh of the unit square (441 nodes, 800 triangles), each with 2
parameters ``mu0, mu1``. It stores no time values, so the time of step ``k`` is ``k``.

:func:`export_heat_series` writes what ``meshops train --series`` reads::

    OUT/train/params.csv            file,mu0,mu1 (keyed by the trajectory's folder)
    OUT/train/traj_082/u_0000.vtu   one folder of numbered files per trajectory
    ...
    OUT/test/...

with the suggested split of the trajectories (:func:`data_adapters.parametric.
permutation_split`: ``numpy.random.default_rng(seed).permutation``, seed 0, the first
``n_train`` = 80 for training, the other 20 for testing). Folders are named by the
trajectory's index in the archive (``traj_082`` is ``u[82]``).

Example::

    python -m data_adapters.unsteady_heat heat/            # the archive from data_dir()
    meshops train --series --data heat/train --inputs "" --targets u --params mu0,mu1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from data_adapters.fem_npz import FILES, _load, data_dir
from data_adapters.parametric import permutation_split
from meshops.errors import MeshError

FIELD = "u"


def export_heat_series(out, npz=None, n_train: int = 80, seed: int = 0,
                       overwrite: bool = False) -> dict[str, list[Path]]:
    """Write the archive as time-series folders ``out/train`` and ``out/test`` (see the
    module docstring); each trajectory's folder is written completely or not at all.

    Args:
        out: The output folder.
        npz: The archive (default ``data_dir() / "unsteady_heat.npz"``).
        n_train: Training trajectories (the first of the permutation).
        seed: Seed of the permutation.
        overwrite: Replace an earlier export.

    Returns:
        ``{"train": [folders], "test": [folders]}``.

    Raises:
        MeshError: a missing or malformed archive, or ``out`` already holding an
            export (unless ``overwrite``).
    """
    from meshops.datasets.params import write_param_table
    from meshops.mesh.io import mesh_from_arrays, write_mesh
    from meshops.utils.atomic import atomic_folder

    npz = Path(npz) if npz is not None else data_dir() / FILES["heat"]
    d = _load(npz, ["params", "points", "triangles", "u"])
    n_traj, n_steps, n = d["u"].shape
    if d["params"].shape[0] != n_traj or d["points"].shape[0] != n:
        raise MeshError(f"{npz}: u is {d['u'].shape} but params {d['params'].shape} and "
                        f"points {d['points'].shape}")
    out = Path(out)
    if not overwrite and any((out / split).exists() for split in ("train", "test")):
        raise MeshError(f"{out}: already holds an export (train/ or test/); pass "
                        f"overwrite=True (--overwrite) or choose another folder")
    mesh = mesh_from_arrays(d["points"], [("triangle", d["triangles"])], source=str(npz))
    width = max(3, len(str(n_traj - 1)))
    names = [f"mu{k}" for k in range(d["params"].shape[1])]
    written: dict[str, list[Path]] = {}
    train, test = permutation_split(n_traj, n_train, seed)
    for split, idx in (("train", train), ("test", test)):
        folder = out / split
        rows = {}
        written[split] = []
        for i in sorted(idx):
            name = f"traj_{i:0{width}d}"

            def write_steps(tmp: str, i=i) -> None:
                for k in range(n_steps):
                    write_mesh(Path(tmp) / f"{FIELD}_{k:04d}.vtu", mesh,
                               point_data={FIELD: d["u"][i, k]})

            written[split].append(atomic_folder(folder / name, write_steps))
            rows[name] = d["params"][i]
        write_param_table(folder, names, rows)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_adapters.unsteady_heat",
        description="Write unsteady_heat.npz as time-series folders (train/ and test/, one "
                    "folder of numbered .vtu files per trajectory, params.csv) for "
                    "meshops train --series.")
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--archive", type=Path, help="the .npz (default: found in shared/data or "
                                                "$MESHOPS_DEV_DATA)")
    p.add_argument("--n-train", type=int, default=80, help="training trajectories (80)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    w = export_heat_series(args.out, args.archive, args.n_train, args.seed, args.overwrite)
    print(f"wrote {len(w['train'])} training and {len(w['test'])} test series to {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
