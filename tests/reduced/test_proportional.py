"""Which global input the targets are proportional to (issue 37, item 2): found on a
family linear in a load, and not on one that ignores it, grows as its square, changes
sign or spans too little to tell."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data

from meshops.reduced.parameters import means_and_sizes, proportional_channel


def _found(samples, channels):
    return proportional_channel(*means_and_sizes(samples), channels)


def _family(power: float, loads, n_nodes: int = 30, seed: int = 0):
    """Meshes whose target is ``load**power * g_s(node)``, with a field input and the
    load as a second, constant input channel."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in loads:
        f = torch.rand(n_nodes, 1, generator=g, dtype=torch.float64)
        shape = 1 + 0.2 * torch.rand(1, generator=g, dtype=torch.float64)  # geometry
        y = torch.cat([math.copysign(abs(c) ** power, c) * shape * (1 + f),
                       math.copysign(abs(c) ** power, c) * shape * f ** 2], 1)
        out.append(Data(x=torch.cat([f, torch.full((n_nodes, 1), c, dtype=torch.float64)], 1),
                        y=y, weight=torch.rand(n_nodes, generator=g, dtype=torch.float64)))
    return out


LOADS = torch.linspace(0.5, 4.0, 12).tolist()


def test_a_family_linear_in_the_load_is_found_with_exponent_one():
    found = _found(_family(1.0, LOADS), [False, True])
    assert found is not None and found[0] == 1
    assert found[1] == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("power, loads", [(0.0, LOADS), (2.0, LOADS),
                                          (1.0, [-2.0, -1.0, 1.0, 2.0, 3.0]),
                                          (1.0, [1.0, 1.2, 1.4, 1.6, 1.8])])
def test_no_channel_when_the_answer_is_not_proportional_or_cannot_tell(power, loads):
    """Independent of the load, as its square, a load changing sign (its size alone
    says nothing of the answer's sign) and loads within a ratio of 1.8."""
    assert _found(_family(power, loads), [False, True]) is None


def test_only_global_channels_are_candidates():
    assert _found(_family(1.0, LOADS), [False, False]) is None
    assert _found(_family(1.0, LOADS), None) is None
