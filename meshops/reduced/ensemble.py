"""An ensemble of MLPs from parameters to modal coefficients (:class:`MLPEnsemble`).

Each member maps the standardised parameters to the ``R`` coefficients of a
:class:`~meshops.reduced.PODBasis` (scaled by each coefficient's training spread);
the ensemble predicts the members' mean. The members are stored stacked (weights
``[E, d_in, d_out]``), so a step of all of them is one batched matrix product per
layer instead of ``E`` small ones.

Because the modes are orthonormal in the quadrature inner product, the relative L2
error of a reconstructed field is ``|c_pred - c| / |y|`` (up to the part of ``y``
outside the basis, a constant), so :func:`train_ensemble` trains on the exact loss of
the fields without ever expanding them: a full-batch step costs a few small matrix
products, not a mesh's worth of work (the POD-NN of Hesthaven & Ubbiali,
*Non-intrusive reduced order modeling of nonlinear problems using neural networks*,
J. Comput. Phys. 363, 2018, here trained on the fields' metric).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from meshops.nn.mlp import make_activation


class MLPEnsemble(nn.Module):
    """``members`` MLPs ``D -> R`` (``layers`` linear layers of ``width``), averaged.

    Args:
        in_channels: ``D``, the parameters.
        out_channels: ``R``, the coefficients.
        members: Ensemble size ``E``.
        width: Hidden width.
        layers: Linear layers per member (``>= 1``).
        activation: ``"gelu"``, ``"relu"``, ``"silu"`` or ``"tanh"``.

    Shapes:
        forward: ``[T, D] -> [T, R]``; :meth:`members_forward`: ``[T, D] -> [E, T, R]``
    """

    def __init__(self, in_channels: int, out_channels: int, members: int = 4,
                 width: int = 128, layers: int = 4, activation: str = "gelu") -> None:
        super().__init__()
        if layers < 1 or members < 1:
            raise ValueError(f"MLPEnsemble: need layers >= 1 and members >= 1, got "
                             f"{layers} and {members}")
        sizes = [in_channels] + [width] * (layers - 1) + [out_channels]
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(members, a, b))
                                        for a, b in zip(sizes[:-1], sizes[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.empty(members, 1, b))
                                       for b in sizes[1:])
        self.act = make_activation(activation)
        self.register_buffer("scale", torch.ones(out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default initialisation, member by member.
        for w, b in zip(self.weights, self.biases):
            bound = 1.0 / math.sqrt(w.shape[1]) if w.shape[1] else 0.0
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(b, -bound, bound)

    def members_forward(self, x: Tensor) -> Tensor:
        h = x.to(self.weights[0].dtype).expand(len(self.weights[0]), *x.shape)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)
            if i < len(self.weights) - 1:
                h = self.act(h)
        return h * self.scale.to(h.dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.members_forward(x).mean(0)


def train_ensemble(ensemble: MLPEnsemble, x: Tensor, c: Tensor, norm: Tensor, epochs: int,
                   lr: float = 3e-3, weight_decay: float = 1e-4, seed: int = 0) -> None:
    """Train every member on ``mean_s |c_pred_s - c_s| / norm_s`` (the relative L2 error
    of the fields, ``norm`` their weighted norms): full batch, AdamW with a one-cycle
    schedule, from initial weights drawn from ``seed``. The members' losses are summed,
    so each gets exactly the gradient of its own loss.

    Shapes:
        x ``[S, D]``, c ``[S, R]``, norm ``[S]``
    """
    dtype = ensemble.weights[0].dtype
    x, c, norm = x.to(dtype), c.to(dtype), norm.to(dtype)
    ensemble.scale.copy_(c.std(0).clamp_min(torch.finfo(dtype).tiny) if len(c) > 1
                         else torch.ones_like(ensemble.scale))
    torch.manual_seed(seed)
    ensemble.reset_parameters()
    ensemble.train()
    opt = torch.optim.AdamW(ensemble.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs)
    for _ in range(epochs):
        opt.zero_grad(set_to_none=True)
        err = (ensemble.members_forward(x) - c).square().sum(-1).sqrt() / norm  # [E, S]
        err.mean(1).sum().backward()
        opt.step()
        sched.step()
    ensemble.eval()
