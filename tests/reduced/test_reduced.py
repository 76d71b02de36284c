"""meshops.reduced: the weighted POD, the thin-plate spline against scipy, parameter
vectors, and the POD + RBF baseline on a family of known low rank, where it is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshops.mesh.data import MeshData
from meshops.reduced import pod_basis, sample_parameters
from meshops.reduced.rbf import ThinPlateSpline
from meshops.training.baselines import baselines, pod_rbf_baseline

F64 = torch.float64


def _mesh(n=12):
    """Points and lumped P1 weights of the unit square's n x n structured triangulation."""
    t = np.linspace(0, 1, n)
    X, Y = np.meshgrid(t, t, indexing="ij")
    pos = np.stack([X.ravel(), Y.ravel()], 1)
    idx = np.arange(n * n).reshape(n, n)
    a, b, c, d = idx[:-1, :-1].ravel(), idx[1:, :-1].ravel(), idx[:-1, 1:].ravel(), \
        idx[1:, 1:].ravel()
    tri = np.concatenate([np.stack([a, b, d], 1), np.stack([a, d, c], 1)])
    p = pos[tri]
    area = 0.5 * np.abs((p[:, 1, 0] - p[:, 0, 0]) * (p[:, 2, 1] - p[:, 0, 1])
                        - (p[:, 2, 0] - p[:, 0, 0]) * (p[:, 1, 1] - p[:, 0, 1]))
    w = np.zeros(n * n)
    np.add.at(w, tri.ravel(), np.repeat(area / 3, 3))
    return torch.tensor(pos), torch.tensor(w)


def _low_rank_family(num, seed, pos, as_fields=False):
    """Two-channel fields phi_0 + sum_{k=1..3} a_k(mu) phi_k with a_k affine in the three
    parameters mu: rank 3 around the mean, and the thin-plate spline's linear tail
    reproduces affine coefficients exactly."""
    rng = np.random.default_rng(seed)
    x, y = pos[:, 0].numpy(), pos[:, 1].numpy()
    phi = [np.stack([1 + x * y, np.cos(x)], 1), np.stack([np.sin(np.pi * x), y ** 2], 1),
           np.stack([x * (1 - x), np.exp(y)], 1), np.stack([np.cos(3 * y), x + y], 1)]
    A = np.array([[1.0, -2.0, 0.5], [0.3, 1.0, -1.0], [2.0, 0.1, 1.5]])
    out = []
    for mu in rng.uniform(-1, 2, (num, 3)) * [1.0, 10.0, 0.01]:  # units differ on purpose
        a = A @ mu + [0.5, -0.2, 1.0]
        u = phi[0] + sum(a[k] * phi[k + 1] for k in range(3))
        s = MeshData(pos=pos, weight=_mesh_weight, y=torch.tensor(u))
        if as_fields:
            s.x = torch.tensor(np.tile(mu, (pos.shape[0], 1)))
        else:
            s.x = torch.zeros(pos.shape[0], 0, dtype=F64)
            s.params = torch.tensor(mu)[None]
        out.append(s)
    return out


_mesh_pos, _mesh_weight = _mesh()


def _rel(pred, s):
    w = s.weight[:, None]
    return float(((w * (pred - s.y) ** 2).sum() / (w * s.y ** 2).sum()).sqrt())


def test_pod_modes_are_orthonormal_in_the_quadrature_inner_product_and_rank_by_energy():
    train = _low_rank_family(20, 0, _mesh_pos)
    y = torch.stack([s.y for s in train])
    basis = pod_basis(y, _mesh_weight)
    assert basis.rank == 3
    gram = torch.einsum("rmc,m,smc->rs", basis.modes, _mesh_weight, basis.modes)
    assert torch.allclose(gram, torch.eye(3, dtype=F64), atol=1e-12)
    # The coefficients carry the weighted norm: |y - mean|_W = |c|.
    c = basis.coefficients(y, _mesh_weight)
    d = y - basis.mean
    assert torch.allclose((d.square() * _mesh_weight[:, None]).sum((1, 2)),
                          c.square().sum(1), rtol=1e-10)
    assert torch.allclose(basis.expand(c), y, atol=1e-10)
    # A tolerance that keeps less energy keeps fewer modes.
    sv2 = basis.singular_values.square()
    loose = float(sv2[2] / sv2.sum()) * 1.01
    assert pod_basis(y, _mesh_weight, tol=loose).rank == 2


def test_pod_refuses_bad_snapshots():
    y = torch.ones(3, 4, 1, dtype=F64)
    with pytest.raises(ValueError, match="4 positive weights"):
        pod_basis(y, torch.ones(5, dtype=F64))
    with pytest.raises(ValueError, match="with some <= 0"):
        pod_basis(y, torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=F64))
    y[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        pod_basis(y, torch.ones(4, dtype=F64))


def test_thin_plate_spline_equals_scipy_rbf_interpolator():
    from scipy.interpolate import RBFInterpolator

    rng = np.random.default_rng(3)
    x, y, t = rng.normal(size=(40, 3)), rng.normal(size=(40, 5)), rng.normal(size=(15, 3))
    ref = RBFInterpolator(x, y, kernel="thin_plate_spline")(t)
    tps = ThinPlateSpline(40, 3, 5).fit(torch.tensor(x), torch.tensor(y))
    assert np.abs(tps(torch.tensor(t)).numpy() - ref).max() < 1e-10 * np.abs(ref).max()
    assert np.abs(tps(torch.tensor(x)).numpy() - y).max() < 1e-10
    with pytest.raises(ValueError, match="repeated parameter vectors"):
        ThinPlateSpline(40, 3, 5).fit(torch.tensor(np.r_[x[:39], x[:1]]), torch.tensor(y))


@pytest.mark.parametrize("as_fields", [False, True])
def test_pod_rbf_is_exact_on_a_low_rank_affine_family(as_fields):
    train = _low_rank_family(25, 0, _mesh_pos, as_fields)
    test = _low_rank_family(10, 1, _mesh_pos, as_fields)
    res = pod_rbf_baseline(train, test)
    assert res.available, res.note
    assert res.note.startswith("3 POD mode(s)")
    assert ("constant over each mesh" in res.note) == as_fields
    assert float(np.max(res.errors["l2"])) < 1e-8
    for p, s in zip(res.predictions, test):
        assert _rel(p, s) < 1e-8
    # In the list of baselines, third, after the two that need no parameters.
    assert [b.name for b in baselines(train, test)] == [
        "training mean", "nearest training sample", "POD + RBF"]


def test_sample_parameters_reads_params_or_constant_inputs():
    fields = _low_rank_family(4, 2, _mesh_pos, as_fields=True)
    vectors = _low_rank_family(4, 2, _mesh_pos, as_fields=False)
    p_f, why_f = sample_parameters(fields)
    p_v, why_v = sample_parameters(vectors)
    assert torch.allclose(p_f, p_v, rtol=1e-12) and p_v.shape == (4, 3)
    assert "constant over each mesh" in why_f and "parameter(s) of each sample" in why_v


def test_pod_rbf_not_available_without_parameters_or_one_mesh():
    train = _low_rank_family(8, 0, _mesh_pos, as_fields=True)
    varying = [MeshData(pos=s.pos, weight=s.weight, y=s.y, x=s.pos.clone()) for s in train]
    res = pod_rbf_baseline(varying[:6], varying[6:])
    assert not res.available and "inputs vary over the mesh" in res.note
    moved = [MeshData(pos=s.pos + 0.1 * k, weight=s.weight, y=s.y, x=s.x)
             for k, s in enumerate(train)]
    res = pod_rbf_baseline(moved[:6], moved[6:])
    assert not res.available and res.note.startswith("n/a: meshes differ")


def test_constant_inputs_does_not_depend_on_the_inputs_units():
    from meshops.reduced import constant_inputs

    g = torch.Generator().manual_seed(0)
    pos = torch.rand(30, 2, generator=g, dtype=torch.float64)

    def samples(field):
        return [MeshData(pos=pos, x=field(k)) for k in range(3)]

    varying = lambda k: torch.rand(30, 1, generator=g, dtype=torch.float64)  # noqa: E731
    constant = lambda k: torch.full((30, 1), float(k + 1), dtype=torch.float64)  # noqa: E731
    for scale in (1e-38, 1.0, 1e30):
        assert not constant_inputs(samples(lambda k: scale * varying(k))), scale
        assert constant_inputs(samples(lambda k: scale * constant(k))), scale


def test_constant_channels_are_found_one_by_one_in_any_units():
    from meshops.reduced import constant_channels, input_ranges

    g = torch.Generator().manual_seed(1)
    pos = torch.rand(30, 2, generator=g, dtype=torch.float64)
    for scale in (1e-30, 1.0, 1e30):
        # channel 0 a field, 1 a load constant over each mesh, 2 a field on one mesh only
        xs = [torch.stack([torch.rand(30, generator=g, dtype=torch.float64),
                           torch.full((30,), 1.0 + k, dtype=torch.float64),
                           torch.full((30,), 2.0, dtype=torch.float64)], 1) * scale
              for k in range(3)]
        xs[1][5, 2] *= 1 + 1e-4
        got = constant_channels([input_ranges(MeshData(pos=pos, x=x)) for x in xs])
        assert got == [False, True, False], scale
    assert input_ranges(MeshData(pos=pos)) is None
    assert constant_channels([input_ranges(MeshData(pos=pos)), ([0.0], [1.0])]) is None


def test_global_channels_are_constant_over_each_mesh_and_differ_between_meshes():
    from meshops.reduced import global_channels, input_ranges

    g = torch.Generator().manual_seed(2)
    pos = torch.rand(20, 2, generator=g, dtype=torch.float64)
    # a field, a load that differs per mesh, a material value the same everywhere
    xs = [torch.stack([torch.rand(20, generator=g, dtype=torch.float64),
                       torch.full((20,), 3.0 + k, dtype=torch.float64),
                       torch.full((20,), 7.0, dtype=torch.float64)], 1) for k in range(3)]
    ranges = [input_ranges(MeshData(pos=pos, x=x)) for x in xs]
    assert global_channels(ranges) == [False, True, False]
