"""Gaussian-process regression with one length scale per input (:class:`GaussianProcess`).

Each output ``r`` is an independent GP with the Matérn-5/2 kernel

.. math::
    k_r(x, x') = \\sigma_r^2 \\left(1 + \\sqrt5\\, \\rho + \\tfrac53 \\rho^2\\right)
                 e^{-\\sqrt5\\, \\rho},
    \\qquad \\rho = \\Big|\\frac{x - x'}{\\ell_r}\\Big|,

a length scale per input dimension (automatic relevance determination: a parameter
that does not matter gets a long scale and drops out of the distance, which a
thin-plate spline on standardised parameters cannot do) and a noise variance
``s_r^2``, all fitted by maximising the marginal likelihood (L-BFGS on the logs).
The prediction is the posterior mean ``k_r(x, X) (K_r + s_r^2 I)^{-1} y_r``
(Rasmussen & Williams, *Gaussian Processes for Machine Learning*, 2006, ch. 2 and 5).

Why this is ours rather than scikit-learn's ``GaussianProcessRegressor`` (issue 29):
``python -m benchmarks.gp_library`` sets the two side by side on the problem the reduced
basis hands this class (the five parametric sets of the accuracy benchmark, their
training/validation split, the validation fields' mean relative L2 error), with the same
kernel (``ConstantKernel * Matern(nu=2.5, ARD) + WhiteKernel``), start, bounds and
fitting subset (``benchmarks/results/gp-library-cpu-1thread.txt``, on a quiet machine,
the two alternating on one thread each). With one start, scikit-learn is level on
navier_stokes and materials and behind on convdiff (by 4 %), heat (by 13 % in the mean,
though its worst sample is better: 0.18 against 1.13) and boundary_layer (12x: scipy's
L-BFGS-B stops in the all-noise optimum for most coefficients). With five random
restarts it is level on four sets and 10 % behind on heat, but takes 2.0 to 5.4 times
as long. So the fit stays here: as accurate, or more, in less time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from meshops.reduced.kernel import KernelRegression

#: The noise standard deviation, relative to the output's spread, is kept above this:
#: exact interpolation of a smooth map is then within 1e-4 and the kernel matrix stays
#: well conditioned.
MIN_NOISE = 1e-4
#: Bounds of the signal standard deviation (outputs are standardised) and of the length
#: scales (inputs are standardised: a scale of 100 already means "does not matter").
#: Without them the likelihood can prefer a near-polynomial fit with a huge signal
#: variance, whose prediction is a sum of huge terms that cancel (round-off amplified
#: by 1e8 was seen).
MAX_SIGNAL = 30.0
MAX_LENGTHSCALE = 100.0
#: Hyperparameters are fitted on at most this many points (a random subset); the
#: posterior then uses all of them.
MAX_FIT_POINTS = 600


def matern52(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> Tensor:
    """``[S1, D], [S2, D], [D] -> [S1, S2]`` Matérn-5/2 correlations."""
    rho = math.sqrt(5.0) * torch.cdist(x1 / lengthscale, x2 / lengthscale)
    return (1.0 + rho + rho.square() / 3.0) * torch.exp(-rho)


def _cholesky(k: Tensor) -> Tensor:
    """Cholesky factor, with jitter added only if the matrix needs it."""
    jitter = 0.0
    eye = torch.eye(k.shape[0], dtype=k.dtype, device=k.device)
    for _ in range(8):
        factor, info = torch.linalg.cholesky_ex(k + jitter * eye)
        if not int(info):
            return factor
        jitter = max(jitter * 100, 1e-10 * float(k.diagonal().mean()))
    raise ValueError("Gaussian process: the kernel matrix is not positive definite even "
                     "with jitter (repeated parameter vectors with different values?)")


class GaussianProcess(KernelRegression):
    """Independent GPs from ``D`` inputs to ``R`` outputs (see the module docstring;
    arguments and shapes: :class:`~meshops.reduced.kernel.KernelRegression`)."""

    def __init__(self, num_points: int, in_channels: int, out_channels: int) -> None:
        super().__init__(num_points, in_channels, out_channels)
        f64 = torch.float64
        self.register_buffer("alpha", torch.zeros(out_channels, num_points, dtype=f64))
        self.register_buffer("lengthscale", torch.ones(out_channels, in_channels, dtype=f64))
        self.register_buffer("signal", torch.ones(out_channels, dtype=f64))
        self.register_buffer("noise", torch.full((out_channels,), MIN_NOISE, dtype=f64))
        self.register_buffer("y_mean", torch.zeros(out_channels, dtype=f64))
        self.register_buffer("y_scale", torch.ones(out_channels, dtype=f64))

    def fit(self, x: Tensor, y: Tensor, iterations: int = 60, fitted_outputs: int = 16,
            seed: int = 0) -> "GaussianProcess":
        """Fit the hyperparameters by the marginal likelihood, then the posterior weights.

        Outputs are expected in decreasing order of importance (modal coefficients):
        the first ``fitted_outputs`` get their own hyperparameters; the others, small
        and rough, share those of the last fitted one (one factorisation for all).

        Shapes:
            x ``[S, D]``, y ``[S, R]``
        """
        x, y = x.to(torch.float64), y.to(torch.float64)
        self.inputs.copy_(x)
        self.y_mean.copy_(y.mean(0))
        self.y_scale.copy_(y.std(0).clamp_min(1e-300))
        yn = (y - self.y_mean) / self.y_scale
        sub = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        sub = sub[:MAX_FIT_POINTS]
        eye = torch.eye(x.shape[0], dtype=x.dtype)
        outputs = y.shape[1]
        for r in range(min(fitted_outputs, outputs)):
            ls, sig, noise = _fit_one(x[sub], yn[sub, r], iterations)
            self.lengthscale[r], self.signal[r], self.noise[r] = ls, sig, noise
            last = r == min(fitted_outputs, outputs) - 1
            cols = slice(r, outputs if last else r + 1)
            if last:  # the rest share these hyperparameters
                self.lengthscale[cols], self.signal[cols], self.noise[cols] = ls, sig, noise
            k = sig ** 2 * matern52(x, x, ls) + noise ** 2 * eye
            self.alpha[cols] = torch.cholesky_solve(yn[:, cols], _cholesky(k)).T
        return self

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.float64)
        out = torch.stack([self.signal[r] ** 2 * matern52(x, self.inputs, self.lengthscale[r])
                           @ self.alpha[r] for r in range(self.alpha.shape[0])], 1)
        return out * self.y_scale + self.y_mean



def _fit_one(x: Tensor, y: Tensor, iterations: int) -> tuple[Tensor, float, float]:
    """Length scales ``[D]``, signal and noise standard deviations of one output by
    L-BFGS on the negative log marginal likelihood (``y`` standardised)."""
    d = x.shape[1]
    log_ls = torch.zeros(d, dtype=x.dtype, requires_grad=True)
    log_sig = torch.zeros((), dtype=x.dtype, requires_grad=True)
    log_noise = torch.tensor(math.log(1e-2), dtype=x.dtype, requires_grad=True)
    eye = torch.eye(x.shape[0], dtype=x.dtype)
    floor = math.log(MIN_NOISE)
    opt = torch.optim.LBFGS([log_ls, log_sig, log_noise], lr=0.5, max_iter=iterations,
                            line_search_fn="strong_wolfe")

    top_sig, top_ls = math.log(MAX_SIGNAL), math.log(MAX_LENGTHSCALE)

    def nll():
        opt.zero_grad()
        noise = log_noise.clamp_min(floor).exp()
        k = log_sig.clamp_max(top_sig).exp() ** 2 * matern52(x, x, log_ls.clamp_max(top_ls).exp()) \
            + noise ** 2 * eye
        factor, info = torch.linalg.cholesky_ex(k)
        if int(info):  # a step into an ill-conditioned corner: make L-BFGS back off
            for p in (log_ls, log_sig, log_noise):
                p.grad = torch.zeros_like(p)
            return torch.tensor(float("inf"), dtype=x.dtype)
        a = torch.cholesky_solve(y[:, None], factor)
        loss = 0.5 * (y[:, None] * a).sum() + torch.log(factor.diagonal()).sum()
        loss.backward()
        return loss

    opt.step(nll)
    with torch.no_grad():
        return (log_ls.clamp_max(top_ls).exp().detach().clone(),
                float(log_sig.clamp_max(top_sig).exp()), float(log_noise.clamp_min(floor).exp()))
