"""Fixed-tau admission (Dong-Luo-Yi Alg. 3) agrees with the rank bands of the user-level
mechanisms (operators/user_level/counter.py) at every power of two."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import truncation


def test_partial_admission_of_a_straddling_item():
    spec = truncation.make_truncation(4)
    assert [truncation.admit(spec, u, w) for u, w in [(0, 3), (3, 4), (7, 2)]] == [3, 1, 0]


@given(st.integers(0, 5000), st.integers(1, 5000), st.integers(0, 14))
def test_bands_agree_with_admission_at_every_power_of_two(used, weight, i):
    bands = ul.band_units(used, weight)
    assert sum(units for _, units in bands) == weight
    at_tau = sum(units for band, units in bands if band <= i)
    assert at_tau == truncation.admit(truncation.make_truncation(1 << i), used, weight)
