"""Where a model's mean error stands against the baselines': ahead, level or behind.

Two mean errors are **level** when the larger is at most :data:`LEVEL_RTOL` (0.1 %)
above the smaller: the same number to the four digits anyone quotes, and a difference a
new seed or the next data set moves. Outside it one is **behind** the other, by the
stated gap. ``meshops train`` (a reduced basis' validation table), ``meshops evaluate``
and the accuracy benchmark's verdicts in the README (``benchmarks/accuracy/report.py``)
all say it with :func:`standing`, so a model 0.3 % behind its baseline is never called
level or best in one place and behind in another.
"""

from __future__ import annotations

import math
from typing import Mapping

#: Relative gap up to which two mean errors are level.
LEVEL_RTOL = 1e-3
#: Gaps up to this ratio are given in percent, larger ones as a factor.
PERCENT_UP_TO = 2.0


def gap(larger: float, smaller: float) -> str:
    """How much ``larger`` is above ``smaller``: ``"0.33 %"``, or ``"2.1x"`` from
    :data:`PERCENT_UP_TO` on."""
    ratio = larger / smaller if smaller > 0 else math.inf
    if ratio >= PERCENT_UP_TO:
        return f"{ratio:.3g}x"
    percent = 100 * (ratio - 1)  # two digits, and no exponent from 99.5 % on
    return f"{percent:.2g} %" if percent < 99.5 else f"{percent:.0f} %"


def is_level(a: float, b: float) -> bool:
    """Whether the larger of two errors is within :data:`LEVEL_RTOL` of the smaller."""
    return abs(a - b) <= LEVEL_RTOL * min(a, b)


def standing(name: str, mean: float, others: Mapping[str, float]) -> str:
    """One sentence on ``name``'s mean error against ``others`` (name -> mean error;
    non-finite ones are left out), e.g. ``"reduced_basis is behind POD + RBF by 0.33 %
    (2.068e-05 vs 2.061e-05)"``.

    Behind every model whose error is lower by more than :data:`LEVEL_RTOL`, level with
    those within it, otherwise ahead (naming the closest and the gap to it).
    """
    others = {k: v for k, v in others.items() if v is not None and math.isfinite(v)}
    if not others:
        return f"{name}: nothing to compare with"
    level = {k: v for k, v in others.items() if is_level(mean, v)}
    behind = sorted(((k, v) for k, v in others.items() if v < mean and k not in level),
                    key=lambda kv: kv[1])
    parts = []
    if behind:
        parts.append("is behind " + ", ".join(f"{k} by {gap(mean, v)} ({mean:.4g} vs {v:.4g})"
                                               for k, v in behind))
    if level:
        parts.append("level with " + ", ".join(f"{k} ({mean:.4g} vs {v:.4g})"
                                                for k, v in level.items())
                     + f", within {100 * LEVEL_RTOL:g} %")
    if parts:
        text = "; ".join(parts)
        return f"{name} {text if behind else 'is ' + text}"
    closest, v = min(others.items(), key=lambda kv: kv[1])
    return (f"{name} is ahead: the closest, {closest}, is {gap(v, mean)} above "
            f"({v:.4g} vs {mean:.4g})")
