"""PyG conventions: knn_graph / radius_graph drop-ins, cells as PyG sees them, batching errors.

The references are written here from their definitions: brute-force distances
(torch.cdist) for the graphs, all node pairs of simplices and the grid-spacing
neighbours of structured quads/hexahedra for the cell edges.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch_geometric.transforms as T
from _meshes import grid_points, square_mesh
from torch_geometric.data import Batch
from torch_geometric.loader import DataLoader

import meshops
from meshops import MeshData, MeshError, cells_to_edge_index, knn_graph, radius_graph
from meshops.mesh.data import MissingFieldError
from meshops.search import available_backends, cells_to_face

BACKENDS = [b for b in ("scipy", "torch") if available_backends()[b]]


def _cloud(sizes, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(sum(sizes), d, generator=g, dtype=torch.float64)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, batch


def _pairs(edge_index):
    return set(map(tuple, edge_index.t().tolist()))


def _brute_knn(x, batch, k, loop, dist=None):
    """{(neighbour, centre)}: the k nearest points of every centre in its own sample."""
    d = torch.cdist(x, x) if dist is None else dist.clone()
    d[batch[:, None] != batch[None, :]] = float("inf")
    if not loop:
        d.fill_diagonal_(float("inf"))
    nbr = d.topk(k, dim=1, largest=False).indices
    return {(int(j), i) for i in range(x.shape[0]) for j in nbr[i]}


# ------------------------------------------------------------ knn_graph / radius_graph


def test_top_level_names_are_the_pyg_drop_ins():
    # the top-level names are the PyG-compatible ones (meshops.nn has no knn_graph: its
    # local layers' own search is meshops.nn.local_graph)
    import meshops.nn
    assert meshops.knn_graph is meshops.search.graph.knn_graph
    assert meshops.radius_graph is meshops.search.graph.radius_graph
    assert not hasattr(meshops.nn, "knn_graph")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loop", [False, True])
def test_knn_graph_equals_brute_force_with_pyg_orientation(backend, loop):
    x, batch = _cloud([40, 1 + 23, 31])
    k = 6
    e = knn_graph(x, k, batch, loop=loop, backend=backend)
    assert e.dtype == torch.long and e.shape == (2, x.shape[0] * k)
    # source_to_target: row 0 = neighbour (source), row 1 = centre (target)
    assert _pairs(e) == _brute_knn(x, batch, k, loop)
    assert torch.equal(torch.bincount(e[1], minlength=x.shape[0]),
                       torch.full((x.shape[0],), k))
    assert bool((batch[e[0]] == batch[e[1]]).all())          # never across samples
    assert bool((e[0] == e[1]).any()) == loop                 # self loops only on request
    t2s = knn_graph(x, k, batch, loop=loop, flow="target_to_source", backend=backend)
    assert torch.equal(t2s, e.flip(0))


def test_knn_graph_orientation_aggregates_neighbours_into_the_centre():
    # What PyG's flow means for a layer: summing x[source] into target gives, for
    # every point, the sum over its k nearest neighbours.
    x, batch = _cloud([30, 20], d=2, seed=3)
    k = 4
    e = knn_graph(x, k, batch)
    agg = torch.zeros_like(x).index_add_(0, e[1], x[e[0]])
    d = torch.cdist(x, x)
    d[batch[:, None] != batch[None, :]] = float("inf")
    d.fill_diagonal_(float("inf"))
    ref = x[d.topk(k, dim=1, largest=False).indices].sum(1)
    torch.testing.assert_close(agg, ref, rtol=0, atol=1e-12)


def test_knn_graph_cosine_equals_brute_force():
    x, batch = _cloud([25, 35], d=4, seed=1)
    x = x - 0.5                                     # directions all around the origin
    xn = x / x.norm(dim=1, keepdim=True)
    cos_dist = 1 - xn @ xn.t()
    e = knn_graph(x, 5, batch, cosine=True)
    assert _pairs(e) == _brute_knn(x, batch, 5, False, dist=cos_dist)


def test_knn_graph_coincident_points_keep_k_neighbours_without_self():
    x, batch = _cloud([12], d=2, seed=2)
    x = torch.cat([x, x[:4]])                       # 4 points twice
    e = knn_graph(x, 3, None)
    assert not bool((e[0] == e[1]).any())
    assert torch.equal(torch.bincount(e[1], minlength=16), torch.full((16,), 3))
    for i in range(4):                              # its twin is a neighbour at distance 0
        assert (i + 12, i) in _pairs(e) and (i, i + 12) in _pairs(e)


def test_knn_graph_errors():
    x, batch = _cloud([10, 5])
    with pytest.raises(MeshError, match=r"knn_graph: k=5 needs 6 points per sample .* "
                                        r"sample 1 has 5"):
        knn_graph(x, 5, batch)
    assert knn_graph(x, 5, batch, loop=True).shape == (2, 75)   # 5 points suffice with loops
    with pytest.raises(MeshError, match=r"knn_graph: flow must be 'source_to_target' or "
                                        r"'target_to_source', got 'up'"):
        knn_graph(x, 2, batch, flow="up")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loop", [False, True])
def test_radius_graph_equals_brute_force(backend, loop):
    x, batch = _cloud([50, 30, 45], seed=4)
    r = 0.3
    e = radius_graph(x, r, batch, loop=loop, max_num_neighbors=1000, backend=backend)
    d = torch.cdist(x, x)
    near = (d <= r) & (batch[:, None] == batch[None, :])
    if not loop:
        near.fill_diagonal_(False)
    centre, nbr = near.nonzero(as_tuple=True)
    assert _pairs(e) == set(zip(nbr.tolist(), centre.tolist()))      # (source, target)
    assert torch.equal(radius_graph(x, r, batch, loop=loop, max_num_neighbors=1000,
                                    flow="target_to_source", backend=backend), e.flip(0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loop", [False, True])
def test_radius_graph_max_num_neighbors_keeps_the_nearest(backend, loop):
    x, batch = _cloud([60, 40], d=2, seed=5)
    r, m = 0.5, 5                                   # ~40% of a sample within r: the cap binds
    e = radius_graph(x, r, batch, loop=loop, max_num_neighbors=m, backend=backend)
    d = torch.cdist(x, x)
    d[batch[:, None] != batch[None, :]] = float("inf")
    if not loop:
        d.fill_diagonal_(float("inf"))
    within = (d <= r).sum(1)
    assert int(within.min()) > m                    # the test exercises the cap everywhere
    # exactly max_num_neighbors per point (not counting itself when loop=False) ...
    assert torch.equal(torch.bincount(e[1], minlength=x.shape[0]),
                       torch.full((x.shape[0],), m))
    # ... and they are the nearest ones
    assert _pairs(e) == _brute_knn(x, batch, m, loop)


def test_radius_graph_errors():
    x, batch = _cloud([4])
    with pytest.raises(MeshError, match=r"radius_graph: r must be >= 0, got -1"):
        radius_graph(x, -1.0)
    with pytest.raises(MeshError, match=r"radius_graph: max_num_neighbors"):
        radius_graph(x, 0.5, max_num_neighbors=0)


def test_same_as_pyg_when_pyg_has_a_backend():
    from torch_geometric.nn import knn_graph as pyg_knn_graph
    from torch_geometric.nn import radius_graph as pyg_radius_graph
    x, batch = _cloud([30, 20], seed=6)
    try:
        ref = pyg_knn_graph(x, 4, batch)
    except ImportError as e:
        pytest.skip(f"PyG's knn_graph is unavailable here: {e}")
    assert _pairs(knn_graph(x, 4, batch)) == _pairs(ref)
    ref = pyg_radius_graph(x, 0.3, batch, max_num_neighbors=1000)
    assert _pairs(radius_graph(x, 0.3, batch, max_num_neighbors=1000)) == _pairs(ref)


# ------------------------------------------------------------ cells as PyG sees them


def _mesh(n, kind, field="u", source="mesh"):
    pts, cells = square_mesh(n, kind)
    return meshops.mesh_from_arrays(pts, cells, {field: np.arange(len(pts), dtype=float)},
                                    source=source)


def _brute_face_edges(face):
    """{(i, j)} for every pair of distinct corners of every face, both directions."""
    out = set()
    for f in face.t().tolist():
        out |= {(a, b) for a in f for b in f if a != b}
    return out


def test_face_to_edge_on_a_batch_of_two_meshes():
    meshes = [_mesh(2, "triangle"), _mesh(3, "triangle")]
    batch = next(iter(DataLoader(meshes, batch_size=2)))
    n0 = meshes[0].num_nodes
    out = T.FaceToEdge()(batch).edge_index
    # the union of every mesh's own graph, the second one offset by the first's points
    each = [T.FaceToEdge()(m).edge_index for m in meshes]
    assert _pairs(out) == _pairs(each[0]) | {(a + n0, b + n0) for a, b in _pairs(each[1])}
    # ... equal to the helper on the batch's cells and to all pairs of every triangle
    assert torch.equal(out, cells_to_edge_index(batch.cells, batch.num_nodes))
    tris = [torch.as_tensor(c).long() + off for m, off in zip(meshes, (0, n0))
            for t, c in m.cells]
    assert _pairs(out) == _brute_face_edges(torch.cat(tris).t())
    assert out.shape[1] == len(_pairs(out))                          # deduplicated
    # 2x2 / 3x3 squares split into triangles: 16 + 33 undirected edges
    assert out.shape[1] == 2 * (16 + 33)


def test_batched_cells_are_offset_and_come_back_local():
    meshes = [_mesh(2, "quad"), _mesh(3, "mixed"), _mesh(1, "triangle")]
    batch = Batch.from_data_list(meshes)
    ptr = batch.ptr.tolist()
    expect = {}
    for m, off in zip(meshes, ptr):
        for t, c in m.cells:
            expect.setdefault(t, []).append(torch.as_tensor(c) + off)
    got = dict(batch.cells)
    assert list(got) == list(expect)                # one block per type, first-seen order
    for t in expect:
        assert torch.equal(got[t], torch.cat(expect[t]))
    assert batch.cell_counts() == {t: int(c.shape[0]) for t, c in got.items()}
    for i, m in enumerate(meshes):                  # to_data_list gives local indices back
        back = batch.get_example(i)
        assert [t for t, _ in back.cells] == [t for t, _ in m.cells]
        for (_, c), (_, c0) in zip(back.cells, m.cells):
            assert torch.equal(torch.as_tensor(c), torch.as_tensor(c0))
        assert torch.equal(back.face, m.face)
    # the batch's faces index the batch's points: every face lies in one mesh
    assert torch.equal(batch.face, cells_to_face(batch.cells))
    fb = batch.batch[batch.face]
    assert bool((fb == fb[0]).all())


def test_face_of_triangles_and_quads():
    tri = _mesh(3, "triangle")
    assert torch.equal(tri.face, torch.as_tensor(tri.cells[0][1]).t())
    assert tri.face.dtype == torch.long and tri.num_faces == 18
    quad = _mesh(3, "quad")
    face = quad.face
    assert face.shape == (3, 18) and quad.num_faces == 18
    # the two triangles of every quad cover it: their areas add up to the square's
    p = quad.pos[face]                              # [3, F, 2]
    a, b = p[1] - p[0], p[2] - p[0]
    area = 0.5 * (a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]).abs()
    torch.testing.assert_close(area.sum(), torch.tensor(1.0, dtype=area.dtype))
    # FaceToEdge on quads gives the quad sides plus the 0-2 diagonal of each quad
    q = torch.as_tensor(quad.cells[0][1])
    diag = {(int(i), int(j)) for i, j in q[:, [0, 2]].tolist()}
    diag |= {(j, i) for i, j in diag}
    assert _pairs(T.FaceToEdge()(quad).edge_index) == \
        _pairs(cells_to_edge_index(quad.cells)) | diag
    # no 2-D cells: no face, as for a PyG Data without one
    cloud = MeshData(pos=torch.rand(5, 3), weight=torch.ones(5))
    assert cloud.face is None and cloud.num_faces is None
    # an explicit face wins, and FaceToEdge(remove_faces=True) can remove it
    out = T.FaceToEdge()(tri)
    assert out.face is None and tri.face is not None


def test_cells_to_edge_index_against_brute_force():
    # simplices: every pair of corners is an edge
    pts, cells = square_mesh(3, "triangle")
    tri = torch.as_tensor(cells[0][1])
    e = cells_to_edge_index(cells)
    assert _pairs(e) == _brute_face_edges(tri.t()) and e.shape[1] == len(_pairs(e))
    tet = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    assert _pairs(cells_to_edge_index([("tetra", tet)])) == _brute_face_edges(tet.t())
    # structured quads / hexahedra: the edges are the grid neighbours at distance h
    for dim, ctype in ((2, "quad"), (3, "hexahedron")):
        n = 3
        p = torch.from_numpy(grid_points(n, dim))
        conn = torch.from_numpy(meshops.structured_grid_cells((n + 1,) * dim))
        d = torch.cdist(p, p)
        i, j = ((d - 1 / n).abs() < 1e-9).nonzero(as_tuple=True)
        e = cells_to_edge_index([(ctype, conn)], num_nodes=p.shape[0])
        assert _pairs(e) == set(zip(i.tolist(), j.tolist()))
        # sorted by row, as torch_geometric.utils.to_undirected leaves it
        assert bool((e[0].diff() >= 0).all())
    # mixed blocks; vertices add no edges
    mixed = [("line", torch.tensor([[0, 5]])), ("vertex", torch.tensor([[2]])),
             ("triangle", torch.tensor([[0, 1, 2]]))]
    assert _pairs(cells_to_edge_index(mixed)) == \
        {(0, 5), (5, 0)} | _brute_face_edges(torch.tensor([[0], [1], [2]]))


def test_cells_to_edge_index_errors():
    with pytest.raises(MeshError, match=r"cells_to_edge_index: cell block 1 has type "
                                        r"'triangle6'; supported types:"):
        cells_to_edge_index([("line", torch.tensor([[0, 1]])),
                             ("triangle6", torch.zeros((1, 6), dtype=torch.long))])
    with pytest.raises(MeshError, match=r"cell block 0 \(quad\) must be \[M, 4\], got shape "
                                        r"\(2, 3\)"):
        cells_to_edge_index([("quad", torch.zeros((2, 3), dtype=torch.long))])


# ------------------------------------------------------------ fields that differ


def test_batching_meshes_with_different_fields_names_them():
    a = _mesh(2, "triangle", field="f", source="a.vtu")
    b = _mesh(2, "triangle", field="g", source="b.vtu")
    with pytest.raises(MissingFieldError,
                       match=r"^mesh 'b\.vtu' has no point field 'f' \(its fields: \['g'\]\); "
                             r"meshes batched together need the same field names$"):
        next(iter(DataLoader([a, b], batch_size=2)))
    # also a KeyError, for code that catches the lookup error of a dict
    with pytest.raises(KeyError):
        Batch.from_data_list([a, b])
    with pytest.raises(MeshError, match="has no point field 'f'"):
        pickle.loads(pickle.dumps(b)).fields["f"]    # kept through pickling
    with pytest.raises(MeshError, match="has no point field 'f'"):
        Batch.from_data_list([a, b.to("cpu")])        # and through PyG's .to()/apply


def test_fields_stay_a_mutable_dict():
    m = _mesh(2, "triangle")
    t = torch.zeros(m.num_nodes)
    m.fields["new"] = t
    assert m.fields["new"] is t and isinstance(m.fields, dict)
    batch = Batch.from_data_list([m, m])
    assert batch.fields["new"].shape == (2 * m.num_nodes,)
    assert m.field_names == ["u", "new"]
