"""Target fields: which output channels form each field that has its own relative error.

A model's targets are one tensor ``y [N, C]``, the concatenation of the target arrays
(``--targets u,v,p``). Pooling all ``C`` channels into one relative norm lets the field
of largest magnitude decide the error: with a pressure about 100 times the velocity, a
model that predicts the pressure and ignores the velocity scores 1 %. Every error of
meshops is therefore taken *per field* and averaged over the fields: the relative error
of sample ``b`` is

.. math::
    e_b = \\frac{\\sum_f \\omega_f\\, \\|\\hat y_{b,f} - y_{b,f}\\| / \\|y_{b,f}\\|}
               {\\sum_f \\omega_f},

with the norms over the channels of field ``f`` (a vector field's components together)
and weights ``omega_f`` (1 by default). A field is one target array (a scalar or a
vector of components) or several scalar arrays joined by ``+`` (``--targets u+v,p``:
velocity ``(u, v)`` and pressure ``p``). Since the concatenation keeps the order of the
names, each field is a contiguous range of channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import Tensor

from meshops.errors import UsageError

__all__ = ["JOIN", "TargetFields", "field_mean", "field_names", "field_shape", "field_spec",
           "format_shape", "optional_field_names", "split_field", "target_names"]


def field_shape(v) -> list[int]:
    """Per-point shape of a field: ``[]`` for a scalar, ``[c]`` for a vector."""
    return [int(s) for s in v.shape[1:]]


def format_shape(shape: Sequence[int]) -> str:
    """A per-point field shape for messages: ``scalar`` or ``3x3 per point``."""
    return "scalar" if not shape else "x".join(str(s) for s in shape) + " per point"

#: Joins the scalar arrays of one field: ``u+v``.
JOIN = "+"


def split_field(spec: str) -> list[str]:
    """The array names of one field spec: ``"u+v"`` -> ``["u", "v"]``.

    Raises:
        ValueError: An empty name (``"u+"``).
    """
    parts = [p.strip() for p in spec.split(JOIN)]
    if not all(parts):
        raise ValueError(f"field {spec!r}: empty name around {JOIN!r}; write e.g. u+v")
    return parts


def field_spec(spec: str) -> str:
    """The one spelling of a field spec: its names stripped around :data:`JOIN`
    (``"u + v"`` -> ``"u+v"``), so that a weight or a field given either way is found.

    Raises:
        ValueError: An empty name (``"u+"``).
    """
    return JOIN.join(split_field(spec))


def target_names(specs: Sequence[str]) -> list[str]:
    """The target arrays of field specs, in order: ``["u+v", "p"]`` -> ``["u", "v", "p"]``.

    Raises:
        ValueError: An empty name, or an array in two fields.
    """
    names = [n for s in specs for n in split_field(s)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"target(s) {dup} given more than once")
    return names


@dataclass(frozen=True)
class TargetFields:
    """The fields of a target tensor: a name, a channel range and a weight each.

    Build one with :meth:`from_specs` (field specs and each array's channel count),
    :meth:`single` (every channel one field: the pooled error) or :meth:`from_dict`
    (as saved in a run's metadata by :meth:`to_dict`).

    Attributes:
        names: One per field (``"u+v"``, ``"p"``).
        starts, stops: The channel range ``[start, stop)`` of each field.
        weights: The weight of each field in the mean (positive).
    """

    names: tuple[str, ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.names)
        if not n or not (len(self.starts) == len(self.stops) == len(self.weights) == n):
            raise ValueError("TargetFields: names, starts, stops and weights must be "
                             "non-empty and of one length")
        if len(set(self.names)) != n:
            raise ValueError(f"TargetFields: field names repeat: {list(self.names)}")
        at = 0
        for name, a, b in zip(self.names, self.starts, self.stops):
            if a != at or b <= a:
                raise ValueError(f"TargetFields: field {name!r} has channels [{a}, {b}); the "
                                 f"fields must cover the channels in order from 0")
            at = b
        for name, w in zip(self.names, self.weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or \
                    not (math.isfinite(w) and w > 0):
                raise ValueError(f"TargetFields: field {name!r} has weight {w!r}; weights "
                                 f"must be finite and positive")

    # ---------------------------------------------------------------- building
    @classmethod
    def single(cls, channels: int, name: str = "all") -> "TargetFields":
        """All ``channels`` as one field: the pooled relative error."""
        return cls((name,), (0,), (int(channels),), (1.0,))

    @classmethod
    def from_specs(cls, specs: Sequence[str], channels: Mapping[str, int],
                   weights: Mapping[str, float] | None = None) -> "TargetFields":
        """Fields from their specs (``["u+v", "p"]``), the channels of each array
        (``{"u": 1, "v": 1, "p": 1}``) and optional weights by field name.

        Raises:
            ValueError: An array without a channel count, a weight for a field that is
                not there, a weight that is not positive.
        """
        weights = dict(weights or {})
        unknown = sorted(set(weights) - set(specs))
        if unknown:
            raise ValueError(f"field weight(s) for {unknown}, which are not target fields "
                             f"(the fields are {', '.join(specs)})")
        names, starts, stops, ws, at = [], [], [], [], 0
        for spec in specs:
            arrays = split_field(spec)
            missing = [a for a in arrays if a not in channels]
            if missing:
                raise ValueError(f"field {spec!r}: no channel count for {missing}")
            width = sum(int(channels[a]) for a in arrays)
            names.append(JOIN.join(arrays))
            starts.append(at)
            stops.append(at + width)
            ws.append(float(weights.get(spec, 1.0)))
            at += width
        return cls(tuple(names), tuple(starts), tuple(stops), tuple(ws))

    @classmethod
    def from_dict(cls, d: Mapping) -> "TargetFields":
        """The inverse of :meth:`to_dict`."""
        return cls(tuple(d["names"]), tuple(int(a) for a in d["starts"]),
                   tuple(int(b) for b in d["stops"]), tuple(float(w) for w in d["weights"]))

    def to_dict(self) -> dict:
        """Plain data for a checkpoint's metadata."""
        return {"names": list(self.names), "starts": list(self.starts),
                "stops": list(self.stops), "weights": list(self.weights)}

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_channels(self) -> int:
        return self.stops[-1]

    def slices(self) -> dict[str, slice]:
        """``{name: channel slice}``, in order."""
        return {n: slice(a, b) for n, a, b in zip(self.names, self.starts, self.stops)}

    def check_channels(self, channels: int) -> None:
        """``ValueError`` unless the fields cover exactly ``channels`` channels."""
        if channels != self.num_channels:
            raise ValueError(f"the target fields {', '.join(self.names)} cover "
                             f"{self.num_channels} channels but the targets have {channels}")

    def describe(self) -> str:
        """``"u+v (2 channels), p (1 channel)"``, with the weights that are not 1."""
        parts = []
        for n, a, b, w in zip(self.names, self.starts, self.stops, self.weights):
            size = f"{b - a} channel{'s' if b - a > 1 else ''}"
            parts.append(f"{n} ({size}{'' if w == 1 else f', weight {w:g}'})")
        return ", ".join(parts)


def field_mean(values: Tensor, fields: TargetFields | None) -> Tensor:
    """The weighted mean over the fields of per-field values ``[B, F]``, over the
    fields where a value is defined (not NaN): NaN where none is.

    Shapes:
        values ``[B, F]`` -> ``[B]``
    """
    if fields is None:
        return values[:, 0]
    w = torch.tensor(fields.weights, dtype=values.dtype, device=values.device)
    defined = ~torch.isnan(values)
    w = torch.where(defined, w, torch.zeros_like(values))
    total = (w * torch.where(defined, values, torch.zeros_like(values))).sum(-1)
    return total / w.sum(-1)  # 0 / 0 = NaN where no field is defined


def field_names(value, key: str) -> list[str]:
    """A list of field names from ``"a,b"``, ``""`` or a list; ``key`` names the
    option (and its source) in the error."""
    if value is None:
        return []
    if isinstance(value, str):
        out = [s.strip() for s in value.split(",")]
        out = [s for s in out if s]
    elif isinstance(value, (list, tuple)):
        out = []
        for v in value:
            if not isinstance(v, str) or not v.strip():
                raise UsageError(f"{key}: field names must be non-empty strings, got {v!r}")
            out.append(v.strip())
    else:
        raise UsageError(f"{key}: expected a comma-separated string or a list of field "
                       f"names, got {value!r}")
    dup = sorted({n for n in out if out.count(n) > 1})
    if dup:
        raise UsageError(f"{key}: field(s) {dup} given more than once")
    return out


def optional_field_names(value) -> list[str] | None:
    """``--inputs`` / ``--targets`` of predict and evaluate: ``None`` when absent."""
    return None if value is None else field_names(value, "--inputs/--targets")
