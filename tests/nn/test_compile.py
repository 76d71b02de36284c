"""Every layer's forward compiles with ``torch.compile(fullgraph=True)`` once its
structures are precomputed (issue 14, item 3): the inputs are validated once
(:func:`meshops.nn.batch_points`, ``layer.graph``, ``layer.groups``) and the forward
pass does no host synchronisation (no ``.item()``, no ``bool(tensor)``, no branch on
data), which ``fullgraph=True`` turns into an error.  The compiled output must equal
the eager output of the checked (tensor-input) call.

The default run traces with the ``aot_eager`` backend (Dynamo's full graph plus
AOTAutograd's fake-tensor propagation, a few seconds); the slow test also generates
Inductor code for every layer.
"""

import pytest
import torch

from meshops.nn import (
    ContinuumAttention,
    FourierAttention,
    GalerkinAttention,
    LocalAttention,
    LocalPositionAttention,
    PatchTokenAttention,
    PositionAttention,
    WindowAttention,
    batch_points,
)

DT = torch.float64
SIZES = [7, 5]
# float64 and the same operations in the same order: only fused/reordered rounding
TOL = dict(rtol=0, atol=1e-12)


def _data(seed=0, c=8):
    g = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    batch = torch.arange(len(SIZES)).repeat_interleave(torch.tensor(SIZES))
    pos = torch.rand(n, 2, generator=g, dtype=DT)
    w = torch.rand(n, generator=g, dtype=DT) + 0.1
    x = torch.randn(n, c, generator=g, dtype=DT)
    return x, pos, w, batch


def _cases():
    """name -> (layer, eager call with checked tensors, call with precomputed structures)."""
    x, pos, w, b = _data()
    pts = batch_points(pos, w, b)
    # cross: 12 source points -> 8 destination points
    xd, pd, _, _ = _data(1)
    bd = torch.tensor([0] * 5 + [1] * 3)
    xd, pd = xd[:8], pd[:8]
    cross = batch_points((pos, pd), w, (b, bd))

    def glob(cls, **kw):
        layer = cls(8, heads=2, **kw)
        return layer, (lambda l: l(x, pos, w, b)), (lambda l: l(x, pts))

    def local(cls, **kw):
        layer = cls(8, heads=2, k=3, **kw)
        e = layer.graph(pos, b)
        return layer, (lambda l: l(x, pos, w, b, edge_index=e)), \
            (lambda l: l(x, pts, edge_index=e))

    def patch(cls, **kw):
        layer = cls(8, heads=2, num_patches=2, **kw)
        groups = layer.groups(pos, w, b)
        return layer, (lambda l: l(x, pos, w, b)), (lambda l: l(x, pos, w, groups=groups))

    pa = PositionAttention(8, heads=2, lam_init=[3.0, 11.0]).to(DT)
    kernel = pa.kernel(pos, w, b).detach()
    xs = x[:7].unsqueeze(0).expand(3, 7, 8)            # a dense batch sharing one mesh
    ca = ContinuumAttention(8, heads=2)
    return {
        "continuum": glob(ContinuumAttention),
        "continuum_sdpa": glob(ContinuumAttention, impl="sdpa"),
        "continuum_cross": (ca, lambda l: l((x, xd), (None, None), w, (b, bd)),
                            lambda l: l((x, xd), (cross[0], cross[1]))),
        "continuum_dense": (ca, lambda l: l.dense(xs, None, w[:7].expand(3, 7)),
                            lambda l: l.dense(xs, None, w[:7].expand(3, 7))),
        "galerkin": glob(GalerkinAttention),
        "fourier": glob(FourierAttention, pos_dim=2),
        "position_kernel": glob(PositionAttention, impl="kernel"),
        "position_sdpa": glob(PositionAttention, impl="sdpa"),
        "position_cross": (pa, lambda l: l((x, None), (pos, pd), w, (b, bd)),
                           lambda l: l((x, None), cross)),
        "position_precomputed": (pa, lambda l: l(x, pos, w, b),
                                 lambda l: l(x, pts, kernel=kernel)),
        "position_dense_shared": (pa, lambda l: l.dense(xs, pos[:7], w[:7]),
                                  lambda l: l.dense(xs, pos[:7], w[:7])),
        "local_position": local(LocalPositionAttention),
        "local": local(LocalAttention),
        "window": patch(WindowAttention),
        "token": patch(PatchTokenAttention, pos_dim=2),
    }


CASES = sorted(_cases())


def _check(name, backend):
    layer, eager_call, structured_call = _cases()[name]
    layer = layer.to(DT).eval()
    expected = eager_call(layer)
    torch._dynamo.reset()
    compiled = torch.compile(lambda: structured_call(layer), fullgraph=True, backend=backend)
    out = compiled()
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize("name", CASES)
def test_forward_compiles_without_graph_breaks(name):
    _check(name, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_forward_compiles_with_inductor(name):
    _check(name, "inductor")


def test_points_built_from_known_sizes_compile_and_equal_the_read_ones():
    """batch_points with the sizes given (num_graphs, max_points) reads no tensor
    value: it traces with fullgraph=True, while compiling skips the value checks, and
    gives the layout it reads eagerly; a sample larger than max_points is an error
    (raised on the device, as an eager call shows), not a silently overlapping layout."""
    x, pos, w, b = _data()
    eager = batch_points(pos, w, b)
    build = torch.compile(lambda: batch_points(pos, w, b, num_graphs=2, max_points=7),
                          fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    known = build()
    assert (known.num_graphs, known.max_points) == (eager.num_graphs, eager.max_points) == (2, 7)
    assert torch.equal(known.index, eager.index) and torch.equal(known.mask, eager.mask)
    torch.testing.assert_close(known.to_dense(x), eager.to_dense(x), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="more than max_points=6 points"):
        batch_points(pos, w, b, num_graphs=2, max_points=6)
