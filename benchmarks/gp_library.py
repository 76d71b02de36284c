"""``python -m benchmarks.gp_library``: meshops' Gaussian process against scikit-learn's,
on the problem the reduced basis gives it (issue 29, item 3).

    python -m benchmarks.gp_library [--datasets navier_stokes,heat,convdiff,...]
        [--repeats 3] [--data-root DIR] [--out FILE.txt]

The problem is exactly the one :func:`meshops.fitting.reduced_basis.fit_reduced_basis` hands its
``gp`` candidate: each benchmark data set's ``train/`` folder (``python -m
benchmarks.accuracy`` writes them; never ``test/``) read as ``meshops train`` reads it,
split into training and validation files as ``meshops train`` splits it (its default
``--val-fraction`` and ``--seed``), the weighted POD of the training split, and the
regression from the standardised parameters to the modal coefficients. The score is the
reduced basis' own: the per-sample relative L2 error of the reconstructed fields on the
validation split (quadrature-weighted, each target field's, averaged over the fields),
mean, median and worst.

Regressions, all with the ARD Matérn-5/2 kernel, a signal variance and a noise variance
fitted by the marginal likelihood on the same random subset of at most
:data:`meshops.reduced.gp.MAX_FIT_POINTS` points, from the same start (length scales 1,
signal 1, noise standard deviation 1e-2) and within the same bounds, and the posterior
on every training point:

* ``meshops``: :class:`meshops.reduced.gp.GaussianProcess` (torch, L-BFGS on the logs);
  the first 16 coefficients get their own hyperparameters, the rest share the 16th's;
* ``sklearn``: ``GaussianProcessRegressor(ConstantKernel() * Matern(nu=2.5,
  length_scale=[1] * D) + WhiteKernel(), normalize_y=True)``, scipy's L-BFGS-B, with the
  same per-coefficient structure;
* ``sklearn-restarts``: the same with ``n_restarts_optimizer=5`` (scikit-learn's remedy
  for a local optimum: five more starts drawn log-uniformly within the bounds);
* ``sklearn-shared``: one such regressor for all coefficients together (scikit-learn's
  multi-output fit: one set of hyperparameters for the summed likelihood).

The fit is timed on one thread (torch's and the BLAS pools' of numpy and scipy), the
median of ``--repeats`` fits, the regressions alternating; ``nlml c1`` is the negative log
marginal likelihood of the first coefficient on the fitting subset at each fit's
hyperparameters (scikit-learn's evaluation for both), which says which optimiser found
the better optimum of the same objective. Needs scikit-learn (``pip install
scikit-learn``). Take the figures on a quiet machine (docs: the QUIET protocol of the
repository's guide); the output states the load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import commit, loadavg
from benchmarks.paths import command
from meshops.reduced import gp as ours

REPO = Path(__file__).resolve().parents[1]
NAMES = ("navier_stokes", "heat", "convdiff", "materials", "boundary_layer")
METHODS = ("meshops", "sklearn", "sklearn-restarts", "sklearn-shared")
#: Random restarts of scikit-learn's optimiser in ``sklearn-restarts``.
RESTARTS = 5
#: Coefficients with their own hyperparameters (GaussianProcess.fit's default).
FITTED_OUTPUTS = 16


def load_problem(name: str, root: Path) -> dict:
    """The reduced basis' regression problem of data set ``name`` (see the module
    docstring), built as :func:`meshops.fitting.reduced_basis.fit_reduced_basis` builds it:
    standardised parameters ``x_tr [S, D]``, ``x_val [V, D]``, coefficients ``c_tr [S, R]``,
    the basis, the validation fields, the weights and the target fields."""
    from meshops.datasets.fields import TargetFields
    from meshops.datasets.samples import load_folder
    from meshops.fitting.config import TrainConfig
    from meshops.inference.predict import field_channels
    from meshops.reduced import pod_basis, sample_parameters
    from meshops.training.baselines import target_points
    from meshops.training.splits import validation_split

    folder = root / name
    meta = json.loads((folder / "dataset.json").read_text())
    cfg = TrainConfig()
    _, samples, shapes, _ = load_folder(folder / "train", meta["inputs"], meta["targets"],
                                        getattr(torch, cfg.dtype))
    fields = TargetFields.from_specs(meta["targets"], {k: field_channels(shapes[k])
                                                       for k in meta["targets"]})
    tr, val = validation_split(len(samples), cfg.val_fraction, cfg.seed)
    params = sample_parameters(samples)[0]
    y = torch.stack([s.y.to(torch.float64) for s in samples])
    w = torch.stack([target_points(samples[i])[1].to(torch.float64) for i in tr]).mean(0)
    basis = pod_basis(y[tr], w)
    spread = params[tr].std(0)
    index = [int(i) for i in torch.nonzero(spread > 0).flatten()]
    shift, scale = params[tr][:, index].mean(0), spread[index]
    return {"name": name, "x_tr": (params[tr][:, index] - shift) / scale,
            "x_val": (params[val][:, index] - shift) / scale,
            "c_tr": basis.coefficients(y[tr], w), "basis": basis, "y_val": y[val], "w": w,
            "fields": fields, "points": int(y.shape[1])}


def validation_errors(problem: dict, coefficients: torch.Tensor) -> np.ndarray:
    """Per-sample relative L2 errors ``[V]`` of the fields the coefficients ``[V, R]``
    give, quadrature-weighted, averaged over the target fields
    (:func:`meshops.training.loss.lp_errors`, the metric of every meshops run)."""
    from meshops.training.loss import lp_errors

    pred, y = problem["basis"].expand(coefficients), problem["y_val"]
    v, m, c = y.shape
    return lp_errors(pred.reshape(v * m, c), y.reshape(v * m, c), problem["w"].repeat(v),
                     torch.arange(v).repeat_interleave(m), fields=problem["fields"])[
        "relative"].numpy()


def _kernel(d: int):
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    # The bounds of meshops.reduced.gp: signal std <= MAX_SIGNAL, length scales <=
    # MAX_LENGTHSCALE, noise std >= MIN_NOISE; scikit-learn needs the other side too.
    return (ConstantKernel(1.0, (1e-10, ours.MAX_SIGNAL ** 2))
            * Matern(length_scale=np.ones(d), length_scale_bounds=(1e-5, ours.MAX_LENGTHSCALE),
                     nu=2.5)
            + WhiteKernel(1e-4, (ours.MIN_NOISE ** 2, 10.0)))


def _subset(n: int, seed: int = 0) -> np.ndarray:
    """GaussianProcess.fit's fitting subset."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:ours.MAX_FIT_POINTS].numpy()


def _sk_fit(kernel, x, y, optimise: bool, restarts: int = 0):
    from sklearn.gaussian_process import GaussianProcessRegressor

    return GaussianProcessRegressor(kernel, normalize_y=True,
                                    optimizer="fmin_l_bfgs_b" if optimise else None,
                                    n_restarts_optimizer=restarts, random_state=0).fit(x, y)


def fit_sklearn(x: np.ndarray, c: np.ndarray, shared: bool, restarts: int = 0):
    """Per-coefficient (or shared) hyperparameters on the subset (``restarts`` more
    starts drawn from the bounds), then the posterior on every point; returns
    ``(predict, theta of coefficient 1)``."""
    sub = _subset(len(x))
    if shared:
        first = _sk_fit(_kernel(x.shape[1]), x[sub], c[sub], True)
        full = [(slice(0, c.shape[1]), _sk_fit(first.kernel_, x, c, False))]
        return _stack(full, c.shape[1]), first.kernel_.theta
    parts, theta = [], None
    fitted = min(FITTED_OUTPUTS, c.shape[1])
    for r in range(fitted):
        hyper = _sk_fit(_kernel(x.shape[1]), x[sub], c[sub, r], True, restarts)
        theta = hyper.kernel_.theta if r == 0 else theta
        cols = slice(r, c.shape[1] if r == fitted - 1 else r + 1)
        parts.append((cols, _sk_fit(hyper.kernel_, x, c[:, cols], False)))
    return _stack(parts, c.shape[1]), theta


def _stack(parts, outputs: int):
    def predict(x):
        out = np.empty((len(x), outputs))
        for cols, model in parts:
            out[:, cols] = model.predict(x).reshape(len(x), -1)
        return out
    return predict


def fit_meshops(x: np.ndarray, c: np.ndarray):
    model = ours.GaussianProcess(len(x), x.shape[1], c.shape[1]).fit(
        torch.from_numpy(x), torch.from_numpy(c), fitted_outputs=FITTED_OUTPUTS, seed=0)
    theta = np.log(np.concatenate([[float(model.signal[0]) ** 2],
                                   model.lengthscale[0].numpy(),
                                   [float(model.noise[0]) ** 2]]))

    def predict(xq):
        with torch.no_grad():
            return model(torch.from_numpy(xq)).numpy()
    return predict, theta


def _nlml(x, y, theta) -> float:
    """Negative log marginal likelihood of ``y`` at kernel log-hyperparameters ``theta``
    (scikit-learn's evaluation, its normalisation of ``y``)."""
    return -float(_sk_fit(_kernel(x.shape[1]), x, y, False).log_marginal_likelihood(theta))


def compare(problem: dict, repeats: int, methods) -> dict:
    """Validation errors, fit seconds and the first coefficient's NLML of each method."""
    from threadpoolctl import threadpool_limits

    x, c = problem["x_tr"].numpy(), problem["c_tr"].numpy()
    fits = {"meshops": lambda: fit_meshops(x, c),
            "sklearn": lambda: fit_sklearn(x, c, shared=False),
            "sklearn-restarts": lambda: fit_sklearn(x, c, shared=False, restarts=RESTARTS),
            "sklearn-shared": lambda: fit_sklearn(x, c, shared=True)}
    seconds = {m: [] for m in methods}
    result, warned = {}, {}
    with threadpool_limits(1):
        torch.set_num_threads(1)
        for _ in range(repeats):
            for m in methods:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    t0 = time.perf_counter()
                    predict, theta = fits[m]()
                    seconds[m].append(time.perf_counter() - t0)
                result[m] = (predict, theta)
                warned[m] = sorted({_warning_kind(w) for w in caught})
        sub = _subset(len(x))
        out = {}
        for m in methods:
            predict, theta = result[m]
            err = validation_errors(problem,
                                    torch.from_numpy(predict(problem["x_val"].numpy())))
            out[m] = {"mean": float(np.mean(err)), "median": float(np.median(err)),
                      "worst": float(np.max(err)), "fit_s": statistics.median(seconds[m]),
                      "fit_s_all": seconds[m], "nlml_c1": _nlml(x[sub], c[sub, 0], theta),
                      "warnings": warned[m]}
    return out


def _warning_kind(w) -> str:
    """A warning in a few words: scikit-learn's optimiser stopping on a failed line
    search, or a hyperparameter at its bound."""
    text = str(w.message)
    if "failed to converge" in text:
        return "L-BFGS-B stopped (ABNORMAL line search)"
    if "close to the specified" in text:
        return "a hyperparameter at its bound"
    return f"{w.category.__name__}: {text.splitlines()[0][:60]}"


def table(problem: dict, res: dict) -> str:
    x, c = problem["x_tr"], problem["c_tr"]
    lines = [f"{problem['name']}: {len(x)} training / {len(problem['x_val'])} validation "
             f"samples, {x.shape[1]} parameter(s), {c.shape[1]} POD coefficients, "
             f"{problem['points']} points",
             f"  {'regression':<16} {'val mean':>10} {'median':>10} {'worst':>10} "
             f"{'fit s':>7} {'nlml c1':>10}"]
    for m, r in res.items():
        lines.append(f"  {m:<16} {r['mean']:>10.4e} {r['median']:>10.4e} {r['worst']:>10.4e} "
                     f"{r['fit_s']:>7.2f} {r['nlml_c1']:>10.2f}")
    for m, r in res.items():
        if r["warnings"]:
            lines.append(f"  {m} warned (last fit): {'; '.join(r['warnings'])}")
    base = res.get("meshops")
    for m, r in res.items():
        if m != "meshops" and base:
            lines.append(f"  {m} vs meshops: validation mean x{r['mean'] / base['mean']:.3f}, "
                         f"fit time x{r['fit_s'] / base['fit_s']:.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gp_library", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default=",".join(NAMES), help="comma-separated")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="timed fits per method (median)")
    p.add_argument("--data-root", type=Path, default=None,
                   help="the benchmark's data folders (default $MESHOPS_CACHE/accuracy or "
                        "~/.cache/meshops/accuracy; written by python -m benchmarks.accuracy)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks/results/"
                   "gp-library-cpu-1thread.txt", help="result text (a .json goes beside it)")
    args = p.parse_args(argv)
    import sklearn

    from benchmarks.accuracy import datasets

    root = args.data_root or Path(os.environ.get("MESHOPS_CACHE", Path.home() / ".cache/meshops"))
    root = root if args.data_root else root / "accuracy"
    methods = args.methods.split(",")
    # One thread throughout, as fit_reduced_basis fits: the POD too, whose last digits
    # (and so the coefficients' and the fits') depend on the thread count.
    torch.set_num_threads(1)
    head = [f"# {command('benchmarks.gp_library', argv)}".rstrip(),
            f"# torch {torch.__version__}, scikit-learn {sklearn.__version__}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs, 1 thread per fit",
            f"# meshops {commit()}",
            f"# load before: {loadavg()} (1, 5, 15 min)", ""]
    print("\n".join(head), flush=True)
    body, doc = [], {"command": head[0][2:], "datasets": {}}
    for name in args.datasets.split(","):
        problem = load_problem(name, Path(datasets.prepare(name, root, progress=False)).parent)
        res = compare(problem, args.repeats, methods)
        body.append(table(problem, res))
        print(body[-1] + "\n", flush=True)
        doc["datasets"][name] = res
    tail = f"# load after: {loadavg()} (1, 5, 15 min)"
    print(tail)
    doc["load"] = {"before": head[3], "after": tail}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(head) + "\n\n".join(body) + "\n\n" + tail + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

