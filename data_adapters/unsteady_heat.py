"""The transient heat data of ``../shared/data/unsteady_heat.npz`` as time-series folders.

The archive (converted from the ``smithers`` package, see the data folder's README)
holds 100 trajectories of 100 time steps of a temperature ``u`` on one P1 mesh of the
unit square (441 nodes, 800 triangles), each with 2 parameters: keys ``params [S, 2]``,
``points [N, 2]``, ``triangles [M, 3]``, ``u [S, T, N]``. It stores no time values, so
the time of step ``k`` is ``k`` (in steps).

:func:`export_heat_series` writes what ``meshops train --series`` reads::

    OUT/train/params.csv            series,mu1,mu2
    OUT/train/traj_082/u_0000.vtu   one folder of numbered files per trajectory
    ...
    OUT/test/...

with the suggested split: a permutation of the trajectories drawn with
``numpy.random.default_rng(seed).permutation`` (seed 0), the first ``num_train`` (80)
for training and the rest for testing. Folders are named by the trajectory's index in
the archive (``traj_082`` is ``u[82]``).

Example::

    python -m data_adapters.unsteady_heat /work/shared/data/unsteady_heat.npz heat/
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from meshops.errors import MeshError

PARAM_NAMES = ("mu1", "mu2")
FIELD = "u"
KEYS = ("params", "points", "triangles", "u")


def load_unsteady_heat(path) -> dict[str, np.ndarray]:
    """The archive's arrays, checked: ``params [S, K]``, ``points [N, 2]``,
    ``triangles [M, 3]``, ``u [S, T, N]``.

    Raises:
        MeshError: a missing file or key, or arrays whose sizes disagree.
    """
    path = Path(path)
    if not path.is_file():
        raise MeshError(f"{path}: no such file")
    with np.load(path) as z:
        missing = [k for k in KEYS if k not in z]
        if missing:
            raise MeshError(f"{path}: missing array(s) {missing}; found {sorted(z.files)}")
        d = {k: z[k] for k in KEYS}
    s, t, n = d["u"].shape
    if d["params"].shape[0] != s or d["points"].shape[0] != n:
        raise MeshError(f"{path}: u is {d['u'].shape} but params {d['params'].shape} and "
                        f"points {d['points'].shape}")
    return d


def split_trajectories(num: int, num_train: int = 80, seed: int = 0
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` trajectory indices: the first ``num_train`` of a permutation
    drawn with ``numpy.random.default_rng(seed)``, and the rest."""
    if not 0 < num_train < num:
        raise MeshError(f"num_train must be in 1..{num - 1}, got {num_train}")
    perm = np.random.default_rng(seed).permutation(num)
    return perm[:num_train], perm[num_train:]


def export_heat_series(npz, out, num_train: int = 80, seed: int = 0,
                       overwrite: bool = False) -> dict[str, list[Path]]:
    """Write the archive as time-series folders ``out/train`` and ``out/test`` (see the
    module docstring); each trajectory folder is written completely or not at all.

    Returns:
        ``{"train": [folders], "test": [folders]}``.

    Raises:
        MeshError: a bad archive, or ``out`` already holding an export (unless
            ``overwrite``).
    """
    from meshops._atomic import atomic_folder, atomic_write
    from meshops.io import mesh_from_arrays, write_mesh

    d = load_unsteady_heat(npz)
    out = Path(out)
    if not overwrite and any((out / split).exists() for split in ("train", "test")):
        raise MeshError(f"{out}: already holds an export (train/ or test/); pass "
                        f"overwrite=True (--overwrite) or choose another folder")
    mesh = mesh_from_arrays(d["points"], [("triangle", d["triangles"])], source=str(npz))
    width = max(3, len(str(d["u"].shape[0] - 1)))
    names = list(PARAM_NAMES) if d["params"].shape[1] == len(PARAM_NAMES) else \
        [f"mu{i + 1}" for i in range(d["params"].shape[1])]
    written: dict[str, list[Path]] = {}
    train, test = split_trajectories(d["u"].shape[0], num_train, seed)
    for split, idx in (("train", train), ("test", test)):
        folder = out / split
        rows = ["series," + ",".join(names)]
        written[split] = []
        for i in sorted(int(j) for j in idx):
            name = f"traj_{i:0{width}d}"

            def write_steps(tmp: str, i=i) -> None:
                for k, u in enumerate(d["u"][i]):
                    write_mesh(Path(tmp) / f"{FIELD}_{k:04d}.vtu", mesh,
                               point_data={FIELD: u})

            written[split].append(atomic_folder(folder / name, write_steps))
            rows.append(name + "," + ",".join(repr(float(v)) for v in d["params"][i]))
        atomic_write(folder / "params.csv",
                     lambda tmp, rows=rows: Path(tmp).write_text("\n".join(rows) + "\n"))
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Write unsteady_heat.npz as time-series folders "
                                "(train/ and test/) for meshops train --series.")
    p.add_argument("npz", help="path of unsteady_heat.npz")
    p.add_argument("out", help="output folder")
    p.add_argument("--num-train", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    w = export_heat_series(args.npz, args.out, args.num_train, args.seed, args.overwrite)
    print(f"wrote {len(w['train'])} training and {len(w['test'])} test series to {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
