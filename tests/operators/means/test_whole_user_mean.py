"""The whole-user mean (operators/means/whole_user_mean.py): exact with zero noise against an
event-at-a-time definition, a worked example by hand, the delta-method std, the
sensitivities under both relations, and (statistical) the released std against the
empirical spread."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.means import whole_user_mean as wum
from dpstream.operators.noise import (
    RecordingNoise,
    ZeroNoise,
    clip_to_grid,
    discrete_laplace_variance,
)
from dpstream.operators.trees import tree_counter
from tests.noise_doubles import MemoNoise, NodeNoise
from tests.operators.support import binomial_upper

Ticks = list[list[tuple[str, float]]]


def spec_of(m: int = 2, resolution: int = 4, epsilon: Fraction = Fraction(1), multiplier=1):
    return wum.make_whole_user_mean(epsilon, m, 0, 100, resolution, ("latency", 0), multiplier)


def leaves(spec, ticks: Ticks) -> list[tuple[int, int]]:
    """Stage 1's report (C_t, S_t) per tick: ``admit`` per event, a used count per user."""
    used: dict[str, int] = {}
    out = []
    for tick in ticks:
        c = s = 0
        for user, x in tick:
            kept, q = wum.admit(spec, used.get(user, 0), x)
            used[user] = used.get(user, 0) + 1
            c, s = c + kept, s + q
        out.append((c, s))
    return out


def run(spec, ticks: Ticks, noise) -> list[wum.WholeUserMeanRelease]:
    """Stage 1, then stage 2 tick by tick."""
    state, out = wum.init(spec), []
    for samples, units in leaves(spec, ticks):
        state, rel = wum.step(spec, state, samples, units, noise)
        out.append(rel)
    return out


def definition(spec, ticks: Ticks) -> list[tuple[int, int]]:
    """(C, S) after each tick, from scratch: the first m samples of each user in stream
    order, clipped and snapped, summed over everything seen so far."""
    seen = [event for tick in ticks for event in tick]
    out, start = [], 0
    for tick in ticks:
        start += len(tick)
        count: dict[str, int] = {}
        c = s = 0
        for user, x in seen[:start]:
            count[user] = count.get(user, 0) + 1
            if count[user] <= spec.max_samples:
                c += 1
                s += clip_to_grid(spec.lower, spec.upper, spec.resolution, x)[0]
        out.append((c, s))
    return out


def random_ticks(seed: int, ticks: int, users: int = 12) -> Ticks:
    rng = random.Random(seed)
    return [
        [(f"u{rng.randrange(users)}", rng.uniform(-20, 120)) for _ in range(rng.randrange(0, 9))]
        for _ in range(ticks)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_zero_noise_releases_the_exact_mean_of_the_kept_samples(seed):
    spec = spec_of(m=3, resolution=1000)
    ticks = random_ticks(seed, 40)
    for rel, (c, s) in zip(run(spec, ticks, ZeroNoise()), definition(spec, ticks), strict=True):
        assert rel.samples.value == c
        if c == 0:
            assert rel.value is None and rel.std is None
        else:  # the same rational, rounded once
            assert rel.value == float(Fraction(s, c) * 100 / 1000)


def test_worked_example_by_hand():
    # m = 2, R = 4 on [0, 100], epsilon 1: the count tree has sensitivity 2, the units
    # tree 2 * 4 = 8, each at epsilon 1/2; a period-0 node has scale 2 / (1/2) = 4 and
    # 8 / (1/2) = 16, a period-1 node twice that.
    spec = spec_of()
    assert (spec.samples.sensitivity, spec.units.sensitivity) == (2, 8)
    # Tick 1: u1 sends 40 (q = floor(1.6 + 0.5) = 2), 37.4 (q = floor(1.496 + 0.5) = 1)
    # and 90 (its third sample: dropped); u2 sends 250 (clipped to 100: q = 4).
    # C = 3, S = 7, mean 100 * 7 / (4 * 3). Tick 2: u1's 10 is dropped, u3's 0 is q = 0:
    # C = 4, S = 7, mean 100 * 7 / 16 = 43.75.
    ticks = [[("u1", 40.0), ("u1", 37.4), ("u1", 90.0), ("u2", 250.0)], [("u1", 10.0), ("u3", 0.0)]]
    noise = RecordingNoise(ZeroNoise())
    first, second = run(spec, ticks, noise)
    assert (first.samples.value, first.value) == (3, 100 * 7 / 12)
    assert (second.samples.value, second.value) == (4, 43.75)
    assert noise.calls == [
        (("latency", 0, "samples", 0, 0, 0), 4, 0),
        (("latency", 0, "units", 0, 0, 0), 16, 0),
        (("latency", 0, "samples", 0, 0, 0), 4, 0),
        (("latency", 0, "samples", 1, 0, 0), 8, 0),
        (("latency", 0, "units", 0, 0, 0), 16, 0),
        (("latency", 0, "units", 1, 0, 0), 32, 0),
    ]


# +1 on every count node, -2 on every units node.
CONSTANT_NOISE = NodeNoise(lambda node, scale: 1 if "samples" in node else -2)


def test_the_release_is_post_processing_of_the_two_noisy_totals():
    spec = spec_of()
    ticks = [[("u1", 40.0), ("u1", 37.4), ("u2", 250.0)]]
    (rel,) = run(spec, ticks, CONSTANT_NOISE)
    # C~ = 3 + 1, S~ = 7 - 2: the value is 100 * 5 / (4 * 4) = 31.25, never the exact 3.
    assert rel.samples.value == 4 and rel.value == 31.25
    var_c, var_s = discrete_laplace_variance(Fraction(4)), discrete_laplace_variance(Fraction(16))
    assert rel.samples.std == pytest.approx(math.sqrt(var_c), rel=1e-12)
    # Delta method: (100 / 4) sqrt(Var S~ + r^2 Var C~) / C~ with r = S~ / C~ = 5 / 4.
    expected = 25 * math.sqrt(var_s + (5 / 4) ** 2 * var_c) / 4
    assert rel.std == pytest.approx(min(expected, 50), rel=1e-12)


def test_a_noisy_count_below_one_releases_no_value():
    spec = spec_of()
    (rel,) = run(spec, [[]], ZeroNoise())
    assert rel.samples.value == 0 and rel.value is None and rel.std is None
    assert rel.interval == [0.0, 100.0]


def test_the_value_is_clamped_to_the_bounds_and_the_std_to_half_the_range():
    spec = spec_of()
    wild = NodeNoise(lambda node, scale: 0 if "samples" in node else 1000)  # S~ far above R C~
    (rel,) = run(spec, [[("u1", 50.0)]], wild)
    assert rel.value == 100.0 and rel.std <= 50.0
    assert 0.0 <= rel.interval[0] <= rel.interval[1] <= 100.0


def test_stage1_keeps_each_users_first_m_samples_clipped_and_snapped():
    spec = spec_of(m=2, resolution=4)
    assert [wum.admit(spec, used, 40.0) for used in range(4)] == [(1, 2), (1, 2), (0, 0), (0, 0)]
    assert wum.admit(spec, 0, -5.0) == (1, 0) and wum.admit(spec, 0, math.inf) == (1, 4)
    assert wum.admit(spec, 0, math.nan) == (1, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epsilon": 0}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"max_samples": 0}, "max_samples must be >= 1, got 0"),
        ({"max_samples": 1.5}, "max_samples must be an integer, got 1.5"),
        ({"resolution": 0}, "resolution must be >= 1, got 0"),
        ({"upper": 0}, "upper must be > lower (0), got Fraction(0, 1)"),
        ({"multiplier": 0}, "multiplier must be >= 1, got 0"),
    ],
)
def test_bad_parameters_are_named(change, message):
    args = {"epsilon": 1, "max_samples": 2, "lower": 0, "upper": 1, "resolution": 4}
    with pytest.raises(InvalidOperatorConfig) as info:
        wum.make_whole_user_mean(node_prefix=("x",), **{**args, "multiplier": 1, **change})
    assert str(info.value) == message


def test_state_round_trips_through_json():
    spec = spec_of()
    state = wum.init(spec)
    for samples, units in [(3, 7), (0, 0), (5, 11), (1, 4), (2, 2)]:
        state, _ = wum.step(spec, state, samples, units, ZeroNoise())
        assert state_codec.from_json(wum.WholeUserMeanState, state_codec.to_json(state)) == state
    assert tree_counter.exact_value(wum.tree_state(state, "samples")) == 11
    assert tree_counter.exact_value(wum.tree_state(state, "units")) == 24


def l1(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> tuple[int, int]:
    """Leaf-vector L1 distances of both trees; it bounds every level's (dyadic sums)."""
    pairs = list(zip(a, b, strict=True))
    return sum(abs(x[0] - y[0]) for x, y in pairs), sum(abs(x[1] - y[1]) for x, y in pairs)


EVENT = st.tuples(st.sampled_from(["u0", "u1", "u2"]), st.sampled_from([-5.0, 0.0, 50.0, 100.0]))


@settings(max_examples=80, deadline=None)
@given(ticks=st.lists(st.lists(EVENT, max_size=4), min_size=1, max_size=4))
def test_sensitivities_bound_every_neighbour(ticks):
    # Whole user: removing u0 moves the leaves by <= (m, m R); any subset of u0's events:
    # by <= (2m, 2m R), the spec's sensitivities with multiplier 2. Every subset is tried.
    m, r = 2, 4
    whole, subset = spec_of(m, r), spec_of(m, r, multiplier=2)
    assert (subset.samples.sensitivity, subset.units.sensitivity) == (2 * m, 2 * m * r)
    base = leaves(whole, ticks)
    users = {u for tick in ticks for u, _ in tick}
    assert sum(c for c, _ in base) <= m * len(users)  # the contribution bound holds
    mine = [(t, i) for t, tick in enumerate(ticks) for i, (u, _) in enumerate(tick) if u == "u0"]
    removed = [[e for e in tick if e[0] != "u0"] for tick in ticks]
    dc, ds = l1(base, leaves(whole, removed))
    assert dc <= whole.samples.sensitivity and ds <= whole.units.sensitivity
    assert sum(c for c, _ in base) - sum(c for c, _ in leaves(whole, removed)) <= m
    for k in range(len(mine) + 1):
        for drop in itertools.combinations(mine, k):
            kept = [[e for i, e in enumerate(tick) if (t, i) not in drop]
                    for t, tick in enumerate(ticks)]  # fmt: skip
            dc, ds = l1(base, leaves(whole, kept))
            assert dc <= subset.samples.sensitivity and ds <= subset.units.sensitivity


def test_the_any_subset_bound_is_attained():
    # u0 sends m values at the top in tick 1 and m more in tick 2; dropping the first m
    # promotes the last m into the kept samples, in another tick: 2m and 2mR.
    spec = spec_of(m=2, resolution=4)
    top = [("u0", 100.0), ("u0", 100.0)]
    base = leaves(spec, [top, top])
    assert l1(base, leaves(spec, [[], top])) == (2 * 2, 2 * 2 * 4)
    assert l1(base, leaves(spec, [[], []])) == (2, 2 * 4)  # the whole user: m and mR


@pytest.mark.statistical
def test_the_released_std_matches_the_empirical_spread():
    """Over n = 3000 keyed runs on one data set (10^4 kept samples at t = 3), the sample
    std of the released value matches the mean released (delta-method) std.

    The sample std of n draws has relative standard error about sqrt((2 + k) / n) / 2, k
    the excess kurtosis, estimated from the sample itself; the assertion allows 5 of them
    plus 1% for the delta method's first-order approximation (its neglected terms are of
    relative order (std C~ / C~)^2 < 1e-4 here). Coverage of the released interval (a
    guaranteed 95%) is checked with an exact binomial bound.
    """
    n = 3000
    spec = spec_of(m=8, resolution=1024)
    rng = random.Random(20261124)
    ticks = [[(f"u{i}", rng.gauss(40.0, 15.0)) for i in range(2500) for _ in range(2)]
             for _ in range(2)] + [[]]  # fmt: skip
    (c, s) = definition(spec, ticks)[-1]
    exact = float(Fraction(s, c) * 100 / 1024)
    values, stds, misses = [], [], 0
    report = leaves(spec, ticks)  # stage 1 does not depend on the noise
    for seed in range(n):
        state, noise = wum.init(spec), MemoNoise.seeded(seed)
        for samples, units in report:
            state, rel = wum.step(spec, state, samples, units, noise)
        values.append(rel.value)
        stds.append(rel.std)
        misses += not rel.interval[0] <= exact <= rel.interval[1]
    errors = np.array(values) - exact
    spread = float(np.std(errors, ddof=1))
    centred = errors - errors.mean()
    kurtosis = float(np.mean(centred**4) / np.mean(centred**2) ** 2 - 3)
    rel_se = math.sqrt((2 + kurtosis) / n) / 2
    assert spread == pytest.approx(float(np.mean(stds)), rel=5 * rel_se + 0.01)
    assert abs(float(errors.mean())) < 5 * spread / math.sqrt(n)  # unbiased to first order
    assert misses <= binomial_upper(n, 0.05)
