"""A reduced-basis model for parametric studies (:class:`ReducedBasis`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from meshops.models.base import NeuralOperator, check_positive_int, register_model
from meshops.reduced.ensemble import MLPEnsemble
from meshops.reduced.gp import GaussianProcess
from meshops.reduced.parameters import batch_parameters
from meshops.reduced.rbf import ThinPlateSpline
from meshops.reduced.transfer import mls_weights, transfer

__all__ = ["REGRESSORS", "ReducedBasis"]

#: The regressions from parameters to modal coefficients, by name; ``"gp+mlp"`` is the
#: mean of the Gaussian processes' and the MLP ensemble's predictions.
REGRESSORS = ("mlp", "gp", "rbf", "gp+mlp")
#: Two point sets are the reference mesh when they differ by at most this fraction of
#: its extent (positions stored in float32 round-trip within it).
SAME_POINTS_RTOL = 1e-5


class Average(nn.Module):
    """The mean of several regressions' outputs (each ``[T, D] -> [T, R]``)."""

    def __init__(self, *parts: nn.Module) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([p(x).to(torch.float64) for p in self.parts]).mean(0)


@register_model("reduced_basis")
class ReducedBasis(NeuralOperator):
    r"""Fields of a parametric study: a POD basis and a regression of its coefficients.

    For a study on one mesh (every sample on the same points, a parameter vector per
    sample: ``params`` or input fields constant over the mesh) the map from parameters
    :math:`\mu` to fields is

    .. math::
        u(x; \mu) = \bar u(x) + \sum_{k=1}^{r} c_k(\mu)\, \varphi_k(x),

    with the mean :math:`\bar u` and modes :math:`\varphi_k` of the training snapshots'
    proper orthogonal decomposition in the mesh's quadrature inner product
    (:func:`meshops.reduced.pod_basis`), and :math:`c(\mu)` a regression of the
    standardised parameters (``regressor``): an ensemble of MLPs trained on the
    fields' relative L2 error (``"mlp"``, :mod:`meshops.reduced.ensemble`; the
    POD-NN of Hesthaven & Ubbiali, 2018), Gaussian processes with a length scale per
    parameter (``"gp"``), the thin-plate spline of the classical POD + RBF model
    (``"rbf"``), or the mean of the first two (``"gp+mlp"``).
    :func:`meshops.fitting.reduced_basis.fit_reduced_basis` fits them and keeps the one with the
    lowest validation error.

    Any mesh of the same geometry: on the training points the modes are used as
    stored; on other points (a refined mesh, ``query_pos``) they are evaluated by linear
    moving least squares from the training points (:mod:`meshops.reduced.transfer`,
    exact for linear fields), so the model is a function of :math:`x` like every
    meshops operator. With ``grid=True`` (structured grids whose nodes correspond but
    move from sample to sample) point ``k`` is grid node ``k`` and other point counts
    are refused.

    Args:
        in_channels: Input channels of the data (the parameters when they are
            constant fields; ignored when samples carry ``params``).
        out_channels: Target channels ``C``.
        pos_dim: Spatial dimension ``d``.
        num_points: Points ``M`` of the training mesh.
        rank: Modes ``r`` (0: the model predicts the mean).
        num_params: Length ``K`` of a sample's parameter vector.
        param_index: The parameters used (those that vary over the training set),
            default all ``K``.
        regressor: ``"mlp"``, ``"gp"``, ``"rbf"`` or ``"gp+mlp"``.
        num_train: Training samples (sizes the GP's and spline's stored points).
        members, width, layers, activation: The MLP ensemble's.
        grid: Structured grids matched node by node (see above).

    Shapes:
        forward: batch with ``pos [N, d]`` (or ``query_pos [M, d]``), ``weight [N]`` and
        ``params [B, K]`` or ``x [N, K]`` -> ``[N or M, C]``
    """

    #: The inputs it takes (:func:`meshops.inference.predict.input_dtype`): parameters are
    #: standardised in float64 (a timestamp-like 1.7e9 + 100 a is quantised in float32).
    input_dtype = torch.float64
    #: Its input channels are parameters, constant over each mesh
    #: (:meth:`meshops.inference.predict.RunSpec.check_mesh` refuses a field that is not).
    constant_inputs = True

    def __init__(self, in_channels: int, out_channels: int, pos_dim: int, num_points: int = 1,
                 rank: int = 0, num_params: int = 1, param_index: list[int] | None = None,
                 regressor: str = "mlp", num_train: int = 1, members: int = 4,
                 width: int = 128, layers: int = 4, activation: str = "gelu",
                 grid: bool = False) -> None:
        super().__init__()
        for name, value, low in (("out_channels", out_channels, 1), ("pos_dim", pos_dim, 1),
                                 ("num_points", num_points, 1), ("rank", rank, 0),
                                 ("num_params", num_params, 1), ("num_train", num_train, 1)):
            check_positive_int(value, name, low)
        if regressor not in REGRESSORS:
            raise ValueError(f"regressor must be one of {REGRESSORS}, got {regressor!r}")
        index = list(range(num_params)) if param_index is None else [int(i) for i in param_index]
        if not index or any(not 0 <= i < num_params for i in index):
            raise ValueError(f"param_index must list parameters in [0, {num_params}), "
                             f"got {param_index!r}")
        self.regressor_name, self.grid = regressor, bool(grid)
        f64 = dict(dtype=torch.float64)
        self.register_buffer("ref_pos", torch.zeros(num_points, pos_dim, **f64))
        self.register_buffer("mean", torch.zeros(num_points, out_channels, **f64))
        self.register_buffer("modes", torch.zeros(rank, num_points, out_channels, **f64))
        self.register_buffer("param_index", torch.tensor(index, dtype=torch.long))
        self.register_buffer("param_shift", torch.zeros(len(index), **f64))
        self.register_buffer("param_scale", torch.ones(len(index), **f64))
        k = len(index)
        parts = {"mlp": lambda: MLPEnsemble(k, rank, members, width, layers, activation),
                 "gp": lambda: GaussianProcess(num_train, k, rank),
                 "rbf": lambda: ThinPlateSpline(num_train, k, rank)}
        names = regressor.split("+")
        self.regressor: nn.Module = parts[names[0]]() if len(names) == 1 else \
            Average(*(parts[n]() for n in names))

    @property
    def param_channels(self) -> int:
        """The parameters it takes from ``data.params`` (the others are the means of
        its constant input channels)."""
        return int(self.config["num_params"]) - int(self.config["in_channels"])

    def standardise(self, params: Tensor) -> Tensor:
        """``[B, K]`` raw parameters -> ``[B, K']`` the regression's inputs."""
        p = params.to(torch.float64)[:, self.param_index]
        return (p - self.param_shift) / self.param_scale

    def coefficients(self, params: Tensor) -> Tensor:
        """Modal coefficients of raw parameter vectors: ``[B, K] -> [B, r]`` (float64)."""
        if self.modes.shape[0] == 0:
            return params.new_zeros(params.shape[0], 0, dtype=torch.float64)
        return self.regressor(self.standardise(params)).to(torch.float64)

    def basis_at(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """Mean ``[m, C]`` and modes ``[r, m, C]`` at the points ``pos [m, d]``."""
        m = self.ref_pos.shape[0]
        if pos.shape[0] == m:
            if self.grid:
                return self.mean, self.modes
            extent = float((self.ref_pos.amax(0) - self.ref_pos.amin(0)).max())
            gap = float((pos.to(torch.float64) - self.ref_pos).abs().max())
            if gap <= SAME_POINTS_RTOL * max(extent, 1e-300):
                return self.mean, self.modes
        if self.grid:
            raise ValueError(f"this reduced basis matches structured grids node by node: it "
                             f"needs {m} points, got {pos.shape[0]}")
        idx, w = mls_weights(self.ref_pos, pos.to(torch.float64))
        return transfer(self.mean, idx, w), transfer(self.modes, idx, w)

    def forward(self, data) -> Tensor:
        # 1. One parameter vector per sample -> modal coefficients [B, r].
        batch = getattr(data, "batch", None)
        num = int(data.num_graphs) if batch is not None else 1
        coef = self.coefficients(batch_parameters(data, num))
        # 2. Where the fields are wanted, sample by sample.
        pos = getattr(data, "query_pos", None)
        if pos is None:
            pos, owner = data.pos, batch
        else:
            owner = getattr(data, "query_batch", None)
        owner = owner if owner is not None else torch.zeros(pos.shape[0], dtype=torch.long,
                                                            device=pos.device)
        out = []
        for b in range(num):
            # 3. The basis at those points, combined with the sample's coefficients.
            mean, modes = self.basis_at(pos[owner == b])
            out.append(mean + torch.einsum("r,rmc->mc", coef[b], modes))
        return torch.cat(out).to(pos.dtype)

    def __repr__(self) -> str:
        r, m, c = self.modes.shape
        return (f"{type(self).__name__}(points={m}, channels={c}, rank={r}, "
                f"params={self.param_index.numel()}, regressor={self.regressor_name!r})")
