"""AboveThreshold and the continual contribution tracker: Dong-Luo-Yi Alg. 1, Alg. 4, App. C-A,
worked examples A and B, the tracker's monotone powers of two, statistical checks."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    KeyedNoise,
    NodeId,
    RecordingNoise,
    ZeroNoise,
    discrete_laplace_variance,
)
from dpstream.operators.user_level import svt
from tests.noise_doubles import MemoNoise, NodeNoise
from tests.operators.support import binomial_upper

# ---------------------------------------------------------------------------------------
# Test helpers


def scripted_noise(values: dict[tuple[int, str], int]) -> NodeNoise:
    """Fixed values per node kind: {(node[2], "eta" | "q"): z} ("eta" when the node's last
    field is "eta"), default 0."""

    def value(node: NodeId, scale: Fraction) -> int:
        return values.get((node[2], "eta" if node[-1] == "eta" else "q"), 0)

    return NodeNoise(value)


def dlap_tail(x: int, scale: Fraction) -> float:
    """P(Z > x) for Z discrete Laplace of scale b (x an integer)."""
    p = math.exp(-1 / float(scale))
    if x >= 0:
        return p ** (x + 1) / (1 + p)
    return 1 - p ** (-x) / (1 + p)


def dlap_pmf(z: int, scale: Fraction) -> float:
    p = math.exp(-1 / float(scale))
    return (1 - p) / (1 + p) * p ** abs(z)


def fire_probability(count: int, discount: float, eps: Fraction) -> float:
    """Exact P(count + Z_q - Z_eta > discount), Z_q at 4/eps, Z_eta at 2/eps."""
    eta_scale, q_scale = 2 / eps, 4 / eps
    width = int(60 * eta_scale) + 10
    total = 0.0
    for z in range(-width, width + 1):
        # Z_q > discount - count + z  <=>  Z_q > floor(discount - count + z)
        total += dlap_pmf(z, eta_scale) * dlap_tail(math.floor(discount - count + z), q_scale)
    return total


def tracker(**kwargs) -> svt.ContributionTrackerSpec:
    """Ex A/B's tracker: epsilon = 2, beta = 0.1 overall, so the tracker gets 1 and 0.05."""
    params = {"name": "k", "epsilon": 1, "beta": Fraction(1, 20), "theta": 1} | kwargs
    return svt.make_contribution_tracker(**params)


# ---------------------------------------------------------------------------------------
# LOG and the comparison


def test_log_is_max_one_log2():
    assert svt.LOG(1) == 1 and svt.LOG(0.5) == 1 and svt.LOG(2) == 1
    assert svt.LOG(8) == 3
    assert svt.LOG(Fraction(160)) == pytest.approx(7.321928, abs=1e-6)
    assert svt.LOG(Fraction(2**2000, 3)) == pytest.approx(2000 - math.log2(3))  # no overflow
    assert svt.LOG(3) > math.log(3)  # log2, not ln (footnote 3)


def test_fires_is_strict_and_exact_for_large_integers():
    assert svt.fires(208, 207.7262742772967, 0, 0)
    assert not svt.fires(207, 207.7262742772967, 0, 0)
    assert not svt.fires(5, 5, 0, 0)  # strict '>'
    assert svt.fires(5, 5, 1, 0) and not svt.fires(5, 5, 1, 1)
    # int/float comparison is exact: 2^60 + 1 > 2^60 even though float(2^60 + 1) == 2^60.
    big = 2**60
    assert float(big + 1) == float(big)
    assert svt.fires(big + 1, float(big), 0, 0)
    assert not svt.fires(big, float(big), 0, 0)


# ---------------------------------------------------------------------------------------
# AboveThreshold (Alg. 1)


def test_above_threshold_scales_nodes_and_single_stop():
    spec = svt.make_above_threshold(Fraction(1, 2), ("a", 7), threshold=10)
    rec = RecordingNoise(ZeroNoise())
    state = svt.above_threshold_init(spec)
    state, stopped = svt.above_threshold_step(spec, state, 10, 1, rec)
    assert not stopped and state == svt.AboveThresholdState(queries=1, stopped_at=0)
    assert rec.calls == [(("a", 7, "eta"), Fraction(4), 0), (("a", 7, "q", 1), Fraction(8), 0)]
    state, stopped = svt.above_threshold_step(spec, state, 11, 2, rec)
    assert stopped and state.stopped_at == 2
    calls = len(rec.calls)
    state2, stopped = svt.above_threshold_step(spec, state, 0, 3, rec)
    assert stopped and state2 == state and len(rec.calls) == calls  # no draws after the stop


def test_above_threshold_compares_with_noisy_threshold():
    spec = svt.make_above_threshold(1, ("a",), threshold=0)
    fixed = NodeNoise(lambda node, scale: 3 if node[-1] == "eta" else -2)

    # count - discount + Z_q > eta + Z_eta  <=>  count - 1.5 - 2 > 3
    assert not svt.above_threshold_step(spec, svt.AboveThresholdState(), 6, 1, fixed, 1.5)[1]
    assert svt.above_threshold_step(spec, svt.AboveThresholdState(), 7, 1, fixed, 1.5)[1]


def test_above_threshold_rejects_bad_parameters():
    with pytest.raises(InvalidOperatorConfig, match="epsilon must be finite and > 0"):
        svt.make_above_threshold(0, ("a",))
    with pytest.raises(InvalidOperatorConfig, match="node fields must be str or int"):
        svt.make_above_threshold(1, ("a", 1.5))


# ---------------------------------------------------------------------------------------
# Example A: budgets


def test_example_a_tracker_series():
    spec = tracker()
    assert [svt.epsilon_i(spec, i) for i in (1, 2, 3, 4)] == [
        Fraction(1, 4),
        Fraction(1, 9),
        Fraction(1, 16),
        Fraction(1, 25),
    ]
    assert [svt.beta_i(spec, i) for i in (1, 2, 3, 4)] == [
        Fraction(1, 80),
        Fraction(1, 180),
        Fraction(1, 320),
        Fraction(1, 500),
    ]
    assert [float(svt.beta_i(spec, i)) for i in (1, 2, 3, 4)] == pytest.approx(
        [0.0125, 0.0055556, 0.003125, 0.002], abs=1e-7
    )
    assert [svt.tau_i(spec, i) for i in (1, 2, 3, 4)] == [2, 4, 8, 16]
    # sum_i 1/(i+1)^2 = pi^2/6 - 1 = 0.644934: the partial sums approach it from below
    # with tail sum_{n > N+1} 1/n^2 < 1/(N+1).
    n = 2000
    partial = svt.series_spent(Fraction(1), Fraction(1), n, False)
    limit = math.pi**2 / 6 - 1
    assert limit == pytest.approx(0.644934, abs=1e-6)
    assert limit - 1 / (n + 1) < float(partial) < limit < 1


def test_example_a_practical_series():
    spec = tracker(practical=True)
    assert [svt.epsilon_i(spec, i) for i in (1, 2, 3, 4)] == [
        Fraction(3, 16),
        Fraction(3, 25),
        Fraction(1, 12),
        Fraction(3, 49),
    ]
    assert [svt.tau_i(spec, i) for i in (1, 2, 3, 4)] == [64, 128, 256, 512]
    assert svt.tau_start(spec) == 64 and svt.tau_exponent(spec, 1) == 6
    assert [svt.beta_i(spec, i) for i in (1, 2)] == [Fraction(1, 80), Fraction(1, 180)]
    # sum_{i>=1} 3/(i+3)^2 = 3 (pi^2/6 - 1 - 1/4 - 1/9) = 0.8514689. Our notes print
    # 0.851466, which is the partial sum over i <= 10^6 (tail 3/(10^6+4)); both are < 1.
    limit = 3 * (math.pi**2 / 6 - 1 - 1 / 4 - 1 / 9)
    assert limit == pytest.approx(0.8514689, abs=1e-7)
    partial = math.fsum(3 / (i + 3) ** 2 for i in range(1, 10**6 + 1))
    assert partial == pytest.approx(0.851466, abs=5e-7)
    # The module's exact terms are these 3/(i+3)^2, and their exact sums stay below 1.
    assert all(svt.epsilon_i(spec, i) == Fraction(3, (i + 3) ** 2) for i in range(1, 300))
    assert float(svt.series_spent(Fraction(1), Fraction(1), 300, True)) < limit < 1


@pytest.mark.parametrize("theta", [Fraction(1, 2), Fraction(3, 2), Fraction(1, 3), Fraction(7)])
@pytest.mark.parametrize("practical", [False, True])
def test_series_rounds_down_and_sums_below_total(theta, practical):
    total = Fraction(3, 7)
    shift = 3 if practical else 1
    p, q = theta.numerator, theta.denominator
    spent = Fraction(0)
    for i in range(1, 400):
        eps = svt.series_epsilon(total, theta, i, practical)
        # eps <= total theta shift^theta / (i+shift)^(1+theta), checked exactly in q-th powers
        lhs = eps**q * (i + shift) ** (p + q)
        rhs = (total * theta) ** q * shift**p
        assert eps > 0 and lhs <= rhs
        # ... and within 2^-40 of it (48 significant bits)
        real = float(total * theta) * shift ** float(theta) / (i + shift) ** (1 + float(theta))
        assert float(eps) == pytest.approx(real, rel=2**-40)
        spent += eps
    assert spent == svt.series_spent(total, theta, 399, practical)
    assert spent < total
    if q == 1:  # exact for an integer theta
        assert svt.series_epsilon(total, theta, 5, practical) == (
            total * theta * shift**p / Fraction(5 + shift) ** (p + 1)
        )


def test_series_is_exact_when_the_root_is_rational():
    # theta = 1/2, i + 1 = 4: 4^(3/2) = 8 exactly.
    assert svt.series_epsilon(Fraction(1), Fraction(1, 2), 3, False) == Fraction(1, 16)


def test_beta_series_sums_below_beta():
    total = Fraction(1, 20)
    assert svt.beta_spent(total, 500) < total * Fraction(645, 1000) < total
    assert svt.beta_spent(total, 0) == 0


def test_spent_epsilon_counts_the_started_svts():
    spec = tracker()
    assert svt.spent_epsilon(spec, svt.tracker_init(spec)) == 0
    state = svt.ContributionTrackerState(t=5, svt_index=3)
    assert svt.spent_epsilon(spec, state) == Fraction(1, 4) + Fraction(1, 9) + Fraction(1, 16)
    assert svt.spent_beta(spec, state) == Fraction(1, 80) + Fraction(1, 180) + Fraction(1, 320)
    # after very many restarts the exact sum stays below the tracker's budget
    assert svt.spent_epsilon(spec, svt.ContributionTrackerState(t=9, svt_index=3000)) < 1


# ---------------------------------------------------------------------------------------
# Example B: discounts


def test_example_b_discounts():
    spec = tracker()
    assert svt.LOG(2 / svt.beta_i(spec, 1)) == pytest.approx(7.321928, abs=1e-6)
    for t, expected in [(1, 207.7263), (2, 226.4451), (100, 388.7890), (1023, 495.7263)]:
        assert svt.discount(spec, 1, t) == pytest.approx(expected, abs=1e-4)
    assert svt.guaranteed_stop_level(spec, 1, 1) == pytest.approx(415.4525, abs=1e-4)
    assert svt.guaranteed_stop_level(spec, 1, 1023) == pytest.approx(991.4525, abs=1e-4)
    assert svt.discount(spec, 2, 1) == pytest.approx(530.5601, abs=1e-4)


def test_zero_noise_tracker_fires_exactly_above_the_discount():
    spec = tracker()
    # Count(D_1, 2) = G[1]; disc(1) = 207.73
    _, tau = svt.tracker_step(spec, svt.tracker_init(spec), 1, (0, 207), ZeroNoise())
    assert tau == 2
    state, tau = svt.tracker_step(spec, svt.tracker_init(spec), 1, (0, 208), ZeroNoise())
    assert tau == 4 and state == svt.ContributionTrackerState(t=1, svt_index=2)
    # the CURRENT SVT's discount: SVT 2 at t = 2 needs G[2] > disc_2(2) (not disc_1)
    d2 = svt.discount(spec, 2, 2)
    assert d2 > 500
    _, tau = svt.tracker_step(spec, state, 2, (0, 10**6, math.floor(d2)), ZeroNoise())
    assert tau == 4
    _, tau = svt.tracker_step(spec, state, 2, (0, 10**6, math.floor(d2) + 1), ZeroNoise())
    assert tau == 8


def test_while_loop_doubles_several_times_and_requeries_the_same_t():
    spec = tracker()
    rec = RecordingNoise(ZeroNoise())
    g = (0, 10**6, 10**6, 10**6)  # SVTs 1, 2, 3 fire; SVT 4 reads G[4] = 0
    state, tau = svt.tracker_step(spec, svt.tracker_init(spec), 1, g, rec)
    assert tau == 16 and state.svt_index == 4
    nodes = [node for node, _, _ in rec.calls]
    assert nodes == [
        ("k", "svt", 1, "eta"),
        ("k", "svt", 1, "q", 1),
        ("k", "svt", 2, "eta"),  # a fresh threshold for every new SVT
        ("k", "svt", 2, "q", 1),  # re-query the SAME t with fresh noise
        ("k", "svt", 3, "eta"),
        ("k", "svt", 3, "q", 1),
        ("k", "svt", 4, "eta"),
        ("k", "svt", 4, "q", 1),
    ]
    for node, scale, _ in rec.calls:
        eps = svt.epsilon_i(spec, node[2])
        assert scale == (2 / eps if node[-1] == "eta" else 4 / eps)


def test_tracker_threshold_is_rederived_not_redrawn():
    """The same threshold node at every step of one SVT (keyed noise: the same value)."""
    spec = tracker()
    rec = RecordingNoise(KeyedNoise(bytes(range(16))))
    state = svt.tracker_init(spec)
    for t in range(1, 6):
        state, _ = svt.tracker_step(spec, state, t, (), rec)
    etas = [(node, scale, value) for node, scale, value in rec.calls if node[-1] == "eta"]
    assert len(etas) == 5 and len(set(etas)) == 1
    queries = [node for node, _, _ in rec.calls if node[-1] != "eta"]
    assert queries == [("k", "svt", 1, "q", t) for t in range(1, 6)]


def test_scripted_noise_decides_with_both_noises():
    spec = tracker()
    d = svt.discount(spec, 1, 1)
    count = math.floor(d) - 5
    # count + Z_q - Z_eta > d: Z_q = 10, Z_eta = 4 gives count + 6 > d (fires) ...
    noise = scripted_noise({(1, "q"): 10, (1, "eta"): 4, (2, "eta"): 10**9})
    assert svt.tracker_step(spec, svt.tracker_init(spec), 1, (0, count), noise)[1] == 4
    # ... Z_eta = 6 gives count + 4 <= d (does not)
    noise = scripted_noise({(1, "q"): 10, (1, "eta"): 6})
    assert svt.tracker_step(spec, svt.tracker_init(spec), 1, (0, count), noise)[1] == 2


def test_practical_mode_reads_count_at_64():
    spec = tracker(practical=True)
    d = svt.discount(spec, 1, 1)
    g = [0] * 7
    g[5] = 10**6  # Count(D, 32) is irrelevant in practical mode
    assert svt.tracker_step(spec, svt.tracker_init(spec), 1, g, ZeroNoise())[1] == 64
    g[6] = math.floor(d) + 1
    assert svt.tracker_step(spec, svt.tracker_init(spec), 1, g, ZeroNoise())[1] == 128


def test_tracker_requires_consecutive_steps():
    spec = tracker()
    with pytest.raises(InvalidOperatorConfig, match="t must be the next step 1, got 2"):
        svt.tracker_step(spec, svt.tracker_init(spec), 2, (), ZeroNoise())


def test_forced_schedule_draws_no_noise():
    spec = tracker(forced_schedule=[(3, 4), (5, 16), (9, 16), (10, 64)])
    rec = RecordingNoise(ZeroNoise())
    state, taus, indices = svt.tracker_init(spec), [], []
    for t in range(1, 12):
        state, tau = svt.tracker_step(spec, state, t, (0, 10**9, 10**9), rec)
        taus.append(tau)
        indices.append(state.svt_index)
    assert taus == [2, 2, 4, 4, 16, 16, 16, 16, 16, 64, 64]
    assert indices == [1, 1, 2, 2, 4, 4, 4, 4, 4, 6, 6]
    assert rec.calls == []
    practical = tracker(practical=True, forced_schedule=[(2, 256)])
    state, _ = svt.tracker_step(practical, svt.tracker_init(practical), 1, (), rec)
    state, tau = svt.tracker_step(practical, state, 2, (), rec)
    assert tau == 256 and state.svt_index == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"beta": 1}, "beta must be in (0, 1), got Fraction(1, 1)"),
        ({"theta": -1}, "theta must be finite and > 0, got Fraction(-1, 1)"),
        ({"theta": Fraction(1, 1001)}, "theta must be a rational with denominator <= 1000"),
        ({"name": 3}, "name must be a str, got 3"),
        ({"practical": 1}, "practical must be a bool, got 1"),
        ({"forced_schedule": [(1, 3)]}, "forced_schedule tau must be a power of two, got 3"),
        ({"forced_schedule": [(1, 1)]}, "forced_schedule tau must be >= 2, got 1"),
        ({"forced_schedule": [(2, 8), (4, 4)]}, "forced_schedule tau must be >= 8, got 4"),
        ({"forced_schedule": [(2, 8), (2, 16)]}, "forced_schedule step must be >= 3, got 2"),
        ({"forced_schedule": [(0, 8)]}, "forced_schedule step must be >= 1, got 0"),
        (
            {"practical": True, "forced_schedule": [(1, 32)]},
            "forced_schedule tau must be >= 64, got 32",
        ),
    ],
)
def test_make_tracker_rejects_bad_parameters(kwargs, message):
    with pytest.raises(InvalidOperatorConfig) as info:
        tracker(**kwargs)
    assert str(info.value).startswith(message)


def test_svt_index_of_rejects_non_series_tau():
    with pytest.raises(InvalidOperatorConfig, match="tau must be a power of two >= 64, got 32"):
        svt.svt_index_of(tracker(practical=True), 32)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 3000), max_size=6),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 2**31),
    st.booleans(),
)
def test_oracle_2_tau_is_a_monotone_power_of_two(g_steps, seed, practical):
    """Oracle 2 for the tracker: tau_t non-decreasing, a power of two, >= tau_1, and equal
    to tau_i of the running SVT, on arbitrary (even non-monotone) G sequences."""
    spec = tracker(practical=practical, epsilon=50)  # a large budget makes restarts common
    noise = MemoNoise.seeded(seed)
    state, previous = svt.tracker_init(spec), svt.tau_start(spec)
    for t, g in enumerate(g_steps, 1):
        state, tau = svt.tracker_step(spec, state, t, g, noise)
        assert tau & (tau - 1) == 0 and tau >= previous >= svt.tau_start(spec)
        assert tau == svt.tau_i(spec, state.svt_index)
        previous = tau


def test_memo_noise_matches_the_discrete_laplace_variance():
    """The fast test source used by the statistical tests has the right distribution:
    n = 40000 draws; the sample variance's relative standard error is about
    sqrt((2 + excess kurtosis ~ 3) / n) = 1.1%; allow 5 of them."""
    noise = MemoNoise.seeded(7)
    for scale in (Fraction(8), Fraction(16), Fraction(1, 2)):
        draws = np.array([noise.discrete_laplace(("v", i), scale) for i in range(40000)])
        assert float(np.var(draws)) == pytest.approx(discrete_laplace_variance(scale), rel=0.056)
        assert abs(float(np.mean(draws))) < 5 * math.sqrt(discrete_laplace_variance(scale) / 40000)
    assert noise.discrete_laplace(("v", 3), Fraction(8)) == noise.discrete_laplace(
        ("v", 3), Fraction(8)
    )


# ---------------------------------------------------------------------------------------
# Statistical checks


def union_bound_all_dummy(spec: svt.ContributionTrackerSpec, horizon: int) -> float:
    """sum_t P(Z_q - Z_eta > disc_1(t)): a union bound on SVT 1 ever firing on a stream
    whose counts are all 0, computed exactly from the discrete Laplace pmfs."""
    eps = svt.epsilon_i(spec, 1)
    return math.fsum(
        fire_probability(0, svt.discount(spec, 1, t), eps) for t in range(1, horizon + 1)
    )


@pytest.mark.statistical
def test_s1_all_dummy_stream_keeps_tau_at_its_start():
    """S1: all-dummy stream, epsilon = 2, beta = 0.1 (tracker: 1, 0.05), 10^4 steps.

    Scaled down from 2000 runs to n = 500 (each run is 10^4 tracker steps, ~4 us each on
    an idle core). The fraction of runs in which tau leaves 2 must be <= beta_1 = 0.0125
    (Lemma III.2's all-dummy claim): with a miss probability <= beta_1, the count of such
    runs exceeds binomial_upper(n, beta_1) = 21 with probability <= 1e-6. The union bound
    over t of the exact per-step firing probability is ~3e-6 per run, so the count is
    almost surely 0 and binomial_upper(n, union bound) = 1. That second assertion is what
    catches a discount that lost its LOG(t+1) growth (then ~1.6% of runs fire: ~8 of 500,
    and P(<= 1 of them) ~ 0.003).
    """
    n, horizon = 500, 10**4
    spec = tracker()
    beta_1 = float(svt.beta_i(spec, 1))
    # The terms fall like (t+1)^(-32/(16 ln 2)) = (t+1)^(-2.89): those beyond t = 2000 add
    # far less than 1% of the sum.
    union = union_bound_all_dummy(spec, 2000) * 1.01
    assert union < 1e-5
    left = 0
    for run in range(n):
        noise = MemoNoise.seeded(1_000_003 * run + 17)
        state = svt.tracker_init(spec)
        for t in range(1, horizon + 1):
            state, tau = svt.tracker_step(spec, state, t, (), noise)
            if tau != 2:
                left += 1
                break
    assert left <= binomial_upper(n, beta_1)
    assert left <= binomial_upper(n, union)


@pytest.mark.statistical
@pytest.mark.parametrize("svt_index", [1, 2])
def test_s4_svt_fires_once_the_count_reaches_the_guaranteed_level(svt_index):
    """S4: once Count(D_t, tau_i) >= (12/eps_i) LOG(2/beta_i) + (16/eps_i) LOG(t+1), SVT i
    has fired by t in >= 1 - beta_i of the runs.

    Stream: for i = 2, SVT 1 is pushed out at t = 1 (G[1] huge). G[i] is 0 until t0 = 40
    and then ceil(guaranteed level at t0). n = 2000 runs; misses (SVT i still running at
    t0) have probability <= beta_i, so their count exceeds binomial_upper(n, beta_i) with
    probability <= 1e-6. At the guaranteed level the exact miss probability is ~1e-7, so
    a discount twice too large (miss ~50%) fails by far.
    """
    n, t0 = 2000, 40
    spec = tracker()
    beta = float(svt.beta_i(spec, svt_index))
    level = math.ceil(svt.guaranteed_stop_level(spec, svt_index, t0))
    misses = 0
    for run in range(n):
        noise = MemoNoise.seeded(7_919 * run + svt_index)
        state = svt.tracker_init(spec)
        for t in range(1, t0 + 1):
            g = [0] * (svt_index + 1)
            if svt_index == 2:
                g[1] = 10**7
            if t == t0:
                g[svt_index] = level
            state, _ = svt.tracker_step(spec, state, t, g, noise)
        misses += state.svt_index <= svt_index
    assert misses <= binomial_upper(n, beta)


@pytest.mark.statistical
@pytest.mark.parametrize("offset", [-40, -10, 0, 10, 40])
def test_firing_probability_matches_the_exact_discrete_laplace_calculation(offset):
    """The first query of SVT 1 fires with probability P(count + Z_q - Z_eta > disc_1(1)),
    computed exactly from the pmfs (Z_q at 4/eps_1 = 16, Z_eta at 2/eps_1 = 8).

    n = 20000 runs (each its own tracker name, hence its own nodes, in one keyed-style
    source): the empirical rate has standard error sqrt(p(1-p)/n) <= 0.0036; allow 5 of
    them (plus 1e-9 for p near 0 or 1). Near the middle the rate moves by ~0.021 per unit
    of discount, so a discount off by one unit (0.5%) fails; this pins the discount, the
    LOG convention and the noise scales together.
    """
    n = 20000
    d = svt.discount(tracker(), 1, 1)
    count = round(d) + offset
    p = fire_probability(count, d, svt.epsilon_i(tracker(), 1))
    noise = MemoNoise.seeded(1000 + offset)
    fired = 0
    for run in range(n):
        spec = tracker(name=f"k{run}")
        _, tau = svt.tracker_step(spec, svt.tracker_init(spec), 1, (0, count), noise)
        fired += tau > 2
    assert fired / n == pytest.approx(p, abs=5 * math.sqrt(p * (1 - p) / n) + 1e-9)


def test_telescoping_series_growth_start_and_discount_scale():
    """The tuning parameters of the tracker: the telescoping series total / (i (i+1)) and its
    exact sums total n / (n+1); tau_1 = 2^start_exponent growing by 2^growth; the discount
    scaled by discount_scale (a public threshold: each SVT stays epsilon_i-DP)."""
    total = Fraction(1, 4)
    assert [svt.telescoping_epsilon(total, i) for i in (1, 2, 3)] == [
        Fraction(1, 8),
        Fraction(1, 24),
        Fraction(1, 48),
    ]
    for n in range(50):
        assert (
            svt.telescoping_spent(total, n)
            == total * n / (n + 1)
            == sum((svt.telescoping_epsilon(total, i) for i in range(1, n + 1)), Fraction(0))
        )
    spec = svt.make_contribution_tracker(
        "g", total, Fraction(1, 20), series="telescoping", start_exponent=8, growth=2
    )
    assert [svt.tau_i(spec, i) for i in (1, 2, 3)] == [256, 1024, 4096]
    assert svt.svt_index_of(spec, 4096) == 3
    with pytest.raises(InvalidOperatorConfig, match="a power of two >= 256, 2\\^2 times"):
        svt.svt_index_of(spec, 512)
    assert svt.epsilon_i(spec, 2) == Fraction(1, 24)
    half = svt.make_contribution_tracker(
        "g", total, Fraction(1, 20), series="telescoping", discount_scale=Fraction(1, 2)
    )
    plain = svt.make_contribution_tracker("g", total, Fraction(1, 20), series="telescoping")
    for i, t in ((1, 1), (2, 100), (5, 10_000)):
        assert svt.discount(half, i, t) == pytest.approx(svt.discount(plain, i, t) / 2, rel=1e-15)
    state = svt.tracker_init(spec)
    state, tau = svt.tracker_step(spec, state, 1, [], ZeroNoise())
    assert tau == 256 and svt.spent_epsilon(spec, state) == Fraction(1, 8)
