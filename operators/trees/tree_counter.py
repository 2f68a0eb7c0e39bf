"""Binary tree counter on an infinite stream (Chan, Shi, Song), Dong-Luo-Yi Alg. 2.

Time is cut into periods: period l covers t in [2^l, 2^(l+1) - 1] and runs its own
dyadic tree with l + 1 levels, each level getting epsilon / (l + 1). Periods cover
disjoint time ranges, so the whole infinite stream is epsilon-DP for a leaf stream
whose per-level L1 sensitivity is ``sensitivity`` (tau after truncation,
Dong-Luo-Yi Alg. 3).

Noise is never stored: the noise of node (period, level, index) is drawn from the
NoiseSource under that node's identity, so the production (keyed) source gives the
same value every time it is asked, and a replay never releases a second draw.

References:
    T.-H. H. Chan, E. Shi, D. Song. Private and continual release of statistics.
    ACM TISSEC 2011. Dong-Luo-Yi (IEEE S&P 2023), Alg. 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import (
    NodeId,
    NoiseSource,
    Term,
    TreeRelease,
    discrete_laplace_variance,
    laplace_variance,
    noise_std,
    noisy_release,
)
from . import kary_tree

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "binary_tree"


@dataclass(frozen=True, slots=True)
class BinaryTreeSpec:
    """Public parameters of one tree counter.

    Attributes:
        epsilon: budget of the whole infinite stream.
        sensitivity: L1 change of each level's exact node vector between neighbours.
        node_prefix: public identity of this counter, e.g. (statistic, instance); it
            prefixes every node id so two counters never share noise.
    """

    epsilon: Fraction
    sensitivity: int
    node_prefix: NodeId


@dataclass(frozen=True, slots=True)
class BinaryTreeState:
    """Exact counts only (no noise). Plain data: serializable as it is.

    Attributes:
        t: number of time steps taken so far.
        alpha: exact node counts alpha_0..alpha_l of the current period; empty right
            after a period completed (its top node moved to ``period_totals``).
        period_totals: exact totals P_0..P_(l-1) of the completed periods.
    """

    t: int = 0
    alpha: tuple[int, ...] = ()
    period_totals: tuple[int, ...] = ()


def make_binary_tree(
    epsilon: float | Fraction, sensitivity: int, node_prefix: NodeId
) -> BinaryTreeSpec:
    """Validate the parameters and build a BinaryTreeSpec.

    Privacy:
        epsilon-DP for neighbouring leaf streams whose node vectors differ by at most
        ``sensitivity`` in L1 per level: node noise Lap((l + 1) * sensitivity / epsilon),
        drawn as discrete Laplace (two-sided geometric) since counts are integers.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    return BinaryTreeSpec(epsilon=eps, sensitivity=sensitivity, node_prefix=tuple(node_prefix))


def init(spec: BinaryTreeSpec) -> BinaryTreeState:
    return BinaryTreeState()


def period_of(t: int) -> tuple[int, int]:
    """(l, k): step t >= 1 is the k-th step (1-based) of period l = floor(log2 t): the
    k-ary tree's periods for k = 2."""
    return kary_tree.period_of(2, t)


def node_scale(spec: BinaryTreeSpec, period: int) -> Fraction:
    """Laplace scale of every node of ``period``: (l + 1) * sensitivity / epsilon."""
    return Fraction((period + 1) * spec.sensitivity) / spec.epsilon


def release_nodes(spec: BinaryTreeSpec, t: int) -> list[Term]:
    """The noisy nodes whose sum is the release at step t, with their scales (public).

    floor(log2 t) completed-period totals, then popcount(k) live nodes of the current
    period (none when t closes its period: the top node is then that period's total).
    Node identity is (*node_prefix, period, level, index); a period total is the top
    node (p, p, 0) of its period, the same node that was live when it completed.
    """
    period, k = period_of(t)
    completed = period + 1 if k == 1 << period else period
    nodes = [((*spec.node_prefix, p, p, 0), node_scale(spec, p), 1) for p in range(completed)]
    if completed == period:
        scale = node_scale(spec, period)
        for level in range(period, -1, -1):
            if k >> level & 1:
                nodes.append(((*spec.node_prefix, period, level, (k >> level) - 1), scale, 1))
    return nodes


def std(spec: BinaryTreeSpec, t: int) -> float:
    """Exact standard deviation of the release at step t."""
    return noise_std(release_nodes(spec, t))


def variance(spec: BinaryTreeSpec, t: int, continuous: bool = False) -> float:
    """Exact variance of the release at step t: discrete Laplace (what releases carry) or,
    with ``continuous``, the paper's 2b^2 per node."""
    var = laplace_variance if continuous else discrete_laplace_variance
    return sum(var(scale) for _, scale, _ in release_nodes(spec, t))


def mse(spec: BinaryTreeSpec, horizon: int, continuous: bool = False) -> float:
    """Exact mean squared error over steps 1..horizon, in O(log horizon) operations.

    The release is unbiased for the truncated count, so its MSE is the mean variance. At
    local step k of period l the release uses the totals of periods p < l and popcount(k)
    nodes of scale b_l (at k = 2^l, one node: the period's own total, also of scale b_l).
    """
    _validate.check_int_ge("horizon", horizon, 1)
    var = laplace_variance if continuous else discrete_laplace_variance
    total, completed = 0.0, 0.0
    period = 0
    while (1 << period) <= horizon:
        steps = min(horizon, (2 << period) - 1) - (1 << period) + 1
        v = var(node_scale(spec, period))
        total += steps * completed + v * popcount_sum(steps)
        completed += v
        period += 1
    return total / horizon


def popcount_sum(n: int) -> int:
    """sum of popcount(k) for k = 1..n, bit by bit."""
    total, bit = 0, 0
    while (1 << bit) <= n:
        cycle = 2 << bit
        total += (n + 1) // cycle * (1 << bit) + max(0, (n + 1) % cycle - (1 << bit))
        bit += 1
    return total


def step(
    spec: BinaryTreeSpec, state: BinaryTreeState, weight: int, noise: NoiseSource
) -> tuple[BinaryTreeState, TreeRelease]:
    """Advance one public time step with leaf weight ``weight`` (0 on an empty tick).

    Alg. 2: the node completing at step k sits at level i = lsb(k) and holds the EXACT
    sum of its children plus this leaf (never noisy children).
    """
    t = state.t + 1
    period, k = period_of(t)
    alpha = list(state.alpha) if state.alpha else [0] * (period + 1)
    level = (k & -k).bit_length() - 1
    alpha[level] = sum(alpha[:level]) + weight
    alpha[:level] = [0] * level
    totals = state.period_totals
    if k == 1 << period:
        totals, alpha = (*totals, alpha[period]), []
    new_state = BinaryTreeState(t=t, alpha=tuple(alpha), period_totals=totals)
    return new_state, _release(spec, new_state, noise)


def exact_value(state: BinaryTreeState) -> int:
    """The exact (truncated) running count the tree holds: sum of its live exact nodes."""
    _, k = period_of(state.t) if state.t else (0, 0)
    live = sum(a for level, a in enumerate(state.alpha) if k >> level & 1)
    return sum(state.period_totals) + live


def _release(spec: BinaryTreeSpec, state: BinaryTreeState, noise: NoiseSource) -> TreeRelease:
    return noisy_release(state.t, exact_value(state), release_nodes(spec, state.t), noise)
