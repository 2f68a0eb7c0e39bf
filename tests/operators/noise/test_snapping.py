"""Real values on a public grid: exact rounding and the unit sensitivity bound."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import from_units, make_grid, to_units, unit_sensitivity

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


def test_rounding_is_exact_not_floating():
    grid = make_grid("0.1")
    assert grid.step == Fraction(1, 10)
    # 0.15 is the double 0.1499999999999999944..., which is below the tie: 1 unit, not 2.
    assert to_units(grid, 0.15) == 1
    assert to_units(grid, 0.25) == 3  # the double 0.25 is exact: a tie, rounded up
    assert to_units(grid, -0.25) == -2
    assert from_units(grid, 37) == pytest.approx(3.7)


@given(finite, finite, st.sampled_from(["0.01", "0.5", "1", "3", "7.25"]))
def test_unit_change_is_at_most_ceil_of_value_change(a, b, step):
    grid = make_grid(step)
    delta = abs(Fraction(a) - Fraction(b))
    bound = math.ceil(delta / grid.step)
    assert abs(to_units(grid, a) - to_units(grid, b)) <= bound
    assert abs(to_units(grid, a) * grid.step - Fraction(a)) <= grid.step / 2


def test_unit_sensitivity_and_validation():
    assert unit_sensitivity(make_grid("0.5"), 3) == 6
    assert unit_sensitivity(make_grid("0.4"), 1) == 3
    with pytest.raises(InvalidOperatorConfig, match="grid step must be finite and > 0, got"):
        make_grid(0)
    with pytest.raises(InvalidOperatorConfig, match="sensitivity must be finite and > 0"):
        unit_sensitivity(make_grid(1), -1)
