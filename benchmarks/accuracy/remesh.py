"""The mesh-independence suite: the test shapes meshed again, and what the meshing
alone changes.

A family's data folder may hold, beside ``test/``, the same shapes on other meshes
(``dataset.json``'s ``extra_splits``; each file named as the test file of the same
shape). Every model trained on ``train/`` predicts them zero-shot, and its error there
is set beside its error on ``test/``. A ratio near 1 says the model computes the same
function whatever the mesh; but the truths differ too (each mesh's finite-element
solution has its own discretisation error), so the **finite-element difference of the
truths** is printed beside: the test mesh's solution interpolated (P1, on its
triangles or tetrahedra) onto the re-meshed nodes against the re-meshed solution, with
the metric of :mod:`benchmarks.accuracy.metric`. A model whose error grows by much more than that
difference depends on the mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from benchmarks.accuracy.classical import transfer
from benchmarks.accuracy.folder import Sample
from benchmarks.accuracy.metric import field_errors, summarize

#: What each re-meshed split is, for the reports (unknown splits show their name).
LABELS = {"test_fine": "uniformly finer (about 4x the nodes)",
          "test_ring16": "band at the bodies refined 16x in area (volume in 3-D)",
          "test_ring64": "band at the bodies refined 64x in area (volume in 3-D)",
          "test_wall": "grid rows packed 4x closer to the wall",
          "test_graded": "cap at the front stagnation point refined 16x in area"}


def label(split: str) -> str:
    """The report's name of split ``split``."""
    return LABELS.get(split, split)


def pair(test: Sequence[Sample], remeshed: Sequence[Sample]) -> list[tuple[Sample, Sample]]:
    """``(test sample, the same shape re-meshed)`` by file name.

    Raises:
        ValueError: a re-meshed file with no test file of its name.
    """
    by_name = {s.name: s for s in test}
    missing = [s.name for s in remeshed if s.name not in by_name]
    if missing:
        raise ValueError(f"re-meshed file(s) without a test file of the same shape: "
                         f"{', '.join(missing[:3])}")
    return [(by_name[s.name], s) for s in remeshed]


def moved_predictions(test: Sequence[Sample], predictions: dict,
                      remeshed: Sequence[Sample]) -> dict:
    """A model's predictions on the test meshes carried (P1) onto the re-meshed ones:
    ``{file name: [N, C]}``. Scored against the re-meshed truths, they say what the
    model's error would be there if it computed the same function on every mesh; its
    own predictions on the re-meshed files scoring worse than these is the model's
    dependence on the mesh, not the meshing's change of the truth or of the metric's
    quadrature."""
    out = {}
    for coarse, fine in pair(test, remeshed):
        if coarse.name in predictions:
            src = dataclasses.replace(coarse, targets=np.asarray(predictions[coarse.name]))
            out[fine.name] = transfer(src, fine)
    return out


def truth_difference(test: Sequence[Sample], remeshed: Sequence[Sample],
                     columns: dict[str, list[int]]) -> dict:
    """The finite-element difference of the truths: per re-meshed sample, the test
    mesh's targets interpolated to its nodes against its own targets, per field.

    Returns:
        ``{"mean", "median", "worst", "n", "fields": {field: summary}}`` as
        :func:`benchmarks.accuracy.run.score` gives for a model.
    """
    per = [field_errors(transfer(coarse, fine), fine.targets, fine.weight, columns)
           for coarse, fine in pair(test, remeshed)]
    out = summarize([e["mean"] for e in per])
    if len(columns) > 1:
        out["fields"] = {f: summarize([e[f] for e in per]) for f in columns}
    return out
