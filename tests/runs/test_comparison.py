"""One tolerance and one wording for "ahead", "level" and "behind" (issue 29): the
Navier-Stokes step's reduced basis at 2.0680e-05 against its POD + RBF baseline at
2.0611e-05 is 0.33 % behind, not level and not best."""

import math

import pytest

from meshops.runs.comparison import LEVEL_RTOL, gap, is_level, standing


def test_gap_in_percent_below_twice_and_as_a_factor_above():
    assert gap(2.0680e-5, 2.0611e-5) == "0.33 %"
    assert gap(0.01922, 0.01764) == "9 %"
    assert gap(0.02, 0.01) == "2x" and gap(0.05, 0.01) == "5x"


@pytest.mark.parametrize("a, b, level", [(1.0, 1.0 + 0.9 * LEVEL_RTOL, True),
                                         (1.0, 1.0 + 1.1 * LEVEL_RTOL, False),
                                         (2.0679841e-5, 2.0679489e-5, True),
                                         (2.0680e-5, 2.0611e-5, False)])
def test_level_is_symmetric_and_relative_to_the_smaller(a, b, level):
    assert is_level(a, b) == is_level(b, a) == level
    assert is_level(1e6 * a, 1e6 * b) == level


def test_behind_level_and_ahead():
    assert standing("rb", 2.0680e-5, {"POD + RBF": 2.0611e-5, "mean": 2.6}) == \
        "rb is behind POD + RBF by 0.33 % (2.068e-05 vs 2.061e-05)"
    assert standing("rb", 2.0680e-5, {"POD + RBF": 2.0679e-5}) == \
        "rb is level with POD + RBF (2.068e-05 vs 2.068e-05), within 0.1 %"
    assert standing("rb", 1.0, {"a": 0.5, "b": 0.9999, "c": 3.0}) == \
        "rb is behind a by 2x (1 vs 0.5); level with b (1 vs 0.9999), within 0.1 %"
    assert standing("rb", 0.01, {"a": 0.0195, "b": 0.5}) == \
        "rb is ahead: the closest, a, is 95 % above (0.0195 vs 0.01)"


def test_results_that_are_no_numbers_are_left_out():
    assert standing("rb", 0.1, {"failed": math.inf, "undefined": None, "a": 0.2}) == \
        "rb is ahead: the closest, a, is 2x above (0.2 vs 0.1)"
    assert standing("rb", 0.1, {"failed": math.nan}) == "rb: nothing to compare with"


def test_a_gap_just_below_twice_is_in_percent_without_an_exponent():
    from meshops.runs.comparison import gap

    assert gap(1.997, 1.0) == "100 %"
    assert gap(1.7, 1.0) == "70 %"
    assert gap(2.0, 1.0) == "2x"
