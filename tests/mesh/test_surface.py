"""Tests of meshops.mesh.surface: reading, surface quadrature, sampling, signed distance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import trimesh

from meshops.errors import MeshError
from meshops.mesh.surface import (
    GEOMETRY_FEATURE_NAMES,
    geometry_features,
    read_surface,
    sample_surface,
    signed_distance,
    surface_to_meshdata,
    surface_weights,
)


def _sphere(subdivisions: int = 4, radius: float = 1.0) -> trimesh.Trimesh:
    return trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)


def _max_sagitta(mesh: trimesh.Trimesh, radius: float = 1.0) -> float:
    """Largest gap between a sphere and its inscribed convex polyhedron.

    The icosphere's vertices lie on the sphere, so the polyhedron lies inside the
    ball and contains the ball of radius ``min plane distance``: the distance of any
    point to the polyhedron differs from ``| |x| - radius |`` by at most this much.
    """
    plane_dist = np.abs(np.einsum("ij,ij->i", mesh.face_normals, mesh.triangles[:, 0]))
    return radius - float(plane_dist.min())


def _unit_directions(n: int, seed: int) -> np.ndarray:
    d = np.random.default_rng(seed).normal(size=(n, 3))
    return d / np.linalg.norm(d, axis=1, keepdims=True)


# ------------------------------------------------------------------ surface_weights
@pytest.mark.parametrize("subdivisions", [1, 3])
def test_weights_sum_to_mesh_area(subdivisions):
    mesh = _sphere(subdivisions, radius=1.7)
    w = surface_weights(mesh)
    assert w.dtype == torch.float64 and w.shape == (len(mesh.vertices),)
    assert (w > 0).all()
    assert float(w.sum()) == pytest.approx(mesh.area, rel=1e-12)


def test_weights_converge_to_sphere_area_at_second_order():
    radius = 2.0
    exact = 4 * math.pi * radius ** 2
    errors = [exact - float(surface_weights(_sphere(s, radius)).sum()) for s in (2, 3, 4)]
    # inscribed polyhedron: area is always below the sphere's
    assert all(e > 0 for e in errors)
    for coarse, fine in zip(errors, errors[1:]):
        assert 3.5 < coarse / fine < 4.5


def test_weights_integrate_linear_functions_exactly():
    mesh = _sphere(3, radius=1.3)
    mesh.apply_translation([0.4, -0.2, 0.9])  # makes the integral of a.x nonzero
    a, b = np.array([0.7, -1.1, 2.3]), 0.35
    w = surface_weights(mesh).numpy()
    nodal = float(w @ (mesh.vertices @ a + b))
    # exact on each flat triangle: area times the value at the centroid
    exact = float(mesh.area_faces @ (mesh.triangles_center @ a + b))
    assert nodal == pytest.approx(exact, rel=1e-12)


def test_weights_use_true_3d_area_not_projection():
    # a single tilted triangle: its xy-projection has half the true area
    tri = trimesh.Trimesh(vertices=[[0, 0, 0], [1, 0, 1], [0, 1, 0]], faces=[[0, 1, 2]],
                          process=False)
    w = surface_weights(tri)
    assert torch.allclose(w, torch.full((3,), math.sqrt(2) / 2 / 3, dtype=torch.float64),
                          rtol=1e-14)


def test_surface_to_meshdata_fields():
    mesh = _sphere(3)
    md = surface_to_meshdata(mesh, source="ball")
    assert md.pos.dtype == torch.float64 and md.pos.shape == (len(mesh.vertices), 3)
    assert torch.equal(md.weight, surface_weights(mesh))
    assert md.measure == pytest.approx(mesh.area, rel=1e-12)
    ctype, faces = md.cells[0]
    assert ctype == "triangle" and faces.dtype == torch.int64
    assert torch.equal(faces, torch.from_numpy(mesh.faces.astype(np.int64)))
    normal = md.fields["normal"]
    assert normal.shape == (len(mesh.vertices), 3)
    assert torch.allclose(normal.norm(dim=1), torch.ones(len(mesh.vertices), dtype=torch.float64))
    # outward on a sphere: nearly radial
    assert float((normal * md.pos).sum(1).min()) > 0.99
    assert md.source == "ball"


# ------------------------------------------------------------------- sample_surface
def test_sample_surface_count_weights_and_determinism():
    mesh = trimesh.creation.box(extents=[1.0, 2.0, 0.5])
    for n in (1, 7, 1000):
        s = sample_surface(mesh, n, seed=3)
        assert s.pos.shape == (n, 3) and s.weight.shape == (n,)
        assert s.fields["normal"].shape == (n, 3)
        assert float(s.weight.sum()) == pytest.approx(mesh.area, rel=1e-12)
    a, b, c = (sample_surface(mesh, 500, seed=k) for k in (11, 11, 12))
    assert torch.equal(a.pos, b.pos) and torch.equal(a.fields["normal"], b.fields["normal"])
    assert not torch.allclose(a.pos, c.pos)
    # points lie on the box surface and normals are the box's face normals
    half = torch.tensor([0.5, 1.0, 0.25], dtype=torch.float64)
    on_face = (a.pos.abs() - half).abs().min(1).values
    assert float(on_face.max()) < 1e-12
    assert torch.allclose(a.fields["normal"].abs().sum(1), torch.ones(500, dtype=torch.float64))


def test_sample_surface_monte_carlo_integral_of_z_squared():
    mesh = _sphere(5)
    n = 20000
    s = sample_surface(mesh, n, seed=0)
    f = s.pos[:, 2] ** 2
    estimate = float(s.integrate(f))
    # MC standard error of area * mean(f), plus the polyhedron's own deviation
    # from the sphere (second order in the mesh size, bounded by the sagitta)
    std_err = mesh.area * float(f.std()) / math.sqrt(n)
    tess = 4 * math.pi * 4 * _max_sagitta(mesh)
    assert abs(estimate - 4 * math.pi / 3) < 5 * std_err + tess


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_sample_surface_rejects_bad_count(bad):
    with pytest.raises(ValueError, match="num_points"):
        sample_surface(_sphere(1), bad)


# ------------------------------------------------------------------ signed distance
@pytest.mark.parametrize("r", [0.5, 1.5, 2.0])
def test_signed_distance_on_unit_sphere(r):
    mesh = _sphere(4)
    u = _unit_directions(40, seed=int(10 * r))
    query = torch.from_numpy(r * u)
    sd = signed_distance(mesh, query)
    assert sd.dtype == torch.float64 and sd.shape == (40,)
    bound = _max_sagitta(mesh)
    assert 0 < bound < 5e-3
    assert float((sd - (r - 1)).abs().max()) <= bound + 1e-12
    assert bool((sd < 0).all()) == (r < 1)


def test_signed_distance_is_minus_trimesh_and_ignores_winding():
    mesh = _sphere(3)
    pts = np.concatenate([0.6 * _unit_directions(30, 1), 1.4 * _unit_directions(30, 2)])
    sd = signed_distance(mesh, pts).numpy()
    np.testing.assert_allclose(sd, -trimesh.proximity.signed_distance(mesh, pts), atol=1e-12)
    flipped = mesh.copy()
    flipped.invert()  # inward normals: the sign must come from containment, not winding
    np.testing.assert_allclose(signed_distance(flipped, pts).numpy(), sd, atol=1e-12)


def test_signed_distance_accepts_arrays_and_empty_queries():
    mesh = _sphere(2)
    sd = signed_distance(mesh, np.zeros((1, 3), dtype=np.float32))
    assert float(sd[0]) < -0.9
    assert signed_distance(mesh, torch.zeros(0, 3)).shape == (0,)
    assert geometry_features(mesh, np.zeros((0, 3))).shape == (0, 5)


def test_geometry_features_consistent():
    mesh = _sphere(4)
    u = _unit_directions(60, seed=5)
    radii = np.repeat([0.5, 0.9, 1.2, 2.0], 15)[:, None]
    query = radii * u
    feats = geometry_features(mesh, torch.from_numpy(query))
    assert feats.shape == (60, 5) and len(GEOMETRY_FEATURE_NAMES) == 5
    sd, inside, direction = feats[:, 0], feats[:, 1], feats[:, 2:]
    assert torch.equal(sd, signed_distance(mesh, query))
    assert torch.equal(inside, (sd < 0).to(torch.float64))
    assert torch.equal(inside, torch.from_numpy((radii[:, 0] < 1).astype(np.float64)))
    assert torch.allclose(direction.norm(dim=1), torch.ones(60, dtype=torch.float64), atol=1e-12)
    # query + |sd| * dir is the closest point, so it lies on the surface
    foot = query + sd.abs().numpy()[:, None] * direction.numpy()
    _, dist_to_surface, _ = trimesh.proximity.closest_point(mesh, foot)
    assert dist_to_surface.max() < 1e-9
    # on a sphere the direction is radial: outward from inside, inward from outside
    radial = (direction.numpy() * u).sum(1)
    expected = np.where(radii[:, 0] < 1, 1.0, -1.0)
    assert np.all(radial * expected > 0.99)


def test_geometry_features_zero_direction_on_surface():
    mesh = _sphere(2)
    feats = geometry_features(mesh, mesh.vertices[:5])
    assert torch.equal(feats, torch.zeros(5, 5, dtype=torch.float64))


def test_signed_distance_rejects_open_surface():
    open_box = trimesh.creation.box()
    open_box.update_faces(np.arange(len(open_box.faces)) != 0)
    with pytest.raises(MeshError, match="not watertight.*trimesh.repair"):
        signed_distance(open_box, np.zeros((1, 3)))
    with pytest.raises(MeshError, match="watertight"):
        geometry_features(open_box, np.zeros((1, 3)))


@pytest.mark.parametrize("query, fragment", [
    (np.zeros((4, 2)), r"shape \[M, 3\], got \[4, 2\]"),
    (np.zeros(3), r"shape \[M, 3\], got \[3\]"),
    (np.array([[0.0, 0.0, 0.0], [np.nan, 0.0, 0.0]]), "NaN/inf.*row 1"),
    (torch.tensor([[0.0, np.inf, 0.0]]), "NaN/inf.*row 0"),
])
def test_signed_distance_rejects_bad_query(query, fragment):
    with pytest.raises(MeshError, match=fragment):
        signed_distance(_sphere(1), query)


# ------------------------------------------------------------------------- reading
@pytest.mark.parametrize("ext", ["stl", "obj", "ply", "off", "glb"])
def test_round_trip_keeps_area_and_topology(tmp_path, ext):
    mesh = _sphere(3, radius=1.5)
    path = tmp_path / f"ball.{ext}"
    mesh.export(path)
    back = read_surface(path)
    # STL stores float32 and OBJ/OFF print a fixed number of digits
    assert back.area == pytest.approx(mesh.area, rel=1e-6)
    # corners repeated per triangle (STL) are merged back into shared vertices
    assert len(back.vertices) == len(mesh.vertices) and len(back.faces) == len(mesh.faces)
    assert back.is_watertight
    assert back.metadata["file_path"] == str(path)
    md = surface_to_meshdata(back)
    assert md.source == str(path)
    assert md.measure == pytest.approx(back.area, rel=1e-12)


def test_round_trip_ply_keeps_vertex_order(tmp_path):
    mesh = _sphere(2)
    path = tmp_path / "ball.ply"
    mesh.export(path)
    back = read_surface(path)
    # trimesh writes PLY coordinates as float32; nothing else may change
    assert np.array_equal(back.vertices, mesh.vertices.astype(np.float32).astype(np.float64))
    assert np.array_equal(back.faces, mesh.faces)


def test_glb_scene_is_concatenated(tmp_path):
    box = trimesh.creation.box()
    ball = _sphere(2).apply_translation([3.0, 0.0, 0.0])
    path = tmp_path / "two.glb"
    trimesh.Scene([box, ball]).export(path)
    both = read_surface(path)
    assert len(both.faces) == len(box.faces) + len(ball.faces)
    assert both.area == pytest.approx(box.area + ball.area, rel=1e-6)
    np.testing.assert_allclose(both.bounds, [[-0.5, -1.0, -1.0], [4.0, 1.0, 1.0]], atol=1e-6)


def test_read_missing_file(tmp_path):
    with pytest.raises(MeshError, match="nope.stl: no such file"):
        read_surface(tmp_path / "nope.stl")


def test_read_unknown_format(tmp_path):
    path = tmp_path / "body.xyz"
    path.write_text("0 0 0\n1 0 0\n")
    with pytest.raises(MeshError, match=r"body.xyz: unknown surface format '\.xyz'"):
        read_surface(path)


def test_read_unparsable_file(tmp_path):
    path = tmp_path / "broken.ply"
    path.write_text("this is not a ply file\n")
    with pytest.raises(MeshError, match="broken.ply: could not be read as .ply"):
        read_surface(path)


def test_read_garbage_stl_has_no_triangles(tmp_path):
    path = tmp_path / "garbage.stl"
    path.write_bytes(b"\x00\x01garbage" * 3)
    with pytest.raises(MeshError, match="garbage.stl: the file holds no triangles"):
        read_surface(path)


def test_read_points_without_faces(tmp_path):
    path = tmp_path / "points.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\n")
    with pytest.raises(MeshError, match="points.obj: the file holds no triangles"):
        read_surface(path)


def test_read_nan_vertex(tmp_path):
    path = tmp_path / "nan.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv nan 1 0\nv 0 0 1\nf 1 2 4\nf 1 2 3\n")
    with pytest.raises(MeshError, match="nan.obj: 1 vertices have NaN/inf.*vertex 2"):
        read_surface(path)


def test_read_degenerate_face(tmp_path):
    path = tmp_path / "flat.obj"
    # face 1 (0-based) is collinear, face 2 repeats a vertex
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 2 0 0\n"
                    "f 1 2 3\nf 1 2 4\nf 1 3 3\n")
    with pytest.raises(MeshError, match=r"flat.obj: face 1 is degenerate.*2 degenerate faces"):
        read_surface(path)


def test_in_memory_degenerate_face_is_named():
    mesh = trimesh.Trimesh(vertices=[[0, 0, 0], [1, 0, 0], [0, 1, 0]], faces=[[0, 1, 2], [0, 0, 1]],
                           process=False)
    with pytest.raises(MeshError, match="face 1 is degenerate"):
        surface_weights(mesh)


def test_read_keeps_tiny_but_valid_geometry(tmp_path):
    # exact merging must not collapse a model in nanometres written as metres
    # (trimesh's own merge rounds to 1e-8 and would fuse all its vertices)
    mesh = _sphere(2, radius=1e-9)
    path = tmp_path / "tiny.ply"
    mesh.export(path)
    back = read_surface(path)
    assert len(back.vertices) == len(mesh.vertices)
    # abs=0: pytest.approx's default absolute tolerance would swallow an area of 1e-17
    assert back.area == pytest.approx(mesh.area, rel=1e-6, abs=0)


def test_repeated_faces_are_refused_after_merging(tmp_path):
    # An STL with one triangle written twice (each with its own corner copies, as STL
    # stores them, and in another vertex order) would count its area twice.
    sphere = _sphere(1)
    tri = sphere.triangles
    path = tmp_path / "twice.stl"
    trimesh.Trimesh(vertices=np.concatenate([tri, tri[7:8, ::-1]]).reshape(-1, 3),
                    faces=np.arange(3 * (len(tri) + 1)).reshape(-1, 3),
                    process=False).export(path)
    n = len(tri)
    with pytest.raises(MeshError, match=rf"twice.stl: face {n} \(vertices .*\) repeats face 7, "
                                        r"1 repeated faces in all"):
        read_surface(path)
    mesh = trimesh.Trimesh(vertices=sphere.vertices,
                           faces=np.concatenate([sphere.faces, sphere.faces[3:4, [1, 2, 0]]]),
                           process=False)
    with pytest.raises(MeshError, match=rf"face {n} .* repeats face 3"):
        surface_weights(mesh)
