"""The square-root factorization counter, streaming, with exact discrete Gaussian noise:
rho-zCDP continual counting on an infinite stream (the approximate-DP mode's counter).

**The factorization.** The prefix sums S = A x (A the lower-triangular all-ones matrix)
are released as A x + B z with A = B C: C (the encoder) and B (the decoder) are
lower-triangular Toeplitz, and the privacy of the release is that of the Gaussian
mechanism C x + z. The square root B = C = A^(1/2) has the Toeplitz coefficients
c_j = C(2j, j) / 4^j = 1, 1/2, 3/8, 5/16, ... (``sqrt_coefficient``; the moments of the
arcsine law on [0, 1]) and is within an additive constant of the best factorization for
the largest per-step variance (Henzinger-Upadhyay-Upadhyay; Fichtenberger-Henzinger-
Upadhyay): its variance at step t, times 2 rho, is (sum_{j < T} c_j^2)(sum_{j < t} c_j^2)
for a horizon T, below (1 + ln(5T/4)/pi)(1 + ln(5t/4)/pi), with mean over t <= T below
(1 + ln T / pi)^2 (Henzinger-Upadhyay-Upadhyay's bound; checked in the tests). Exactly,
it needs all of x's past at every step and a sensitivity that grows with T.

**The BLT.** We run C as a buffered linear Toeplitz matrix (Dvijotham-McMahan-Pillutla-
Steinke-Thakurta): c_0 = 1 and c_j = sum_i omega_i theta_i^(j-1) for j >= 1, d buffers
with decays theta_i in (0, 1). Ours is a quadrature of the arcsine integral
c_j = (1/pi) int_0^1 x^j (x(1 - x))^(-1/2) dx: with x = 1 / (1 + e^(-v)) it is
(1/pi) int x(v)^j sqrt(x(v)(1 - x(v))) dv over the real line, which the trapezoid rule
with step h at the nodes v_k = k h computes to an error that falls like exp(-pi^2 / h)
for the j whose mass the nodes cover. So theta_k = x(v_k) and omega_k = (h/pi)
sqrt(theta_k (1 - theta_k)) theta_k, all positive, for v_k from -2 to ln(T_design) + 2
(``sqrt_blt``; h and the range chosen by measuring, docs/sqrt-factorization.md). With 14
buffers at a design horizon of 2^20 steps the largest and the mean variance up to it are
within 9% and 6% of the exact square root's built for that horizon, and at 16 times the
horizon within 1.5 times that of a square root built for it. Every decay is below 1, so
the column norm, hence the sensitivity, is finite for the whole infinite stream
(sum_j c_j^2 = 1 + sum_{i,k} omega_i omega_k / (1 - theta_i theta_k)); the price is that
far past the design horizon the variance grows linearly. The coefficients themselves
fall below C(2j, j)/4^j as j nears the horizon (the cut tail): what the cut saves in
sensitivity pays for it.

**Exact noise in streaming form (our construction).** A discrete Gaussian z added to C x
would not do: C x is not an integer, and N_Z(0, s^2) noise around a non-integer reveals
its fractional part. So we generate the noise process N = B z itself, on the integers:
given the past, B z_t has the predictable part m_t = N_{t-1} - sum_i omega_i b_i (the
buffers b_i = sum_s theta_i^(t-1-s) (N_s - N_{s-1}) hold the past increments), and we
draw N_t from N_Z(m_t, sigma^2) (keyed, node (*prefix, "sqrt", t);
``noise.discrete_gaussian``). The release is S(t) + N_t, an integer; with zero noise it
is S(t). The buffers and centres are kept in fixed point (``FRACTION_BITS`` bits, exact
integer arithmetic, each product rounded to nearest), a deterministic function of the
noise drawn so far, never of the data.

**Privacy (our proof).** Fix the outputs y. Under leaf streams x and x' the centre of
step t differs by delta_t = (C (x - x'))_t + e_t, |e_t| <= E = 2^-F (1 + sum_i omega_i /
(1 - theta_i)) (the fixed-point rounding, propagated through the contracting buffers),
whatever the path: so the Renyi divergence of the sequence of discrete Gaussians is at
most alpha sum_t delta_t^2 / (2 sigma^2) plus the variation of their normalisers over
non-integer centres, at most 2 kappa sum_t |delta_t| with kappa <= 8 pi e^(-2 pi^2
sigma^2) / (1 - 4 e^(-2 pi^2 sigma^2)) (Poisson summation), about 1e-33 at sigma^2 >= 4,
which we require. With ||x - x'||_1 <= Delta_1 (the sensitivity: tau for whole-user
neighbours after truncation, 2 tau for any subset), sum_t delta_t^2 <= Delta_1^2
||c||_2^2 + 2 E Delta_1 ||c||_1 + T_max E^2 = Delta^2 (``sensitivity_squared``), for any
stream shorter than T_max = 2^64 steps. ``make_sqrt_factorization`` picks sigma^2 so that
Delta^2 / (2 sigma^2) + 2 kappa (Delta_1 ||c||_1 + T_max E) <= rho: rho-zCDP, since
D_alpha <= xi + alpha rho' implies D_alpha <= alpha (rho' + xi) for alpha >= 1.

**Variance.** N_t = sum_s beta_(t-s) zhat_s with zhat_s the innovations (variance
sigma^2 to within 1e-30 relative at sigma^2 >= 4, the lattice's effect) and beta the
coefficients of B = A C^-1, up to the fixed-point rounding (below 1e-13 absolute for
t < 10^12): Var(N_t) = sigma^2 sum_{j < t} beta_j^2 (``variance``), in closed form from
C^-1, itself a BLT whose decays are the eigenvalues of diag(theta) - omega 1^T.

**Interval.** P(|N_t| > h) <= 2 exp(-h^2 / (2 Var)) times the innovations' moment
generating function slack (their centres are not integers): a guaranteed half-width
(``half_width``), sqrt(2 ln 40) / 1.96 = 1.39 times the normal quantile. Exact intervals
like the trees' are future work.

References:
    M. Henzinger, J. Upadhyay, S. Upadhyay. Almost Tight Error Bounds on Differentially
    Private Continual Counting. SODA 2023, arXiv:2211.05006.
    H. Fichtenberger, M. Henzinger, J. Upadhyay. Constant Matters: Fine-grained Error
    Bound on Differentially Private Continual Observation. ICML 2023, arXiv:2202.11205.
    K. Dvijotham, H. B. McMahan, K. Pillutla, T. Steinke, A. Thakurta. Efficient and
    Near-Optimal Noise Generation for Streaming Differential Privacy. FOCS 2024,
    arXiv:2404.16706.
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010.
    M. Bun, T. Steinke. Concentrated Differential Privacy. TCC 2016, arXiv:1605.02065.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import _validate
from ..noise import NodeId, NoiseSource, TreeRelease

MECHANISM = "sqrt_factorization"
VERSION = 1  # of the algorithm and its noise nodes: a change is a new statistic

DEFAULT_HORIZON = 1 << 20
"""The BLT's design horizon when a statistic gives no ``horizon_ticks`` (``sqrt_blt``):
2^20 ticks, 12 days of one-second ticks, a year of 30-second ones."""

FRACTION_BITS = 96
"""F: the buffers and the centre are integers in units of 2^-F."""

PARAMETER_BITS = 64
"""The decays and weights are dyadic rationals with this many fraction bits."""

MAX_STEPS = 1 << 64
"""T_max: the privacy bound covers every stream shorter than this many steps."""

MIN_SIGMA2 = Fraction(4)
"""The least sigma^2 accepted: below it the discrete Gaussian's lattice effects (the
normaliser slack, the variance) stop being negligible."""

# Quadrature of the arcsine integral (module docstring): step h and the node range.
_STEP = 1.5
_FIRST_NODE = -2.0
_PAST_HORIZON = 2.0


@dataclass(frozen=True, slots=True)
class SqrtFactorizationSpec:
    """Public parameters of one square-root factorization counter.

    Attributes:
        rho: the zCDP budget of the whole infinite stream.
        sensitivity: Delta_1, the largest sum_t |x_t - x'_t| between neighbouring leaf
            streams (tau after truncation, 2 tau for any-subset neighbours).
        node_prefix: public identity; prefixes every noise node id.
        decay: the BLT's theta_i, dyadic, in (0, 1).
        weight: the BLT's omega_i, dyadic, > 0.
        sigma2: the discrete Gaussian's sigma^2, calibrated to rho (``make_``).
    """

    rho: Fraction
    sensitivity: int
    node_prefix: NodeId
    decay: tuple[Fraction, ...]
    weight: tuple[Fraction, ...]
    sigma2: Fraction


@dataclass(frozen=True, slots=True)
class SqrtFactorizationState:
    """Plain data: serializable as it is.

    Attributes:
        t: steps taken.
        total: exact running sum S(t) (sensitive: never publish it).
        noise: N_t, the noise of the last release (an integer).
        buffers: b_i in units of 2^-FRACTION_BITS, as decimal strings (they exceed the
            64-bit integers JSON codecs such as orjson take): the past noise increments
            N_s - N_(s-1), decayed by theta_i per step. Noise, not data, and a function
            of the keyed draws, so a replay rebuilds it exactly.
    """

    t: int = 0
    total: int = 0
    noise: int = 0
    buffers: tuple[str, ...] = ()


def sqrt_coefficient(j: int) -> Fraction:
    """c_j = C(2j, j) / 4^j, the j-th Toeplitz coefficient of A^(1/2).

    Example:
        >>> [str(sqrt_coefficient(j)) for j in range(5)]
        ['1', '1/2', '3/8', '5/16', '35/128']
    """
    _validate.check_int_ge("j", j, 0)
    return Fraction(math.comb(2 * j, j), 4**j)


def sqrt_blt(horizon: int) -> tuple[tuple[Fraction, ...], tuple[Fraction, ...]]:
    """(decays, weights) of our BLT for the square root, tuned to a design horizon.

    The trapezoid rule for the arcsine integral (module docstring) at v_k = k h, h = 1.5,
    from v = -2 to ln(horizon) + 2; each parameter rounded to PARAMETER_BITS bits.

    Args:
        horizon: the design horizon T_design >= 2: up to it the variance stays within 9%
            of the exact square root's built for that horizon (module docstring).

    Returns:
        (theta_i, omega_i), ascending in theta.
    """
    _validate.check_int_ge("horizon", horizon, 2)
    first = math.floor(_FIRST_NODE / _STEP)
    last = math.ceil((math.log(horizon) + _PAST_HORIZON) / _STEP)
    decays, weights = [], []
    for k in range(first, last + 1):
        x = 1 / (1 + math.exp(-k * _STEP))
        decays.append(_dyadic(x))
        weights.append(_dyadic(_STEP / math.pi * math.sqrt(x * (1 - x)) * x))
    return tuple(decays), tuple(weights)


def make_sqrt_factorization(
    rho: float | Fraction, sensitivity: int, node_prefix: NodeId, horizon: int
) -> SqrtFactorizationSpec:
    """Validate, build the BLT for ``horizon`` and calibrate sigma^2 to ``rho``.

    Args:
        rho: the zCDP budget > 0 of the whole stream (a float is read as the decimal it
            prints as).
        sensitivity: Delta_1 >= 1 (see SqrtFactorizationSpec).
        node_prefix: tuple of str and int.
        horizon: the BLT's design horizon (``sqrt_blt``); privacy holds at every step,
            before and after it.

    Returns:
        The spec; ``rho_spent(spec) <= rho``.

    Raises:
        InvalidOperatorConfig: a parameter is out of range, or rho is so large that
            sigma^2 would fall below MIN_SIGMA2.

    Privacy:
        rho-zCDP for neighbouring leaf streams x, x' with sum_t |x_t - x'_t| <=
        ``sensitivity`` (module docstring): sigma^2 = Delta^2 / (2 (rho - xi)) rounded up
        to a multiple of 2^-32, with Delta^2 = ``sensitivity_squared`` and xi the
        normalisers' slack, both upper bounds; the result is re-checked.

    References:
        Bun-Steinke Prop. 1.6 and Lemma 1.7; Canonne-Kamath-Steinke Thm. 14 (our
        extension to rational centres, module docstring).
    """
    budget = _validate.exact_fraction("rho", rho)
    _validate.check_positive("rho", budget)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    if not isinstance(node_prefix, (tuple, list)) or not all(
        isinstance(v, (str, int)) and not isinstance(v, bool) for v in node_prefix
    ):
        raise _validate.invalid("node_prefix", "a tuple of str and int", node_prefix)
    decay, weight = sqrt_blt(horizon)
    draft = SqrtFactorizationSpec(
        budget, sensitivity, tuple(node_prefix), decay, weight, MIN_SIGMA2
    )
    slack = _normaliser_slack(draft)
    if slack >= budget:
        raise _validate.invalid("rho", f"> {float(slack):.3g}", budget)
    exact = sensitivity_squared(draft) / (2 * (budget - slack))
    sigma2 = Fraction(math.ceil(exact * 2**32), 2**32)
    if sigma2 < MIN_SIGMA2:
        most = sensitivity_squared(draft) / (2 * MIN_SIGMA2) + slack
        raise _validate.invalid("rho", f"<= {float(most):.6g} (sigma^2 >= 4)", budget)
    spec = SqrtFactorizationSpec(budget, sensitivity, tuple(node_prefix), decay, weight, sigma2)
    if rho_spent(spec) > budget:  # pragma: no cover - the rounding above goes up
        raise AssertionError("sigma^2 rounding undercut the budget")
    return spec


def init(spec: SqrtFactorizationSpec) -> SqrtFactorizationState:
    """The state before the first step."""
    return SqrtFactorizationState(buffers=("0",) * len(spec.decay))


def center(spec: SqrtFactorizationSpec, state: SqrtFactorizationState) -> Fraction:
    """m_t: the predictable part of the next noise, N_(t-1) - sum_i omega_i b_i, rounded to
    a multiple of 2^-FRACTION_BITS (a function of the past noise only)."""
    buffers = (int(b) for b in state.buffers)
    predicted = sum(w * b for w, b in zip(_scaled(spec.weight), buffers, strict=True))
    return state.noise - Fraction(_nearest(predicted), 1 << FRACTION_BITS)


def advance(
    spec: SqrtFactorizationSpec, state: SqrtFactorizationState, weight: int, drawn: int
) -> SqrtFactorizationState:
    """The state after a step with leaf ``weight`` whose noise draw was ``drawn`` = N_t:
    each buffer decays (rounded to nearest) and takes the increment N_t - N_(t-1)."""
    increment = (drawn - state.noise) << FRACTION_BITS
    buffers = tuple(
        str(_nearest(theta * int(b)) + increment)
        for theta, b in zip(_scaled(spec.decay), state.buffers, strict=True)
    )
    return SqrtFactorizationState(
        t=state.t + 1, total=state.total + weight, noise=drawn, buffers=buffers
    )


def step(
    spec: SqrtFactorizationSpec, state: SqrtFactorizationState, weight: int, noise: NoiseSource
) -> tuple[SqrtFactorizationState, TreeRelease]:
    """Advance one public time step with leaf weight ``weight`` (0 on an empty tick).

    Args:
        spec: the counter's parameters.
        state: the state after the previous step.
        weight: this step's leaf value, an int (already truncated).
        noise: where the noise comes from (keyed in production).

    Returns:
        The new state and the release S(t) + N_t with its std and guaranteed interval.

    Privacy:
        See ``make_sqrt_factorization``. The draw's node, sigma^2 and centre depend on t
        and the past noise only.

    References:
        Module docstring (our streaming form of B z).
    """
    t = state.t + 1
    drawn = noise.discrete_gaussian(
        (*spec.node_prefix, MECHANISM, t), spec.sigma2, center(spec, state)
    )
    new_state = advance(spec, state, weight, drawn)
    release = TreeRelease(
        t=t,
        value=new_state.total + drawn,
        std=std(spec, t),
        ci95=half_width(spec, t),
    )
    return new_state, release


def std(spec: SqrtFactorizationSpec, t: int) -> float:
    """The exact standard deviation of the release at step t (``variance``)."""
    return math.sqrt(variance(spec, t))


def exact_value(state: SqrtFactorizationState) -> int:
    """The exact (truncated) running count."""
    return state.total


# ---------------------------------------------------------------------------------------
# Public structure: coefficients, norms, sensitivity, variance


def coefficients(spec: SqrtFactorizationSpec, n: int) -> list[Fraction]:
    """The encoder's Toeplitz coefficients c_0 .. c_(n-1), exact: 1, then
    sum_i omega_i theta_i^(j-1) (exact rationals: their size grows with n; for tests on
    short streams)."""
    _validate.check_int_ge("n", n, 1)
    out = [Fraction(1)]
    powers = [Fraction(1)] * len(spec.decay)
    for _ in range(1, n):
        out.append(sum((w * p for w, p in zip(spec.weight, powers, strict=True)), Fraction(0)))
        powers = [p * theta for p, theta in zip(powers, spec.decay, strict=True)]
    return out


def column_norm_squared(spec: SqrtFactorizationSpec) -> Fraction:
    """||c||_2^2 = 1 + sum_{i,k} omega_i omega_k / (1 - theta_i theta_k): the squared L2
    norm of every column of C over the infinite stream (exact)."""
    return 1 + sum(
        (
            wi * wk / (1 - ti * tk)
            for ti, wi in zip(spec.decay, spec.weight, strict=True)
            for tk, wk in zip(spec.decay, spec.weight, strict=True)
        ),
        Fraction(0),
    )


def column_norm_l1(spec: SqrtFactorizationSpec) -> Fraction:
    """||c||_1 = C(1) = 1 + sum_i omega_i / (1 - theta_i) (exact)."""
    return 1 + sum(
        (w / (1 - theta) for theta, w in zip(spec.decay, spec.weight, strict=True)), Fraction(0)
    )


def rounding_error(spec: SqrtFactorizationSpec) -> Fraction:
    """E: the most the fixed-point rounding moves a centre's shift between neighbours,
    2^-F (1 + sum_i omega_i / (1 - theta_i)) (module docstring)."""
    return column_norm_l1(spec) / (1 << FRACTION_BITS)


def sensitivity_squared(spec: SqrtFactorizationSpec) -> Fraction:
    """Delta^2 >= sum_t delta_t^2, the squared shift of all centres between neighbours:
    Delta_1^2 ||c||_2^2 + 2 E Delta_1 ||c||_1 + T_max E^2 (exact; module docstring)."""
    error = rounding_error(spec)
    d1 = spec.sensitivity
    return (
        d1 * d1 * column_norm_squared(spec)
        + 2 * error * d1 * column_norm_l1(spec)
        + MAX_STEPS * error * error
    )


def rho_spent(spec: SqrtFactorizationSpec) -> Fraction:
    """The zCDP budget the counter uses over the whole stream: Delta^2 / (2 sigma^2) plus
    the normalisers' slack (an upper bound, exact rational)."""
    return sensitivity_squared(spec) / (2 * spec.sigma2) + _normaliser_slack(spec)


def variance(spec: SqrtFactorizationSpec, t: int) -> float:
    """Var(N_t) = sigma^2 sum_{j < t} beta_j^2, beta the coefficients of A C^-1, in O(d^2).

    With C^-1 = 1 + sum_k omega'_k x / (1 - theta'_k x) (``_inverse``) and
    a_k = omega'_k / (1 - theta'_k): beta_j = A - sum_k a_k theta'_k^j, A = 1 + sum a_k,
    so sum_{j < t} beta_j^2 = t A^2 - 2 A sum_k a_k G_k + sum_{k,l} a_k a_l G_kl with
    G = (1 - q^t) / (1 - q) for q = theta'_k and theta'_k theta'_l, computed from
    eta = 1 - theta' (expm1, log1p) so that decays near 1 keep their precision.

    Args:
        spec: the counter's parameters.
        t: the step, >= 1.

    Returns:
        The variance of the release's noise (module docstring on its accuracy).
    """
    _validate.check_int_ge("t", t, 1)
    eta, weights = _inverse(spec.decay, spec.weight)
    a = weights / eta
    total = 1 + a.sum()
    log_q = np.log1p(-eta)  # ln theta' (theta' > 0; see _inverse)
    geometric = -np.expm1(t * log_q) / eta
    pair_logs = log_q[:, None] + log_q[None, :]
    pairs = np.expm1(t * pair_logs) / np.expm1(pair_logs)
    squares = t * total * total - 2 * total * float(a @ geometric) + float(a @ pairs @ a)
    return float(spec.sigma2) * squares


def mean_variance(spec: SqrtFactorizationSpec, horizon: int) -> float:
    """(1/T) sum_{t=1..T} Var(N_t), the mean squared error of the releases over steps
    1..horizon, in closed form: sum_{t <= T} sum_{j < t} q^j = (T - q (1 - q^T) / (1 - q))
    / (1 - q) for each geometric term of beta_j^2 (see ``variance``).

    Args:
        spec: the counter's parameters.
        horizon: T >= 1.

    Returns:
        The mean variance.
    """
    _validate.check_int_ge("horizon", horizon, 1)
    eta, weights = _inverse(spec.decay, spec.weight)
    a = weights / eta
    total = 1 + a.sum()
    log_q = np.log1p(-eta)

    def nested(logs: np.ndarray) -> np.ndarray:  # sum_{t<=T} (1 - q^t) / (1 - q)
        one_minus = -np.expm1(logs)
        return (horizon - np.exp(logs) * -np.expm1(horizon * logs) / one_minus) / one_minus

    pair_logs = log_q[:, None] + log_q[None, :]
    squares = (
        total * total * horizon * (horizon + 1) / 2
        - 2 * total * float(a @ nested(log_q))
        + float(a @ nested(pair_logs) @ a)
    )
    return float(spec.sigma2) * squares / horizon


def half_width(spec: SqrtFactorizationSpec, t: int, alpha: float = 0.05) -> float:
    """The least integer h with P(|N_t| > h) <= alpha guaranteed by the sub-Gaussian tail.

    Each innovation's moment generating function is at most exp(lambda^2 sigma^2 / 2)
    (1 + zeta) / (1 - zeta), zeta = 4 e^(-2 pi^2 sigma^2) (Poisson summation over a
    non-integer centre), so P(|N_t| >= h) <= 2 exp(-h^2 / (2 V_t) + t ln((1 + zeta) /
    (1 - zeta))), widened by the fixed-point rounding's bound.

    Args:
        spec: the counter's parameters.
        t: the step, >= 1.
        alpha: miss probability in (0, 1).

    Returns:
        h (an integer, as a float).
    """
    _validate.check_probability("alpha", alpha)
    zeta = 4 * math.exp(-2 * math.pi**2 * float(spec.sigma2))
    slack = t * (math.log1p(zeta) - math.log1p(-zeta))
    spread = math.sqrt(2 * variance(spec, t) * (math.log(2 / alpha) + slack))
    return float(math.floor(spread * (1 + 1e-9) + 1e-6))


@functools.lru_cache(maxsize=64)
def _inverse(
    decay: tuple[Fraction, ...], weight: tuple[Fraction, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """C^-1 as a BLT: (eta_k = 1 - theta'_k, omega'_k).

    theta'_k = 1/r_k for the zeros r_k of C(x) = 1 + sum_i omega_i x / (1 - theta_i x).
    With x = 1/(1 - eta) and e_i = 1 - theta_i, C = 0 reads f(eta) = 1 + sum_i omega_i /
    (e_i - eta) = 0; f increases between its poles, from -inf to +inf, so there is one zero
    between each two consecutive e_i and one above the largest (where f rises to 1): d
    zeros, each found by bisection to the last bit, and accurate relative to eta, which
    is what decays near 1 need (an eigenvalue solver would lose their 1 - theta'). The
    residues of 1/C give omega'_k = -1 / sum_i omega_i / (e_i - eta_k)^2. The zero above
    the largest e_i has eta < 1 when f(1) > 0, which holds for ``sqrt_blt``'s parameters
    (checked), so every theta' is in (0, 1).
    """
    gaps = sorted(1 - float(v) for v in decay)
    omega = [float(w) for _, w in sorted(zip(decay, weight, strict=True), reverse=True)]
    # omega sorted to match gaps ascending (gap = 1 - theta, so theta descending)

    def f(eta: float) -> float:
        return 1 + sum(w / (g - eta) for w, g in zip(omega, gaps, strict=True))

    if f(1.0) <= 0:
        raise _validate.invalid("decay", "a BLT whose inverse decays lie in (0, 1)", decay)
    etas = []
    for k in range(len(gaps)):
        low = gaps[k]
        high = gaps[k + 1] if k + 1 < len(gaps) else 1.0
        for _ in range(200):
            mid = (low + high) / 2
            if mid in (low, high):
                break
            if f(mid) < 0:
                low = mid
            else:
                high = mid
        etas.append((low + high) / 2)
    eta = np.array(etas)
    slope = np.array(
        [sum(w / (g - e) ** 2 for w, g in zip(omega, gaps, strict=True)) for e in etas]
    )
    return eta, -1 / slope


def _normaliser_slack(spec: SqrtFactorizationSpec) -> Fraction:
    """xi >= 2 kappa sum_t |delta_t| with kappa at sigma^2 >= MIN_SIGMA2 and sum_t |delta_t|
    <= Delta_1 ||c||_1 + T_max E (module docstring), as a Fraction rounded up."""
    sigma2 = max(spec.sigma2, MIN_SIGMA2)
    tail = math.exp(-2 * 3.14159 * 3.14159 * float(sigma2))  # pi > 3.14159: an upper bound
    kappa = 8 * math.pi * tail / (1 - 4 * tail) * (1 + 1e-9)
    shifts = spec.sensitivity * column_norm_l1(spec) + MAX_STEPS * rounding_error(spec)
    return Fraction(2 * kappa) * shifts


def _scaled(values: tuple[Fraction, ...]) -> tuple[int, ...]:
    """Dyadic parameters as integers in units of 2^-PARAMETER_BITS (exact)."""
    return tuple(int(v * (1 << PARAMETER_BITS)) for v in values)


def _nearest(value: int) -> int:
    """value / 2^PARAMETER_BITS rounded to the nearest integer (halves up): the fixed-point
    rounding of a product of a parameter and a buffer."""
    return (value + (1 << (PARAMETER_BITS - 1))) >> PARAMETER_BITS


def _dyadic(x: float) -> Fraction:
    return Fraction(round(x * 2**PARAMETER_BITS), 2**PARAMETER_BITS)
