"""How far a sample lies from the training set, so a prediction says when it
extrapolates (``meshops predict`` writes it beside ``<target>_pred``; ``meshops
evaluate`` shows how the error grows with it).

Every sample is described by two short vectors, both mesh-independent up to the
quadrature's error (integrals over the domain):

* **parameters**: ``sample.params`` (``[1, K]``) when the samples carry them, else the
  quadrature mean of each input channel (a parametric study's constant inputs are
  exactly their parameters);
* **geometry**: the domain's measure, centroid, extent (max - min per axis) and RMS
  radius about the centroid per axis, from the points and quadrature weights.

The RMS radius integrates a quadratic, and the mean of a varying input a field that is
not linear on the cells, which the quadrature gets right to ``O(h^2)`` only: each mesh
carries a bound of that error (:func:`tolerance`), and a difference within the two
meshes' bounds (and, for the geometry, the margin below) counts as none, so that the
same shapes meshed finer are not "outside the training range" nor far from their
training samples.

Each component is standardised by its spread over the training samples (standard
deviation), so distances are in *units of the training spread*. The distance of a
sample is the Euclidean distance to its nearest training sample, for the parameters,
the geometry and both together. A sample **extrapolates** when

* a component lies outside the training range ``[min, max]`` (beyond 1e-6 of the
  spread, the discretisation bounds and, for the geometry and the means of varying
  inputs, 10 % of its training range (:data:`MARGIN`): re-meshing a curved boundary
  moves even the measure and the centroid by ``O(h^2)``; the means on the very mesh of
  a training sample get none of this against it: their quadrature errors are the
  same), or differs by more than 1 % from a component
  that is the same for every training sample (e.g. another geometry than the
  one fixed mesh trained on), or
* its distance exceeds the largest nearest-neighbour distance among the training
  samples themselves (leave-one-out): it is farther from the data than any training
  sample was from the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from meshops.datasets.descriptors import describe, geometry_tolerance, mesh_key, tolerance

__all__ = ["ENSEMBLE", "TrainingSet", "describe", "ensemble_members", "geometry_tolerance",
           "predict_ensemble", "tolerance"]

#: Relative tolerance (of the spread) for the ends of the training range, and for "no
#: spread" (a component constant over the training samples).
RTOL = 1e-6
#: A component that is constant in training (one fixed mesh's geometry) counts as the
#: same when within this fraction of its size: the lumped quadrature of a refined copy
#: of the mesh moves the RMS radius by O(h^2).
SAME = 1e-2
#: Fraction of a geometry component's (or a varying input's mean's) training range
#: (max - min) by which a sample's component may differ and still count as the same: a
#: re-meshed curved boundary moves the measure, the centroid, the extent and the means
#: over the domain by O(h^2), which no bound of the points alone (:func:`tolerance`)
#: can see, and a family's spread sets the scale at which such a difference matters.
MARGIN = 0.1


def _names(k_params: int, d: int, param_names: Sequence[str] | None) -> list[str]:
    axes = "xyz"[:d]
    names = list(param_names) if param_names and len(param_names) == k_params else \
        [f"parameter {i}" for i in range(k_params)]
    return names + ["measure"] + [f"centroid {a}" for a in axes] + \
        [f"extent {a}" for a in axes] + [f"rms radius {a}" for a in axes]


@dataclass
class TrainingSet:
    """The training samples' descriptors, and distances of new samples to them.

    Build with :meth:`from_samples`; :meth:`to_dict` / :meth:`from_dict` store it in a
    checkpoint's metadata (``meshops train`` does, under ``"training_set"``).

    Attributes:
        params: ``[S, K]`` parameter descriptors of the ``S`` training samples.
        geometry: ``[S, G]`` geometry descriptors.
        names: The ``K + G`` component names (parameter names when known).
        tolerance: ``[S, K + G]`` discretisation bounds of the descriptors
            (:func:`tolerance`; zeros where a set stored before them has none).
        meshes: The ``S`` samples' :func:`~meshops.datasets.descriptors.mesh_key`
            (``None`` for a set stored before them: every mesh counts as another).
    """

    params: np.ndarray
    geometry: np.ndarray
    names: list[str] = field(default_factory=list)
    tolerance: np.ndarray | None = None
    meshes: list[str] | None = None

    def __post_init__(self) -> None:
        if self.tolerance is None:
            self.tolerance = np.zeros_like(self._all)

    @classmethod
    def from_samples(cls, samples: Sequence, param_names: Sequence[str] | None = None
                     ) -> "TrainingSet":
        if len(samples) == 0:
            raise ValueError("TrainingSet: no training samples")
        # a lazily read data set knows them without reading its samples again
        known = getattr(samples, "descriptors", None)
        desc = known() if callable(known) else \
            [(*describe(s), tolerance(s), mesh_key(s)) for s in samples]
        params = np.stack([p for p, _, _, _ in desc])
        geometry = np.stack([g for _, g, _, _ in desc])
        d = (geometry.shape[1] - 1) // 3  # measure, then centroid, extent, rms radius
        return cls(params, geometry, _names(params.shape[1], d, param_names),
                   np.stack([t for _, _, t, _ in desc]), [m for _, _, _, m in desc])

    def to_dict(self) -> dict:
        return {"params": self.params.tolist(), "geometry": self.geometry.tolist(),
                "names": list(self.names), "tolerance": self.tolerance.tolist(),
                "meshes": self.meshes}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingSet":
        s = len(d["geometry"])
        params = np.asarray(d["params"], dtype=np.float64).reshape(s, -1)
        tol = d.get("tolerance")
        if tol is None and d.get("geometry_tolerance") is not None:
            # stored before the parameters had bounds: the geometry's alone
            tol = np.concatenate([np.zeros_like(params), d["geometry_tolerance"]], 1)
        return cls(params, np.asarray(d["geometry"], dtype=np.float64), list(d["names"]),
                   None if tol is None else np.asarray(tol, dtype=np.float64),
                   d.get("meshes"))

    # ------------------------------------------------------------------ distances
    @property
    def _all(self) -> np.ndarray:
        return np.concatenate([self.params, self.geometry], 1)

    def _tol(self, sample_tol: np.ndarray, mesh: str | None) -> np.ndarray:
        """``[S, D]``: the difference each training sample's components may have from a
        sample of bounds ``sample_tol [D]`` on mesh ``mesh`` (its key) for discretisation
        alone: the two bounds and :data:`MARGIN` of the training range, for the geometry
        and the means of varying inputs (those with a bound); but no difference of the
        parameters on the same mesh, whose quadrature errors are the same."""
        k = self.params.shape[1]
        varying = np.concatenate([(self.tolerance[:, :k] > 0).any(0) | (sample_tol[:k] > 0),
                                  np.ones(self.geometry.shape[1], dtype=bool)])
        margin = np.where(varying, MARGIN * np.ptp(self._all, axis=0), 0.0)
        tol = self.tolerance + sample_tol + margin
        if mesh is not None and self.meshes is not None:
            tol[np.asarray(self.meshes) == mesh, :k] = 0.0
        return tol

    def _size(self) -> np.ndarray:
        """``[D]``: the size of each component, the scale of "constant" and "the same".

        Lengths (centroid, extent, RMS radius) are measured at the domain's size: a
        centroid at 0 is not "0 give or take nothing", and its round-off is no spread.
        """
        size = np.abs(self._all).max(0)
        d = (self.geometry.shape[1] - 1) // 3
        length = float(self.geometry[:, 1 + d:1 + 2 * d].max()) if d else 0.0
        k = self.params.shape[1]
        size[k + 1:] = np.maximum(size[k + 1:], length)
        return size + 1e-300

    def _scale(self) -> tuple[np.ndarray, np.ndarray]:
        """Per component: the training spread, and whether it is constant in training."""
        std = self._all.std(0)
        const = std <= RTOL * self._size()
        return np.where(const, 1.0, std), const

    def _mismatch(self, v: np.ndarray) -> np.ndarray:
        """``[D]``: components constant in training that ``v`` does not share."""
        _, const = self._scale()
        return const & (np.abs(v - self._all[0]) > SAME * self._size())

    def _gaps(self, v: np.ndarray, tol: np.ndarray) -> np.ndarray:
        """``[S, D]``: ``v``'s differences from each training sample in training spreads,
        each first reduced by what discretisation may explain (``tol [S, D]``), and 0
        for components constant in training."""
        std, const = self._scale()
        diff = v - self._all
        diff = np.sign(diff) * np.maximum(np.abs(diff) - tol, 0.0)
        return np.where(const, 0.0, diff / std)

    def reference_distance(self) -> float:
        """The largest distance of a training sample to its nearest other training
        sample (standardised, all components): the threshold of extrapolation."""
        if getattr(self, "_reference", None) is None:
            a, n = self._all, len(self._all)
            near = []
            for i in range(n):
                mesh = None if self.meshes is None else self.meshes[i]
                d = np.linalg.norm(self._gaps(a[i], self._tol(self.tolerance[i], mesh)),
                                   axis=1)
                d[i] = np.inf
                near.append(float(d.min()))
            self._reference = max(near) if n > 1 else 0.0
        return self._reference

    def distance(self, sample) -> dict:
        """Distance of ``sample`` to the training set, and why it extrapolates (if so).

        Differences that the discretisation of the two meshes may explain (their
        :func:`tolerance` bounds added) do not count: the same shape meshed
        finer is at distance 0 from it, and inside the training range of a family.

        Returns:
            ``distance``, ``params_distance``, ``geometry_distance`` (nearest training
            sample, in training spreads; ``inf`` when a component that is constant in
            training differs), ``nearest`` (its training index), ``reference`` (see
            :meth:`reference_distance`), ``extrapolates`` and ``reasons`` (one line
            per cause).
        """
        p, g = describe(sample)
        if p.shape[0] != self.params.shape[1] or g.shape[0] != self.geometry.shape[1]:
            raise ValueError(f"the sample has {p.shape[0]} parameters and {g.shape[0]} "
                             f"geometry components, the training set "
                             f"{self.params.shape[1]} and {self.geometry.shape[1]}")
        v = np.concatenate([p, g])
        mismatch = self._mismatch(v)
        tol = self._tol(tolerance(sample), mesh_key(sample))
        gaps = self._gaps(v, tol)
        k = self.params.shape[1]
        parts = {"params": slice(0, k), "geometry": slice(k, None), "": slice(None)}
        out: dict = {}
        for key, cols in parts.items():
            dist = np.linalg.norm(gaps[:, cols], axis=1)
            i = int(np.argmin(dist))
            out[f"{key}_distance" if key else "distance"] = \
                math.inf if mismatch[cols].any() else float(dist[i])
            if not key:
                out["nearest"] = i
        reasons = self._range_reasons(v, mismatch, tol)
        ref = self.reference_distance()
        if math.isfinite(out["distance"]) and out["distance"] > ref:
            reasons.append(f"{out['distance']:.3g} training spreads from the nearest training "
                           f"sample, farther than any training sample from the others "
                           f"({ref:.3g})")
        out.update(reference=ref, extrapolates=bool(reasons), reasons=reasons)
        return out

    def _range_reasons(self, v: np.ndarray, mismatch: np.ndarray, tol: np.ndarray) -> list:
        """A line per component that differs from a constant one, or lies outside the
        training range widened by the discretisation bounds ``tol [S, D]``."""
        a = self._all
        std, const = self._scale()
        lo, hi = (a - tol).min(0) - RTOL * std, (a + tol).max(0) + RTOL * std
        reasons = []
        for j, name in enumerate(self.names):
            if mismatch[j]:
                reasons.append(f"{name} is {v[j]:.6g} but {a[0, j]:.6g} in every training "
                               f"sample")
            elif not const[j] and not lo[j] <= v[j] <= hi[j]:
                widened = tol[:, j].max()
                reasons.append(f"{name} = {v[j]:.6g} is outside the training range "
                               f"[{a[:, j].min():.6g}, {a[:, j].max():.6g}]"
                               + (f" (widened by discretisation and margin, up to "
                                  f"{widened:.2g})" if widened > 0 else ""))
        return reasons


# ---------------------------------------------------------------------- ensembles
#: Sub-folder of a run that holds the other members of an ensemble (``meshops train
#: --ensemble K``): ``RUN/ensemble/seed<S+k>/``, each a complete run folder.
ENSEMBLE = "ensemble"


def ensemble_members(run, metadata: dict | None = None) -> list:
    """The member run folders of an ensemble run (the run itself first), or ``[run]``.

    ``meshops train --seed S --ensemble K`` trains the run with seed ``S`` and the
    members ``RUN/ensemble/seed<S+1> ... seed<S+K-1>``: the same command with another
    seed (so another split, initial weights, data order and dropout). With the run's
    ``metadata`` only those seeds count: a folder of another run's members (a run
    retrained in place) is no member of this one.
    """
    from pathlib import Path

    run = Path(run)
    folder = run / ENSEMBLE
    if not run.is_dir() or not folder.is_dir():
        return [run]
    members = [p for p in folder.glob("seed*") if (p / "best.pt").is_file()]
    config = (metadata or {}).get("train_config") or {}
    if "seed" in config and "ensemble" in config:
        wanted = {f"seed{int(config['seed']) + k}" for k in range(1, int(config["ensemble"]))}
        members = [p for p in members if p.name in wanted]
    return [run] + sorted(members, key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else 0)


def predict_ensemble(models: Sequence, spec, mesh) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean and standard deviation (``None`` for one model) of the members' predictions.

    Shapes:
        mesh ``pos [N, d]`` -> mean ``[N, C_out]``, std ``[N, C_out]``
    """
    from meshops.inference.predict import predict_mesh

    preds = torch.stack([predict_mesh(m, spec, mesh).to(torch.float64) for m in models])
    return preds.mean(0), (preds.std(0) if len(models) > 1 else None)
