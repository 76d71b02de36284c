"""Steps shared by the example pipelines: arguments, training, evaluation, figures, .vtu.

Each example (``elasticity.py``, ``airfoil.py``) loads its data, then calls
:func:`run`, which holds out a validation split of the training samples, trains a
model with :class:`meshops.training.Trainer` (the validation error picks
``best.pt``; the test samples play no part), evaluates that checkpoint on the
test samples once, next to three baselines that need no training
(:mod:`meshops.training.baselines`), and writes a figure and the test predictions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import meshops.models  # noqa: F401  (registers the models)
from meshops.fitting.defaults import choose_defaults
from meshops.inference.plot import plot_comparisons
from meshops.mesh.io import write_mesh
from meshops.models import NeuralOperator, get_model
from meshops.training import RelativeLpLoss, Trainer
from meshops.training.baselines import baselines, error_stats, format_table, per_sample_errors
from meshops.training.seed import seed_everything
from meshops.training.splits import validation_split
from meshops.utils.progress import on_terminal

# The published PiT recipe (Chen & Wu, ICLR 2024, appendix E.1): Adam (no weight
# decay is stated, so none), learning rate 1e-3 with cosine annealing, 500 epochs,
# the mean relative L2 error over the points (unweighted) as the loss, 1,000
# training samples, and no validation split (a train-test setting: the model at the
# end of training is tested). The batch size and the model are per benchmark
# (Tables 6-9), in each example's FULL_* settings.
PAPER_RECIPE = {"lr": 1e-3, "weight_decay": 0.0, "val_fraction": 0.0, "unweighted_loss": True}
# The quicker CPU default: Adam with an L2 penalty of 1e-4, and 10 % of the training
# samples held out to pick the checkpoint.
DEFAULT_RECIPE = {"lr": 1e-3, "weight_decay": 1e-4, "val_fraction": 0.1}


def parser(description: str, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="folder with the Geo-FNO .npy files; without it the offline "
                        "STAND-IN data set is generated (and cached)")
    p.add_argument("--model", default="auto",
                   help="auto (default: reduced_basis when the samples are a parametric "
                        "study on corresponding meshes, pit otherwise, as meshops train "
                        "chooses), reduced_basis, pit, transformer_no, galerkin_transformer, "
                        "patched_transformer")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="time budget of a reduced basis' fit (default 10)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs")
    p.add_argument("--num-train", type=int, default=None, help="training samples")
    p.add_argument("--num-test", type=int, default=None, help="test samples")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per step (default 8; the paper's with --full)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="Adam's L2 penalty (default 1e-4; 0 with --full)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="share of the training samples held out to pick the checkpoint "
                        "(default 0.1; 0 with --full, as in the paper: the last epoch's "
                        "model is tested)")
    p.add_argument("--full", action="store_true",
                   help="the published PiT recipe: 1000 training / 200 test samples, 500 "
                        "epochs, Adam lr 1e-3 without weight decay, cosine schedule, "
                        "unweighted relative L2 loss, the paper's batch size and model "
                        "(for a GPU)")
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
          quick: tuple[int, int, int], full_batch_size: int = 8) -> tuple[int, int, int]:
    """(num_train, num_test, epochs) from the mode, overridden by explicit flags.

    Also fills the training options left unset (``lr``, ``weight_decay``,
    ``val_fraction``, ``batch_size``, ``unweighted_loss``) from
    :data:`PAPER_RECIPE` with ``--full`` and from :data:`DEFAULT_RECIPE` otherwise.
    """
    recipe = PAPER_RECIPE if args.full else DEFAULT_RECIPE
    for key in ("lr", "weight_decay", "val_fraction"):
        if getattr(args, key) is None:
            setattr(args, key, recipe[key])
    if args.batch_size is None:
        args.batch_size = full_batch_size if args.full else 8
    args.unweighted_loss = args.unweighted_loss or recipe.get("unweighted_loss", False)
    n_train, n_test, epochs = full if args.full else quick if args.quick else default
    return (args.num_train or n_train, args.num_test or n_test, args.epochs or epochs)


def split_blocks(path, num_samples: int, n_train: int, n_test: int,
                 published_test_start: int) -> tuple[range, range]:
    """Train and test blocks of a benchmark file holding ``num_samples`` samples.

    Training samples are ``[:n_train]``; the test block is the first ``n_test`` of
    the published test block (which starts at ``published_test_start``) when the
    file holds it, and otherwise the last ``n_test`` samples, never overlapping the
    training block. Exits with a one-line error when the file is too small.
    """
    if n_train < 1 or n_test < 1:
        fail(f"--num-train and --num-test must be positive, got {n_train} and {n_test}")
    if n_train + n_test > num_samples:
        fail(f"{path}: the files hold {num_samples} samples, fewer than --num-train "
             f"{n_train} + --num-test {n_test}; pass smaller --num-train/--num-test")
    start = published_test_start
    if not n_train <= start <= num_samples - n_test:
        start = num_samples - n_test
    return range(n_train), range(start, start + n_test)


def fail(message: str) -> None:
    """Exit with ``<script>: error: message`` and status 2, as argparse does."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _train(args, sample, fit, val, model_config, metadata, title, num_test):
    """A neural operator trained by the :class:`Trainer`; ``best.pt`` written."""
    out: Path = args.out
    model = get_model(args.model, in_channels=sample.x.shape[1], out_channels=sample.y.shape[1],
                      pos_dim=sample.pos.shape[1], **model_config.get(args.model, {}))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{title}: {len(fit)} training + {len(val or [])} validation / {num_test} test "
          f"samples, {sample.num_nodes} points per sample, {args.model} with "
          f"{n_params:,} parameters")
    trainer = Trainer(model, fit, val, epochs=args.epochs, batch_size=args.batch_size,
                      lr=args.lr, weight_decay=args.weight_decay, optimizer="adam",
                      scheduler="cosine", seed=args.seed, device=args.device, out_dir=out,
                      loss=RelativeLpLoss(quadrature=not args.unweighted_loss),
                      metadata=metadata,
                      # bars on a terminal only; a log gets the Trainer's line per epoch
                      progress=on_terminal())
    history = trainer.fit()
    if val is None:
        model.save(out / "best.pt", **metadata, epoch=trainer.epoch, metric=None, val=None,
                   selected="last epoch (no validation split)")
        return model, history, f"the model after epoch {trainer.epoch} (no validation split)"
    return model, history, (f"epoch {trainer.best['epoch']} by validation {trainer.metric} "
                            f"{trainer.best['value']:.4f} on {len(val)} held-out training "
                            f"samples")


def _fit_reduced_basis(args, fit, val, metadata, title, num_test):
    """A :class:`~meshops.models.ReducedBasis` fitted within ``args.minutes``, its
    regression chosen on ``val``, refitted on ``fit + val``; ``best.pt`` written."""
    from meshops.fitting.reduced_basis import fit_reduced_basis

    if not val:
        fail("the reduced basis chooses its regression on validation samples: "
             "--val-fraction must be > 0")
    print(f"{title}: {len(fit)} training + {len(val)} validation / {num_test} test samples, "
          f"{fit[0].num_nodes} points per sample, a reduced basis (a parametric study)")
    args.out.mkdir(parents=True, exist_ok=True)
    model, report = fit_reduced_basis(fit, val, minutes=args.minutes, seed=args.seed,
                                      log=print)
    lines = report.lines()
    print(lines[0])
    model.save(args.out / "best.pt", **metadata, epoch=None, metric="l2",
               val={"l2_mean": min(c.mean for c in report.candidates)}, selected=lines[-1])
    return model, [], lines[-1].removeprefix("chosen: ")


def run(args, train, test, *, target: str, model_config: dict, title: str,
        window=None, inputs: tuple = ()) -> dict:
    """Fit ``args.model`` on ``train``, evaluate on ``test``, write results to ``args.out``.

    ``--model auto`` (the default) is what ``meshops train`` chooses: a reduced basis
    for a parametric study (corresponding meshes, a parameter vector per sample), PiT
    otherwise. A fraction ``args.val_fraction`` of ``train`` (drawn from ``args.seed``)
    is held out to pick ``best.pt`` (the epoch, or the reduced basis' regression, which
    is then refitted on all of ``train``); with none held out, ``best.pt`` is the model
    after the last epoch. The test samples are used once, at the end, to evaluate that
    model and the baselines (fitted on all of ``train``).

    Returns the summary written to ``args.out/summary.json``.
    """
    # Right before the model is built, whatever loading the data drew (a stand-in
    # generated now or read from the cache): its initial weights depend on the
    # seed alone. The Trainer seeds again for dropout and the data order.
    seed_everything(args.seed)
    out: Path = args.out
    sample = train[0]
    if args.model == "auto":
        args.model = "pit" if args.full else choose_defaults(train)[0]
    try:
        fit_idx, val_idx = validation_split(len(train), args.val_fraction, args.seed)
    except ValueError as e:
        fail(f"--val-fraction: {e}")
    fit = [train[i] for i in fit_idx]
    val = [train[i] for i in val_idx] or None
    metadata = {"inputs": list(inputs), "targets": [target], "example": title}
    start = time.perf_counter()
    if args.model == "reduced_basis":
        model, history, selected = _fit_reduced_basis(args, fit, val, metadata, title,
                                                      len(test))
    else:
        model, history, selected = _train(args, sample, fit, val, model_config, metadata,
                                          title, len(test))
    n_params = sum(p.numel() for p in model.parameters())
    minutes = (time.perf_counter() - start) / 60

    # The test samples' only use: the selected model and the baselines, once.
    best = NeuralOperator.from_checkpoint(out / "best.pt")
    preds = [best.predict(s) for s in test]
    model_errors = per_sample_errors(preds, test)
    metric = "l2_unweighted" if args.unweighted_loss else "l2"
    errors = model_errors["l2"]
    # Median and worst among the samples whose relative error is defined (NaN: a
    # target that is zero everywhere); all samples when none is.
    ranked = np.flatnonzero(~np.isnan(errors)) if (~np.isnan(errors)).any() \
        else np.arange(len(errors))
    order = ranked[np.argsort(errors[ranked])]
    median, worst = int(order[len(order) // 2]), int(order[-1])
    figure = plot_comparisons(
        [(test[i], test[i].y[:, 0], preds[i][:, 0], label, target)
         for i, label in ((median, "median"), (worst, "worst"))],
        out / "test_samples.png", title=f"{title}: test samples (truth, prediction, error)",
        window=window)
    pred_dir = out / "predictions"
    for i, s in enumerate(test):
        write_mesh(pred_dir / f"test_{i:04d}.vtu", s,
                   point_data={target: s.y[:, 0], f"{target}_pred": preds[i][:, 0]})
    # The baselines see every training sample (the validation ones too), as a user's
    # classical model would.
    base = baselines(train, test)
    stats = {m: error_stats(v) for m, v in model_errors.items()}

    fitted = args.model == "reduced_basis"  # no epochs, no optimiser: a fit
    summary = {
        "example": title, "model": args.model, "parameters": n_params,
        "num_train": len(train), "num_test": len(test),
        "epochs": None if fitted else args.epochs,
        "minutes": round(minutes, 2),
        "test_relative_l2_mean": stats["l2"]["mean"],
        "test_relative_l2_median": stats["l2"]["median"],
        "test_relative_l2_worst": stats["l2"]["worst"],
        "test": stats,
        "selected": selected, "num_val": len(val_idx), "val_fraction": args.val_fraction,
        "recipe": {"fit": "POD modes and the regression of their coefficients chosen on "
                          "validation", "minutes": args.minutes} if fitted else
                  {"lr": args.lr, "weight_decay": args.weight_decay, "optimizer": "adam",
                   "scheduler": "cosine", "batch_size": args.batch_size,
                   "loss": "unweighted relative L2" if args.unweighted_loss
                   else "quadrature-weighted relative L2"},
        "baselines": {b.name: b.summary() for b in base},
        "final_train_loss": history[-1].get("train_loss") if history else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    label = "unweighted" if args.unweighted_loss else "quadrature-weighted"
    print(f"selected {selected}; test relative L2 ({label}) on {len(test)} test samples "
          f"[{minutes:.1f} min]:")
    rows = [(f"{args.model} ({'fitted' if fitted else 'trained'})", stats[metric], "")]
    rows += [(b.name, error_stats(b.errors[metric]) if b.available else None, b.note)
             for b in base]
    print(format_table(rows, f"{label}, {len(test)} test samples"))
    print(f"wrote {out / 'best.pt'}, {figure}, {len(test)} .vtu files in {pred_dir}")
    return summary
