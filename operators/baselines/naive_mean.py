"""Naive continual mean, George et al. Alg. 2: one BinMech over all samples.

Every used sample is a leaf of one BinMech (``binary_mechanism``) with capacity T, and the
release is mu^_t = BinMech.Sum / t. A user changes at most m leaves by at most G grid
units each (the sample range), so the leaf vector moves by at most m G in L1 and the node
scale is eta = m G (1 + floor(log2 T)) / eps (e.g. T = 1024, m = 8, eps = 0.5 gives
eta = 176 per unit of range). The privacy term of the error is linear in m (eq. (1)),
against sqrt(M_t) for Algorithm 6 (``continual_mean``): this is the baseline it improves.

Input per tick: the number of used samples and their unit sum, exactly the ``samples`` /
``sample_sum`` fields of ``continual_mean.TickMessage`` (stage 1 caps users at n and each
user at m samples, and snaps values to the grid of ``continual_mean.to_units``). T is
n m by default, which the caps guarantee; with a smaller declared horizon, a tick that
would overflow it is not used, and is counted (the decision depends on counts only).

Privacy:
    epsilon-DP for user-level neighbours (same arrival pattern, one user's <= m samples
    change): the BinMech's leaf vector moves by at most m G in L1.

References:
    A. George, L. Ramesh, A. V. Singh, H. Tyagi. Continual Mean Estimation Under
    User-Level Privacy. Alg. 1, Alg. 2, eq. (1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..means.continual_mean import DEFAULT_RESOLUTION, MeanRelease
from ..noise import NodeId, NoiseSource, exact_half_width, node_bytes
from ..trees import binary_mechanism as bm

MECHANISM = "naive_mean"


@dataclass(frozen=True, slots=True)
class NaiveMeanSpec:
    """Public parameters of Alg. 2.

    Attributes:
        epsilon: total budget.
        n, m: caps on users and samples per user (enforced by stage 1).
        lower, upper: declared sample range.
        resolution: G, grid units per (upper - lower).
        horizon: T, the most samples ever used (n m by default).
        tree: the BinMech (sensitivity m G, capacity T).
    """

    epsilon: Fraction
    n: int
    m: int
    lower: Fraction
    upper: Fraction
    resolution: int
    horizon: int
    tree: bm.BinMechSpec


@dataclass(frozen=True, slots=True)
class NaiveMeanState:
    """Attributes: tick; count, samples used (t); total, their exact units; dropped."""

    tick: int = 0
    count: int = 0
    total: int = 0
    dropped: int = 0


def make_naive_mean(
    epsilon: float | Fraction,
    n: int,
    m: int,
    *,
    horizon: int | None = None,
    lower: float | Fraction = 0,
    upper: float | Fraction = 1,
    resolution: int = DEFAULT_RESOLUTION,
    node_prefix: NodeId = ("naive_mean", 0),
) -> NaiveMeanSpec:
    """Validate the parameters and build Alg. 2's spec.

    Args:
        epsilon: > 0; a float is read as the decimal it prints as.
        n, m: caps, >= 1.
        horizon: T >= 1, or None for n m.
        lower, upper: declared range, lower < upper.
        resolution: G >= 1.
        node_prefix: public identity of this statistic.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP, user level (module docstring).
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("n", n, 1)
    _validate.check_int_ge("m", m, 1)
    lo = _validate.exact_fraction("lower", lower)
    hi = _validate.exact_fraction("upper", upper)
    if not lo < hi:
        raise _validate.invalid("upper", f"> lower = {lower!r}", upper)
    _validate.check_int_ge("resolution", resolution, 1)
    horizon = n * m if horizon is None else horizon
    _validate.check_int_ge("horizon", horizon, 1)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    tree = bm.make_binary_mechanism(eps, m * resolution, horizon, prefix)
    return NaiveMeanSpec(eps, n, m, lo, hi, resolution, horizon, tree)


def init(spec: NaiveMeanSpec) -> NaiveMeanState:
    """The state before the first tick."""
    return NaiveMeanState()


def step(
    spec: NaiveMeanSpec, state: NaiveMeanState, samples: int, sample_sum: int, noise: NoiseSource
) -> tuple[NaiveMeanState, MeanRelease]:
    """Append the tick's ``samples`` leaves (unit sum ``sample_sum``) and release.

    Args:
        spec: the parameters.
        state: the state after tick t - 1.
        samples: used samples in the tick (public count).
        sample_sum: their grid units.
        noise: the noise source (keyed in production).

    Returns:
        The new state and the release (``active`` is 0, ``medians`` empty).
    """
    if state.count + samples > spec.horizon:
        state = NaiveMeanState(state.tick + 1, state.count, state.total, state.dropped + samples)
    else:
        tree = bm.append(spec.tree, bm.BinMechState(state.count, state.total), samples, sample_sum)
        state = NaiveMeanState(state.tick + 1, tree.count, tree.total, state.dropped)
    return state, release(spec, state, noise)


def release(spec: NaiveMeanSpec, state: NaiveMeanState, noise: NoiseSource) -> MeanRelease:
    """mu^_t = BinMech.Sum / t in [lower, upper] units, with its noise error bars."""
    span = spec.upper - spec.lower
    if state.count == 0:
        return MeanRelease(
            state.tick, float((spec.lower + spec.upper) / 2), 0, 0.0, 0.0, float(span / 2), 0,
            0, state.dropped, (),
        )  # fmt: skip
    rel = bm.release(spec.tree, bm.BinMechState(state.count, state.total), noise)
    denominator = state.count * spec.resolution
    to_value = float(span) / denominator
    return MeanRelease(
        t=state.tick,
        value=float(spec.lower + span * Fraction(rel.value, denominator)),
        total=state.count,
        std=rel.std * to_value,
        ci95=rel.ci95 * to_value,
        mean_ci95=_mean_half_width(spec, state.count) * float(span),
        active=0,
        samples=state.count,
        dropped=state.dropped,
        medians=(),
    )


def _mean_half_width(spec: NaiveMeanSpec, count: int) -> float:
    """Half-width around mu on the [0, 1] scale, as ``continual_mean.MeanRelease.mean_ci95``:
    noise quantile at 0.025 (exact) + Hoeffding at 0.025 + snapping 1/(2G)."""
    scales = [s for _, s, _ in bm.release_nodes(spec.tree, count)]
    noise_half = exact_half_width(scales, 0.025) / (count * spec.resolution)
    return noise_half + math.sqrt(math.log(2 / 0.025) / (2 * count)) + 1 / (2 * spec.resolution)
