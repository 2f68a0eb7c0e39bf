"""The square-root factorization counter (dpstream.operators.trees.sqrt_factorization): the
coefficients against their published values and bounds, the BLT against them, exact
releases with zero noise, replay, the sensitivity exhaustively on small streams, the
closed-form variance against the recurrence and against simulation (statistical)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import orjson
import pytest

from dpstream.operators import state_codec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, RecordingNoise, SeededNoise, ZeroNoise
from dpstream.operators.trees import sqrt_factorization as sf

KEY = bytes(range(32))


def exact_sums(n: int) -> np.ndarray:
    """S_T = sum_{j < T} c_j^2 for T = 1..n (float), c_j = C(2j, j) / 4^j by its ratio."""
    c = np.empty(n)
    c[0] = 1.0
    j = np.arange(1, n)
    c[1:] = np.cumprod((2 * j - 1) / (2 * j))
    return np.cumsum(c * c)


def float_coefficients(spec: sf.SqrtFactorizationSpec, n: int) -> np.ndarray:
    """The BLT's c_0 .. c_(n-1) in floats: 1, then sum_i omega_i theta_i^(j-1)."""
    theta = np.array([float(v) for v in spec.decay])
    omega = np.array([float(v) for v in spec.weight])
    powers = theta[None, :] ** np.arange(n - 1)[:, None]
    return np.concatenate(([1.0], powers @ omega))


# ---------------------------------------------------------------------------------------
# The square root's coefficients


def test_coefficients_are_the_published_values():
    """C(2j, j) / 4^j: 1, 1/2, 3/8, 5/16, 35/128, 63/256, 231/1024, 429/2048, 6435/32768
    (OEIS A001790 / A046161), the Taylor coefficients of 1 / sqrt(1 - x)."""
    published = ["1", "1/2", "3/8", "5/16", "35/128", "63/256", "231/1024", "429/2048"]
    published.append("6435/32768")
    assert [str(sf.sqrt_coefficient(j)) for j in range(9)] == published
    # their convolution square is the all-ones sequence: A^(1/2) A^(1/2) = A
    c = [sf.sqrt_coefficient(j) for j in range(30)]
    assert all(sum(c[i] * c[n - i] for i in range(n + 1)) == 1 for n in range(30))


def test_the_error_bounds_of_the_square_root():
    """With sigma^2 = Delta^2 / (2 rho) the variance at t, times 2 rho / Delta_1^2, is
    S_T S_t (S_t = sum_{j < t} c_j^2, horizon T). Its mean over t <= T is below
    (1 + ln T / pi)^2 (Henzinger-Upadhyay-Upadhyay), at every T up to 2^20, with equality
    at T = 1; S_T itself lies between Matousek-Nikolov-Talwar's lower bound on any
    factorization, (2 + ln((2T + 1) / 3)) / pi, and 1 + ln(5T/4) / pi."""
    n = 1 << 20
    sums = exact_sums(n)
    horizons = np.arange(1, n + 1)
    mean_variance = np.cumsum(sums) / horizons * sums
    assert np.all(mean_variance <= (1 + np.log(horizons) / math.pi) ** 2 * (1 + 1e-12))
    assert mean_variance[0] == 1.0
    assert np.all(sums <= 1 + np.log(1.25 * horizons) / math.pi)
    assert np.all(sums >= (2 + np.log((2 * horizons + 1) / 3)) / math.pi)
    # The numbers at T = 2^20 against the Gaussian binary tree (21 levels: each
    # leaf in 21 nodes, sigma^2 = 21 Delta^2 / (2 rho), up to 20 nodes per release):
    binary_max, binary_mean = 21 * 20, 21 * 10
    assert 13.5 < binary_max / sums[-1] ** 2 < 14.5
    assert 7 < binary_mean / mean_variance[-1] < 8


# ---------------------------------------------------------------------------------------
# The BLT


@pytest.mark.parametrize("horizon", [1 << 12, 1 << 16])
def test_the_blt_errs_like_the_square_root_built_for_its_horizon(horizon):
    """With the infinite stream's sensitivity, the BLT's largest and mean variance up to its
    design horizon T are within 10% and 7% of the exact square root built for T, and at
    16 T within 1.6 times the square root built for 16 T. Its coefficients start at
    C(2j, j) / 4^j (1, then within 1% for j < 8) and decrease; decays lie in (0, 1)."""
    spec = sf.make_sqrt_factorization(Fraction(1, 100), 1, ("b",), horizon)
    assert all(0 < theta < 1 for theta in spec.decay) and all(w > 0 for w in spec.weight)
    c = float_coefficients(spec, 16 * horizon)
    exact = np.sqrt(np.diff(exact_sums(16 * horizon), prepend=0.0))
    assert c[0] == 1 and np.all(np.abs(c[:8] / exact[:8] - 1) < 0.01)
    assert np.all(np.diff(c) < 0)
    sums = exact_sums(16 * horizon)
    unit = float(sf.column_norm_squared(spec)) / float(spec.sigma2)
    steps = np.unique(np.linspace(1, horizon, 2000).astype(int))
    blt = np.array([sf.variance(spec, int(t)) for t in steps]) * unit
    assert blt[-1] / sums[horizon - 1] ** 2 < 1.10
    assert blt.mean() / (sums[horizon - 1] * sums[steps - 1].mean()) < 1.07
    far = sf.variance(spec, 16 * horizon) * unit
    assert far / sums[-1] ** 2 < 1.6


def test_column_norms_are_the_coefficients_sums():
    spec = sf.make_sqrt_factorization(Fraction(1, 10), 1, ("b",), 64)
    c = float_coefficients(spec, 100_000)
    assert float(sf.column_norm_squared(spec)) == pytest.approx(float(np.sum(c * c)), rel=1e-9)
    assert float(sf.column_norm_l1(spec)) == pytest.approx(float(np.sum(c)), rel=1e-6)


def test_variance_closed_form_equals_the_recurrence():
    """sigma^2 sum_{j < t} beta_j^2 in closed form against the streaming inverse (the
    impulse response of C^-1, summed) over 2^17 steps."""
    spec = sf.make_sqrt_factorization(Fraction(1, 2), 1, ("v",), 1 << 14)
    theta = np.array([float(v) for v in spec.decay])
    omega = np.array([float(v) for v in spec.weight])
    steps = 1 << 17
    buffers, increments = np.zeros(len(theta)), np.empty(steps)
    for t in range(steps):
        increments[t] = (1.0 if t == 0 else 0.0) - float(omega @ buffers)
        buffers = theta * buffers + increments[t]
    running = np.cumsum(np.cumsum(increments) ** 2) * float(spec.sigma2)
    for t in (1, 2, 3, 17, 1000, 1 << 14, steps):
        assert sf.variance(spec, t) == pytest.approx(running[t - 1], rel=1e-10)


def test_mean_variance_is_the_mean_of_the_variances():
    spec = sf.make_sqrt_factorization(Fraction(1, 5), 1, ("v",), 1 << 10)
    per_step = [sf.variance(spec, t) for t in range(1, 5001)]
    for horizon in (1, 2, 10, 1000, 5000):
        assert sf.mean_variance(spec, horizon) == pytest.approx(
            sum(per_step[:horizon]) / horizon, rel=1e-10
        )


def test_calibration_spends_the_budget_and_no_more():
    for rho, sensitivity in ((Fraction(1, 2), 1), (Fraction(1, 10), 8), (Fraction(3), 64)):
        spec = sf.make_sqrt_factorization(rho, sensitivity, ("c",), 1 << 16)
        spent = sf.rho_spent(spec)
        assert spent <= rho
        assert spent > rho * (1 - Fraction(1, 10**8))
        assert spec.sigma2 >= sf.MIN_SIGMA2
        delta2 = sensitivity**2 * sf.column_norm_squared(spec)
        assert sf.sensitivity_squared(spec) - delta2 < Fraction(1, 10**20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rho": 0}, "rho must be finite and > 0, got Fraction(0, 1)"),
        ({"rho": 2}, "rho must be <= 0.399032 (sigma^2 >= 4), got Fraction(2, 1)"),
        ({"sensitivity": 0}, "sensitivity must be >= 1, got 0"),
        ({"horizon": 1}, "horizon must be >= 2, got 1"),
        ({"node_prefix": ("a", 1.5)}, "node_prefix must be a tuple of str and int"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    params = {"rho": Fraction(1, 2), "sensitivity": 1, "node_prefix": ("m",), "horizon": 1024}
    with pytest.raises(InvalidOperatorConfig) as info:
        sf.make_sqrt_factorization(**(params | kwargs))
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------------------------------
# Releases


def run(spec, weights, noise):
    state, releases = sf.init(spec), []
    for w in weights:
        state, release = sf.step(spec, state, w, noise)
        releases.append(release)
    return state, releases


def test_zero_noise_releases_the_exact_prefix_sums():
    spec = sf.make_sqrt_factorization(Fraction(1, 2), 3, ("z",), 256)
    rng = np.random.Generator(np.random.PCG64(3))
    weights = [int(w) for w in rng.integers(0, 4, size=300)]
    _, releases = run(spec, weights, ZeroNoise())
    assert [r.value for r in releases] == list(np.cumsum(weights))
    assert [r.t for r in releases] == list(range(1, 301))
    # error bars from public parameters only: a busy and an empty stream agree
    _, empty = run(spec, [0] * 300, ZeroNoise())
    assert [(r.std, r.ci95) for r in releases] == [(r.std, r.ci95) for r in empty]


def test_noise_is_keyed_per_step_and_replays_after_a_restart():
    spec = sf.make_sqrt_factorization(Fraction(1, 5), 2, ("r", 0), 1024)
    weights = [1, 0, 2, 2, 0, 1] * 10
    recorder = RecordingNoise(KeyedNoise(KEY))
    state, first = run(spec, weights, recorder)
    assert [node for node, _, _, _ in recorder.gaussian_calls] == [
        ("r", 0, "sqrt_factorization", t) for t in range(1, 61)
    ]
    assert all(sigma2 == spec.sigma2 for _, sigma2, _, _ in recorder.gaussian_calls)
    middle, _ = run(spec, weights[:25], KeyedNoise(KEY))
    restored = state_codec.from_json(
        sf.SqrtFactorizationState, orjson.loads(orjson.dumps(state_codec.to_json(middle)))
    )
    assert restored == middle
    rest = []
    for w in weights[25:]:
        restored, release = sf.step(spec, restored, w, KeyedNoise(KEY))
        rest.append(release)
    assert rest == first[25:]
    assert len({r.value - s for r, s in zip(first, np.cumsum(weights), strict=True)}) > 10


# ---------------------------------------------------------------------------------------
# Sensitivity, exhaustively on small streams


def centres(spec, leaves, outputs) -> list[Fraction]:
    """The centre of each step's draw, in output space (S(t) + m_t), along the outputs."""
    state, out, total = sf.init(spec), [], 0
    for leaf, y in zip(leaves, outputs, strict=True):
        total += leaf
        out.append(total + sf.center(spec, state))
        state = sf.advance(spec, state, leaf, y - total)
    return out


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5])
def test_sensitivity_exhaustively(steps):
    """Every pair of leaf streams whose difference d has ||d||_1 <= Delta_1 = 2, along
    random output paths: the centres of the draws shift by (C d)_t up to the rounding
    error E at every step, so sum_t delta_t^2 <= Delta^2 (the bound the calibration uses);
    the largest sum_t (C d)_t^2 is Delta_1^2 sum_{j < T} c_j^2, at d = Delta_1 e_1."""
    spec = sf.make_sqrt_factorization(Fraction(1, 10), 2, ("e",), 8)
    c = sf.coefficients(spec, steps)
    error = sf.rounding_error(spec)
    rng = np.random.Generator(np.random.PCG64(steps))
    base = [int(v) for v in rng.integers(0, 3, size=steps)]
    paths = [[int(v) for v in rng.integers(-40, 41, size=steps)] for _ in range(3)]
    largest = Fraction(0)
    for d in itertools.product(range(-2, 3), repeat=steps):
        if sum(abs(v) for v in d) > 2:
            continue
        other = [b + v for b, v in zip(base, d, strict=True)]
        shifted = [sum(c[t - s] * d[s] for s in range(t + 1)) for t in range(steps)]
        largest = max(largest, sum(x * x for x in shifted))
        for outputs in paths:
            deltas = [
                a - b
                for a, b in zip(
                    centres(spec, other, outputs), centres(spec, base, outputs), strict=True
                )
            ]
            assert all(abs(x - y) <= error for x, y in zip(deltas, shifted, strict=True))
            assert sum(x * x for x in deltas) <= sf.sensitivity_squared(spec)
    assert largest == 4 * sum(x * x for x in c)
    assert largest <= 4 * sf.column_norm_squared(spec)


# ---------------------------------------------------------------------------------------
# Statistical


@pytest.mark.statistical
def test_variance_and_interval_against_simulation():
    """2,000 runs of 40 steps with fresh exact draws (SeededNoise): the sample variance of
    N_t at t = 1, 5, 20, 40 is within 5 standard errors (sqrt(2/n) relative, Gaussian
    noise) of ``variance``; the covariance of N_1 and N_40 within 5 standard errors of
    sigma^2 beta_39; the guaranteed interval covers at least 95% (minus 4 standard
    errors): it is conservative, sqrt(2 ln 40) / 1.96 = 1.39 times the normal quantile."""
    spec = sf.make_sqrt_factorization(Fraction(1, 8), 2, ("s",), 64)
    runs, steps = 2000, 40
    noises = np.empty((runs, steps))
    inside = 0
    source = SeededNoise(404)
    for i in range(runs):
        state, releases = run(spec, [0] * steps, source)
        noises[i] = [r.value for r in releases]
        inside += abs(releases[-1].value) <= releases[-1].ci95
    se = math.sqrt(2 / runs)
    for t in (1, 5, 20, 40):
        assert float(np.var(noises[:, t - 1])) == pytest.approx(sf.variance(spec, t), rel=5 * se)
    # Cov(N_1, N_40) = sigma^2 beta_0 beta_39, beta_39^2 = (V_40 - V_39) / sigma^2
    sigma2 = float(spec.sigma2)
    expected = sigma2 * math.sqrt((sf.variance(spec, 40) - sf.variance(spec, 39)) / sigma2)
    first, last = noises[:, 0], noises[:, -1]
    corr = expected / math.sqrt(sf.variance(spec, 1) * sf.variance(spec, 40))
    cov_se = math.sqrt(sf.variance(spec, 1) * sf.variance(spec, 40) * (1 + corr**2) / runs)
    assert abs(float(np.cov(first, last)[0, 1]) - expected) <= 5 * cov_se
    coverage = inside / runs
    assert coverage >= 0.95 - 4 * math.sqrt(0.05 * 0.95 / runs)
