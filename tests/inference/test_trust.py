"""Issue 22, items 5-6: uniform refinement and coarsening of meshes with the
mesh-independence report (``meshops evaluate --refine``), the distance of a sample to the
training set (``meshops predict`` fields and warning, ``evaluate``'s error against
distance) and ensembles (``meshops train --ensemble K``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import annulus_quads, cube_mesh, grid_points, perturb_interior, square_mesh
from _tiny_run import tiny_args
from scipy.spatial import Delaunay
from test_cli import _sample, _write_dataset

from meshops import MeshError, cli
from meshops.inference.predict import RunSpec, load_model, predict_mesh
from meshops.inference.refine import coarsen_points, mesh_independence, refine_mesh
from meshops.inference.trust import TrainingSet, describe
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.models import NeuralOperator, register_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _linear(p):
    return 1.0 + 2.0 * p[:, 0] - 3.0 * p[:, -1]


# --------------------------------------------------------------------- refinement
@pytest.mark.parametrize("kind", ["triangle", "quad", "mixed"])
def test_refined_square_keeps_points_area_and_linear_fields(kind):
    pts, cells = square_mesh(4, kind, amount=0.25, seed=3)
    mesh = mesh_from_arrays(pts, cells, {"f": _linear(pts),
                                         "g": np.stack([pts[:, 0], _linear(pts)], 1)})
    fine = refine_mesh(mesh)
    edges = {tuple(sorted(e)) for t, c in cells for row in c
             for e in zip(row, np.roll(row, -1))}
    quads = sum(len(c) for t, c in cells if t == "quad")
    n = len(pts)
    assert fine.pos.shape[0] == n + len(edges) + quads  # midpoints, quad centres
    assert sum(len(c) for _, c in fine.cells) == 4 * sum(len(c) for _, c in cells)
    assert torch.equal(fine.pos[:n], mesh.pos)  # the original points come first
    # P1 / Q1 interpolation reproduces linear fields exactly at the new points
    np.testing.assert_allclose(fine.fields["f"].numpy(), _linear(fine.pos.numpy()), atol=1e-13)
    assert fine.fields["g"].shape == (fine.pos.shape[0], 2)
    assert float(fine.weight.sum()) == pytest.approx(1.0, abs=1e-13)
    assert float(fine.integrate(fine.fields["f"])) == pytest.approx(
        float(mesh.integrate(mesh.fields["f"])), abs=1e-13)


def test_refinement_computes_the_geometry_features_on_the_refined_mesh():
    """Issue 38, item 7: evaluate --refine interpolated geo:distance linearly to the new
    nodes, where the distance to the boundary is not linear (its ridges): the refined
    copy then measured another input than predict gives. Computed, they are the exact
    distance and direction of the square at every node (straight sides: exact)."""
    from meshops.mesh.geometry import geometry_channels

    pts, cells = square_mesh(4, "triangle", amount=0.2, seed=1)
    mesh = mesh_from_arrays(pts, cells, {"f": _linear(pts)})
    mesh.fields.update(geometry_channels(mesh))
    fine = refine_mesh(mesh)
    p = fine.pos.numpy()
    exact = np.minimum.reduce([p[:, 0], 1 - p[:, 0], p[:, 1], 1 - p[:, 1]])
    np.testing.assert_allclose(fine.fields["geo:distance"].numpy(), exact, rtol=0, atol=1e-12)
    want = geometry_channels(fine)
    assert torch.equal(fine.fields["geo:direction"], want["geo:direction"])
    assert fine.fields["geo:distance"].dtype == mesh.fields["geo:distance"].dtype
    np.testing.assert_allclose(fine.fields["f"].numpy(), _linear(p), atol=1e-13)


def test_refined_tetra_and_hexahedra():
    p = perturb_interior(grid_points(2, 3), 2, 0.2, seed=1)
    tets = Delaunay(p).simplices
    tets = tets[np.abs(np.linalg.det(p[tets[:, 1:]] - p[tets[:, :1]])) > 1e-9]
    idx = np.arange(27).reshape(3, 3, 3)
    hexes = np.array([[idx[i, j, k], idx[i + 1, j, k], idx[i + 1, j + 1, k], idx[i, j + 1, k],
                       idx[i, j, k + 1], idx[i + 1, j, k + 1], idx[i + 1, j + 1, k + 1],
                       idx[i, j + 1, k + 1]] for i in range(2) for j in range(2) for k in range(2)])
    for cells in ([("tetra", tets)], [("hexahedron", hexes)]):
        mesh = mesh_from_arrays(p, cells, {"f": _linear(p)})
        fine = refine_mesh(mesh)  # every child has positive volume, or this raises
        assert sum(len(c) for _, c in fine.cells) == 8 * len(cells[0][1])
        assert float(fine.weight.sum()) == pytest.approx(float(mesh.weight.sum()), abs=1e-13)
        np.testing.assert_allclose(fine.fields["f"].numpy(), _linear(fine.pos.numpy()),
                                   atol=1e-13)
    # a cube of 2 x 2 x 2 hexahedra: 5^3 nodes after one refinement
    assert refine_mesh(mesh_from_arrays(grid_points(2, 3), [("hexahedron", hexes)],
                                        {})).pos.shape[0] == 125


def test_refine_refuses_what_it_cannot_split():
    pts, cells = cube_mesh(2)  # hexahedra, pyramids and wedges
    with pytest.raises(MeshError, match="cannot refine pyramid cells uniformly"):
        refine_mesh(mesh_from_arrays(pts, cells, {}))
    cloud = MeshData(pos=torch.rand(10, 2), weight=torch.full((10,), 0.1))
    with pytest.raises(MeshError, match="no cells to refine"):
        refine_mesh(cloud)


def test_coarsened_points_keep_the_measure():
    pts, cells = square_mesh(8, "triangle", amount=0.2)
    mesh = mesh_from_arrays(pts, cells, {"f": _linear(pts)})
    coarse, idx = coarsen_points(mesh)
    assert coarse.pos.shape[0] == math.ceil(len(pts) / 4)
    assert not getattr(coarse, "cells", None)  # a point cloud
    assert float(coarse.weight.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.equal(coarse.fields["f"], mesh.fields["f"][idx])
    assert torch.equal(coarse.pos, mesh.pos.to(torch.float64)[idx])


# ------------------------------------------------------- mesh-independence report
@register_model("_test_pointwise_or_count")
class _Pointwise(NeuralOperator):
    """``x`` (pointwise: mesh independent), or ``x * N / 100`` (depends on the number of
    points N: the change under refinement is known exactly)."""

    def __init__(self, in_channels: int = 1, out_channels: int = 1, count: bool = False):
        super().__init__()
        self.count = count
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, data):
        n = data.pos.shape[0]
        return data.x * self.scale * (n / 100 if self.count else 1.0)


def _spec(model):
    return RunSpec(model, Path("m.pt"), {"inputs": ["f"], "targets": ["u"],
                                         "field_shapes": {"f": [], "u": []}})


def test_mesh_independence_of_a_pointwise_and_a_mesh_counting_model():
    pts, cells = square_mesh(6, "mixed", amount=0.2)
    mesh = mesh_from_arrays(pts, cells, {"f": _linear(pts), "u": _linear(pts)})
    model = _Pointwise().double()
    rep = mesh_independence(model, _spec(model), mesh)
    assert rep["error"] == 0 and rep["refined"]["error"] == pytest.approx(0, abs=1e-7)
    assert rep["refined"]["change"] == 0 and rep["coarsened"]["change"] == 0
    counting = _Pointwise(count=True).double()
    rep = mesh_independence(counting, _spec(counting), mesh)
    n, nr, nc = rep["points"], rep["refined"]["points"], rep["coarsened"]["points"]
    assert rep["refined"]["change"] == pytest.approx((nr - n) / n, rel=1e-6)
    assert rep["coarsened"]["change"] == pytest.approx((n - nc) / n, rel=1e-6)


@register_model("_test_times_params")
class _TimesParams(NeuralOperator):
    """``x * params[0]``: pointwise (mesh independent) and conditioned on a parameter."""

    def __init__(self, in_channels: int = 1, out_channels: int = 1):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, data):
        return data.x * self.scale * data.params.reshape(-1)[0]


def test_refined_and_coarsened_copies_keep_the_parameters():
    # issue 28: `evaluate --refine` on a --params run: the copies lost the parameters
    pts, cells = square_mesh(4, "triangle")
    mesh = mesh_from_arrays(pts, cells, {"f": _linear(pts), "u": 2.5 * _linear(pts)})
    mesh.params = torch.tensor([[2.5]], dtype=torch.float64)
    assert torch.equal(refine_mesh(mesh).params, mesh.params)
    assert torch.equal(coarsen_points(mesh)[0].params, mesh.params)
    model = _TimesParams().double()
    rep = mesh_independence(model, _spec(model), mesh)
    assert rep["error"] == pytest.approx(0, abs=1e-15)
    assert rep["refined"]["change"] == 0 and rep["coarsened"]["change"] == 0
    assert rep["refined"]["error"] == pytest.approx(0, abs=1e-7)


def test_refine_refuses_a_point_cloud_stored_with_vertex_cells():
    # issue 28: a cloud read from a file has one vertex cell per point; "refining" it
    # changed nothing and reported change 0, perfect mesh independence
    pts = np.random.default_rng(0).random((12, 2))
    cloud = mesh_from_arrays(pts, [("vertex", np.arange(12)[:, None])],
                             {"meshops:weight": np.full(12, 1 / 12)}, source="c.vtu")
    with pytest.raises(MeshError, match=r"c\.vtu: no cells to refine \(a point cloud"):
        refine_mesh(cloud)


def test_evaluate_refine_refuses_point_clouds_and_cell_runs(tmp_path, capsys):
    from _tiny_run import one_line_error
    from test_cells import _write_cell_folder

    clouds = tmp_path / "clouds"
    clouds.mkdir()
    rng = np.random.default_rng(1)
    for k in range(3):
        pts = rng.random((30, 2))
        write_mesh(clouds / f"p{k}.vtu", mesh_from_arrays(
            pts, [], {"f": _linear(pts), "u": k + _linear(pts),
                      "meshops:weight": np.full(30, 1 / 30)}))
    cells = _write_cell_folder(tmp_path / "cells", n=3)
    for data, targets, message in (
            (clouds, "u", f"{clouds / 'p0.vtu'}: no cells to refine (a point cloud"),
            (cells, "p", "--refine: the targets of this run are cell data")):
        out = tmp_path / f"run_{data.name}"
        assert cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", targets,
                         *tiny_args(1)[4:], "--logger", "none", "--out", str(out)]) == 0
        capsys.readouterr()
        code = cli.main(["evaluate", str(out), "--data", str(data), "--refine",
                         "--no-baselines"])
        err = capsys.readouterr().err
        assert code == 2 and one_line_error(err) and message in err, err
        assert "point cloud" not in err or data is clouds


# ---------------------------------------------------------- distance to training
def _param_samples(values):
    pts, cells = square_mesh(3, "triangle")
    base = mesh_from_arrays(pts, cells, {})
    return [MeshData(pos=base.pos, weight=base.weight, x=torch.zeros(len(pts), 0),
                     params=torch.tensor([v], dtype=torch.float64)) for v in values]


def test_distance_in_training_spreads_and_extrapolation_by_range():
    train_values = [[0.0, 10.0], [1.0, 10.0], [0.0, 30.0], [1.0, 30.0], [0.5, 20.0]]
    ts = TrainingSet.from_samples(_param_samples(train_values), ["a", "b"])
    v = np.array(train_values)
    std = v.std(0)
    inside = _param_samples([[0.4, 21.0]])[0]
    d = ts.distance(inside)
    want = np.linalg.norm((np.array([0.4, 21.0]) - v) / std, axis=1)
    assert d["params_distance"] == pytest.approx(want.min(), rel=1e-12)
    assert d["nearest"] == 4 and d["geometry_distance"] == 0 and not d["extrapolates"]
    # the largest nearest-neighbour distance among the training samples themselves
    z = v / std
    loo = [min(np.linalg.norm(z[i] - z[j]) for j in range(5) if j != i) for i in range(5)]
    assert d["reference"] == pytest.approx(max(loo), rel=1e-12)
    outside = ts.distance(_param_samples([[0.5, 35.0]])[0])
    assert outside["extrapolates"]
    assert outside["reasons"] == ["b = 35 is outside the training range [10, 30]"]
    far = ts.distance(_param_samples([[0.99, 29.9]])[0])  # inside the box, near a corner
    assert not far["extrapolates"]
    # the metadata round trip keeps everything
    again = TrainingSet.from_dict(json.loads(json.dumps(ts.to_dict())))
    assert again.distance(inside) == d


def _rectangle(width: float, n: int, kind: str = "mixed"):
    """[0, width] x [0, 1] with n x n cells, the interior nodes perturbed."""
    pts, cells = square_mesh(n, kind, amount=0.2, seed=n)
    return mesh_from_arrays(pts * [width, 1.0], cells, {})


def test_the_same_shapes_meshed_finer_do_not_extrapolate():
    # issue 28: "rms radius y = 0.118843 is outside the training range [0.118931,
    # 0.119929]": the lumped quadrature overestimates second moments by O(h^2), more
    # than this family's spread, so the same shapes meshed finer fell outside the range
    widths = np.linspace(1.0, 1.02, 5)
    ts = TrainingSet.from_samples([_rectangle(a, 6) for a in widths])
    for a in widths:
        for fine in (_rectangle(a, 12), _rectangle(a, 24, "triangle"),
                     refine_mesh(_rectangle(a, 6))):
            d = ts.distance(fine)
            assert not d["extrapolates"], (a, d["reasons"])
    # outside: wider than any training shape by a fifth of a cell (the extent, exact on
    # any mesh, says so), and clearly wider (the RMS radius too, beyond its bound)
    near = ts.distance(_rectangle(1.02 + 0.2 / 6, 12))
    assert "extent x = 1.05333 is outside the training range [1, 1.02] (widened by " \
           "discretisation and margin, up to 0.002)" in near["reasons"]
    for n in (6, 24):
        d = ts.distance(_rectangle(1.3, n))
        assert d["extrapolates"] and any(r.startswith("rms radius x = ") for r in d["reasons"])


def _ellipse_ring(sx: float, nr: int, nt: int, jitter: float = 0.0, seed: int = 0):
    """An annulus stretched by ``sx`` along x and moved by ``0.1 sx`` along y: its nodes
    on the curved boundaries, moved along them by ``jitter`` of a cell as a remesher
    would place them."""
    pts, cells = annulus_quads(nr, nt)
    r, t = np.linalg.norm(pts, axis=1), np.arctan2(pts[:, 1], pts[:, 0])
    t = t + jitter * np.random.default_rng(seed).uniform(-1, 1, len(t)) * 2 * np.pi / nt
    pts = np.stack([r * np.cos(t), r * np.sin(t)], -1) * [sx, 1.0] + [0.0, 0.1 * sx]
    return mesh_from_arrays(pts, cells, {})


def test_curved_shapes_meshed_again_do_not_extrapolate():
    # issue 38: test shapes meshed 3.5x finer were "outside the training range" by 1e-4
    # of their centroid: a re-meshed curved boundary moves the measure, the centroid
    # and the extent by O(h^2), and a centroid at 0 had its round-off as its "spread"
    scales = np.linspace(1.0, 1.04, 4)
    ts = TrainingSet.from_samples([_ellipse_ring(s, 4, 40) for s in scales])
    for s in scales:
        for again in (_ellipse_ring(s, 14, 140), _ellipse_ring(s, 8, 80, 0.3, seed=1),
                      refine_mesh(_ellipse_ring(s, 4, 40))):
            d = ts.distance(again)
            assert not d["extrapolates"], (s, d["reasons"])
            assert d["distance"] <= d["reference"]
    # a shape 30 % larger than the largest in training still extrapolates, by its measure
    d = ts.distance(_ellipse_ring(1.04 * 1.3, 14, 140))
    assert d["extrapolates"]
    assert any(r.startswith("measure = 3.") and "outside the training range [2.3" in r
               for r in d["reasons"]), d["reasons"]


def test_the_discretisation_bound_of_the_rms_radius_holds():
    # the bound the range is widened by (meshops.inference.trust.geometry_tolerance) against the
    # rms radius's true error (exact: width / sqrt(12) for x, 1 / sqrt(12) for y): at
    # least the error, and not more than 8x it
    from meshops.inference.trust import geometry_tolerance

    for n in (4, 8, 16):
        for kind in ("quad", "triangle", "mixed"):
            s = _rectangle(1.5, n, kind)
            g, tol = describe(s)[1], geometry_tolerance(s)
            err = np.abs(g[5:7] - np.array([1.5, 1.0]) / 12 ** 0.5)
            assert np.all(err <= tol[5:7]) and np.all(tol[5:7] <= 8 * err), (n, kind)
            assert np.all(tol[:5] == 0)  # measure, centroid, extent: exact on straight cells


def test_the_discretisation_bound_is_measured_part_by_part_alike(monkeypatch):
    # the spacing of a large mesh's points is measured a part of its points at a time:
    # parts of 7 points give the bound of one piece exactly
    from meshops.datasets import descriptors
    from meshops.inference.trust import geometry_tolerance

    s = _rectangle(1.5, 8, "mixed")
    whole = geometry_tolerance(s)
    assert np.all(whole[5:7] > 0)
    monkeypatch.setattr(descriptors, "_PART", 7)
    np.testing.assert_array_equal(geometry_tolerance(s), whole)


def _square_with(n: int, kind: str, *fields):
    """The unit square meshed ``n x n`` (perturbed), with input channels
    ``fields(pos) -> [N]`` (float64)."""
    pts, cells = square_mesh(n, kind, amount=0.3, seed=n)
    mesh = mesh_from_arrays(pts, cells, {})
    pos = mesh.pos.to(torch.float64)
    return MeshData(pos=pos, weight=mesh.weight.to(torch.float64),
                    x=torch.stack([f(pos) for f in fields], 1))


def test_the_discretisation_bound_of_an_input_mean_holds_and_is_second_order():
    # the mean of exp(x + y) over the unit square is (e - 1)^2 exactly; the vertex rule
    # of the linear cells overestimates it (convex): the bound is at least the error, not
    # more than 16x it, and falls as h^2 (x4 per halving); constants and linear fields
    # get 0, and parameters given as params too
    from meshops.datasets.descriptors import params_tolerance

    exact = (math.e - 1) ** 2
    for kind in ("triangle", "mixed"):
        tols = []
        for n in (4, 8, 16, 32):
            s = _square_with(n, kind, lambda p: torch.exp(p[:, 0] + p[:, 1]),
                             lambda p: torch.full_like(p[:, 0], 2.5), _linear)
            mean, tol = describe(s)[0], params_tolerance(s)
            err = abs(mean[0] - exact)
            assert err <= tol[0] <= 16 * err, (kind, n, err, tol[0])
            assert tol[1] == 0 and tol[2] <= 1e-9, (kind, n, tol)  # the ridge: 1e-10 of 5
            tols.append(tol[0])
        assert np.all(np.diff(np.log2(tols)) < -1.7), (kind, tols)
    with_params = MeshData(pos=s.pos, weight=s.weight, x=s.x, params=torch.ones(1, 4))
    np.testing.assert_array_equal(params_tolerance(with_params), np.zeros(4))


def test_the_input_mean_bound_is_measured_part_by_part_alike(monkeypatch):
    from meshops.datasets import descriptors

    s = _square_with(8, "mixed", lambda p: torch.sin(3 * p[:, 0]) * p[:, 1])
    whole = descriptors.params_tolerance(s)
    assert whole[0] > 0
    monkeypatch.setattr(descriptors, "_PART", 7)
    np.testing.assert_allclose(descriptors.params_tolerance(s), whole, rtol=1e-12)


def test_input_means_on_the_training_mesh_get_no_discretisation_bound():
    # a review of issue 37's bound: on one fixed mesh the quadrature errors of the
    # training samples and a new one are the same, so a load 2 % beyond the training
    # range must extrapolate there, where the bound alone (and its margin) would excuse
    # it; the same loads on a finer mesh of the square are inside
    def sample(n, a):
        return _square_with(n, "triangle", lambda p: a * torch.exp(p[:, 0] + p[:, 1]))

    loads = np.linspace(1.0, 1.04, 5)
    ts = TrainingSet.from_samples([sample(8, a) for a in loads])
    assert TrainingSet.from_dict(ts.to_dict()).meshes == ts.meshes
    d = ts.distance(sample(8, 1.06))
    assert d["extrapolates"] and d["reasons"][0].startswith("parameter 0 = "), d["reasons"]
    assert not ts.distance(sample(8, 1.02))["extrapolates"]
    fine = ts.distance(sample(16, 1.02))
    assert not fine["extrapolates"], fine["reasons"]


def test_input_means_of_the_same_shapes_meshed_again_do_not_extrapolate():
    # issue 37: every graded re-mesh of a body's surface "extrapolated", its normal's
    # mean (about 1e-4, the training spread of it as small) moved by the discretisation;
    # here a quadratic field whose mean varies over the shapes less than the quadrature
    # moves it; a constant input out of range still extrapolates
    def with_inputs(mesh, sx, level):
        pos = mesh.pos.to(torch.float64)
        f = (pos[:, 0] / sx) ** 2 + (pos[:, 1] - 0.1 * sx) ** 2 + 0.01 * sx
        x = torch.stack([f, torch.full_like(f, level)], 1)
        return MeshData(pos=pos, weight=mesh.weight.to(torch.float64), x=x)

    scales = np.linspace(1.0, 1.04, 4)
    ts = TrainingSet.from_samples([with_inputs(_ellipse_ring(s, 4, 40), s, 1.0 + i)
                                   for i, s in enumerate(scales)])
    fine = TrainingSet.from_samples([with_inputs(_ellipse_ring(1.0, 14, 140), 1.0, 1.0)])
    spread = np.ptp(ts.params[:, 0])
    assert spread < 0.5 * abs(fine.params[0, 0] - ts.params[0, 0])  # a test of the bound
    for i, s in enumerate(scales):
        for again in (_ellipse_ring(s, 14, 140), _ellipse_ring(s, 8, 80, 0.3, seed=1)):
            d = ts.distance(with_inputs(again, s, 1.0 + i))
            assert not d["extrapolates"], (s, d["reasons"])
    d = ts.distance(with_inputs(_ellipse_ring(1.0, 14, 140), 1.0, 5.0))
    assert d["extrapolates"] and d["reasons"][0].startswith("parameter 1 = 5 is outside")


def test_without_params_the_weighted_input_means_are_the_parameters():
    pts, cells = square_mesh(4, "triangle", amount=0.3, seed=2)
    mesh = mesh_from_arrays(pts, cells, {})
    x = torch.from_numpy(pts[:, :1] ** 3)
    p, g = describe(MeshData(pos=mesh.pos, weight=mesh.weight, x=x))
    w = mesh.weight.to(torch.float64)
    assert p == pytest.approx([float((w * x[:, 0]).sum() / w.sum())], rel=1e-12)
    assert p[0] != pytest.approx(float(x.mean()), rel=1e-3)  # not the plain mean
    assert g[0] == pytest.approx(1.0) and g[1:3] == pytest.approx([0.5, 0.5], abs=1e-12)


def test_geometry_distance_on_one_fixed_mesh():
    pts, cells = square_mesh(8, "triangle")
    mesh = mesh_from_arrays(pts, cells, {"f": _linear(pts)})
    train = [MeshData(pos=mesh.pos, weight=mesh.weight, x=mesh.fields["f"][:, None] * s)
             for s in (1.0, 1.5, 2.0)]
    ts = TrainingSet.from_samples(train)
    # a refined copy of the same square: the same geometry, within the quadrature's O(h^2)
    fine = refine_mesh(mesh)
    d = ts.distance(MeshData(pos=fine.pos, weight=fine.weight,
                             x=fine.fields["f"][:, None] * 1.5))
    assert d["geometry_distance"] == 0 and not d["extrapolates"]
    # a wider rectangle is another geometry than the one the model saw
    wide = MeshData(pos=mesh.pos * torch.tensor([1.5, 1.0], dtype=torch.float64),
                    weight=mesh.weight * 1.5, x=mesh.fields["f"][:, None] * 1.5)
    d = ts.distance(wide)
    assert d["geometry_distance"] == math.inf and d["extrapolates"]
    assert "measure is 1.5 but 1 in every training sample" in d["reasons"]


# ----------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = _write_dataset(tmp_path_factory.mktemp("data"), n=6)
    out = tmp_path_factory.mktemp("runs") / "run"
    assert cli.main(["train", "--data", str(data), *tiny_args(1), "--logger", "none",
                     "--ensemble", "2", "--seed", "4", "--out", str(out)]) == 0
    return out, data


def test_predict_writes_distance_fields_and_warns_when_extrapolating(run, tmp_path, capsys):
    out, data = run
    model, ckpt, meta = load_model(out, "cpu")
    ts = TrainingSet.from_dict(meta["training_set"])
    assert ts.params.shape == (len(meta["split"]["train"]), 1)  # mean of f
    far = _sample(3)
    far.fields["f"] = far.fields["f"] * 0 + 50.0  # a mean of f no training sample had
    write_mesh(tmp_path / "in" / "far.vtu", far)
    known = meta["split"]["train"][0]  # a training file: at distance 0
    assert cli.main(["predict", str(out), str(data / known), str(tmp_path / "in" / "far.vtu"),
                     "-o", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert "far.vtu: the model extrapolates here: mean of f = 50 is outside the training " \
           "range" in err and known not in err
    from meshops.inference.predict import mesh_sample

    for name in (Path(known).stem, "far"):
        got = read_mesh(tmp_path / "p" / f"{name}.vtu")
        src = far if name == "far" else read_mesh(data / known)
        want = ts.distance(mesh_sample(model, RunSpec(model, ckpt, meta), src))
        for key, field in (("distance", "train_distance"),
                           ("params_distance", "train_distance_params"),
                           ("geometry_distance", "train_distance_geometry")):
            values = got.fields[field].numpy()
            assert np.all(values == values[0])  # one value per mesh
            assert values[0] == pytest.approx(want[key], rel=1e-6)


def test_ensemble_members_and_their_mean_and_std(run, tmp_path):
    out, data = run
    member = out / "ensemble" / "seed5"
    assert (member / "best.pt").is_file()
    a, ckpt, meta = load_model(out, "cpu")
    b = load_model(member, "cpu")[0]
    assert meta["split"] != b.metadata["split"] or not torch.equal(
        next(a.parameters()), next(b.parameters()))  # another seed
    assert cli.main(["predict", str(out), str(data / "s2.vtu"), "-o", str(tmp_path)]) == 0
    got = read_mesh(tmp_path / "s2.vtu")
    mesh = read_mesh(data / "s2.vtu")
    spec = RunSpec(a, ckpt, meta)
    pa, pb = (predict_mesh(m, spec, mesh).to(torch.float64)[:, 0] for m in (a, b))
    np.testing.assert_allclose(got.fields["u_pred"].numpy(), ((pa + pb) / 2).numpy(), rtol=1e-6,
                               atol=1e-9)
    np.testing.assert_allclose(got.fields["u_std"].numpy(), ((pa - pb).abs() / 2 ** 0.5).numpy(),
                               rtol=1e-6, atol=1e-9)


def test_overwrite_clears_the_members_of_an_earlier_ensemble(run, tmp_path):
    """Issue 38, item 1: a single model trained with --overwrite over an ensemble run
    predicted the mean and std of itself and the old members."""
    import shutil

    from meshops.runs.run import load_run

    out, data = run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    (copy / "notes.txt").write_text("mine")
    (copy / "ensemble" / "seed9").mkdir()
    (copy / "ensemble" / "seed9" / "plot.png").write_bytes(b"mine")
    assert cli.main(["train", "--data", str(data), *tiny_args(1), "--logger", "none",
                     "--seed", "4", "--out", str(copy), "--overwrite"]) == 0
    assert not (copy / "ensemble" / "seed5").exists()
    # what the run did not write stays
    assert (copy / "notes.txt").read_text() == "mine"
    assert (copy / "ensemble" / "seed9" / "plot.png").read_bytes() == b"mine"
    fields = load_run(copy, "cpu").predict(data / "s2.vtu")
    assert "u_std" not in fields and "u_pred" in fields


def test_members_of_another_run_are_not_averaged_in(run):
    """A folder retrained before --overwrite cleared members keeps another run's
    ``ensemble/seed*``: only the seeds the run's config names are its members."""
    from meshops.inference.trust import ensemble_members

    out, _ = run
    meta = load_model(out, "cpu")[2]
    assert ensemble_members(out, meta) == [out, out / "ensemble" / "seed5"]
    single = dict(meta, train_config=dict(meta["train_config"], ensemble=1))
    assert ensemble_members(out, single) == [out]
    other_seed = dict(meta, train_config=dict(meta["train_config"], seed=5))
    assert ensemble_members(out, other_seed) == [out]


def test_evaluate_reports_refinement_and_error_against_distance(run, capsys):
    out, data = run
    assert cli.main(["evaluate", str(out), "--data", str(data), "--refine", "--json",
                     "--no-baselines"]) == 0
    result = json.loads(capsys.readouterr().out)
    model, ckpt, meta = load_model(out, "cpu")
    spec = RunSpec(model, ckpt, meta)
    files = sorted(data.glob("*.vtu"))
    changes = []
    for s in result["samples"]:
        mesh = read_mesh(data / s["file"])
        want = mesh_independence(model, spec, mesh)
        assert s["refine"]["refined"]["change"] == pytest.approx(want["refined"]["change"],
                                                                 rel=1e-9)
        changes.append(want["refined"]["change"])
    assert result["refine"]["refined"]["mean"] == pytest.approx(np.mean(changes), rel=1e-9)
    assert result["refine"]["refined"]["max"] == pytest.approx(max(changes), rel=1e-9)
    rep = result["distance"]
    assert sum(b["n"] for b in rep["bins"]) == len(files)
    errs = {s["file"]: s["u"]["l2"] for s in result["samples"]}
    dist = {s["file"]: s["distance"]["distance"] for s in result["samples"]}
    for b in rep["bins"]:
        inside = [errs[f] for f in errs if b["from"] <= dist[f] <= b["to"]]
        assert max(inside) == pytest.approx(b["max_error"], rel=1e-12)
    # the training files are at distance 0 from the training set
    for f in meta["split"]["train"]:
        assert dist[f] == 0
    # the text report has both sections
    assert cli.main(["evaluate", str(out), "--data", str(data), "--refine",
                     "--no-baselines"]) == 0
    text = capsys.readouterr().out
    assert "mesh independence: relative L2 change" in text
    assert "error against distance to the training set" in text
