"""User-level k-selection: Dong-Luo-Yi Alg. 6, a worked example (Example G), the noise-free check,
the one-way rank error, eq. (3), and a seeded check that the error is one-way."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, ZeroNoise, chernoff_interval
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import k_selection as ks
from tests.noise_doubles import MemoNoise
from tests.operators.support import binomial_upper

KEY = bytes(range(32))

Item = tuple[str, int]  # (user, value in [1, domain])


def run(spec: ks.KSelectionSpec, ticks: list[list[Item]], noise) -> tuple[list, list]:
    state, totals, states, releases = ks.init(spec), {}, [], []
    for items in ticks:
        bands, crossings, totals = ul.split_tick(
            totals, [(u, x - 1, 1) for u, x in items], spec.domain
        )
        state, rel = ks.step(spec, state, bands, crossings, noise)
        states.append(state)
        releases.append(rel)
    return states, releases


def counts_of(items: list[Item], domain: int) -> list[int]:
    counts = [0] * domain
    for _, x in items:
        counts[x - 1] += 1
    return counts


# ---------------------------------------------------------------------------------------
# Decomposition and search


def test_decompositions_of_the_spec():
    """Alg. 6's canonical decomposition, Ex. G (R = 8): [2,8] = [2,2] u [3,4] u [5,8],
    [6,8] = [6,6] u [7,8], [5,8] is one level-3 bin, [3,8] = [3,4] u [5,8]."""
    assert ks.dyadic_decomposition(2, 8) == ((1, 2), (2, 2), (3, 2))
    assert ks.dyadic_decomposition(6, 8) == ((1, 6), (2, 4))
    assert ks.dyadic_decomposition(5, 8) == ((3, 2),)
    assert ks.dyadic_decomposition(3, 8) == ((2, 2), (3, 2))
    assert ks.dyadic_decomposition(1, 8) == ((4, 1),)
    assert ks.dyadic_decomposition(9, 8) == ()
    assert [ks.bin_interval(level, b) for level, b in ks.dyadic_decomposition(2, 8)] == [
        (2, 2),
        (3, 4),
        (5, 8),
    ]


@given(st.integers(1, 7), st.data())
def test_decomposition_tiles_the_suffix_with_aligned_blocks(log_r, data):
    R = 1 << log_r
    r = data.draw(st.integers(1, R))
    blocks = ks.dyadic_decomposition(r, R)
    assert len(blocks) <= max(1, log_r)
    start = r
    for level, b in blocks:
        lo, hi = ks.bin_interval(level, b)
        assert lo == start and 1 <= b <= ks.level_bins(R, level)
        assert ks.bin_of(lo, level) == b == ks.bin_of(hi, level)
        start = hi + 1
    assert start == R + 1


def test_levels_and_padding():
    """Ex. G: R = 8 has LOG 8 + 1 = 4 levels of 8, 4, 2, 1 bins, each with epsilon/4."""
    spec = ks.make_k_selection("m", 8, 2, Fraction(1, 10))
    assert ks.num_levels(8) == 4 and spec.R == 8
    assert [lv.bins for lv in spec.levels] == [8, 4, 2, 1]
    assert all(lv.epsilon == Fraction(1, 2) for lv in spec.levels)
    assert all(lv.beta == Fraction(1, 40) for lv in spec.levels)
    assert ks.padded_domain(20) == 32 and ks.padded_domain(1) == 2
    assert ks.make_k_selection("m", 20, 2, Fraction(1, 10)).R == 32
    finest = ks.make_k_selection("m", 20, 2, Fraction(1, 10), dyadic=False)
    assert finest.R == 20 and len(finest.levels) == 1 and finest.levels[0].epsilon == 2


def test_scan_and_bisection_on_a_non_monotone_suffix():
    """The scan returns the LARGEST passing r; bisection some r with S(r) passing and
    S(r + 1) failing, which can be smaller (Alg. 6)."""
    S = {1: 5, 2: 1, 3: 5, 4: 0}.__getitem__
    assert ks.select_scan(S, 4, 3) == 3
    assert ks.select_bisect(S, 4, 3) == 1
    assert ks.select_scan(S, 4, 6) == 0 == ks.select_bisect(S, 4, 6)


@given(st.lists(st.integers(-5, 5), min_size=1, max_size=40), st.integers(-3, 3))
def test_search_postconditions(values, threshold):
    R = len(values)
    S = lambda r: values[r - 1]  # noqa: E731
    r = ks.select_scan(S, R, threshold)
    assert all(S(x) < threshold for x in range(r + 1, R + 1))
    assert r == 0 or S(r) >= threshold
    b = ks.select_bisect(S, R, threshold)
    assert b == 0 or S(b) >= threshold
    assert b == R or S(b + 1) < threshold


# ---------------------------------------------------------------------------------------
# Example G and oracle 8


@pytest.mark.parametrize("dyadic", [True, False])
@pytest.mark.parametrize("search", ["scan", "bisect"])
def test_example_g_noise_free(dyadic, search):
    """Ex. G: R = 8, items {7, 3, 5, 4, 1}, Delta = 0: k = 1 -> 7, 2 -> 5, 3 -> 4."""
    ticks = [[(f"u{i}", x)] for i, x in enumerate([7, 3, 5, 4, 1])]
    for k, want in ((1, 7), (2, 5), (3, 4), (5, 1), (6, 0)):
        spec = ks.make_k_selection(
            "m", 8, 2, Fraction(1, 10), k=k, dyadic=dyadic, search=search, delta_mode="zero"
        )
        _, releases = run(spec, ticks, ZeroNoise())
        assert releases[-1].value == want
        assert releases[-1].margin == 0
    hists = releases[-1].histograms
    if dyadic:
        assert hists == ((1, 0, 1, 1, 1, 0, 1, 0), (1, 2, 1, 1), (3, 2), (5,))
        assert ks.suffix_sum(hists, 5) == 2 and ks.suffix_sum(hists, 3) == 4


@st.composite
def streams(draw) -> tuple[int, list[list[Item]]]:
    domain = draw(st.sampled_from([5, 8, 13]))
    items = st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(1, domain))
    return domain, draw(st.lists(st.lists(items, max_size=4), min_size=1, max_size=20))


@settings(max_examples=40, deadline=None)
@given(streams(), st.integers(1, 4), st.booleans(), st.sampled_from([2, 64]))
def test_oracle_8(stream, k, dyadic, tau):
    """Oracle 8: with noise 0 and Delta = 0 the output is o_{t,k} whenever tau~ >= kappa;
    always, S(r) >= k at the output and S(r') < k above it (scan)."""
    domain, ticks = stream
    spec = ks.make_k_selection(
        "m",
        domain,
        1,
        Fraction(1, 10),
        k=k,
        dyadic=dyadic,
        delta_mode="zero",
        forced_schedule=((1, tau),),
    )
    _, releases = run(spec, ticks, ZeroNoise())
    seen: list[Item] = []
    for items, rel in zip(ticks, releases, strict=True):
        seen.extend(items)
        S = ks.suffix_function(rel.histograms, dyadic)
        assert rel.value == 0 or S(rel.value) >= k
        assert all(S(r) < k for r in range(rel.value + 1, domain + 1))
        kappa = max((sum(1 for u, _ in seen if u == user) for user, _ in seen), default=0)
        if tau >= kappa:
            counts = counts_of(seen, domain)
            assert rel.value == ks.true_kth(counts, k)
            assert ks.rank_error(counts, k, rel.value) == 0


def test_median_from_the_noisy_total():
    """Remark 1: k_t = ceil(n~/2) from the histograms' own total (no extra budget)."""
    ticks = [[(f"u{x}", x)] for x in range(1, 8)]
    for dyadic in (True, False):
        spec = ks.make_k_selection(
            "m", 8, 2, Fraction(1, 10), quantile=Fraction(1, 2), dyadic=dyadic, delta_mode="zero"
        )
        _, releases = run(spec, ticks, ZeroNoise())
        assert releases[-1].k == 4 and releases[-1].value == 4
        assert [r.k for r in releases] == [1, 1, 2, 2, 3, 3, 4]


# ---------------------------------------------------------------------------------------
# Rank error, Delta


def test_rank_error():
    counts = [1, 0, 1, 1, 1, 0, 1, 0]  # items {1, 3, 4, 5, 7}
    assert ks.true_kth(counts, 1) == 7 and ks.true_kth(counts, 3) == 4
    assert ks.rank_error(counts, 1, 7) == 0
    assert ks.rank_error(counts, 1, 8) == math.inf
    assert ks.rank_error(counts, 1, 6) == 0  # o_1 = 7 >= 6 is the last item >= 6
    assert ks.rank_error(counts, 1, 5) == 1
    assert ks.rank_error(counts, 1, 0) == 4  # "none": |D_t| - k
    assert ks.rank_error(counts, 3, 1) == 2
    ties = [0, 2, 4]  # values 2, 2, 3, 3, 3, 3
    assert ks.rank_error(ties, 1, 3) == 0  # equal to the truth despite the ties
    assert ks.rank_error(ties, 1, 2) == 4
    assert ks.rank_error([0, 0], 1, 0) == 0  # k > |D_t|: o_k = 0
    assert ks.rank_error([1, 0], 2, 1) == math.inf


def test_delta_eq3_formula():
    """eq. (3): sqrt(sum_i Noise_U(tau_i, t, eps/(LOG R+1), beta/R, theta)^2), Noise_U =
    8 tau (LOG tau + 2)^(1+theta)/(eps theta) ceil(LOG t)^1.5 LOG(2/beta)."""
    got = ks.delta_eq3((64, 64, 64, 64), 1000, 2, Fraction(1, 10), 1, 8)
    per_level = 8 * 64 * 8**2 / 0.5 * 10**1.5 * math.log2(2 / (0.1 / 8))
    assert got == pytest.approx(2 * per_level, rel=1e-12)
    assert got == pytest.approx(3.03486e7, rel=1e-5)


def test_chernoff_delta_is_the_bound_of_the_suffix_terms():
    spec = ks.make_k_selection("m", 8, 2, Fraction(1, 10), delta_mode="chernoff", k=1)
    ticks = [[("a", 3)], [("b", 8)], []]
    _, releases = run(spec, ticks, ZeroNoise())
    rel = releases[-1]
    # Zero noise: the scan passes where k + Delta(r) <= the count, i.e. nowhere.
    assert rel.value == 0 and rel.margin > 0
    assert ks.suffix_scales([(Fraction(1),), (Fraction(2),)], 1, 2, True) == [Fraction(2)]
    assert ks.suffix_scales([(Fraction(1),)], 3, 5, False) == [Fraction(1)] * 3


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from([Fraction(1, 2), Fraction(3), Fraction(40), Fraction(900)]),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
    st.data(),
)
def test_grid_chernoff_margin_matches_the_exact_bound(level_scales, dyadic, data):
    """The grid minimum is a valid Chernoff bound (never below the bisection optimum of
    noise.chernoff_interval) and within 1% of it."""
    if not dyadic:
        level_scales = level_scales[:1]
    elif len(level_scales) == 1:
        level_scales = [*level_scales, [Fraction(5)]]
    R = 1 << (len(level_scales) - 1) if dyadic else 7
    top = R
    r = data.draw(st.integers(1, top))
    margin = ks.chernoff_margin(level_scales, top, dyadic, 0.01)(r)
    exact = chernoff_interval(ks.suffix_scales(level_scales, r, top, dyadic), 0.01)
    assert exact * (1 - 1e-9) <= margin <= exact * 1.01


# ---------------------------------------------------------------------------------------
# State, parameters


def test_state_json_round_trip():
    spec = ks.make_k_selection("m", 8, 2, Fraction(1, 10), delta_mode="chernoff")
    states, _ = run(spec, [[("a", 3), ("a", 5)], [("b", 8)], [("a", 1)]], KeyedNoise(KEY))
    data = orjson.loads(orjson.dumps(state_codec.to_json(states[-1])))
    restored = state_codec.from_json(ks.KSelectionState, data)
    assert restored == states[-1]
    assert ks.spent_epsilon(spec, restored) < 2
    _, a = ks.step(spec, states[-1], ((1,),), (), KeyedNoise(KEY))
    _, b = ks.step(spec, restored, ((1,),), (), KeyedNoise(KEY))
    assert a == b


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"domain": 0}, "domain must be >= 1, got 0"),
        ({"k": 0}, "k must be >= 1, got 0"),
        ({"quantile": 0}, "quantile must be in (0, 1], got 0"),
        ({"delta_mode": "loose"}, "delta_mode must be one of"),
        ({"search": "binary"}, "search must be one of"),
        ({"dyadic": 1}, "dyadic must be a bool, got 1"),
        ({"halve_delta": None}, "halve_delta must be a bool, got None"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    args = {"name": "m", "domain": 8, "epsilon": 1, "beta": Fraction(1, 10)} | kwargs
    with pytest.raises(InvalidOperatorConfig) as info:
        ks.make_k_selection(**args)
    assert message in str(info.value)


def test_practical_keeps_the_full_delta_unless_halving_is_asked_for():
    """Appendix C-A's k + Delta/2 is no longer implied by ``practical``: only the full
    Delta keeps the one-way guarantee, so halving is a separate opt-in."""
    args, half = ("m", 8, 2, Fraction(1, 10)), Fraction(1, 2)
    assert ks.make_k_selection(*args).delta_factor == 1
    assert ks.make_k_selection(*args, practical=True).delta_factor == 1
    assert ks.make_k_selection(*args, practical=True, halve_delta=True).delta_factor == half
    assert ks.make_k_selection(*args, halve_delta=True).delta_factor == half


def test_step_rejects_a_row_longer_than_the_domain():
    spec = ks.make_k_selection("m", 5, 1, Fraction(1, 10))
    with pytest.raises(InvalidOperatorConfig, match="bands\\[0\\] length must be <= domain = 5"):
        ks.step(spec, ks.init(spec), ((0,) * 6,), (), ZeroNoise())


# ---------------------------------------------------------------------------------------
# Statistical


@pytest.mark.statistical
@pytest.mark.parametrize("dyadic", [True, False])
def test_error_is_one_way_with_probability_1_minus_beta(dyadic):
    """With the threshold k + Delta (no halving) the output exceeds o_{t,k} with
    probability <= beta at a fixed t (S(r) - F([r, R]) <= Delta(r) for all r). n = 300
    seeded runs (keyed-semantics test noise); the overshoot count must stay below the
    Binomial(300, beta) upper 1e-6 quantile. epsilon is large so that the counts dominate
    Delta and the test is not vacuous: most runs return the truth (6) or one below."""
    beta = Fraction(1, 10)
    rng = random.Random(11)
    values = [1, 2, 3, 3, 4, 4, 5, 5, 5, 6]
    ticks = [[(f"u{(20 * t + i) % 200}", rng.choice(values)) for i in range(20)] for t in range(16)]
    counts = counts_of([item for items in ticks for item in items], 8)
    truth = ks.true_kth(counts, 2)
    assert truth == 6
    spec = ks.make_k_selection("m", 8, 100, beta, k=2, dyadic=dyadic, delta_mode="chernoff")
    overshoots = exact = 0
    runs = 300
    for seed in range(runs):
        _, releases = run(spec, ticks, MemoNoise.seeded(seed))
        overshoots += releases[-1].value > truth
        exact += releases[-1].value == truth
    assert overshoots <= binomial_upper(runs, float(beta))
    assert exact >= runs // 4
