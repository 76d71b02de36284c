"""Pieces shared by the meshops models.

* :class:`MLP` - pointwise multilayer perceptron;
* :func:`read_inputs` - unpack and validate a (batched) :class:`~meshops.MeshData`
  into a :class:`MeshInputs` (features, positions, quadrature weights, batch vectors,
  query points), cast to the model's dtype;
* :func:`knn_interpolate` - parameter-free inverse-distance interpolation of point
  features to other points (exact at coincident points);
* latent meshes for encoder-processor-decoder models: :func:`fps_latent`,
  :func:`grid_latent` and the latent quadrature rule :func:`voronoi_weights`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn


__all__ = ["MLP", "FourierFeatures", "make_activation", "MeshInputs", "read_inputs",
           "knn_interpolate", "measure_ball_graph", "fps_latent", "grid_latent",
           "voronoi_weights", "sample_ptr", "count_parameters"]

_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


def make_activation(name: str) -> nn.Module:
    """``"gelu"``, ``"relu"``, ``"silu"`` or ``"tanh"`` as a module."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]()


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_model_sizes(in_channels, out_channels, pos_dim, width) -> None:
    """The sizes every model takes: ``in_channels >= 0`` (0: geometry only), the others
    ``>= 1``."""
    check_positive_int(in_channels, "in_channels", minimum=0)
    check_positive_int(out_channels, "out_channels")
    check_positive_int(pos_dim, "pos_dim")
    check_positive_int(width, "width")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (lazy, unmaterialised parameters excluded)."""
    return sum(p.numel() for p in model.parameters()
               if p.requires_grad and not isinstance(p, nn.parameter.UninitializedParameter))


class MLP(nn.Module):
    """Pointwise MLP ``Linear -> σ -> ... -> Linear`` (``layers`` linear layers).

    Applied row by row, so it is trivially discretisation independent.

    Args:
        in_channels, hidden_channels, out_channels: widths.
        layers: number of linear layers (``>= 1``; ``1`` is a plain linear map).
        activation: ``"gelu"`` (default), ``"relu"``, ``"silu"`` or ``"tanh"``.
        out_activation: apply the activation after the last layer too.

    Shapes:
        ``[N, in_channels] -> [N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 layers: int = 2, activation: str = "gelu", out_activation: bool = False) -> None:
        super().__init__()
        check_positive_int(layers, "layers")
        widths = [in_channels] + [hidden_channels] * (layers - 1) + [out_channels]
        mods: list[nn.Module] = []
        for i in range(layers):
            mods.append(nn.Linear(widths[i], widths[i + 1]))
            if i < layers - 1 or out_activation:
                mods.append(make_activation(activation))
        self.net = nn.Sequential(*mods)
        self.in_channels, self.out_channels = in_channels, out_channels

    def reset_parameters(self) -> None:
        for m in self.net:
            if isinstance(m, nn.Linear):
                m.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class FourierFeatures(nn.Module):
    r"""Coordinates with sinusoidal features, :math:`\gamma(x) = [x, \sin(\pi 2^k x),
    \cos(\pi 2^k x)]_{k < F}` per coordinate (``octaves`` ``F``; ``F = 0``: just ``x``).

    Pointwise (so discretisation independent) and parameter free. It makes sharp
    position-dependent attention kernels much easier to learn for content-based
    attention (measured: a transformer neural operator reaches in 400 Adam steps the
    error it needs ~1200 steps for on raw coordinates). The frequencies are in units of
    the coordinates, which should be of order one (e.g. the unit cell); rescale
    positions otherwise.

    Shapes:
        ``[N, d] -> [N, d (1 + 2 F)]``
    """

    def __init__(self, pos_dim: int, octaves: int = 0) -> None:
        super().__init__()
        check_positive_int(octaves, "pos_encoding", minimum=0)
        self.pos_dim, self.octaves = pos_dim, octaves
        self.out_channels = pos_dim * (1 + 2 * octaves)

    def forward(self, pos: Tensor) -> Tensor:
        if not self.octaves:
            return pos
        freq = math.pi * 2.0 ** torch.arange(self.octaves, dtype=pos.dtype, device=pos.device)
        arg = (pos[..., None] * freq).flatten(-2)
        return torch.cat([pos, arg.sin(), arg.cos()], dim=-1)

    def extra_repr(self) -> str:
        return f"pos_dim={self.pos_dim}, octaves={self.octaves}"


# --------------------------------------------------------------------------- inputs
@dataclass
class MeshInputs:
    """A batch of discretised functions, validated and cast to the model's dtype.

    Attributes:
        x: ``[N, C]`` input features (``C = 0`` for geometry-only problems).
        pos: ``[N, d]`` positions.
        weight: ``[N]`` quadrature weights.
        batch: ``[N]`` sorted sample index, or None (one sample).
        query_pos: ``[M, d]`` output points (``pos`` itself when none were given).
        query_batch: ``[M]`` sample index of the output points, or None (one sample).
        has_query: whether the data carried ``query_pos``.
        num_graphs: number of samples ``B``.
    """

    x: Tensor
    pos: Tensor
    weight: Tensor
    batch: Optional[Tensor]
    query_pos: Tensor
    query_batch: Optional[Tensor]
    has_query: bool
    num_graphs: int

    def lifted(self) -> Tensor:
        """``[x, pos]`` (the input function concatenated with the identity), ``[N, C + d]``."""
        return torch.cat([self.x, self.pos], dim=-1)


def _check_batch_vector(b: Tensor, n: int, name: str, check_values: bool = True) -> Tensor:
    if not isinstance(b, Tensor) or b.dim() != 1 or b.shape[0] != n:
        shape = tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__
        raise ValueError(f"data.{name} must be a [{n}] vector of sample indices, got {shape}")
    if b.is_floating_point() or b.dtype == torch.bool:
        raise ValueError(f"data.{name} must be an integer vector, got {b.dtype}")
    b = b.long()
    if check_values and n and (int(b[0]) < 0 or bool((b[1:] < b[:-1]).any())):
        raise ValueError(f"data.{name} must be sorted and non-negative (a PyG batch vector)")
    return b


def read_inputs(data, in_channels: int, pos_dim: int, dtype: torch.dtype,
                device: Optional[torch.device] = None, check_values: bool = True) -> MeshInputs:
    """Unpack ``data`` (a :class:`~meshops.MeshData` or a PyG batch of them).

    Reads ``x [N, in_channels]`` (may be absent or ``[N, 0]`` when ``in_channels == 0``),
    ``pos [N, pos_dim]``, ``weight [N]``, ``batch [N]`` (absent for one sample) and the
    optional ``query_pos [M, pos_dim]`` with ``query_batch [M]`` (or PyG's
    ``query_pos_batch`` from ``follow_batch=["query_pos"]``). Floating tensors are cast
    to ``dtype``.

    Raises:
        ValueError: missing or misshaped fields, negative or non-finite weights, NaN/inf
            positions, unsorted batch vectors, query points of a sample with no input
            points, or several samples with query points but no ``query_batch``.

    ``check_values=False`` skips the checks that read tensor values (finite positions
    and weights, sorted batch vectors, query samples with input points), each a host
    synchronisation and a ``torch.compile`` graph break; the models pass it while
    compiling (their eager calls check). The sample count then comes from a PyG
    batch's ``num_graphs``.
    """
    pos = getattr(data, "pos", None)
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[1] != pos_dim:
        shape = tuple(pos.shape) if isinstance(pos, Tensor) else None
        raise ValueError(f"data.pos must be [N, {pos_dim}] (pos_dim={pos_dim}), got {shape}")
    device = pos.device if device is None else device
    n = pos.shape[0]
    if n == 0:
        raise ValueError("data has no points (data.pos is empty)")
    pos = pos.to(device=device, dtype=dtype)
    if check_values and not bool(torch.isfinite(pos).all()):
        raise ValueError("data.pos contains NaN or inf")

    x = getattr(data, "x", None)
    if x is None:
        if in_channels:
            raise ValueError(f"data.x is missing; the model expects {in_channels} input channels")
        x = pos.new_zeros(n, 0)
    else:
        if x.dim() == 1 and in_channels == 1:
            x = x[:, None]
        if x.dim() != 2 or x.shape[0] != n or x.shape[1] != in_channels:
            raise ValueError(f"data.x must be [N={n}, in_channels={in_channels}], "
                             f"got {tuple(x.shape)}")
        x = x.to(device=device, dtype=dtype)

    weight = getattr(data, "weight", None)
    if weight is None:
        raise ValueError("data.weight (quadrature weights [N]) is missing; see "
                         "meshops.quadrature_weights / meshops.point_cloud_weights")
    if weight.dim() == 2 and weight.shape[1] == 1:
        weight = weight[:, 0]
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"data.weight must be [N={n}], got {tuple(weight.shape)}")
    weight = weight.to(device=device, dtype=dtype)
    if check_values and not bool((torch.isfinite(weight) & (weight >= 0)).all()):
        raise ValueError("data.weight must be finite and non-negative")

    batch = getattr(data, "batch", None)
    if batch is not None:
        batch = _check_batch_vector(batch.to(device), n, "batch", check_values)
    if batch is None:
        num_graphs = 1
    elif not check_values and isinstance(getattr(data, "num_graphs", None), int):
        num_graphs = data.num_graphs  # a PyG batch's count, no read of the batch vector
    else:
        num_graphs = int(batch[-1]) + 1

    query_pos = getattr(data, "query_pos", None)
    has_query = query_pos is not None
    query_batch = None
    if has_query:
        if query_pos.dim() != 2 or query_pos.shape[1] != pos_dim:
            raise ValueError(f"data.query_pos must be [M, {pos_dim}], got {tuple(query_pos.shape)}")
        query_pos = query_pos.to(device=device, dtype=dtype)
        if check_values and not bool(torch.isfinite(query_pos).all()):
            raise ValueError("data.query_pos contains NaN or inf")
        m = query_pos.shape[0]
        query_batch = getattr(data, "query_batch", None)
        if query_batch is None:
            query_batch = getattr(data, "query_pos_batch", None)
        if query_batch is not None:
            query_batch = _check_batch_vector(query_batch.to(device), m, "query_batch",
                                              check_values)
            if check_values and m and int(query_batch[-1]) >= num_graphs:
                raise ValueError(f"data.query_batch refers to sample {int(query_batch[-1])} but "
                                 f"the inputs have {num_graphs} sample(s)")
        elif num_graphs > 1:
            raise ValueError("data has several samples and query_pos but no query_batch "
                             "(batch with meshops.training.dataset's loader, or set "
                             "data.query_batch)")
        if batch is None and query_batch is not None:
            if check_values and m and int(query_batch.max()) > 0:
                raise ValueError("data.query_batch has several samples but data.batch is absent")
            query_batch = None
        elif batch is not None and query_batch is None:
            query_batch = torch.zeros(m, dtype=torch.long, device=device)
    else:
        query_pos, query_batch = pos, batch
    if check_values and batch is not None and has_query and query_pos.shape[0]:
        # every sample with query points needs input points of positive weight
        has_src = torch.zeros(num_graphs, dtype=torch.bool, device=device)
        has_src[batch[weight > 0]] = True
        if not bool(has_src[query_batch].all()):
            bad = int(query_batch[~has_src[query_batch]][0])
            raise ValueError(f"sample {bad} has query points but no input point of positive weight")
    return MeshInputs(x=x, pos=pos, weight=weight, batch=batch, query_pos=query_pos,
                      query_batch=query_batch, has_query=has_query, num_graphs=num_graphs)


def sample_ptr(batch: Optional[Tensor], n: int, num_graphs: int) -> list[int]:
    """``ptr`` (start offsets, length ``B + 1``) of a sorted batch vector."""
    if batch is None:
        return [0, n]
    counts = torch.bincount(batch, minlength=num_graphs)
    return [0] + torch.cumsum(counts, 0).tolist()


# ----------------------------------------------------------------- interpolation
def knn_interpolate(h: Tensor, pos_src: Tensor, pos_dst: Tensor, batch_src: Optional[Tensor],
                    batch_dst: Optional[Tensor], k: int = 4, power: float = 2.0) -> Tensor:
    r"""Inverse-distance interpolation of point features to other points.

    .. math::
        h(y) = \frac{\sum_{j \in \mathrm{kNN}(y)} d_j^{-p}\, h_j}
                    {\sum_{j \in \mathrm{kNN}(y)} d_j^{-p}},
        \qquad d_j = |y - x_j|,

    over the ``k`` nearest source points of the same sample
    (:func:`meshops.search.knn`). Parameter free; continuous in ``y``; *exact* at a
    source point (``d = 0`` takes that point's value), so querying the source points
    themselves reproduces ``h``. As the source mesh is refined the interpolant of a
    continuous field converges to it.

    Shapes:
        h ``[N, C]``, pos_src ``[N, d]``, pos_dst ``[M, d]``, batches ``[N]``/``[M]``
        or None -> ``[M, C]``
    """
    from meshops.search import knn

    if pos_dst.shape[0] == 0:
        return h.new_zeros(0, h.shape[-1])
    n_min = pos_src.shape[0]
    if batch_src is not None:
        counts = torch.bincount(batch_src)
        used = torch.unique(batch_dst) if batch_dst is not None else counts.nonzero()[:, 0]
        n_min = int(counts[used].min())
    k = max(1, min(k, n_min))
    with torch.no_grad():
        edge = knn(pos_src.detach(), pos_dst.detach(), k, batch_src, batch_dst)
        dst, src = edge[0], edge[1]
        d2 = (pos_dst[dst] - pos_src[src]).pow(2).sum(-1).view(-1, k)
        # scale-aware floor: distances below ~1e-6 of the farthest neighbour count as 0
        floor = (d2.amax(-1, keepdim=True) * 1e-12).clamp_min(torch.finfo(d2.dtype).tiny)
        w = d2.clamp_min(floor).pow(-power / 2)
        w = w / w.sum(-1, keepdim=True)
    return (w.to(h.dtype).unsqueeze(-1) * h[src].view(-1, k, h.shape[-1])).sum(1)


# ------------------------------------------------------------------- latent meshes
def fps_latent(pos: Tensor, batch: Optional[Tensor], num: int) -> Tensor:
    """Farthest-point sample of ``num`` points per sample (all points of a smaller sample).

    Deterministic (start point 0 of every sample); returns sorted global indices so the
    latent batch vector stays sorted.
    """
    from meshops.search import fps

    if batch is None:
        idx = fps(pos.detach(), None, num=min(num, pos.shape[0]))
        return idx.sort().values
    counts = torch.bincount(batch).tolist()
    if any(c == 0 for c in counts):
        raise ValueError("a sample of the batch has no points")
    idx = fps(pos.detach(), batch, num=[min(num, c) for c in counts])
    return idx.sort().values


def _grid_axis(n: int, stride: int) -> list[int]:
    idx = list(range(0, n, stride))
    if idx[-1] != n - 1:
        idx.append(n - 1)  # keep the boundary row
    return idx


def grid_latent(grid_shape: Sequence[int], stride: Union[int, Sequence[int]],
                batch: Optional[Tensor], num_points: int, device=None) -> Tensor:
    """Indices of a strided sub-grid of structured samples.

    Every sample must hold ``prod(grid_shape)`` points in C order of ``grid_shape``
    (e.g. the 221 x 51 NACA C-grid, ``X.ravel()``). Along each axis the indices
    ``0, s, 2s, ...`` are kept, plus the last one when the stride does not reach it, so
    the sub-grid always spans the whole grid: 221 x 51 with stride 2 gives 111 x 26.

    Returns:
        Sorted global indices ``[B * prod(sub_shape)]``.
    """
    shape = [int(s) for s in grid_shape]
    strides = [int(stride)] * len(shape) if isinstance(stride, int) else [int(s) for s in stride]
    if len(strides) != len(shape) or min(strides) < 1:
        raise ValueError(f"stride must be a positive int or one per grid axis, got {stride!r}")
    size = math.prod(shape)
    if batch is None:
        counts = [num_points]
    else:
        counts = torch.bincount(batch).tolist()
    if any(c != size for c in counts):
        raise ValueError(f"latent='grid' needs every sample to have prod(grid_shape)={size} "
                         f"points (grid_shape={shape}), got sample sizes {sorted(set(counts))}")
    axes = [torch.tensor(_grid_axis(n, s), dtype=torch.long) for n, s in zip(shape, strides)]
    mesh = torch.meshgrid(*axes, indexing="ij")
    flat = torch.zeros_like(mesh[0])
    for a, m in enumerate(mesh):
        flat = flat * shape[a] + m
    local = flat.reshape(-1).sort().values
    offs = torch.arange(len(counts), dtype=torch.long) * size
    return (offs[:, None] + local[None, :]).reshape(-1).to(device)


def voronoi_weights(pos: Tensor, weight: Tensor, batch: Optional[Tensor], latent_pos: Tensor,
                    latent_batch: Optional[Tensor]) -> Tensor:
    r"""Quadrature weights of a latent point set by Voronoi aggregation.

    Every input point gives its weight to its nearest latent point of the same sample
    (:func:`meshops.search.knn`); a point equidistant from several latent points (common
    on strided sub-grids, whose fine nodes sit midway between coarse ones) splits its
    weight equally among them, so the rule stays symmetric:

    .. math::  w^{lat}_a = \sum_{i:\ \mathrm{nn}(x_i) \ni a} w_i / |\mathrm{nn}(x_i)|
               \approx |V_a \cap \Omega|,

    the measure of latent point ``a``'s Voronoi cell. The latent weights sum exactly to
    the input measure :math:`\sum_i w_i = |\Omega|`, and as the input mesh is refined
    they converge to the Voronoi cell measures, which depend only on the latent points
    and the geometry - not on the input mesh.

    Shapes:
        pos ``[N, d]``, weight ``[N]``, batch ``[N]``, latent_pos ``[Nv, d]``,
        latent_batch ``[Nv]`` -> ``[Nv]``
    """
    from meshops.search import knn

    n = pos.shape[0]
    if latent_batch is None:
        n_lat = latent_pos.shape[0]
    else:
        counts = torch.bincount(latent_batch)
        n_lat = int(counts[torch.unique(batch)].min()) if batch is not None else int(counts.min())
    k = max(1, min(2 ** pos.shape[1], n_lat))       # enough for the ties of a grid
    with torch.no_grad():
        edge = knn(latent_pos.detach(), pos.detach(), k, latent_batch, batch)
        near = edge[1].view(n, k)
        d2 = (pos.detach().double()[edge[0]] - latent_pos.detach().double()[edge[1]]
              ).pow(2).sum(-1).view(n, k)
        tied = d2 <= d2[:, :1] * (1 + 1e-9) + 1e-300
        share = tied.to(weight.dtype) / tied.sum(1, keepdim=True).to(weight.dtype)
    return weight.new_zeros(latent_pos.shape[0]).index_add(
        0, near.reshape(-1), (share * weight[:, None]).reshape(-1))


def measure_ball_graph(pos_src: Tensor, weight_src: Tensor, batch_src: Optional[Tensor],
                       pos_dst: Tensor, batch_dst: Optional[Tensor], quantile: float,
                       k_min: int = 1) -> Tensor:
    r"""Neighbourhoods holding a fixed fraction of the domain's *measure*.

    For each destination point :math:`x_i` the ball :math:`B(x_i, r_i)` is the smallest
    closed ball around :math:`x_i` whose source points carry a fraction ``quantile`` of
    the sample's total weight: the nearest source points :math:`y_{(1)}, y_{(2)},
    \dots` are taken until

    .. math:: \sum_{m \le k_i} w_{(m)} \ge q \sum_j w_j \qquad (k_i \ge k_{min}),

    plus every point at the same distance as :math:`y_{(k_i)}` (so ties, common on
    structured grids, are never broken arbitrarily).

    This is PiT's per-row distance quantile (a fraction of the *points*) with every point
    counted by its quadrature weight, i.e. a quantile of the measure
    :math:`\mu_\Omega`: the radius converges to the geometric radius holding a fraction
    ``q`` of :math:`|\Omega|` as the mesh is refined, on graded and uniform meshes
    alike, whereas a count quantile shrinks the ball where the mesh is dense. With
    equal weights both coincide (up to the rank rounding of
    :func:`~meshops.nn.local.quantile_k`). Sums are exact (float64), so a ball never
    depends on the other samples of a batch.

    The search starts with about ``2 q N`` neighbours and doubles ``k`` until every ball
    is complete.

    Returns:
        LongTensor ``[2, E]``: row 0 destination index, row 1 source index.
    """
    from meshops.search import knn

    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    m = pos_dst.shape[0]
    if m == 0:
        return torch.empty(2, 0, dtype=torch.long, device=pos_dst.device)
    w = weight_src.detach().double()
    ps, pd = pos_src.detach(), pos_dst.detach()
    if batch_src is None:
        counts = torch.tensor([ps.shape[0]], device=ps.device)
        total = w.sum().reshape(1)
        bd = torch.zeros(m, dtype=torch.long, device=pd.device)
    else:
        size = int(max(int(batch_src.max()), int(batch_dst.max()))) + 1
        counts = torch.bincount(batch_src, minlength=size)
        total = torch.zeros(size, dtype=w.dtype, device=w.device).index_add(0, batch_src, w)
        bd = batch_dst
        counts = counts[torch.unique(bd)]
    n_cap = int(counts.min())
    target = (quantile * total)[bd] * (1 - 1e-9)                      # [M]
    k = max(k_min, 2 * (math.floor(quantile * (int(counts.max()) - 1)) + 1))
    while True:
        k = min(k, n_cap)
        edge = knn(ps, pd, k, batch_src, batch_dst)
        ws = w[edge[1]].view(m, k)
        d2 = (pd.double()[edge[0]] - ps.double()[edge[1]]).pow(2).sum(-1).view(m, k)
        cum = torch.cumsum(ws, dim=1)
        reached = cum >= target[:, None]
        # the neighbour that completes the ball (the last one when none does)
        cut = torch.where(reached.any(1), reached.int().argmax(1), torch.full_like(bd, k - 1))
        cut = torch.maximum(cut, torch.full_like(cut, min(k_min, k) - 1))
        d_cut = d2.gather(1, cut[:, None])
        complete = reached.any(1) & (d2[:, -1:] > d_cut).squeeze(1)
        if bool(complete.all()) or k == n_cap:
            break
        k *= 2
    keep = d2 <= d_cut
    edge = edge[:, keep.view(-1)]
    if batch_src is None or bool(complete.all()):
        return edge
    # k was capped by a smaller sample: redo the samples with incomplete balls alone
    redo = torch.unique(bd[~complete])
    parts = [edge[:, ~torch.isin(bd[edge[0]], redo)]]
    for b in redo.tolist():
        src = (batch_src == b).nonzero().view(-1)
        dst = (batch_dst == b).nonzero().view(-1)
        if int(src.numel()) <= k:     # the whole sample is already in every ball
            parts.append(edge[:, torch.isin(edge[0], dst)])
            continue
        e = measure_ball_graph(pos_src[src], weight_src[src], None, pos_dst[dst], None,
                               quantile, k_min)
        parts.append(torch.stack([dst[e[0]], src[e[1]]]))
    return torch.cat(parts, 1)
