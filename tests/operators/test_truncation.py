"""Fixed-tau admission and rank bands (spec 001 sections 2.3-2.7)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dpstream.operators import truncation


def test_rank_bands_are_powers_of_two():
    assert [truncation.rank_band(r) for r in range(1, 10)] == [0, 1, 2, 2, 3, 3, 3, 3, 4]


def test_example_f_sum_clipping_at_tau_4_and_8():
    """Spec 001 Ex. F: (a,3),(b,5),(a,4),(a,2) keep 3,4,1,0 at tau 4 and 3,5,4,1 at 8."""
    used: dict[str, int] = {}
    kept = {4: [], 8: []}
    for user, x in [("a", 3), ("b", 5), ("a", 4), ("a", 2)]:
        bands = truncation.rank_bands(used.get(user, 0), x)
        for tau, i in ((4, 2), (8, 3)):
            kept[tau].append(sum(units for band, units in bands if band <= i))
        used[user] = used.get(user, 0) + x
    assert kept == {4: [3, 4, 1, 0], 8: [3, 5, 4, 1]}
    assert used == {"a": 9, "b": 5}


@given(st.integers(0, 5000), st.integers(1, 5000), st.integers(0, 14))
def test_bands_agree_with_admission_at_every_power_of_two(used, weight, i):
    bands = truncation.rank_bands(used, weight)
    assert sum(units for _, units in bands) == weight
    at_tau = sum(units for band, units in bands if band <= i)
    assert at_tau == truncation.admit(truncation.make_truncation(1 << i), used, weight)


@given(st.integers(0, 5000), st.integers(1, 5000))
def test_crossings_are_the_thresholds_passed(used, weight):
    after = used + weight
    expected = [j for j in range(20) if used <= (1 << j) < after]
    assert truncation.crossings(used, weight) == expected
