"""Regenerate ``annulus.vtu``: a mixed triangle/quad mesh of the annulus 0.5 < r < 1
with the point field ``u = x^2 - y`` (read by the README's "Meshes as functions"
example and by the tests).

Run: ``python examples/meshes/make_annulus.py`` (needs ``pip install gmsh``).
"""

from pathlib import Path

import gmsh
import numpy as np

from meshops.mesh.io import mesh_from_arrays, write_mesh


def annulus(h: float = 0.08, recombine: bool = True):
    gmsh.initialize()
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        outer = gmsh.model.occ.addDisk(0, 0, 0, 1.0, 1.0)
        inner = gmsh.model.occ.addDisk(0, 0, 0, 0.5, 0.5)
        gmsh.model.occ.cut([(2, outer)], [(2, inner)])
        gmsh.model.occ.synchronize()
        gmsh.option.setNumber("Mesh.MeshSizeMax", h)
        if recombine:  # quads where the recombination succeeds, triangles elsewhere
            gmsh.option.setNumber("Mesh.RecombineAll", 1)
            gmsh.option.setNumber("Mesh.RecombinationAlgorithm", 0)
        gmsh.model.mesh.generate(2)
        tags, coords, _ = gmsh.model.mesh.getNodes()
        pts = coords.reshape(-1, 3)
        index = {t: i for i, t in enumerate(tags)}
        cells = []
        for etype, name, nv in ((2, "triangle", 3), (3, "quad", 4)):
            types, _, nodes = gmsh.model.mesh.getElements(2)
            for t, n in zip(types, nodes):
                if t == etype:
                    cells.append((name, np.vectorize(index.get)(n).reshape(-1, nv)))
    finally:
        gmsh.finalize()
    used = np.unique(np.concatenate([c.ravel() for _, c in cells]))
    remap = np.full(len(pts), -1)
    remap[used] = np.arange(len(used))
    return pts[used], [(t, remap[c]) for t, c in cells]


if __name__ == "__main__":
    pts, cells = annulus()
    mesh = mesh_from_arrays(pts, cells, {"u": pts[:, 0] ** 2 - pts[:, 1]}, source="annulus")
    out = write_mesh(Path(__file__).with_name("annulus.vtu"), mesh)
    print(f"wrote {out}: {len(pts)} points, {mesh.cell_counts()}, area {mesh.measure:.6f}")
