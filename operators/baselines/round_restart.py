"""Round-restarted binary mechanism with budget refresh: the baseline of Andersson et al.
(expiration) (Sec. 6).

The stream is cut into rounds of W steps; round k covers [(k - 1) W + 1, k W]. Inside a
round a fresh binary mechanism (Chan et al.) with h = ceil(log2(W + 1)) levels counts the
round's items: local step i creates one noisy node at level nu2(i) (the exact sum of the
last 2^nu2(i) local leaves) with noise Lap(h * sensitivity / epsilon), and releases the
sum of the popcount(i) nodes of the bits of i. From round 2 on, every release also adds
P_k = S_((k-1) W) + Lap(sensitivity / past_epsilon), the noisy total of all earlier
rounds, drawn ONCE per round with fresh noise: that is the "budget refresh" that makes
the loss of an old item grow linearly with the number of rounds it has lived through.
Noise is discrete Laplace with exact Fraction scales; the stream is unbounded.

Noise is never stored: node identities are ``(*node_prefix, "bm", k, m, q)`` for the
binary-mechanism node of round k covering local steps [q 2^m + 1, (q + 1) 2^m] (q is
even: only those nodes are ever created) and ``(*node_prefix, "past", k)`` for P_k.

References:
    J. Andersson, M. Henzinger, R. Pagh, T. A. Steiner, J. Upadhyay. Continual Counting
    with Gradual Privacy Expiration. NeurIPS 2024, arXiv:2406.03802. Section 6 and
    Appendix A.1 (baseline), Table 1; our readings of the baseline in docs/papers.md.
    T.-H. H. Chan, E. Shi, D. Song. Private and continual release of statistics. ACM
    TISSEC 2011 (binary mechanism).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import _validate
from ..noise import (
    NodeId,
    NoiseSource,
    Term,
    TreeRelease,
    discrete_laplace_variance,
    laplace_variance,
    node_bytes,
    noise_std,
    noisy_release,
)
from ..trees.expiring_tree import ceil_float
from ..trees.tree_counter import popcount_sum

MECHANISM = "round_restart"

PAST_FRACTION = Fraction(1, 10)
"""Default past_epsilon / epsilon, the paper's experimental choice (Andersson et al. (expiration)
Sec. 6)."""


@dataclass(frozen=True, slots=True)
class RoundRestartSpec:
    """Public parameters of one round-restarted counter.

    Attributes:
        epsilon: epsilon_cur, the budget of the binary mechanism inside one round.
        sensitivity: L1 change of the leaf stream between neighbours (one step).
        node_prefix: public identity of this counter; it prefixes every node id.
        window: W, the round length (2^h - 1 uses every level fully).
        past_epsilon: epsilon_past, the budget of each round's noisy past total.
    """

    epsilon: Fraction
    sensitivity: int
    node_prefix: NodeId
    window: int
    past_epsilon: Fraction


@dataclass(frozen=True, slots=True)
class RoundRestartState:
    """Attributes: t, steps taken; total, the exact prefix sum S_t.

    The exact parts of the nodes a release uses sum to S_t (past total plus this round's
    prefix), so nothing else needs keeping; the noise is re-derived from node ids.
    """

    t: int = 0
    total: int = 0


def make_round_restart(
    epsilon: float | Fraction,
    sensitivity: int,
    node_prefix: NodeId,
    window: int,
    past_epsilon: float | Fraction | None = None,
) -> RoundRestartSpec:
    """Validate the parameters and build a RoundRestartSpec.

    Args:
        epsilon: epsilon_cur > 0; a float is read as the decimal it prints as.
        sensitivity: int >= 1.
        node_prefix: tuple of str and int fields identifying this counter.
        window: W, int >= 1.
        past_epsilon: epsilon_past > 0; None means epsilon / 10 as in the paper.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP with expiration (absolute loss, not a multiple of one epsilon): an item
        at local step p of its round, d steps old, loses (epsilon / h) times the number of
        its released binary-mechanism nodes (at most h, so at most epsilon) plus
        past_epsilon per later round started, floor((p + d - 2) / W); at most
        epsilon + ceil((d - 1) / W) * past_epsilon. See ``privacy_loss``.

    References:
        Andersson et al. 2024, Section 6 / Appendix A.1.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    _validate.check_int_ge("window", window, 1)
    if past_epsilon is None:
        past = eps * PAST_FRACTION
    else:
        past = _validate.exact_fraction("past_epsilon", past_epsilon)
        _validate.check_positive("past_epsilon", past)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    return RoundRestartSpec(
        epsilon=eps, sensitivity=sensitivity, node_prefix=prefix, window=window, past_epsilon=past
    )


def init(spec: RoundRestartSpec) -> RoundRestartState:
    """The state before the first step (the same for every spec)."""
    return RoundRestartState()


def levels(spec: RoundRestartSpec) -> int:
    """h = ceil(log2(W + 1)), the number of binary-mechanism levels in a round."""
    return spec.window.bit_length()


def bm_scale(spec: RoundRestartSpec) -> Fraction:
    """Scale of every binary-mechanism node: h * sensitivity / epsilon_cur, h = ceil(log2(W +
    1))."""
    return levels(spec) * spec.sensitivity / spec.epsilon


def past_scale(spec: RoundRestartSpec) -> Fraction:
    """Scale of each round's past-total noise: sensitivity / epsilon_past."""
    return spec.sensitivity / spec.past_epsilon


def round_of(spec: RoundRestartSpec, t: int) -> tuple[int, int]:
    """(k, i): step t >= 1 is local step i (1-based) of round k (1-based)."""
    _validate.check_int_ge("t", t, 1)
    k = (t - 1) // spec.window + 1
    return k, t - (k - 1) * spec.window


def release_terms(spec: RoundRestartSpec, t: int) -> list[Term]:
    """The noisy nodes whose sum is the noise of the release at step t (public).

    P_k's node from round 2 on, then one binary-mechanism node per set bit m of the local
    step i (highest first): the node covering local [i - (i mod 2^m) - 2^m + 1, ...].

    Args:
        spec: the counter's parameters.
        t: step >= 1.

    Returns:
        (node id, scale, +1) terms.
    """
    k, i = round_of(spec, t)
    terms: list[Term] = []
    if k >= 2:
        terms.append(((*spec.node_prefix, "past", k), past_scale(spec), 1))
    scale = bm_scale(spec)
    for m in range(i.bit_length() - 1, -1, -1):
        if i >> m & 1:
            terms.append(((*spec.node_prefix, "bm", k, m, (i >> m) - 1), scale, 1))
    return terms


def std(spec: RoundRestartSpec, t: int) -> float:
    """Exact standard deviation of the noise of the release at step t (discrete Laplace)."""
    return noise_std(release_terms(spec, t))


def step(
    spec: RoundRestartSpec, state: RoundRestartState, weight: int, noise: NoiseSource
) -> tuple[RoundRestartState, TreeRelease]:
    """Advance one public time step with leaf weight ``weight`` and release.

    Args:
        spec: the counter's parameters.
        state: the state after step t - 1.
        weight: the leaf value x_t (clipped/truncated upstream).
        noise: the noise source (keyed in production).

    Returns:
        The new state and the release for step t: S_t plus the noise of
        ``release_terms(spec, t)``.

    Privacy:
        See ``privacy_loss``; requires ``noise`` to return the same value for a node
        every time it is asked (P_k must not be redrawn within its round).

    References:
        Andersson et al. (expiration), Section 6 / Appendix A.1.
    """
    new_state = RoundRestartState(t=state.t + 1, total=state.total + weight)
    terms = release_terms(spec, new_state.t)
    return new_state, noisy_release(new_state.t, new_state.total, terms, noise)


def mean_noise_variance(spec: RoundRestartSpec, horizon: int, *, continuous: bool = False) -> float:
    """(1 / T) * sum_{t=1..T} Var(noise_t), the MSE the paper calibrates to 1000.

    (1/T) [sum_t popcount(i_t) Var(bm) + max(0, T - W) Var(past)]: the first round has
    no past-total noise (Andersson et al. (expiration) Sec. 6, App. A.2).

    Args:
        spec: the counter's parameters.
        horizon: T >= 1.
        continuous: use the continuous Laplace variance 2 b^2 as the paper does.

    Returns:
        The mean variance.
    """
    _validate.check_int_ge("horizon", horizon, 1)
    var = laplace_variance if continuous else discrete_laplace_variance
    full, rest = divmod(horizon, spec.window)
    bits = full * popcount_sum(spec.window) + popcount_sum(rest)
    past_steps = max(0, horizon - spec.window)
    return (bits * var(bm_scale(spec)) + past_steps * var(past_scale(spec))) / horizon


def item_loss(spec: RoundRestartSpec, j: int, tau: int) -> Fraction:
    """Exact loss of the item at step j for the releases 1..tau (our derivation for the baseline
    of Andersson et al. (expiration) Sec. 6).

    (epsilon / h) * #{binary-mechanism nodes containing j released by tau}
    + epsilon_past * #{rounds k after j's round with (k - 1) W + 1 <= tau}.

    Args:
        spec: the counter's parameters.
        j: the item's step, >= 1.
        tau: the last release, >= j.

    Returns:
        The loss (absolute, not in units of epsilon).
    """
    _validate.check_int_ge("j", j, 1)
    _validate.check_int_ge("tau", tau, j)
    _, p = round_of(spec, j)
    d = tau - j + 1
    bm_nodes = sum(
        1
        for m in range(levels(spec))
        if ((p - 1) >> m) % 2 == 0
        and (end := (((p - 1) >> m) + 1) << m) <= spec.window
        and end - p <= d - 1
    )
    later_rounds = (p + d - 2) // spec.window
    return spec.epsilon / levels(spec) * bm_nodes + spec.past_epsilon * later_rounds


def privacy_loss(spec: RoundRestartSpec, d: int) -> float:
    """max over j of ``item_loss(spec, j, j + d - 1)``: the loss of an item d steps old.

    The loss depends on j only through its local step p, so the maximum runs over
    p = 1..W (vectorised, O(W log W)). Non-decreasing in d. Rounded up to a float.

    Args:
        spec: the counter's parameters.
        d: elapsed time >= 1, d = tau - j + 1.

    Returns:
        The loss.

    Privacy:
        For neighbours differing at step j by at most ``sensitivity``, releases 1..tau
        change in probability by at most exp(privacy_loss(spec, tau - j + 1)): the
        coupling shifts the binary-mechanism nodes containing j that were released by
        tau and every later P_k.

    References:
        Andersson et al. (expiration) Sec. 6, App. A.1: the baseline's loss is the exact
        formula, maximised over j.
    """
    _validate.check_int_ge("d", d, 1)
    p = np.arange(1, spec.window + 1, dtype=np.int64)
    bm_nodes = np.zeros_like(p)
    for m in range(levels(spec)):
        block = (p - 1) >> m
        end = (block + 1) << m
        bm_nodes += (block % 2 == 0) & (end <= spec.window) & (end - p <= d - 1)
    later_rounds = (p + d - 2) // spec.window
    pairs = set(zip(bm_nodes.tolist(), later_rounds.tolist(), strict=True))
    per_node = spec.epsilon / levels(spec)
    return ceil_float(max(per_node * n + spec.past_epsilon * r for n, r in pairs))


def expiration_curve(spec: RoundRestartSpec, d_max: int) -> tuple[float, ...]:
    """Privacy loss for d = 1..d_max (index d - 1)."""
    _validate.check_int_ge("d_max", d_max, 1)
    return tuple(privacy_loss(spec, d) for d in range(1, d_max + 1))


def nominal_loss_bound(spec: RoundRestartSpec, d: int) -> float:
    """epsilon + ceil((d - 1) / W) * epsilon_past >= privacy_loss(spec, d) (Sec. 6)."""
    _validate.check_int_ge("d", d, 1)
    return ceil_float(spec.epsilon + -(-(d - 1) // spec.window) * spec.past_epsilon)
