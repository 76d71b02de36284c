"""Discretisation-consistent attention layers (PyG style).

Every layer approximates an integral operator with the quadrature weights of the
source mesh, so the same parameters give (nearly) the same function on any mesh
of the same geometry. Flat PyG batches: ``layer(x, pos, weight, batch=None)``;
dense batches: ``layer.dense(x, pos, weight, mask=None)``.
"""
