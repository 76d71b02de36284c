"""Patched continuum attention via spatial partitioning.

The point set of every sample is split into ``P`` patches (``meshops.search.partition``:
balanced k-d bisection, a voxel grid or k-means) and attention is restricted by the patches in one
of two ways:

* :class:`WindowAttention` (``mode="window"``): continuum attention *inside* each patch
  (the lecture's windowed attention, a Swin-type layer). Cost ``O(N · N/P)``.
* :class:`PatchTokenAttention` (``mode="token"``): every patch becomes one token through a
  quadrature integral against learned functions of patch-local coordinates, the ``P``
  tokens attend to each other (continuum-attention paper §3, Definitions 13-14, and the
  ViT neural operator of §4.3) and are mapped back to the points. Cost ``O(N · P)``.

:func:`patch_attention` is the common front: ``patch_attention(in_channels,
mode="window", ...)`` returns a :class:`WindowAttention`, ``mode="token"`` a
:class:`PatchTokenAttention`; both are subclasses of :class:`PatchAttention`, so
``isinstance`` checks work either way.

Patches never mix samples of a batch, whatever the partition ids look like (ids are
combined with ``batch`` before use). The partition depends on coordinates only, so the
layers are permutation equivariant (up to exactly tied coordinates at a k-d cut, which
the partition may break by input order); a precomputed partition (``parts=``, e.g. from
:meth:`PatchAttention.partition`) can be shared by all layers of a model that use the
same ``num_patches``/``patch_size``/``method``/``shift``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn

from meshops.nn._utils import check_channels, merge_heads, safe_log, split_heads
from meshops.nn.base import GlobalAttentionBase, reset_linear
from meshops.nn.functional import weighted_attention
from meshops.nn.points import Points, batch_points
from meshops.search.partition import METHODS as _METHODS
from meshops.search.partition import partition as _partition
from meshops.utils.checks import check_batch, check_length, check_pos, check_weight, checking

__all__ = ["PatchAttention", "WindowAttention", "PatchTokenAttention", "patch_attention",
           "rotate_positions", "SHIFT_ANGLE"]

#: Angle (radians) of the fixed rotation used by the shifted partition. Not pi/4: a
#: rotation with a rational tangent would map regular grids onto exactly tied coordinates.
SHIFT_ANGLE = 0.6

_MODES = ("window", "token")


def rotate_positions(pos: Tensor, angle: float = SHIFT_ANGLE) -> Tensor:
    """Apply the fixed rotation of the shifted partition to ``pos [N, d]``.

    The rotation is the product of Givens rotations by ``angle`` in the coordinate planes
    ``(0, 1), (1, 2), ..., (d-2, d-1)``; it is the identity for ``d = 1``. Axis-aligned cuts
    (k-d medians, voxel faces) of the rotated positions are oblique in the original frame,
    so they cross the borders of the unrotated partition.
    """
    # Geometry stays in the positions' dtype: under autocast these products would be
    # bf16, moving the cuts (and bf16 positions cannot be partitioned at all).
    with torch.autocast(pos.device.type, enabled=False):
        d = pos.shape[-1]
        rot = torch.eye(d, dtype=pos.dtype, device=pos.device)
        c, s = math.cos(angle), math.sin(angle)
        for a in range(d - 1):
            g = torch.eye(d, dtype=pos.dtype, device=pos.device)
            g[a, a], g[a, a + 1], g[a + 1, a], g[a + 1, a + 1] = c, -s, s, c
            rot = g @ rot
        return pos @ rot.T


class _Groups:
    """Patches of a flat batch, sorted by (sample, part) and padded to ``[G, n_max]``
    (built once, with its host synchronisations; the layers' forward passes trust it).

    Attributes:
        perm: ``[N]`` points sorted by patch (stable, so the original order is kept
            inside a patch).
        gid: ``[N]`` patch (group) index of every point, in the *original* order.
        counts: ``[G]`` points per patch; ``G`` counts only non-empty patches.
        sample: ``[G]`` sample index of every patch (sorted).
        dest: ``[N]`` flat position ``g * n_max + rank`` of point ``i`` (original order)
            in the padded ``[G * n_max]`` layout.
        mask: ``[G, n_max]`` True for real points.
        tokens: the :class:`~meshops.nn.base.Points` layout of the patches as tokens of
            their samples.
    """

    def __init__(self, parts: Tensor, batch: Optional[Tensor]):
        n = parts.shape[0]
        k = int(parts.max()) + 1 if n else 1
        key = parts if batch is None else batch * k + parts
        key_sorted, self.perm = torch.sort(key, stable=True)
        uniq, group_sorted, self.counts = torch.unique_consecutive(
            key_sorted, return_inverse=True, return_counts=True)
        self.num_groups = uniq.shape[0]
        self.sample = uniq // k if batch is not None else torch.zeros_like(uniq)
        self.n_max = int(self.counts.max()) if n else 0
        start = torch.cumsum(self.counts, 0) - self.counts
        rank = torch.arange(n, device=parts.device) - start[group_sorted]
        self.dest = torch.empty_like(group_sorted)
        self.dest[self.perm] = group_sorted * self.n_max + rank
        self.gid = torch.empty_like(group_sorted)
        self.gid[self.perm] = group_sorted
        self.mask = torch.zeros(self.num_groups * self.n_max, dtype=torch.bool,
                                device=parts.device)
        self.mask[self.dest] = True
        self.mask = self.mask.view(self.num_groups, self.n_max)
        # the patches of each sample, as tokens (PatchTokenAttention)
        self.tokens: Points = batch_points(None, None, None if batch is None else self.sample,
                                           self.num_groups)

    def pad(self, t: Tensor) -> Tensor:
        """Flat ``[N, *F]`` (original order) to padded ``[G, n_max, *F]`` (zeros)."""
        out = t.new_zeros((self.num_groups * self.n_max,) + tuple(t.shape[1:]))
        out = out.index_copy(0, self.dest, t)
        return out.view((self.num_groups, self.n_max) + tuple(t.shape[1:]))

    def unpad(self, t: Tensor) -> Tensor:
        """Padded ``[G, n_max, *F]`` back to flat ``[N, *F]`` in the original order."""
        return t.reshape((self.num_groups * self.n_max,) + tuple(t.shape[2:]))[self.dest]


def _safe_log_weight(weight: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``log w`` ``[B, n]`` plus a ``[B]`` flag of zero-measure rows.

    A row (patch or sample) whose weights are all zero has no integral; it gets a zero
    ``log w`` instead of ``-inf`` (which would give NaN in the softmax and its
    gradient) and the caller zeroes the output of such rows.
    """
    w = weight if mask is None else weight.masked_fill(~mask, 0)
    empty = w.sum(-1) <= 0
    return _zero_rows(safe_log(w), empty[:, None]), empty


def _attend_rows(q: Tensor, k: Tensor, v: Tensor, log_w: Tensor, empty: Tensor) -> Tensor:
    """Weighted attention of padded rows, zero for the zero-measure rows ``empty``."""
    out = weighted_attention(q, k, v, log_w)
    return _zero_rows(out, empty[:, None, None, None])


def _zero_rows(t: Tensor, where: Tensor) -> Tensor:
    """``t`` with zeros where ``where``: always filled while compiling (no data-dependent
    branch), only when some row is empty in eager calls (a full pass over ``t`` that
    cost small layers 5-10 % of their forward)."""
    if not checking() or bool(where.any()):
        return t.masked_fill(where, 0.0)
    return t


def patch_attention(in_channels: int, out_channels: Optional[int] = None, *,
                    mode: str = "window", **kwargs: Any) -> "PatchAttention":
    """A patched continuum-attention layer: :class:`WindowAttention` for
    ``mode="window"`` (attention inside each patch), :class:`PatchTokenAttention` for
    ``mode="token"`` (patches -> tokens -> attention -> points).  The other keyword
    arguments go to that class (see it, and :class:`PatchAttention` for the
    partition).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    cls = WindowAttention if mode == "window" else PatchTokenAttention
    return cls(in_channels, out_channels, **kwargs)


def _in_channels(in_channels: int) -> int:
    """``in_channels``, a positive integer."""
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels!r}")
    return in_channels


class PatchAttention(GlobalAttentionBase):
    r"""Patched continuum self-attention; front for the two modes.

    The base of :class:`WindowAttention` and :class:`PatchTokenAttention`
    (:func:`patch_attention` builds either from ``mode``; see those classes for the
    formulas and arguments). Both share:

    * ``forward(x, pos, weight, batch=None, parts=None, groups=None) -> [N,
      out_channels]`` on a flat PyG batch (:class:`~meshops.nn.base.GlobalAttentionBase`:
      ``pos`` may be a :class:`~meshops.nn.points.Points`); ``pos`` defines the patches,
      ``parts`` (patch ids) or ``groups`` (:meth:`groups`, checked once) replace the
      partition;
    * ``dense(x, pos, weight, mask=None, parts=None) -> [B, Nmax, out_channels]``;
    * :meth:`partition`, the patch ids the layer uses when ``parts`` is not given;
    * ``reset_parameters()``.

    Partition (``num_patches`` ``P``, or ``patch_size`` points per patch, and ``method``):
    ``meshops.search.partition`` per sample (``"kd"``: balanced recursive coordinate
    bisection, the default; ``"voxel"``: regular grid over the sample's bounding box;
    ``"kmeans"``). With ``patch_size`` a sample of ``n`` points gets ``ceil(n /
    patch_size)`` patches (``num_patches`` is then ignored), so the cost per point stays
    the same on meshes of any size; ``"kd"`` patches then hold at most ``patch_size``
    points, while ``"voxel"`` and ``"kmeans"`` patches only average ``n / P`` points
    (graded meshes make some much larger). ``shift=True`` selects the *alternate*
    partition, so that a model alternating ``shift=False`` / ``shift=True``
    layers moves information across patch borders (Swin's shifted windows):

    * ``"kd"``/``"voxel"`` with ``d >= 2``: the partition of the positions after the fixed
      rotation :func:`rotate_positions` (Givens rotations by :data:`SHIFT_ANGLE` rad in
      the planes of consecutive axes). Its axis-aligned cuts are oblique to the unrotated
      ones, so the shifted patches straddle the unrotated borders. A translation (Swin's
      half-window shift) would not do: k-d medians and bounding-box voxel grids are
      translation invariant.
    * ``d = 1`` (no rotation exists) or ``"kmeans"`` (rotation invariant): ``P + 1``
      patches, whose interior borders do not coincide with those of ``P`` patches.

    Note:
        The balanced k-d partition splits by point *count*; on meshes whose density varies
        strongly the patches then change with the mesh. ``method="voxel"`` (geometric
        cells) or a weight-balanced partition passed as ``parts`` keeps the patches, and
        hence the output function, (nearly) mesh independent.
    """

    dense_layout = False        # patches of the flat batch, not the samples' dense layout
    point_args = ("parts",)     # one patch id per point: the dense form flattens them

    # ----------------------------------------------------------------- shared helpers
    def _init_partition(self, num_patches: int, method: str, shift: bool,
                        patch_size: Optional[int] = None) -> None:
        if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
            raise ValueError(f"num_patches must be an integer >= 1, got {num_patches!r}")
        if patch_size is not None and (isinstance(patch_size, bool)
                                       or not isinstance(patch_size, int) or patch_size < 1):
            raise ValueError(f"patch_size must be None or an integer >= 1, got {patch_size!r}")
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        self.num_patches = num_patches
        self.patch_size = patch_size
        self.method = method
        self.shift = bool(shift)

    def patches_per_sample(self, n: int) -> int:
        """Patches of a sample of ``n`` points (before the alternate partition's ``+1``):
        ``num_patches``, or ``ceil(n / patch_size)`` when ``patch_size`` is set; never
        more than ``n``."""
        num = self.num_patches if self.patch_size is None else -(-n // self.patch_size)
        return max(1, min(num, n))

    def partition(self, pos: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        """Patch id of every point, as used by ``forward`` when ``parts`` is not given.

        Args:
            pos: ``[N, d]`` positions.
            batch: ``[N]`` sorted sample index, or None for one sample.

        Returns:
            LongTensor ``[N]`` of patch ids from ``meshops.search.partition``, distinct
            across samples (with ``num_patches``: ``sample * P + local``), with the
            rotation or one extra patch of the alternate partition when ``shift=True``.
            A sample with fewer points than patches gets one patch per point.
        """
        pos = pos.detach()
        if pos.shape[0] == 0:
            return torch.zeros(0, dtype=torch.long, device=pos.device)
        batch = None if batch is None else batch.long()
        extra = 0
        if self.shift:
            if pos.shape[-1] >= 2 and self.method in ("kd", "voxel"):
                pos = rotate_positions(pos)
            else:
                extra = 1
        sizes = ([pos.shape[0]] if batch is None
                 else torch.bincount(batch, minlength=1).tolist())
        if self.patch_size is None:
            nums = [self.num_patches + extra] * len(sizes)
        else:
            nums = [self.patches_per_sample(n) + extra for n in sizes]
        if len(set(nums)) == 1 and all(n >= nums[0] for n in sizes):
            return _partition(pos, nums[0], method=self.method, batch=batch)
        # Some sample has fewer points than patches (or none: a fully masked row of
        # ``dense``), or samples differ in their number of patches (patch_size):
        # partition sample by sample.
        out = torch.empty(pos.shape[0], dtype=torch.long, device=pos.device)
        lo = offset = 0
        for n, num in zip(sizes, nums):
            if n:
                local = (_partition(pos[lo:lo + n], num, method=self.method) if n >= num
                         else torch.arange(n, device=pos.device))
                out[lo:lo + n] = local + offset
            lo, offset = lo + n, offset + num
        return out

    def _patches_repr(self) -> str:
        return (f"num_patches={self.num_patches}" if self.patch_size is None
                else f"patch_size={self.patch_size}")

    def groups(self, pos: Tensor, weight: Tensor, batch: Optional[Tensor] = None,
               parts: Optional[Tensor] = None) -> _Groups:
        """The checked patches of a flat batch (positions, weights, batch vector and the
        partition), built once per mesh and passed as ``forward(..., groups=g)``: the
        forward pass then does no host synchronisation (it compiles with
        ``torch.compile(fullgraph=True)``)."""
        n = pos.shape[0] if isinstance(pos, Tensor) else 0
        check_pos(pos, "pos", finite=True)
        check_weight(weight, n)
        batch = check_batch(batch, n, "batch")
        return self._groups(pos, batch, parts)

    def _groups(self, pos: Tensor, batch: Optional[Tensor], parts: Optional[Tensor]
                ) -> _Groups:
        """The patches of checked points, from ``parts`` (checked here) or the layer's
        :meth:`partition`."""
        if parts is not None:
            if not isinstance(parts, Tensor) or parts.dim() != 1 or parts.is_floating_point() \
                    or parts.dtype == torch.bool:
                raise ValueError("parts must be an integer vector [N] of patch ids")
            check_length(parts, pos.shape[0], "parts")
            if parts.shape[0] and checking() and int(parts.min()) < 0:
                raise ValueError("parts must be non-negative patch ids")
        if parts is None:
            parts = self.partition(pos, batch)
        return _Groups(parts.long(), None if batch is None else batch.long())

    def _patches(self, x: Tensor, x_dst: Tensor, pos: Optional[Tensor],
                 batch: Optional[Tensor], parts: Optional[Tensor],
                 groups: Optional[_Groups]) -> Optional[_Groups]:
        """The patches of a forward pass (``groups`` trusted when given, else built from
        ``parts`` or the partition); None for an empty input."""
        if x_dst is not x:
            raise ValueError(f"{type(self).__name__} is self-attention: pass x as one "
                             f"[N, C] tensor, not a (src, dst) pair")
        if groups is not None:
            if groups.dest.shape[0] != x.shape[0]:
                raise ValueError(f"groups hold {groups.dest.shape[0]} points, x has "
                                 f"{x.shape[0]}")
            return groups
        if pos is None:
            raise ValueError("pos must be a [N, d] tensor of positions (it defines the "
                             "patches), or pass groups=")
        if checking():
            check_pos(pos, "pos", finite=True)
        groups = self._groups(pos, batch, parts)
        return groups if x.shape[0] else None


class WindowAttention(PatchAttention):
    r"""Windowed continuum attention: continuum attention inside every patch.

    For a point :math:`x_i` in patch :math:`D_p` (patches of the point's own sample),

    .. math::
        A(x)_i = W_O \, \frac{\sum_{j \in p} w_j \exp(q_i \cdot k_j / \sqrt{d_h})\, v_j}
                             {\sum_{j \in p} w_j \exp(q_i \cdot k_j / \sqrt{d_h})}
        \approx W_O \int_{D_p} \frac{e^{\langle Q u(x), K u(y)\rangle/\sqrt{d_h}}\, V u(y)}
                {\int_{D_p} e^{\langle Q u(x), K u(z)\rangle/\sqrt{d_h}} dz}\, dy,

    per head, with :math:`q = W_Q x`, :math:`k = W_K x`, :math:`v = W_V x`: the lecture's
    windowed attention :math:`\mathbb{A}_W`, i.e. ``softmax(QKᵀ/√d_h + log w) V`` per
    patch. The patches are padded to ``[B·P, n_max, C]`` (padding has weight 0, bias
    ``-inf``) and go through ``scaled_dot_product_attention`` with a ``[B·P, 1, 1, n_max]``
    log-weight bias, so memory and time are ``O(N · n_max) = O(N · N/P)`` for a balanced
    partition, never ``O(N²)``. With ``P = 1`` this is global continuum attention.

    Information crosses patch borders only across layers: alternate ``shift=False`` and
    ``shift=True`` layers (see :class:`PatchAttention` for the alternate partition). A
    patch whose weights are all zero has no integral; its points output ``W_O 0 + b_O``.

    Args:
        in_channels (int): input channels ``C``.
        out_channels (int, optional): output channels (default ``in_channels``).
        heads (int): attention heads; ``in_channels`` must be divisible by ``heads``.
        num_patches (int): patches per sample ``P >= 1``.
        patch_size (int, optional): points per patch instead of ``num_patches``:
            ``ceil(n / patch_size)`` patches per sample (see :class:`PatchAttention`).
        method (str): partition method of ``meshops.search.partition`` (``"kd"``,
            ``"voxel"``, ``"kmeans"``).
        shift (bool): use the alternate (rotated, or ``P + 1`` patches) partition.
        bias (bool): biases of the projections.

    Shapes:
        - **input:** ``x [N, C]``, ``pos [N, d]``, ``weight [N]``, ``batch [N]`` (optional,
          sorted), ``parts [N]`` (optional patch ids; combined with ``batch`` so patches
          never mix samples).
        - **output:** ``[N, out_channels]``.
    """

    def __init__(self, in_channels: int, out_channels: Optional[int] = None,
                 heads: int = 4, num_patches: int = 16, method: str = "kd",
                 shift: bool = False, bias: bool = True, patch_size: Optional[int] = None):
        super().__init__()
        in_channels = _in_channels(in_channels)
        self._init_channels(in_channels, out_channels, heads, divisible=False)
        check_channels(in_channels, heads)
        self._init_partition(num_patches, method, shift, patch_size)
        self.lin_qkv = nn.Linear(in_channels, 3 * in_channels, bias=bias)
        self.lin_out = nn.Linear(in_channels, self.out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear(self.lin_qkv, self.lin_out)

    def _attend(self, x: Tensor, x_dst: Tensor, pos: Optional[Tensor], pos_dst: Optional[Tensor],
                weight: Tensor, batch: Optional[Tensor], batch_dst: Optional[Tensor],
                parts: Optional[Tensor] = None, groups: Optional[_Groups] = None) -> Tensor:
        """Windowed attention of a flat batch (the base's flat layout); see the class
        docstring.  ``groups`` (from :meth:`groups`) replaces ``pos``, ``batch`` and
        ``parts`` and their checks."""
        groups = self._patches(x, x_dst, pos, batch, parts, groups)
        if groups is None:
            return x.new_zeros(0, self.out_channels)
        qkv = groups.pad(self.lin_qkv(x))                           # [G, n, 3C]
        q, k, v = (split_heads(t, self.heads) for t in qkv.chunk(3, dim=-1))
        log_w, empty = _safe_log_weight(groups.pad(weight.to(x.dtype)), groups.mask)
        out = _attend_rows(q, k, v, log_w, empty)                        # [G, H, n, C/H]
        return self.lin_out(groups.unpad(merge_heads(out)))

    def _repr_extra(self) -> str:
        return f", {self._patches_repr()}, method={self.method!r}, shift={self.shift}"


class PatchTokenAttention(PatchAttention):
    r"""Patch-token continuum attention (continuum ViT): patches -> tokens -> attention -> points.

    1. **Patch-local coordinates.** With the patch measure :math:`|D_p| \approx m_p =
       \sum_{i \in p} w_i`, weighted centroid :math:`c_p = \sum_{i\in p} w_i x_i / m_p` and
       RMS radius :math:`s_p = (\sum_{i \in p} w_i |x_i - c_p|^2 / m_p)^{1/2}` (all
       quadratures, hence mesh independent), :math:`\xi_i = (x_i - c_p)/s_p`. ``ξ`` is
       dimensionless and comparable across patches, meshes and embedded surfaces.
    2. **Tokens** (the continuum version of ViT's patch embedding, a nonlocal integral
       operator as in the paper's ViT neural operator):

       .. math::
           t_p[m, :] = \frac{1}{m_p} \sum_{i \in p} w_i\, g_m(\xi_i)\, W_{in} u_i
           \approx \frac{1}{|D_p|}\int_{D_p} g_m(\xi(x))\, W_{in} u(x)\, dx,
           \qquad T_p = E\,\mathrm{vec}(t_p) + b_E,

       with :math:`g: \mathbb{R}^d \to \mathbb{R}^M` a small MLP (``num_basis`` ``M``
       learned basis functions on the reference patch) and :math:`E` a linear map
       ``M·C' -> D``. Dividing by the measure makes the token the *average* over the
       patch: independent of the resolution and of the patch size.
    3. **Attention among the P tokens of a sample**, itself a quadrature over patches with
       weights :math:`m_p`:

       .. math::
           O_p = \frac{\sum_k m_k \exp(q_p \cdot k_k/\sqrt{d_h})\, v_k}
                      {\sum_k m_k \exp(q_p \cdot k_k/\sqrt{d_h})},
           \quad q = W_Q T,\; k = W_K T,\; v = W_V T,

       through ``scaled_dot_product_attention`` with a ``log m`` bias. This is the paper's
       patched attention (Definitions 13-14): :math:`t_p` holds the coefficients of the
       patch function :math:`\tilde u(p) = u|_{D_p}` against the basis ``g``, so for
       linear :math:`\mathsf{Q}, \mathsf{K}` acting on that span the :math:`L^2(D')`
       inner product :math:`\langle \mathsf{Q}\tilde u(p), \mathsf{K}\tilde u(k)\rangle
       = a_p^\top G\, b_k` is a bilinear form of the coefficients, which
       :math:`q_p \cdot k_k = T_p^\top W_Q^\top W_K T_k` learns (Gram matrix ``G``
       included). The weights :math:`m_k` turn the paper's plain sum over the patches of a
       *uniform* partition into a quadrature of :math:`\int_D` over patches of unequal
       measure; for equal measures they cancel in the softmax and the paper's definition
       is recovered exactly.
    4. **Back to the points** by evaluating a learned function of ``ξ`` (a second MLP
       :math:`h: \mathbb{R}^d \to \mathbb{R}^M`):
       :math:`y_i = \sum_m h_m(\xi_i)\, (W_O O_p + b_O)[m, :]` for :math:`i \in p`,
       with :math:`W_O: D \to M \cdot` ``out_channels``.

    Every step is a quadrature or pointwise, so the output converges with the mesh;
    it is smooth inside a patch and discontinuous across borders (paper Remark 21; a
    model keeps a pointwise residual path). Cost ``O(N · M · (C' + out) + B · P² · D)``,
    i.e. ``O(N · P)`` at most. Patch positions reach the tokens through ``x`` (models
    concatenate coordinates to the lifted input, paper eq. 14). Zero-measure patches give
    zero tokens and are ignored as keys; a sample whose weights are all zero outputs 0.

    Args:
        in_channels (int): input channels ``C``.
        out_channels (int, optional): output channels (default ``in_channels``).
        heads (int): heads of the token attention; ``embed_dim`` must be divisible by it.
        num_patches (int): patches per sample ``P >= 1``.
        patch_size (int, optional): points per patch instead of ``num_patches``:
            ``ceil(n / patch_size)`` patches per sample (see :class:`PatchAttention`).
        method (str): partition method of ``meshops.search.partition``.
        shift (bool): use the alternate partition (see :class:`PatchAttention`).
        num_basis (int): learned functions ``M`` per patch (for ``g`` and ``h``).
        token_channels (int, optional): ``C'`` of :math:`W_{in}` (default ``in_channels``).
        embed_dim (int, optional): token dimension ``D`` (default ``in_channels``).
        hidden (int): hidden width of the MLPs ``g`` and ``h``.
        bias (bool): biases of the linear maps (the MLPs always have biases).

    Shapes:
        - **input:** ``x [N, C]``, ``pos [N, d]``, ``weight [N]``, ``batch [N]`` (optional,
          sorted), ``parts [N]`` (optional patch ids).
        - **output:** ``[N, out_channels]``.
    """

    def __init__(self, in_channels: int, out_channels: Optional[int] = None,
                 heads: int = 4, num_patches: int = 16, method: str = "kd",
                 shift: bool = False, num_basis: int = 8, token_channels: Optional[int] = None,
                 embed_dim: Optional[int] = None, hidden: int = 32, bias: bool = True,
                 pos_dim: Optional[int] = None, patch_size: Optional[int] = None):
        super().__init__()
        in_channels = _in_channels(in_channels)
        self._init_channels(in_channels, out_channels, heads, divisible=False)
        out_channels = self.out_channels
        token_channels = in_channels if token_channels is None else token_channels
        embed_dim = in_channels if embed_dim is None else embed_dim
        check_channels(embed_dim, heads, "embed_dim")
        for name, val in (("token_channels", token_channels), ("num_basis", num_basis),
                          ("hidden", hidden)):
            if val < 1:
                raise ValueError(f"{name} must be >= 1, got {val}")
        self._init_partition(num_patches, method, shift, patch_size)
        self.num_basis, self.token_channels, self.embed_dim = num_basis, token_channels, embed_dim
        self.hidden = hidden
        self.pos_dim = pos_dim
        self.lin_in = nn.Linear(in_channels, token_channels, bias=False)
        self.embed = nn.Linear(num_basis * token_channels, embed_dim, bias=bias)
        self.lin_qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.lin_out = nn.Linear(embed_dim, num_basis * out_channels, bias=bias)
        # g, h: R^d -> R^M. d is only known from the data unless pos_dim is given.
        self.basis_in: nn.Module = (nn.LazyLinear(hidden) if pos_dim is None
                                    else nn.Linear(pos_dim, hidden))
        self.basis_in_rest = nn.Sequential(nn.GELU(), nn.Linear(hidden, num_basis))
        self.basis_out: nn.Module = (nn.LazyLinear(hidden) if pos_dim is None
                                     else nn.Linear(pos_dim, hidden))
        self.basis_out_rest = nn.Sequential(nn.GELU(), nn.Linear(hidden, num_basis))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear(self.lin_in, self.embed, self.lin_qkv, self.lin_out)
        # The basis MLPs g, h keep PyTorch's initialisation: their random biases give
        # the learned basis constants and offsets (zero biases would make every basis
        # function vanish at the patch centre, xi = 0).
        for m in (self.basis_in, self.basis_in_rest, self.basis_out, self.basis_out_rest):
            for lin in m.modules():
                if isinstance(lin, nn.Linear):   # LazyLinear skips itself until materialised
                    lin.reset_parameters()

    def g(self, xi: Tensor) -> Tensor:
        """Learned basis of the token integral, ``[N, d] -> [N, M]``."""
        return self.basis_in_rest(self.basis_in(xi))

    def h(self, xi: Tensor) -> Tensor:
        """Learned functions evaluating a token at the points, ``[N, d] -> [N, M]``."""
        return self.basis_out_rest(self.basis_out(xi))

    @staticmethod
    def local_coordinates(pos: Tensor, weight: Tensor, gid: Tensor, num_groups: int
                          ) -> tuple[Tensor, Tensor]:
        """Patch measures ``m [G]`` and patch-local coordinates ``ξ [N, d]``.

        ``ξ_i = (x_i - c_p) / s_p`` with the weighted centroid ``c_p`` and RMS radius
        ``s_p`` of patch ``p = gid[i]``; ``ξ = 0`` in degenerate patches (zero measure, a
        single point, or a radius at rounding level ``s_p <= 1e3 eps |c_p|_inf``).
        """
        w = weight.to(pos.dtype)
        m = torch.zeros(num_groups, dtype=pos.dtype, device=pos.device).index_add(0, gid, w)
        valid = m > 0
        m_safe = torch.where(valid, m, torch.ones_like(m))
        centre = torch.zeros(num_groups, pos.shape[1], dtype=pos.dtype, device=pos.device)
        centre = centre.index_add(0, gid, w[:, None] * pos) / m_safe[:, None]
        rel = pos - centre[gid]
        var = torch.zeros_like(m).index_add(0, gid, w * rel.pow(2).sum(-1)) / m_safe
        scale = var.clamp_min(torch.finfo(pos.dtype).tiny).sqrt()
        # Degenerate patches (one point, coincident points, zero measure): the radius is
        # rounding noise, so xi is set to 0 there (constant, hence also no NaN gradient).
        floor = 1e3 * torch.finfo(pos.dtype).eps * centre.detach().abs().amax(-1)
        ok = valid & (var > 0) & (scale > floor)
        scale = torch.where(ok, scale, torch.ones_like(scale))
        xi = torch.where(ok[gid, None], rel / scale[gid, None], torch.zeros_like(rel))
        return m, xi

    def _attend(self, x: Tensor, x_dst: Tensor, pos: Optional[Tensor], pos_dst: Optional[Tensor],
                weight: Tensor, batch: Optional[Tensor], batch_dst: Optional[Tensor],
                parts: Optional[Tensor] = None, groups: Optional[_Groups] = None) -> Tensor:
        """Patch-token attention of a flat batch (the base's flat layout); see the class
        docstring.  ``groups`` (from :meth:`groups`) replaces ``batch`` and ``parts`` and
        their checks (``pos`` is still needed: the patch-local coordinates)."""
        if self.pos_dim is not None and isinstance(pos, Tensor) and pos.shape[1] != self.pos_dim:
            raise ValueError(f"pos has {pos.shape[1]} coordinates, expected pos_dim={self.pos_dim}")
        groups = self._patches(x, x_dst, pos, batch, parts, groups)
        if pos is None:
            raise ValueError(f"{type(self).__name__} needs pos (the patch-local coordinates)")
        if groups is None:
            return x.new_zeros(0, self.out_channels)
        G, M = groups.num_groups, self.num_basis
        # Patch geometry (centroids, radii, measures) in at least float32: in bf16 the
        # differences x_i - c_p lose most of their digits (a 38 % layer error under bf16
        # autocast); only the O(1) local coordinates meet the bf16 features.
        gdt = torch.promote_types(x.dtype, torch.float32)
        measure, xi = self.local_coordinates(pos.to(gdt), weight, groups.gid, G)
        xi = xi.to(x.dtype)
        w = weight.to(x.dtype)

        # tokens t_p = (1/m_p) sum_i w_i g(xi_i) (W_in x_i)^T  as a padded batched matmul
        u = groups.pad(self.lin_in(x))                               # [G, n, C']
        wg = groups.pad((w[:, None] * self.g(xi)).to(u.dtype))       # [G, n, M]
        t = torch.bmm(wg.transpose(1, 2), u)                         # [G, M, C']
        m_safe = torch.where(measure > 0, measure, torch.ones_like(measure))
        tokens = self.embed((t / m_safe[:, None, None]).to(t.dtype).reshape(G, -1))  # [G, D]
        measure = measure.to(x.dtype)

        # continuum attention among the tokens of each sample, patch measures as weights
        tok = groups.tokens
        qkv = tok.to_dense(self.lin_qkv(tokens))
        q, k, v = (split_heads(z, self.heads) for z in qkv.chunk(3, dim=-1))
        log_w, empty = _safe_log_weight(tok.to_dense(measure), tok.mask)
        out = _attend_rows(q, k, v, log_w, empty)                         # [B, H, P, D/H]
        coeff = self.lin_out(tok.to_flat(merge_heads(out))).view(G, M, self.out_channels)

        # back to the points: y_i = sum_m h_m(xi_i) coeff_p[m, :]
        hp = groups.pad(self.h(xi))                                  # [G, n, M]
        y = torch.bmm(hp, coeff)                                     # [G, n, out]
        # all-zero-weight samples output 0 (no bias either)
        y = _zero_rows(y, empty[groups.sample][:, None, None])
        return groups.unpad(y)

    def _repr_extra(self) -> str:
        return (f", {self._patches_repr()}, method={self.method!r}, shift={self.shift}, "
                f"num_basis={self.num_basis}, embed_dim={self.embed_dim}")
