"""How far a sample lies from the training set, so a prediction says when it
extrapolates (``meshops predict`` writes it beside ``<target>_pred``; ``meshops
evaluate`` shows how the error grows with it).

Every sample is described by two short vectors, both mesh-independent (quadrature
integrals, so refining a mesh does not move them):

* **parameters**: ``sample.params`` (``[1, K]``) when the samples carry them, else the
  quadrature mean of each input channel (a parametric study's constant inputs are
  exactly their parameters);
* **geometry**: the domain's measure, centroid, extent (max - min per axis) and RMS
  radius about the centroid per axis, from the points and quadrature weights.

Each component is standardised by its spread over the training samples (standard
deviation), so distances are in *units of the training spread*. The distance of a
sample is the Euclidean distance to its nearest training sample, for the parameters,
the geometry and both together. A sample **extrapolates** when

* a component lies outside the training range ``[min, max]`` (beyond 1e-6 of the
  spread), or differs by more than 1 % from a component that is the same for every
  training sample (e.g. another geometry than the one fixed mesh trained on), or
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

__all__ = ["ENSEMBLE", "TrainingSet", "describe", "ensemble_members", "predict_ensemble"]

#: Relative tolerance (of the spread) for the ends of the training range, and for "no
#: spread" (a component constant over the training samples).
RTOL = 1e-6
#: A component that is constant in training (one fixed mesh's geometry) counts as the
#: same when within this fraction of its size: the lumped quadrature of a refined copy
#: of the mesh moves the RMS radius by O(h^2).
SAME = 1e-2


def _params(sample) -> np.ndarray:
    p = getattr(sample, "params", None)
    if p is not None:
        return torch.as_tensor(p, dtype=torch.float64).reshape(-1).numpy()
    x = getattr(sample, "x", None)
    if x is None or x.numel() == 0:
        return np.zeros(0)
    w = sample.weight.to(torch.float64)
    x = x.to(torch.float64).reshape(x.shape[0], -1)
    return ((w[:, None] * x).sum(0) / w.sum()).numpy()


def _geometry(sample) -> np.ndarray:
    pos, w = sample.pos.to(torch.float64), sample.weight.to(torch.float64)
    measure = w.sum()
    centroid = (w[:, None] * pos).sum(0) / measure
    extent = pos.amax(0) - pos.amin(0)
    rms = ((w[:, None] * (pos - centroid) ** 2).sum(0) / measure).sqrt()
    return torch.cat([measure[None], centroid, extent, rms]).numpy()


def describe(sample) -> tuple[np.ndarray, np.ndarray]:
    """``(parameters [K], geometry [1 + 3d])`` of one sample (see the module).

    Shapes:
        sample ``pos [N, d]``, ``weight [N]``, ``x [N, C]`` or ``params [1, K]``
    """
    return _params(sample), _geometry(sample)


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
    """

    params: np.ndarray
    geometry: np.ndarray
    names: list[str] = field(default_factory=list)

    @classmethod
    def from_samples(cls, samples: Sequence, param_names: Sequence[str] | None = None
                     ) -> "TrainingSet":
        if len(samples) == 0:
            raise ValueError("TrainingSet: no training samples")
        # a lazily read data set knows them without reading its samples again
        known = getattr(samples, "descriptors", None)
        desc = known() if callable(known) else [describe(s) for s in samples]
        params = np.stack([p for p, _ in desc])
        geometry = np.stack([g for _, g in desc])
        d = (geometry.shape[1] - 1) // 3  # measure, then centroid, extent, rms radius
        return cls(params, geometry, _names(params.shape[1], d, param_names))

    def to_dict(self) -> dict:
        return {"params": self.params.tolist(), "geometry": self.geometry.tolist(),
                "names": list(self.names)}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingSet":
        s = len(d["geometry"])
        params = np.asarray(d["params"], dtype=np.float64).reshape(s, -1)
        return cls(params, np.asarray(d["geometry"], dtype=np.float64), list(d["names"]))

    # ------------------------------------------------------------------ distances
    @property
    def _all(self) -> np.ndarray:
        return np.concatenate([self.params, self.geometry], 1)

    def _scale(self) -> tuple[np.ndarray, np.ndarray]:
        """Per component: the training spread, and whether it is constant in training."""
        a = self._all
        std = a.std(0)
        ref = np.abs(a).max(0) + 1e-300
        const = std <= RTOL * ref
        return np.where(const, 1.0, std), const

    def _standardise(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Standardised ``v [.., D]`` and the constant-component mismatches ``[.., D]``."""
        std, const = self._scale()
        a = self._all
        mean = a.mean(0)
        z = (v - mean) / std
        size = np.abs(a).max(0)
        # lengths (centroid, extent, RMS radius) are compared at the domain's size: a
        # centroid at 0 is not "0 give or take nothing"
        d = (self.geometry.shape[1] - 1) // 3
        length = float(self.geometry[:, 1 + d:1 + 2 * d].max()) if d else 0.0
        k = self.params.shape[1]
        size[k + 1:] = np.maximum(size[k + 1:], length)
        mismatch = const & (np.abs(v - a[0]) > SAME * (size + 1e-300))
        return np.where(const, 0.0, z), mismatch

    def _nearest(self, z: np.ndarray, train: np.ndarray, cols: slice,
                 exclude: int | None = None) -> tuple[float, int]:
        d = np.linalg.norm(train[:, cols] - z[cols], axis=1) if train.shape[1] else \
            np.zeros(len(train))
        if exclude is not None:
            d[exclude] = np.inf
        i = int(np.argmin(d))
        return float(d[i]), i

    def reference_distance(self) -> float:
        """The largest distance of a training sample to its nearest other training
        sample (standardised, all components): the threshold of extrapolation."""
        if getattr(self, "_reference", None) is None:
            zt, _ = self._standardise(self._all)
            self._reference = 0.0 if len(zt) < 2 else max(
                self._nearest(zt[i], zt, slice(None), exclude=i)[0] for i in range(len(zt)))
        return self._reference

    def distance(self, sample) -> dict:
        """Distance of ``sample`` to the training set, and why it extrapolates (if so).

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
        z, mismatch = self._standardise(v)
        zt, _ = self._standardise(self._all)
        k = self.params.shape[1]
        parts = {"params": slice(0, k), "geometry": slice(k, None), "": slice(None)}
        out: dict = {}
        for key, cols in parts.items():
            d, i = self._nearest(z, zt, cols)
            if mismatch[cols].any():
                d = math.inf
            out[f"{key}_distance" if key else "distance"] = d
            if not key:
                out["nearest"] = i
        reasons = []
        a = self._all
        lo, hi = a.min(0), a.max(0)
        std, const = self._scale()
        for j, name in enumerate(self.names):
            if mismatch[j]:
                reasons.append(f"{name} is {v[j]:.6g} but {a[0, j]:.6g} in every training "
                               f"sample")
            elif not const[j] and (v[j] < lo[j] - RTOL * std[j] or v[j] > hi[j] + RTOL * std[j]):
                reasons.append(f"{name} = {v[j]:.6g} is outside the training range "
                               f"[{lo[j]:.6g}, {hi[j]:.6g}]")
        ref = self.reference_distance()
        if math.isfinite(out["distance"]) and out["distance"] > ref:
            reasons.append(f"{out['distance']:.3g} training spreads from the nearest training "
                           f"sample, farther than any training sample from the others "
                           f"({ref:.3g})")
        out.update(reference=ref, extrapolates=bool(reasons), reasons=reasons)
        return out


# ---------------------------------------------------------------------- ensembles
#: Sub-folder of a run that holds the other members of an ensemble (``meshops train
#: --ensemble K``): ``RUN/ensemble/seed<S+k>/``, each a complete run folder.
ENSEMBLE = "ensemble"


def ensemble_members(run) -> list:
    """The member run folders of an ensemble run (the run itself first), or ``[run]``.

    ``meshops train --seed S --ensemble K`` trains the run with seed ``S`` and the
    members ``RUN/ensemble/seed<S+1> ... seed<S+K-1>``: the same command with another
    seed (so another split, initial weights, data order and dropout).
    """
    from pathlib import Path

    run = Path(run)
    folder = run / ENSEMBLE
    if not run.is_dir() or not folder.is_dir():
        return [run]
    members = [p for p in folder.glob("seed*") if (p / "best.pt").is_file()]
    return [run] + sorted(members, key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else 0)


def predict_ensemble(models: Sequence, spec, mesh) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean and standard deviation (``None`` for one model) of the members' predictions.

    Shapes:
        mesh ``pos [N, d]`` -> mean ``[N, C_out]``, std ``[N, C_out]``
    """
    from meshops.inference import predict_mesh

    preds = torch.stack([predict_mesh(m, spec, mesh).to(torch.float64) for m in models])
    return preds.mean(0), (preds.std(0) if len(models) > 1 else None)
