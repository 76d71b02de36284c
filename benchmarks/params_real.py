"""``python -m benchmarks.params_real``: a parameter as conditioning (``--params``) against
the same parameter as a constant input field (``--inputs``), end to end through the
``meshops`` command, on the shared Navier-Stokes backward-facing step
(``../shared/data/navier_stokes_backstep.npz``: 1,639-node P1 mesh, one parameter,
fields vx, vy, p; its README's split: permutation seed 0, the first 400 samples for
training, the other 100 for testing).

The samples are written as .vtu files with the parameter both as a point field ``mu``
(constant over the mesh) and in ``params.csv``; then ``meshops train`` runs twice with
one model configuration, seed and epoch count, once with ``--inputs mu`` and once with
``--inputs "" --params mu``, and ``meshops evaluate`` scores both on the test files
(mean relative L2 over the test samples, quadrature-weighted, per field and for the
three fields together). A development check of the conditioning on real data, not a
benchmark of record: the model and budget are small (the options below).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from pathlib import Path

import numpy as np
import torch

# ../shared/data beside the repository (a checkout elsewhere passes --npz)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "navier_stokes_backstep.npz"


def write_folders(npz: Path, root: Path, num_train: int = 400) -> tuple[Path, Path]:
    """``root/train`` and ``root/test`` (.vtu files with vx, vy, p and the constant field
    mu, and params.csv), written once."""
    from meshops.datasets.folder import export_to_folder
    from meshops.mesh.io import mesh_from_arrays

    train, test = root / "train", root / "test"
    if (train / "params.csv").is_file() and (test / "params.csv").is_file():
        return train, test
    d = np.load(npz)
    order = np.random.default_rng(0).permutation(len(d["params"]))
    cells = [("triangle", d["triangles"].astype(np.int64))]
    for folder, idx in ((train, order[:num_train]), (test, order[num_train:])):
        samples = []
        for i in idx:
            mu = float(d["params"][i, 0])
            s = mesh_from_arrays(d["points"], cells, {
                "vx": d["vx"][i], "vy": d["vy"][i], "p": d["p"][i],
                "mu": np.full(len(d["points"]), mu)}, source=f"sample {i}")
            s.params = torch.tensor([[mu]], dtype=torch.float64)
            samples.append(s)
        export_to_folder(samples, folder, param_names=["mu"], overwrite=True)
    return train, test


def run(train: Path, test: Path, out: Path, how: list[str], args) -> dict:
    """Train with ``how`` (the input/parameter flags) and evaluate on ``test``."""
    from meshops import cli

    t = time.perf_counter()
    code = cli.main(["train", "--data", str(train), "--targets", "vx,vy,p", *how,
                     "--model", args.model, "--model-config", *args.model_config,
                     "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
                     "--lr", str(args.lr), "--seed", "0", "--out", str(out)])
    if code:
        raise SystemExit(f"meshops train failed ({code})")
    train_s = time.perf_counter() - t
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(["evaluate", str(out), "--data", str(test), "--json", "--no-baselines"])
    if code:
        raise SystemExit(f"meshops evaluate failed ({code})")
    fields = json.loads(buf.getvalue())["fields"]
    return {"train_s": train_s, **{k: v["l2"]["mean"] for k, v in fields.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npz", type=Path, default=DATA)
    ap.add_argument("--work", type=Path, default=Path("params_real_work"),
                    help="folder for the .vtu files and the two runs")
    # the sizes meshops train picks for a parametric study (fitting.defaults.PARAMETRIC_PIT)
    ap.add_argument("--model", default="pit")
    ap.add_argument("--model-config", nargs="+", default=["width=64", "heads=2", "blocks=2",
                                                          "num_latent=128"])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    if not args.npz.is_file():
        raise SystemExit(f"{args.npz}: not found; pass --npz PATH/navier_stokes_backstep.npz")
    train, test = write_folders(args.npz, args.work)
    rows = {}
    for name, how in (("constant field", ["--inputs", "mu"]),
                      ("conditioning", ["--inputs", "", "--params", "mu"])):
        rows[name] = run(train, test, args.work / name.replace(" ", "_"), how, args)
    print(f"# {args.model} {' '.join(args.model_config)}, {args.epochs} epochs, batch "
          f"{args.batch_size}, lr {args.lr}, seed 0; test mean relative L2 (quadrature)")
    keys = ["vx", "vy", "p", "all"]
    print(f"{'parameter as':<16}" + "".join(f"{k:>11}" for k in keys) + f"{'train s':>10}")
    for name, r in rows.items():
        print(f"{name:<16}" + "".join(f"{r[k]:>11.4e}" for k in keys) + f"{r['train_s']:>10.1f}")


if __name__ == "__main__":
    main()
