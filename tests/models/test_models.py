"""The neural-operator models: overfitting, shapes, batching, query points, config and
checkpoints, and the model-specific pieces (PiT latent meshes and balls, shared
partitions/kernels, parameter counts of the paper's configurations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _devices import BF16_MODEL_RTOL
from _meshes import square_mesh
from torch_geometric.data import Batch

from meshops import MeshData
from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.mesh.quadrature import quadrature_weights
from meshops.models import MODELS, NeuralOperator, PiT, get_model
from meshops.models.base import count_parameters
from meshops.models.inputs import read_inputs
from meshops.models.latent import box_sites, fps_latent, grid_latent, site_latent, voronoi_weights
from meshops.nn import knn_interpolate
from meshops.search.graph import measure_ball_graph
from meshops.training.loss import relative_lp

NAMES = ["transformer_no", "galerkin_transformer", "pit", "patched_transformer",
         "slice_transformer"]
VARIANTS = NAMES + ["pit_fps"]   # PiT with a farthest-point-sampled latent mesh

# Small configurations for the tests (the defaults are benchmark-sized).
SMALL = {
    "transformer_no": dict(width=32, layers=2, heads=2, pos_encoding=2),
    "galerkin_transformer": dict(width=32, layers=2, heads=2, pos_encoding=2),
    "pit": dict(width=32, heads=2, latent="input", quantile_in=0.02, quantile_out=0.02),
    "pit_fps": dict(width=32, heads=2, num_latent=40, quantile_in=0.05, quantile_out=0.05),
    "patched_transformer": dict(width=32, layers=4, heads=2, num_patches=4,
                                pattern="alternate", pos_encoding=2),
    "slice_transformer": dict(width=32, layers=2, heads=2, slices=8, pos_encoding=2),
}


pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def build(name: str, in_channels: int = 1, out_channels: int = 1, seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = "pit" if name == "pit_fps" else name
    return get_model(model, in_channels=in_channels, out_channels=out_channels,
                     **{**SMALL[name], **kw})


def field(pts: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A smooth random field ``c0 sin(pi x) cos(pi y) + c1 cos(2 x y) + c2``."""
    x, y = pts[:, 0], pts[:, 1]
    return c[0] * np.sin(np.pi * x) * np.cos(np.pi * y) + c[1] * np.cos(2 * x * y) + c[2]


def make_sample(n: int, seed: int, in_channels: int = 1, out_channels: int = 1,
                amount: float = 0.3, query: int = 0) -> MeshData:
    """Perturbed triangulated unit square with ``n x n`` cells, input ``f`` (smooth,
    random) and target ``[f (1 + x) + mean f, ...]``; ``query`` extra random query points."""
    rng = np.random.default_rng(seed)
    pts, cells = square_mesh(n, "triangle", amount=amount, seed=seed)
    w = quadrature_weights(pts, cells).float()
    c = rng.standard_normal(3)
    f = field(pts, c)
    mean = float((w.numpy() * f).sum() / w.sum())
    target = [f * (1 + pts[:, 0]) + mean, np.sin(f) + pts[:, 1]][:out_channels]
    x = np.stack([f] + [np.cos(f + k) for k in range(1, in_channels)], 1)[:, :in_channels]
    data = MeshData(pos=torch.tensor(pts, dtype=torch.float32), weight=w,
                    x=torch.tensor(x, dtype=torch.float32),
                    y=torch.tensor(np.stack(target, 1), dtype=torch.float32))
    if query:
        data.query_pos = torch.rand(query, 2, generator=torch.Generator().manual_seed(seed))
    return data


def batch_of(samples):
    b = Batch.from_data_list(samples, follow_batch=["query_pos"]
                             if getattr(samples[0], "query_pos", None) is not None else None)
    if getattr(b, "query_pos", None) is not None:
        b.query_batch = b.query_pos_batch
    return b


# ------------------------------------------------------------------ overfitting
OVERFIT_LR = {"transformer_no": 1e-2, "galerkin_transformer": 1e-2, "pit": 5e-3,
              "patched_transformer": 5e-3, "slice_transformer": 3e-3}
# The slice transformer starts from small weights (Transolver's initialisation): near
# uniform slices and identity blocks, from which it needs more steps.
OVERFIT_STEPS = {"slice_transformer": 800}


# PiT's run takes 32 s on 2 shared cores (pytest --durations), the others 10-16 s:
# it runs with the slow tests (pytest -m slow).
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "pit" else n
                                  for n in NAMES])
def test_overfits_tiny_dataset(name):
    """Mean relative L2 falls by 100x on 4 samples of 100-300 points (plain Adam loop)."""
    samples = [make_sample(n, seed=i) for i, n in enumerate([9, 11, 13, 15])]
    batch = batch_of(samples)
    model = build(name)
    steps, lr = OVERFIT_STEPS.get(name, 400), OVERFIT_LR[name]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.15)
    with torch.no_grad():
        first = float(relative_lp(model(batch), batch.y, batch.weight, batch.batch))
    for _ in range(steps):
        loss = relative_lp(model(batch), batch.y, batch.weight, batch.batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        last = float(relative_lp(model(batch), batch.y, batch.weight, batch.batch))
    print(f"{name}: relative L2 {first:.3f} -> {last:.5f} ({first / last:.0f}x)")
    assert last <= first / 100, (first, last)
    # a mesh with a number of points no training mesh had: finite, right shape, and
    # the same function (it is the first sample's field on a finer mesh)
    fine = make_sample(19, seed=0)
    with torch.no_grad():
        out = model(fine)
    assert out.shape == (fine.pos.shape[0], 1) and bool(torch.isfinite(out).all())
    assert float(relative_lp(out, fine.y, fine.weight)) < 0.05


# ------------------------------------------------------------- shapes and batches
@pytest.mark.parametrize("name", VARIANTS)
def test_query_points_batches_and_shapes(name, device):
    """Samples of different sizes, query points other than the inputs (different
    numbers per sample), 3 input and 2 output channels; on every device the CPU's
    float32 result."""
    samples = [make_sample(n, seed=i, in_channels=3, out_channels=2, query=q)
               for i, (n, q) in enumerate([(6, 17), (9, 5), (7, 40)])]
    batch = batch_of(samples)
    model = build(name, in_channels=3, out_channels=2).eval()
    with torch.no_grad():
        out = device.run(model, batch)
        alone = [device.run(model, s) for s in samples]
        if device.is_cuda:
            device.assert_close(out, model(batch), rtol=1e-4, atol=1e-5,
                                bf16_rtol=BF16_MODEL_RTOL)
    assert out.shape == (17 + 5 + 40, 2)
    assert bool(torch.isfinite(out).all())
    # the batch gives each sample's own result
    device.assert_close(out, torch.cat(alone), rtol=1e-4, atol=1e-5, bf16_rtol=BF16_MODEL_RTOL)
    # without query points: outputs at the input points
    for s in samples:
        del s.query_pos
    with torch.no_grad():
        out = model(batch_of(samples))
    assert out.shape == (sum(s.pos.shape[0] for s in samples), 2)


@pytest.mark.parametrize("name", VARIANTS)
def test_no_mixing_across_samples(name, device):
    """Changing sample 2 (values and mesh) changes nothing in samples 1 and 3."""
    a, b, c = (make_sample(n, seed=i) for i, n in enumerate([7, 8, 6]))
    b2 = make_sample(10, seed=5)
    model = build(name).eval()
    with torch.no_grad():
        out1 = device.run(model, batch_of([a, b, c]))
        out2 = device.run(model, batch_of([a, b2, c]))
    na, nb, nb2 = a.pos.shape[0], b.pos.shape[0], b2.pos.shape[0]
    device.assert_close(out1[:na], out2[:na], rtol=1e-5, atol=1e-6, bf16_rtol=BF16_MODEL_RTOL)
    device.assert_close(out1[na + nb:], out2[na + nb2:], rtol=1e-5, atol=1e-6,
                        bf16_rtol=BF16_MODEL_RTOL)
    # and sample 2's output does depend on sample 2
    with torch.no_grad():
        b3 = b.clone()
        b3.x = b3.x * 2 + 1
        out3 = device.run(model, batch_of([a, b3, c]))
    assert float((out3[na:na + nb] - out1[na:na + nb]).abs().max()) > 1e-4


@pytest.mark.parametrize("name", VARIANTS)
def test_querying_the_input_points_reproduces_the_default(name, device):
    """The decoder is one function of the query point: asking for it at the input
    points explicitly gives exactly the default output."""
    samples = [make_sample(n, seed=i) for i, n in enumerate([6, 9])]
    model = build(name).eval()
    with torch.no_grad():
        default = device.run(model, batch_of(samples))
        for s in samples:
            s.query_pos = s.pos.clone()
        explicit = device.run(model, batch_of(samples))
    device.assert_close(explicit, default, rtol=1e-5, atol=1e-6, bf16_rtol=BF16_MODEL_RTOL)


@pytest.mark.parametrize("name", VARIANTS)
def test_geometry_only_input_and_float64_positions(name):
    """``x [N, 0]`` (the input is the geometry) and float64 pos/weight from files."""
    s = make_sample(8, seed=3)
    s.x = s.x[:, :0]
    s.pos, s.weight = s.pos.double(), s.weight.double()
    model = build(name, in_channels=0).eval()
    with torch.no_grad():
        out = model(s)
        out_none = model(MeshData(pos=s.pos, weight=s.weight))  # no x at all
    assert out.shape == (s.pos.shape[0], 1) and out.dtype == torch.float32
    torch.testing.assert_close(out, out_none)


# --------------------------------------------------------------- config, checkpoint
@pytest.mark.parametrize("name", VARIANTS)
def test_get_model_config_and_checkpoint_round_trip(name, tmp_path):
    model = build(name, in_channels=1, out_channels=2)
    assert isinstance(model, NeuralOperator)
    name = model.model_name
    assert MODELS[name] is type(model)
    # the recorded config is JSON-serialisable and rebuilds the same architecture
    import json
    cfg = json.loads(json.dumps(model.config))
    twin = get_model(name, **cfg)
    assert [(k, v.shape) for k, v in twin.state_dict().items()] == \
        [(k, v.shape) for k, v in model.state_dict().items()]
    assert count_parameters(twin) == count_parameters(model)
    twin.load_state_dict(model.state_dict())
    s = make_sample(7, seed=1, out_channels=2, query=11)
    model.eval(), twin.eval()
    with torch.no_grad():
        torch.testing.assert_close(twin(s), model(s), rtol=0, atol=0)
    # with normalisers, through a checkpoint file
    train = [make_sample(n, seed=i, out_channels=2) for i, n in enumerate([5, 6])]
    model.set_normalizers(UnitGaussianNormalizer(1).fit(train, "x"),
                          UnitGaussianNormalizer(2).fit(train, "y"))
    path = model.save(tmp_path / "model.pt", fields=["f"])
    loaded = NeuralOperator.from_checkpoint(path)
    assert type(loaded) is type(model) and loaded.config == model.config
    other = make_sample(13, seed=9, out_channels=2)  # a size no other mesh here has
    torch.testing.assert_close(loaded.predict(other), model.predict(other), rtol=0, atol=0)
    assert loaded.predict(other).shape == (other.pos.shape[0], 2)


@pytest.mark.parametrize("name", NAMES)
def test_reset_parameters_and_invalid_arguments(name):
    model = build(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    model.reset_parameters()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("lift" in k for k in changed) and len(changed) > len(before) // 3
    with pytest.raises(ValueError):
        get_model(name, in_channels=1, out_channels=0)
    with pytest.raises(ValueError):
        get_model(name, in_channels=-1, out_channels=1)
    s = make_sample(5, seed=0)
    with pytest.raises(ValueError, match="x"):
        build(name, in_channels=2)(s)  # wrong number of input channels
    with pytest.raises(ValueError, match="pos"):
        build(name, pos_dim=3)(s)
    bad = s.clone()
    bad.weight = -bad.weight
    with pytest.raises(ValueError, match="weight"):
        model(bad)
    two = batch_of([make_sample(4, 0), make_sample(5, 1)])
    two.query_pos = torch.rand(3, 2)
    with pytest.raises(ValueError, match="query_batch"):
        model(two)


@pytest.mark.parametrize("name", NAMES)
def test_presets_build(name):
    cls = MODELS[name]
    for preset in cls.PRESETS:
        m = cls.from_preset(preset, in_channels=0, out_channels=1)
        assert count_parameters(m) > 0 and m.config["out_channels"] == 1
    with pytest.raises(ValueError, match="preset"):
        cls.from_preset("nope", in_channels=0, out_channels=1)


# --------------------------------------------------------------------------- TNO
def test_tno_pointwise_decoder_refuses_other_points():
    model = build("transformer_no", decoder="pointwise").eval()
    s = make_sample(6, seed=0)
    with torch.no_grad():
        assert model(s).shape == (s.pos.shape[0], 1)
        s.query_pos = s.pos.clone()
        assert model(s).shape == (s.pos.shape[0], 1)
        s.query_pos = torch.rand(4, 2)
        with pytest.raises(ValueError, match="cross"):
            model(s)


def test_tno_post_norm_is_the_papers_composition(device64):
    """pre_norm=False: every block (and the decoder's cross block) is the post-norm
    iteration h = N1(x + Attn(x)), y = N2(h + FFN(h)), with no final norm; checked in
    float64 against that composition written here from the model's own submodules."""
    s = make_sample(6, seed=0, query=5)
    model = build("transformer_no", pre_norm=False).double().eval()
    assert isinstance(model.norm_out, torch.nn.Identity)
    blocks = [*model.blocks, model.cross]
    assert all(not b.pre_norm and isinstance(b.norm1, torch.nn.LayerNorm)
               and isinstance(b.norm2, torch.nn.LayerNorm) for b in blocks)
    x, pos, w, q = s.x.double(), s.pos.double(), s.weight.double(), s.query_pos.double()
    with torch.no_grad():
        h = model.lift(torch.cat([x, model.pos_enc(pos)], 1))
        for b in model.blocks:
            h = b.norm1(h + b.attention(h, None, w))
            h = b.norm2(h + b.ffn(h))
        c = model.cross
        z = model.query_embed(model.pos_enc(q))
        z = c.norm1(z + c.attention((h, z), None, w))
        ref = model.head(c.norm2(z + c.ffn(z)))
        device64.assert_close(device64.run(model, s), ref, rtol=0, atol=1e-12)
        # and it is not the pre-norm model with the same weights
        pre = build("transformer_no").double().eval()
        pre.load_state_dict(model.state_dict(), strict=False)
        assert float((pre(s) - ref).abs().max()) > 1e-3


def fourier_attention_reference(att, x, pos, w):
    """Cao's Fourier-type attention (eq. (5), 1/n -> w_j) for one sample, per head, in
    float64 with the explicit N x N matrix: z = (Q~ K~^T) diag(w) V, Q~ and K~ layer-
    normalised per head, the coordinates in front of every head's q, k, v."""
    H, D = att.heads, att.head_channels
    q, k, v = att.lin_q(x), att.lin_k(x), att.lin_v(x)
    heads = []
    for h in range(H):
        c = slice(h * D, (h + 1) * D)
        qh = torch.nn.functional.layer_norm(q[:, c], (D,), att.norms["q"].weight[h],
                                            att.norms["q"].bias[h], att.norms["q"].eps)
        kh = torch.nn.functional.layer_norm(k[:, c], (D,), att.norms["k"].weight[h],
                                            att.norms["k"].bias[h], att.norms["k"].eps)
        qh, kh, vh = (torch.cat([pos, t], 1) for t in (qh, kh, v[:, c]))
        heads.append((qh @ kh.T) @ torch.diag(w) @ vh)
    return att.lin_out(torch.cat(heads, 1))


def test_galerkin_transformer_fourier_blocks_and_composition(device64):
    """attention="fourier": every encoder block holds a FourierAttention whose output is
    the float64 formula above, and the model is lift -> (y + Attn(y), then + FFN) per
    block, no norms -> head."""
    from meshops.nn.galerkin import FourierAttention
    s = make_sample(6, seed=0)
    model = build("galerkin_transformer", attention="fourier").double().eval()
    with torch.no_grad():       # generic parameters (the init is close to 0 and identity)
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    assert all(type(b.attention) is FourierAttention for b in model.blocks)
    x, pos, w = s.x.double(), s.pos.double(), s.weight.double()
    with torch.no_grad():
        h = model.lift(torch.cat([x, model.pos_enc(pos)], 1))
        for b in model.blocks:
            a = fourier_attention_reference(b.attention, h, pos, w)
            torch.testing.assert_close(b.attention(h, pos, w), a, rtol=0, atol=1e-10)
            h = h + a
            h = h + b.ffn(h)
        device64.assert_close(device64.run(model, s), model.head(h), rtol=0, atol=1e-10)


# -------------------------------------------------------------------------- PiT
def test_pit_parameter_count_matches_the_paper_naca_model():
    """PiT's NACA model (Table 9: width 256, 2 heads, lift of [coordinates, pos]):
    1,250,061 parameters as reported in the paper."""
    m = PiT.from_preset("naca", in_channels=2, out_channels=1)
    assert count_parameters(m) == 1_250_061


def test_pit_latent_meshes():
    s = make_sample(12, seed=0)                                     # 169 points
    b = batch_of([s, make_sample(9, seed=1)])                       # + 100 points
    # fps: num_latent per sample, the points of each sample, sorted
    idx = fps_latent(b.pos, b.batch, 40)
    assert idx.numel() == 80 and bool((idx[1:] > idx[:-1]).all())
    assert torch.equal(torch.bincount(b.batch[idx]), torch.tensor([40, 40]))
    # Voronoi weights sum to each sample's measure
    lw = voronoi_weights(b.pos, b.weight, b.batch, b.pos[idx], b.batch[idx])
    per = torch.zeros(2).index_add(0, b.batch[idx], lw)
    torch.testing.assert_close(per, torch.ones(2))
    assert bool((lw > 0).all())
    # on a uniform grid the stride-2 sub-grid gets the coarse trapezoid rule (the fine
    # nodes midway between coarse ones split their weight)
    from meshops.mesh.quadrature import grid_weights
    s1 = np.linspace(0, 1, 9)
    X, Y = np.meshgrid(s1, s1, indexing="ij")
    pos = torch.tensor(np.stack([X.ravel(), Y.ravel()], 1), dtype=torch.float32)
    sub = grid_latent([9, 9], 2, None, 81)
    lw = voronoi_weights(pos, grid_weights(X, Y).float(), None, pos[sub], None)
    c = np.linspace(0, 1, 5)
    torch.testing.assert_close(lw, grid_weights(*np.meshgrid(c, c, indexing="ij")).float())
    # grid: 221 x 51 with stride 2 -> 111 x 26 (the NACA latent mesh), boundary kept
    g = grid_latent([221, 51], 2, None, 221 * 51)
    assert g.numel() == 111 * 26
    rows, cols = g // 51, g % 51
    assert set(rows.tolist()) == set(range(0, 221, 2)) and 50 in set(cols.tolist())
    g = grid_latent([10, 7], 3, None, 70)                           # 0,3,6,9 x 0,3,6
    assert g.numel() == 12
    g = grid_latent([10, 8], 3, None, 80)                           # 0,3,6,9 x 0,3,6,7
    assert g.numel() == 16
    with pytest.raises(ValueError, match="grid_shape"):
        grid_latent([10, 8], 3, None, 81)


def test_site_latent_takes_the_point_nearest_each_site_of_the_box():
    s, t = make_sample(12, seed=0), make_sample(9, seed=1)         # 169 + 100 points
    b = batch_of([s, t])
    idx = site_latent(b.pos, b.batch, 30)
    # the plain reference: each site's nearest point of its own sample, each point once
    want = []
    for k, d in enumerate((s, t)):
        p = d.pos.double().numpy()
        lo, hi = p.min(0), p.max(0)
        h = math.sqrt(np.prod(hi - lo) / 30)
        n = [max(1, round(e / h)) for e in hi - lo]
        c = [lo[i] + (np.arange(n[i]) + 0.5) * (hi[i] - lo[i]) / n[i] for i in range(2)]
        sites = np.stack(np.meshgrid(*c, indexing="ij"), -1).reshape(-1, 2)
        near = np.linalg.norm(sites[:, None] - p[None], axis=-1).argmin(1)
        want += sorted(set((near + (0 if k == 0 else 169)).tolist()))
    assert idx.tolist() == want
    # one spacing on both axes of a 2 x 1 box; a flat axis gets one site
    sites = box_sites(torch.zeros(2, dtype=torch.float64), torch.tensor([2.0, 1.0]), 50)
    assert sites.shape == (50, 2)                                   # 10 x 5 cells
    flat = box_sites(torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 1.0, 0.0]), 16)
    assert flat.shape == (16, 3) and bool((flat[:, 2] == 0).all())


def test_site_latent_moves_with_the_mesh_size_and_fps_does_not():
    """The same square meshed at 16, 32 and 64 cells a side: every site latent point is
    within a cell diagonal of its site, so the latent meshes of two meshes differ by at
    most the sum of their cell diagonals, a bound that halves with every refinement; the
    farthest-point samples of the same meshes differ by about their own spacing."""
    meshes = [torch.tensor(square_mesh(n, "triangle", amount=0.2, seed=n)[0],
                           dtype=torch.float64) for n in (16, 32, 64)]

    def moved(pick, a, b):          # largest distance from a latent point of b to a's
        pa, pb = a[pick(a)], b[pick(b)]
        return float(torch.cdist(pb, pa).min(1).values.max())

    sites = lambda p: site_latent(p, None, 49)                      # noqa: E731
    fps = lambda p: fps_latent(p, None, 49)                         # noqa: E731
    diag = [math.sqrt(2) * 1.4 / n for n in (16, 32, 64)]           # perturbed cells
    for (a, b), bound in zip([(0, 1), (1, 2)], [diag[0] + diag[1], diag[1] + diag[2]]):
        assert moved(sites, meshes[a], meshes[b]) <= bound
    # control: FPS of 49 points (spacing about 1/7) moves by a good part of its spacing
    assert moved(fps, meshes[1], meshes[2]) > 2 * moved(sites, meshes[1], meshes[2])


def test_pit_grid_latent_model_and_shared_mesh_path():
    """latent='grid' on structured samples; a batch sharing one mesh takes the shared
    kernel path, with the same result as the per-sample path."""
    n0, n1 = 15, 9
    xs, ys = np.meshgrid(np.linspace(0, 1, n0), np.linspace(0, 1, n1) ** 1.5, indexing="ij")
    pts = np.stack([xs.ravel(), ys.ravel()], 1)
    from meshops.mesh.quadrature import grid_weights
    w = grid_weights(xs, ys).float()
    pos = torch.tensor(pts, dtype=torch.float32)
    samples = [MeshData(pos=pos, weight=w, x=torch.randn(n0 * n1, 1)) for _ in range(3)]
    torch.manual_seed(0)
    model = PiT(1, 1, width=16, latent="grid", grid_shape=[n0, n1], stride=2,
                quantile_in=0.05, quantile_out=0.1).eval()
    b = batch_of(samples)
    lat = model.latent_mesh(read_inputs(b, 1, 2, torch.float32))
    assert lat.shared and lat.pos.shape[0] == 3 * 8 * 5
    with torch.no_grad():
        out = model(b)
        alone = torch.cat([model(s) for s in samples])
    torch.testing.assert_close(out, alone, rtol=1e-5, atol=1e-6)


def test_pit_shared_lambda_builds_one_kernel(monkeypatch):
    """shared_lambda: one position kernel for all processor blocks (instead of one per
    block), the same result as giving every block the first block's lambda."""
    import meshops.nn.functional as functional_mod
    import meshops.nn.position as pos_mod
    calls = []
    real = pos_mod._dense_kernel
    monkeypatch.setattr(pos_mod, "_dense_kernel",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    b = batch_of([make_sample(6, 0), make_sample(7, 1)])
    torch.manual_seed(0)
    model = PiT(1, 1, width=16, heads=2, blocks=4, num_latent=20, shared_lambda=True).eval()
    with torch.no_grad():
        out = model(b)
    assert len(calls) == 1
    # too large for one materialised kernel: each block evaluates the shared lambda
    monkeypatch.setattr(functional_mod, "KERNEL_LIMIT", 1)
    with torch.no_grad():
        torch.testing.assert_close(model(b), out, rtol=1e-5, atol=1e-6)
    monkeypatch.undo()
    # the same as every block with the first block's lambda, one kernel per block
    model.shared_lambda = False
    for att in list(model.attn)[1:]:
        att.lam_raw.data.copy_(model.attn[0].lam_raw.data)
    calls.clear()
    monkeypatch.setattr(pos_mod, "_dense_kernel",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        torch.testing.assert_close(model(b), out, rtol=1e-5, atol=1e-6)
    assert len(calls) == 4
    # the blocks share one lambda parameter (trained once, not frozen copies)
    lam = model.attn[0].lam_raw
    assert all(a.lam_raw is lam for a in model.attn) and lam.requires_grad
    assert sum(p is lam for p in model.parameters()) == 1


def test_measure_ball_is_mesh_independent_and_count_ball_is_not():
    """The measure quantile keeps the ball radius on a graded mesh; PiT's count
    quantile shrinks it where the mesh is dense. With uniform weights they agree."""
    def ball_radius(pts, w, centre, q, measure):
        pos = torch.tensor(pts, dtype=torch.float32)
        c = torch.tensor([centre], dtype=torch.float32)
        if measure:
            e = measure_ball_graph(pos, w, None, c, None, q)
        else:
            from meshops.nn.local import local_graph
            e = local_graph(pos, c, None, q)    # as measure_ball_graph: row 0 source
        return float((pos[e[0]] - c).norm(dim=1).max())

    s = np.linspace(0, 1, 61)
    uni = np.stack(np.meshgrid(s, s, indexing="ij"), -1).reshape(-1, 2)
    g = np.expm1(3 * s) / np.expm1(3)
    grad = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    from meshops.mesh.quadrature import grid_weights
    w_uni = grid_weights(*np.meshgrid(s, s, indexing="ij")).float()
    w_grad = grid_weights(*np.meshgrid(g, g, indexing="ij")).float()
    centre, q = (0.1, 0.1), 0.02            # where the graded mesh is ~5x denser
    r_uni = ball_radius(uni, w_uni, centre, q, True)
    r_meas = ball_radius(grad, w_grad, centre, q, True)
    r_count = ball_radius(grad, w_grad, centre, q, False)
    assert abs(r_meas / r_uni - 1) < 0.15
    assert r_count < 0.6 * r_uni
    # equal weights: the measure ball holds about the count quantile's points
    e_m = measure_ball_graph(torch.tensor(uni).float(), torch.ones(len(uni)), None,
                             torch.tensor([centre]).float(), None, q)
    assert abs(e_m.shape[1] - (math.floor(q * (len(uni) - 1)) + 1)) <= 1


def test_measure_ball_with_batches_of_very_different_sizes():
    small = torch.rand(20, 2)
    big = torch.rand(2000, 2)
    pos = torch.cat([small, big])
    batch = torch.cat([torch.zeros(20), torch.ones(2000)]).long()
    w = torch.cat([torch.full((20,), 1 / 20), torch.full((2000,), 1 / 2000)])
    dst = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    e = measure_ball_graph(pos, w, batch, dst, torch.tensor([0, 1]), 0.2)
    held = torch.zeros(2).index_add(0, e[1], w[e[0]])      # PyG's orientation: row 1 centre
    assert bool((held >= 0.2 - 1e-6).all()) and bool((held < 0.2 + 0.01).all())
    assert bool((batch[e[0]] == e[1]).all())  # never across samples


def idw_reference(h, pos_src, pos_dst, k, power=2.0):
    """Inverse-distance weighting written out: for each query y, its k nearest sources
    x_j (all pairwise distances, sorted), h(y) = sum_j d_j^-p h_j / sum_j d_j^-p."""
    out = []
    for y in pos_dst:
        d = (pos_src - y).norm(dim=1)
        near = torch.argsort(d)[:k]
        wts = d[near] ** -power
        out.append((wts[:, None] * h[near]).sum(0) / wts.sum())
    return torch.stack(out)


def test_knn_interpolate_is_exact_at_nodes_and_inverse_distance_between():
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(200, 2, generator=g, dtype=torch.float64)
    h = torch.stack([pos[:, 0] * 2 + 1, pos[:, 1] ** 2, torch.randn(200, generator=g,
                                                                    dtype=torch.float64)], 1)
    torch.testing.assert_close(knn_interpolate(h, pos, pos, None, None, 4), h)
    # between the nodes: the inverse-distance formula (off-node points, k = 1, 4, 7)
    q = torch.rand(50, 2, generator=g, dtype=torch.float64)
    for k in (1, 4, 7):
        torch.testing.assert_close(knn_interpolate(h, pos, q, None, None, k),
                                   idw_reference(h, pos, q, k), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(knn_interpolate(h, pos, q, None, None, 4, power=1.0),
                               idw_reference(h, pos, q, 4, power=1.0), rtol=1e-12, atol=1e-12)
    # batched: each query interpolates from its own sample only (sample 1's sources are
    # shifted so that they would be nearest to every query if samples mixed)
    bs = torch.arange(200) >= 120
    pos_b = torch.where(bs[:, None], pos * 0.1 + 0.45, pos)
    bq = torch.arange(50) >= 30
    out = knn_interpolate(h, pos_b, q, bs.long(), bq.long(), 4)
    for i in (0, 1):
        torch.testing.assert_close(out[bq == i], idw_reference(h[bs == i], pos_b[bs == i],
                                                               q[bq == i], 4),
                                   rtol=1e-12, atol=1e-12)
    const = torch.full((200, 3), 2.5)
    torch.testing.assert_close(knn_interpolate(const, pos.float(), q.float(), None, None, 4),
                               torch.full((50, 3), 2.5))


# ------------------------------------------------------------------------ Patched
def test_patched_partition_computed_once_per_kind(monkeypatch):
    from meshops.nn.patch import PatchAttention
    calls = []
    real = PatchAttention.partition
    monkeypatch.setattr(PatchAttention, "partition",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model = build("patched_transformer", pattern="window", layers=4).eval()
    with torch.no_grad():
        model(batch_of([make_sample(8, 0), make_sample(9, 1)]))
    assert len(calls) == 2          # unshifted + shifted, shared by 2 layers each
    calls.clear()
    model = build("patched_transformer", pattern="alternate", layers=4).eval()
    with torch.no_grad():
        model(make_sample(8, 0))
    assert len(calls) == 2          # window and token layers share both partitions


def test_patched_patch_size_sets_patches_per_sample_and_round_trips(tmp_path):
    # Two samples of 8x8 and 12x12 cells (81 and 169 points) with patch_size 40:
    # ceil(81/40) = 3 and ceil(169/40) = 5 patches, the same model output as a fixed
    # num_patches of 3 resp. 5 on each sample alone; the setting is saved with the model.
    small, large = make_sample(8, 0), make_sample(12, 1)
    model = build("patched_transformer", patch_size=40, method="kd").eval()
    parts = model.partitions(torch.cat([small.pos, large.pos]),
                             torch.tensor([0] * 81 + [1] * 169))[0]
    assert [len(torch.unique(parts[:81])), len(torch.unique(parts[81:]))] == [3, 5]
    with torch.no_grad():
        both = model(batch_of([small, large]))
        for data, num, rows in ((small, 3, slice(0, 81)), (large, 5, slice(81, None))):
            fixed = build("patched_transformer", num_patches=num, method="kd").eval()
            fixed.load_state_dict(model.state_dict())
            torch.testing.assert_close(both[rows], fixed(data), atol=1e-5, rtol=1e-5)
    model.save(tmp_path / "m.pt")
    again = NeuralOperator.from_checkpoint(tmp_path / "m.pt")
    assert again.config["patch_size"] == 40
    assert all(blk.attention.patch_size == 40 for blk in again.blocks)
    with pytest.raises(ValueError, match="patch_size"):
        build("patched_transformer", patch_size=0)
