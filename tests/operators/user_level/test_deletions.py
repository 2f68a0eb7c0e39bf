"""Insert/delete streams: Dong-Luo-Yi Sec. VI. The release is the
difference of two user-level mechanisms with epsilon/2 and beta/2 each."""

from __future__ import annotations

import math
from fractions import Fraction

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, ZeroNoise
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import deletions as dl

KEY = bytes(range(32))

Event = tuple[str, int, int, bool]  # (user, bin, units, is_deletion)


def run(spec: dl.DeletionsSpec, ticks: list[list[Event]], noise):
    """Reference stage 1 on each side (ranks among that side's items only)."""
    state, ins_totals, del_totals = dl.init(spec), {}, {}
    states, releases = [], []
    bins = spec.inserts.bins
    for items in ticks:
        ins_items = [(u, r, w) for u, r, w, d in items if not d]
        del_items = [(u, r, w) for u, r, w, d in items if d]
        ins_bands, ins_cross, ins_totals = ul.split_tick(ins_totals, ins_items, bins)
        del_bands, del_cross, del_totals = ul.split_tick(del_totals, del_items, bins)
        state, rel = dl.step(spec, state, ins_bands, ins_cross, del_bands, del_cross, noise)
        states.append(state)
        releases.append(rel)
    return states, releases


def run_side(spec: ul.UserLevelSpec, ticks: list[list[Event]], deletion: bool, noise):
    state, totals, releases = ul.init(spec), {}, []
    for items in ticks:
        side = [(u, r, w) for u, r, w, d in items if d == deletion]
        bands, crossings, totals = ul.split_tick(totals, side, spec.bins)
        state, rel = ul.step(spec, state, bands, crossings, noise)
        releases.append(rel)
    return releases


events = st.lists(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.integers(1, 3), st.booleans()),
        max_size=5,
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(events, st.sampled_from(["count", "sum", "histogram"]))
def test_release_is_the_difference_of_the_two_sides(ticks, statistic):
    """F~ = F~_ins - F~_del bin by bin, where each side is exactly the user-level mechanism
    (epsilon/2, beta/2) on its own stream, with the same keyed noise."""
    bins = 3 if statistic == "histogram" else 1
    if statistic != "sum":
        ticks = [[(u, r if bins > 1 else 0, 1, d) for u, r, _, d in items] for items in ticks]
    else:
        ticks = [[(u, 0, w, d) for u, _, w, d in items] for items in ticks]
    spec = dl.make_deletions("x", statistic, 2, Fraction(1, 10), bins=bins)
    assert spec.inserts.epsilon == 1 and spec.deletes.epsilon == 1
    assert spec.inserts.beta == Fraction(1, 20) == spec.deletes.beta
    noise = KeyedNoise(KEY)
    _, releases = run(spec, ticks, noise)
    ins = run_side(spec.inserts, ticks, False, noise)
    dele = run_side(spec.deletes, ticks, True, noise)
    for rel, a, d in zip(releases, ins, dele, strict=True):
        assert rel.values == tuple(x - y for x, y in zip(a.values, d.values, strict=True))
        assert rel.bins[0].std == pytest.approx(math.hypot(a.bins[0].std, d.bins[0].std))
        assert rel.bins[0].ci95 >= max(a.bins[0].ci95, d.bins[0].ci95)


@settings(max_examples=30, deadline=None)
@given(events)
def test_noise_free_release_is_the_truncated_difference(ticks):
    """With noise 0 and tau~ >= every user's count on each side, the release is the exact
    (inserted - deleted) count per bin; in general it is F(Truncate(D_ins)) -
    F(Truncate(D_del)) (``exact_values``)."""
    ticks = [[(u, r, 1, d) for u, r, _, d in items] for items in ticks]
    spec = dl.make_deletions(
        "x", "histogram", 1, Fraction(1, 10), bins=3, forced_schedule=((1, 128),)
    )
    states, releases = run(spec, ticks, ZeroNoise())
    net = [0, 0, 0]
    for items, state, rel in zip(ticks, states, releases, strict=True):
        for _, r, _, d in items:
            net[r] += -1 if d else 1
        assert rel.values == tuple(net) == dl.exact_values(spec, state)


def test_truncation_is_per_side():
    """A user's deletions are ranked among their deletions: with tau~ = 2, a user who
    inserts 3 and deletes 3 items keeps 2 of each, so the noise-free release is 0."""
    spec = dl.make_deletions("x", "count", 1, Fraction(1, 10), forced_schedule=((1, 2),))
    ticks = [[("a", 0, 1, False)] * 3, [("a", 0, 1, True)] * 3]
    states, releases = run(spec, ticks, ZeroNoise())
    assert [r.value for r in releases] == [2, 0]
    assert states[-1].ins_crossings == (1, 1) == states[-1].del_crossings


def test_distinct_count_is_rejected_with_a_clear_error():
    with pytest.raises(InvalidOperatorConfig) as info:
        dl.make_deletions("x", "distinct_count", 1, Fraction(1, 10))
    text = str(info.value)
    assert "statistic must be one of ('count', 'sum', 'histogram')" in text
    assert "not supported" in text and "Sec. VI" in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"statistic": "mean"}, "statistic must be one of ('count', 'sum', 'histogram'), got"),
        ({"bins": 3}, "bins must be 1 for count, got 3"),
        ({"epsilon": -1}, "epsilon must be finite and > 0, got"),
        ({"beta": 0}, "beta must be in (0, 1), got"),
        ({"any_subset": "yes"}, "any_subset must be a bool, got 'yes'"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    args = {"name": "x", "statistic": "count", "epsilon": 1, "beta": Fraction(1, 10)} | kwargs
    with pytest.raises(InvalidOperatorConfig) as info:
        dl.make_deletions(**args)
    assert message in str(info.value)


def test_budget_and_state_round_trip():
    spec = dl.make_deletions("x", "sum", 2, Fraction(1, 10), any_subset=True)
    assert spec.inserts.multiplier == 2 == spec.deletes.multiplier
    ticks = [[("a", 0, 3, False), ("b", 0, 2, True)], [], [("a", 0, 9, True)]]
    states, _ = run(spec, ticks, KeyedNoise(KEY))
    assert dl.spent_epsilon(spec, states[-1]) < 2
    data = orjson.loads(orjson.dumps(state_codec.to_json(states[-1])))
    restored = state_codec.from_json(dl.DeletionsState, data)
    assert restored == states[-1]
    _, a = dl.step(spec, states[-1], ((1,),), (), (), (), KeyedNoise(KEY))
    _, b = dl.step(spec, restored, ((1,),), (), (), (), KeyedNoise(KEY))
    assert a == b
