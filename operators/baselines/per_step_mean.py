"""The per-step baseline of George et al. (Sec. 1.1): a fresh Laplace release of the running mean
per step.

At tick t the running sum of the used samples gets fresh discrete Laplace noise of scale
M_t G / eps_step units, M_t = max_u m_u(t) (public: the arrival pattern), because one user
moves the sum by at most M_t samples of range G. Each release costs eps_step, so the
declared ``horizon`` of T ticks is charged eps_step = eps / T each (basic composition) and
a tick beyond it raises ``BudgetExceededError``. The error O(1/sqrt(t) + M_t T / (t eps))
does not decay in t (George et al. Sec. 1.1): useful only as an experimental baseline.

Input per tick: ``samples``, ``sample_sum`` and ``max_count`` of ``continual_mean``'s
merged ``TickMessage`` (``max_count`` is cumulative; its merge is a max).

Privacy:
    epsilon-DP over the first ``horizon`` ticks for user-level neighbours (same arrival
    pattern): T releases, each eps / T-DP by the Laplace mechanism with sensitivity M_t G.

References:
    A. George, L. Ramesh, A. V. Singh, H. Tyagi. Continual Mean Estimation Under
    User-Level Privacy. Section 1.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..errors import BudgetExceededError
from ..means.continual_mean import DEFAULT_RESOLUTION, MeanRelease
from ..noise import NodeId, NoiseSource, exact_half_width, node_bytes, noisy_release

MECHANISM = "per_step_mean"


@dataclass(frozen=True, slots=True)
class PerStepMeanSpec:
    """Attributes: epsilon (total over ``horizon`` ticks), horizon T, lower, upper,
    resolution G, node_prefix (tick t's noise is node ``(*node_prefix, t)``)."""

    epsilon: Fraction
    horizon: int
    lower: Fraction
    upper: Fraction
    resolution: int
    node_prefix: NodeId


@dataclass(frozen=True, slots=True)
class PerStepMeanState:
    """Attributes: tick; count, samples used; total, their units; max_count, M_t."""

    tick: int = 0
    count: int = 0
    total: int = 0
    max_count: int = 0


def make_per_step_mean(
    epsilon: float | Fraction,
    horizon: int,
    *,
    lower: float | Fraction = 0,
    upper: float | Fraction = 1,
    resolution: int = DEFAULT_RESOLUTION,
    node_prefix: NodeId = ("per_step_mean", 0),
) -> PerStepMeanSpec:
    """Validate the parameters and build B0's spec.

    Args:
        epsilon: total budget over ``horizon`` ticks, > 0.
        horizon: T >= 1 ticks.
        lower, upper: declared range, lower < upper.
        resolution: G >= 1.
        node_prefix: public identity of this statistic.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("horizon", horizon, 1)
    lo = _validate.exact_fraction("lower", lower)
    hi = _validate.exact_fraction("upper", upper)
    if not lo < hi:
        raise _validate.invalid("upper", f"> lower = {lower!r}", upper)
    _validate.check_int_ge("resolution", resolution, 1)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    return PerStepMeanSpec(eps, horizon, lo, hi, resolution, prefix)


def init(spec: PerStepMeanSpec) -> PerStepMeanState:
    """The state before the first tick."""
    return PerStepMeanState()


def scale(spec: PerStepMeanSpec, max_count: int) -> Fraction:
    """Noise scale at a tick with M_t = ``max_count``: M_t G T / eps units."""
    return Fraction(max_count * spec.resolution * spec.horizon) / spec.epsilon


def step(
    spec: PerStepMeanSpec,
    state: PerStepMeanState,
    samples: int,
    sample_sum: int,
    max_count: int,
    noise: NoiseSource,
) -> tuple[PerStepMeanState, MeanRelease]:
    """Add the tick's samples and release the running mean with fresh noise.

    Raises:
        BudgetExceededError: the tick is beyond ``horizon`` (its budget is spent).
    """
    if state.tick >= spec.horizon:
        raise BudgetExceededError(
            f"tick must be <= horizon {spec.horizon} for per_step_mean, got {state.tick + 1}"
        )
    state = PerStepMeanState(
        state.tick + 1, state.count + samples, state.total + sample_sum,
        max(state.max_count, max_count),
    )  # fmt: skip
    span = spec.upper - spec.lower
    if state.count == 0:
        return state, MeanRelease(
            state.tick, float((spec.lower + spec.upper) / 2), 0, 0.0, 0.0, float(span / 2), 0,
            0, 0, (),
        )  # fmt: skip
    b = scale(spec, state.max_count)
    rel = noisy_release(state.tick, state.total, [((*spec.node_prefix, state.tick), b, 1)], noise)
    denominator = state.count * spec.resolution
    to_value = float(span) / denominator
    hoeffding = math.sqrt(math.log(2 / 0.025) / (2 * state.count))
    mean_half = exact_half_width([b], 0.025) * to_value + float(span) * (
        hoeffding + 1 / (2 * spec.resolution)
    )
    return state, MeanRelease(
        t=state.tick,
        value=float(spec.lower + span * Fraction(rel.value, denominator)),
        total=state.count,
        std=rel.std * to_value,
        ci95=rel.ci95 * to_value,
        mean_ci95=mean_half,
        active=0,
        samples=state.count,
        dropped=0,
        medians=(),
    )
