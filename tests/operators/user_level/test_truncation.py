"""Fixed-tau admission (Dong-Luo-Yi Alg. 3) agrees with the rank bands of the user-level
mechanisms (operators/user_level/counter.py) at every power of two."""

from __future__ import annotations

import numpy as np
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


@given(st.integers(-(1 << 63), 1 << 62), st.integers(-(1 << 20), 1 << 20), st.integers(1, 64))
def test_no_used_or_weight_lets_a_user_keep_more_than_tau(used, weight, tau):
    """A negative ``used`` (a corrupted total: -2^63 once, from an out-of-range sum value)
    admitted a user's next 500 units under tau 10; it counts as 0 now."""
    spec = truncation.make_truncation(tau)
    kept = truncation.admit(spec, used, weight)
    many = truncation.admit_many(spec, np.array([used]), np.array([weight]))
    assert 0 <= kept <= tau and int(many[0]) == kept
    assert kept == truncation.admit(spec, max(used, 0), max(weight, 0))


def test_a_negative_total_is_admitted_as_a_new_user():
    spec = truncation.make_truncation(10)
    assert truncation.admit(spec, -(1 << 63), 500) == 10
    assert truncation.admit(spec, 3, -5) == 0
