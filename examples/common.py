"""Steps shared by the example pipelines: arguments, training, evaluation, figures, .vtu.

Each example (``elasticity.py``, ``airfoil.py``) loads its data, then calls
:func:`run`, which trains a model with :class:`meshops.training.Trainer`, reloads
the best checkpoint, and writes a figure and the test predictions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import meshops.models  # noqa: F401  (registers the models)
from meshops.io import write_mesh
from meshops.models import NeuralOperator, get_model
from meshops.plot import plot_comparisons
from meshops.training import RelativeLpLoss, Trainer, relative_lp
from meshops.training.seed import seed_everything


def parser(description: str, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="folder with the Geo-FNO .npy files; without it the offline "
                        "STAND-IN data set is generated (and cached)")
    p.add_argument("--model", default="pit",
                   help="pit (default), transformer_no, galerkin_transformer, patched_transformer")
    p.add_argument("--epochs", type=int, default=None, help="training epochs")
    p.add_argument("--num-train", type=int, default=None, help="training samples")
    p.add_argument("--num-test", type=int, default=None, help="test samples")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--full", action="store_true",
                   help="the published recipe: 1000 training samples, 500 epochs, Adam "
                        "lr 1e-3, cosine schedule (for a GPU)")
    p.add_argument("--quick", action="store_true",
                   help="a few samples and one epoch: checks the pipeline end to end (CI)")
    p.add_argument("--unweighted-loss", action="store_true",
                   help="per-point relative L2 as in the published benchmarks, instead of "
                        "the quadrature-weighted one")
    p.add_argument("--out", type=Path, default=Path(default_out), help="output folder")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    return p


def sizes(args, default: tuple[int, int, int], full: tuple[int, int, int],
          quick: tuple[int, int, int]) -> tuple[int, int, int]:
    """(num_train, num_test, epochs) from the mode, overridden by explicit flags."""
    n_train, n_test, epochs = full if args.full else quick if args.quick else default
    return (args.num_train or n_train, args.num_test or n_test, args.epochs or epochs)


def per_sample_errors(model: NeuralOperator, samples) -> np.ndarray:
    """Quadrature-weighted relative L2 error of each sample (physical units)."""
    errors = []
    for s in samples:
        pred = model.predict(s)
        errors.append(float(relative_lp(pred, s.y, s.weight)))
    return np.array(errors)


def run(args, train, test, *, target: str, model_config: dict, title: str,
        window=None, inputs: tuple = ()) -> dict:
    """Train ``args.model`` on ``train``, evaluate on ``test``, write results to ``args.out``.

    Returns the summary written to ``args.out/summary.json``.
    """
    # Right before the model is built, whatever loading the data drew (a stand-in
    # generated now or read from the cache): its initial weights depend on the
    # seed alone. The Trainer seeds again for dropout and the data order.
    seed_everything(args.seed)
    out: Path = args.out
    sample = train[0]
    model = get_model(args.model, in_channels=sample.x.shape[1], out_channels=sample.y.shape[1],
                      pos_dim=sample.pos.shape[1], **model_config.get(args.model, {}))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{title}: {len(train)} training / {len(test)} test samples, "
          f"{sample.num_nodes} points per sample, {args.model} with {n_params:,} parameters")

    start = time.perf_counter()
    trainer = Trainer(model, train, test, epochs=args.epochs, batch_size=args.batch_size,
                      lr=args.lr, optimizer="adam", scheduler="cosine", seed=args.seed,
                      device=args.device, out_dir=out,
                      loss=RelativeLpLoss(quadrature=not args.unweighted_loss),
                      metadata={"inputs": list(inputs), "targets": [target],
                                "example": title})
    history = trainer.fit()
    minutes = (time.perf_counter() - start) / 60

    best = NeuralOperator.from_checkpoint(out / "best.pt")
    errors = per_sample_errors(best, test)
    order = np.argsort(errors)
    median, worst = int(order[len(order) // 2]), int(order[-1])
    figure = plot_comparisons(
        [(test[i], test[i].y[:, 0], best.predict(test[i])[:, 0], label, target)
         for i, label in ((median, "median"), (worst, "worst"))],
        out / "test_samples.png", title=f"{title}: test samples (truth, prediction, error)",
        window=window)
    pred_dir = out / "predictions"
    for i, s in enumerate(test):
        write_mesh(pred_dir / f"test_{i:04d}.vtu", s,
                   point_data={target: s.y[:, 0], f"{target}_pred": best.predict(s)[:, 0]})

    summary = {
        "example": title, "model": args.model, "parameters": n_params,
        "num_train": len(train), "num_test": len(test), "epochs": args.epochs,
        "minutes": round(minutes, 2),
        "test_relative_l2_mean": float(errors.mean()),
        "test_relative_l2_median": float(np.median(errors)),
        "test_relative_l2_worst": float(errors.max()),
        "final_train_loss": history[-1].get("train_loss") if history else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"test relative L2 (quadrature-weighted): mean {summary['test_relative_l2_mean']:.4f}, "
          f"median {summary['test_relative_l2_median']:.4f}, worst "
          f"{summary['test_relative_l2_worst']:.4f}  [{minutes:.1f} min]")
    print(f"wrote {out / 'best.pt'}, {figure}, {len(test)} .vtu files in {pred_dir}")
    return summary
