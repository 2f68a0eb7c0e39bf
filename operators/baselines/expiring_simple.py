"""Continual counting with linear privacy expiration: fresh noise per release, Andersson et al.
(expiration) Alg. 1.

Algorithm 1 of Andersson et al. (Chan et al.'s "Simple Counting Mechanism I"): release t
is S_t + Z_t with one independent Z_t ~ Lap(sensitivity / epsilon) per step, drawn as
discrete Laplace with an exact Fraction scale. The whole output vector has sensitivity
T, yet constant noise suffices once the loss may grow linearly with the item's age:
g(d) = d (Lemma 3.1). The stream is unbounded.

Noise is never stored: the noise of step t has node identity ``(*node_prefix, t)``, so
the keyed production source gives it again on replay.

References:
    J. Andersson, M. Henzinger, R. Pagh, T. A. Steiner, J. Upadhyay. Continual Counting
    with Gradual Privacy Expiration. NeurIPS 2024, arXiv:2406.03802. Algorithm 1,
    Lemma 3.1. T.-H. H. Chan, E. Shi, D. Song. Private and
    continual release of statistics. ACM TISSEC 2011.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import NodeId, NoiseSource, Term, TreeRelease, node_bytes, noise_std, noisy_release
from ..trees.expiring_tree import ceil_float

MECHANISM = "expiring_simple"


@dataclass(frozen=True, slots=True)
class ExpiringSimpleSpec:
    """Public parameters of one Algorithm-1 counter.

    Attributes:
        epsilon: the epsilon of Definition 1.1 (an item d steps old has loss epsilon * d).
        sensitivity: L1 change of the leaf stream between neighbours (one step).
        node_prefix: public identity of this counter; node ids are ``(*node_prefix, t)``.
    """

    epsilon: Fraction
    sensitivity: int
    node_prefix: NodeId


@dataclass(frozen=True, slots=True)
class ExpiringSimpleState:
    """Attributes: t, steps taken; total, the exact prefix sum S_t."""

    t: int = 0
    total: int = 0


def make_expiring_simple(
    epsilon: float | Fraction, sensitivity: int, node_prefix: NodeId
) -> ExpiringSimpleSpec:
    """Validate the parameters and build an ExpiringSimpleSpec.

    Args:
        epsilon: > 0; a float is read as the decimal it prints as.
        sensitivity: int >= 1.
        node_prefix: tuple of str and int fields identifying this counter.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP with expiration g(d) = d for leaf streams differing at one step by at
        most ``sensitivity``: the coupling shifts Z_j..Z_tau, each by at most
        ``sensitivity`` at cost epsilon.

    References:
        Andersson et al. 2024, Algorithm 1 and Lemma 3.1.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    return ExpiringSimpleSpec(epsilon=eps, sensitivity=sensitivity, node_prefix=prefix)


def init(spec: ExpiringSimpleSpec) -> ExpiringSimpleState:
    """The state before the first step (the same for every spec)."""
    return ExpiringSimpleState()


def node_scale(spec: ExpiringSimpleSpec) -> Fraction:
    """Discrete Laplace scale of every step's noise: sensitivity / epsilon."""
    return spec.sensitivity / spec.epsilon


def release_terms(spec: ExpiringSimpleSpec, t: int) -> list[Term]:
    """The single fresh noise node (*node_prefix, t) of the release at step t >= 1."""
    _validate.check_int_ge("t", t, 1)
    return [((*spec.node_prefix, t), node_scale(spec), 1)]


def std(spec: ExpiringSimpleSpec, t: int) -> float:
    """Exact standard deviation of the noise at step t (the same at every step)."""
    return noise_std(release_terms(spec, t))


def max_error_bound(spec: ExpiringSimpleSpec, horizon: int, beta: float) -> float:
    """With probability >= 1 - beta, |Z_t| <= this for all t <= T simultaneously.

    sensitivity * ln(T / beta) / epsilon: the Laplace tail P(|Y| >= s b) = e^-s and a
    union bound over T steps (Andersson et al. (expiration) Sec. 3.1), for continuous Laplace noise.
    """
    _validate.check_int_ge("horizon", horizon, 1)
    _validate.check_probability("beta", beta)
    return float(node_scale(spec)) * math.log(horizon / beta)


def step(
    spec: ExpiringSimpleSpec, state: ExpiringSimpleState, weight: int, noise: NoiseSource
) -> tuple[ExpiringSimpleState, TreeRelease]:
    """Advance one public time step with leaf weight ``weight`` and release S_t + Z_t.

    Args:
        spec: the counter's parameters.
        state: the state after step t - 1.
        weight: the leaf value x_t (clipped/truncated upstream).
        noise: the noise source (keyed in production).

    Returns:
        The new state and the release for step t.

    Privacy:
        epsilon-DP with expiration g(d) = d (see ``privacy_loss``), provided ``noise``
        returns the same value for a node every time it is asked.

    References:
        Andersson et al. 2024, Algorithm 1.
    """
    new_state = ExpiringSimpleState(t=state.t + 1, total=state.total + weight)
    terms = release_terms(spec, new_state.t)
    return new_state, noisy_release(new_state.t, new_state.total, terms, noise)


def expiration(spec: ExpiringSimpleSpec, d: int) -> Fraction:
    """g(d) = d in units of epsilon (Lemma 3.1), for an item d = tau - j + 1 steps old."""
    _validate.check_int_ge("d", d, 1)
    return Fraction(d)


def privacy_loss(spec: ExpiringSimpleSpec, d: int) -> float:
    """epsilon * d: the privacy loss of an item d steps old (rounded up to a float).

    Privacy:
        For neighbours differing at step j by at most ``sensitivity``, releases 1..tau
        change in probability by at most exp(epsilon * (tau - j + 1)).

    References:
        Andersson et al. 2024, Definition 1.1 and Lemma 3.1.
    """
    return ceil_float(spec.epsilon * expiration(spec, d))


def expiration_curve(spec: ExpiringSimpleSpec, d_max: int) -> tuple[float, ...]:
    """Privacy loss for d = 1..d_max (index d - 1)."""
    _validate.check_int_ge("d_max", d_max, 1)
    return tuple(privacy_loss(spec, d) for d in range(1, d_max + 1))
