"""The binary mechanism with a declared capacity: "BinMech" of George et al. (Alg. 1).

Leaves x_1, x_2, ... (integer grid units) are appended a few at a time; after k leaves the
release is S_k = sum of the ``popcount(k)`` noisy dyadic nodes of the binary decomposition
of k (only the SET bits of k: our correction of Alg. 1). The node ending at leaf index ``i`` is the
paper's ``NPS[i]``: it covers leaves ``i - 2^j + 1 .. i`` with ``j`` the lowest set bit of
i, and it carries discrete Laplace noise of scale ``eta = sensitivity * depth / epsilon``
with ``depth = 1 + floor(log2 capacity)``. Example: S_7 = NPS[4] + NPS[6] + NPS[7].

**State (k, exact total).** The exact parts of the nodes of the decomposition of k sum to
the exact prefix x_1 + ... + x_k, so the release is that total plus the nodes' noise, and
the state needs nothing else (as in ``baselines.round_restart``). Noise is never stored: node i has
the identity ``(*node_prefix, i)`` and a keyed NoiseSource re-derives the same draw at
every release that uses it and after any replay. A node id always names the same leaves,
so it never carries two different quantities.

**Several leaves per call.** ``append`` adds ``count`` leaves whose values sum to
``total``; their order inside the call is irrelevant to every release (releases only use
the exact prefix totals at call boundaries). For privacy, fix any order that depends on
the multiset of the call's leaves only (e.g. ascending): sorting is 1-Lipschitz in L1,
so if neighbours change the leaf vector by at most ``sensitivity`` in L1, the sorted
vectors too, and so does every tree level's node vector (its nodes are disjoint blocks).

Privacy:
    Neighbouring leaf streams (same number of leaves per call) whose leaf vectors differ by
    at most ``sensitivity`` in L1. Each of the ``depth`` tree levels of the (at most
    ``capacity``-leaf) tree changes by at most ``sensitivity`` in L1, so the whole node
    vector by at most ``sensitivity * depth``, and node noise Lap(eta) makes it
    epsilon-DP (Laplace mechanism, George et al. Lemma 2.4); releases are post-processing.
    ``depth`` is the exact number of levels, ``ceil(log2(capacity + 1))``; the paper
    writes ``1 + log T`` with a real log, which is never smaller.

References:
    T.-H. H. Chan, E. Shi, D. Song. Private and continual release of statistics. ACM
    TISSEC 2011. C. Dwork, M. Naor, T. Pitassi, G. Rothblum. Differential privacy under
    continual observation. STOC 2010. George et al. (A. J. George, L. Ramesh, A. V. Singh, H. Tyagi,
    "Continual Mean Estimation Under User-Level Privacy", arXiv:2212.09980), Alg. 1.
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
    node_bytes,
    noise_std,
    noisy_release,
)

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "binary_mechanism"


@dataclass(frozen=True, slots=True)
class BinMechSpec:
    """Public parameters of one BinMech.

    Attributes:
        epsilon: budget of the whole (at most ``capacity``-leaf) stream.
        sensitivity: L1 distance between neighbouring leaf vectors, in grid units.
        capacity: the largest number of leaves ever appended (T in Alg. 1 and 2, n per
            level in Alg. 5 and 6).
        node_prefix: public identity of this BinMech; node i is ``(*node_prefix, i)``.
        depth: 1 + floor(log2 capacity), the number of nodes a leaf can lie in.
        scale: eta = sensitivity * depth / epsilon, the discrete Laplace scale of a node.
    """

    epsilon: Fraction
    sensitivity: int
    capacity: int
    node_prefix: NodeId
    depth: int
    scale: Fraction


@dataclass(frozen=True, slots=True)
class BinMechState:
    """Attributes: count, the number of leaves k; total, their exact sum (grid units)."""

    count: int = 0
    total: int = 0


def make_binary_mechanism(
    epsilon: float | Fraction, sensitivity: int, capacity: int, node_prefix: NodeId
) -> BinMechSpec:
    """Validate the parameters and build a BinMechSpec.

    Args:
        epsilon: > 0; a float is read as the decimal it prints as.
        sensitivity: int >= 1, the L1 change of the leaf vector between neighbours.
        capacity: int >= 1, the most leaves this BinMech will hold.
        node_prefix: tuple of str and int fields identifying this BinMech.

    Returns:
        The spec, with ``scale = sensitivity * (1 + floor(log2 capacity)) / epsilon``.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP, see the module docstring.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    _validate.check_int_ge("capacity", capacity, 1)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    depth = capacity.bit_length()
    return BinMechSpec(
        epsilon=eps,
        sensitivity=sensitivity,
        capacity=capacity,
        node_prefix=prefix,
        depth=depth,
        scale=Fraction(sensitivity * depth) / eps,
    )


def init(spec: BinMechSpec) -> BinMechState:
    """The empty BinMech (its Sum is 0 and uses no noise)."""
    return BinMechState()


def append(spec: BinMechSpec, state: BinMechState, count: int, total: int) -> BinMechState:
    """Append ``count`` leaves whose exact values sum to ``total`` (grid units).

    Args:
        spec: the BinMech's parameters.
        state: the state before.
        count: number of leaves, >= 0.
        total: their exact sum.

    Returns:
        The new state.

    Raises:
        ValueError: the capacity would be exceeded. Callers enforce their caps on public
            counts before appending (George et al.'s caps n and m), so this is a wiring error.
    """
    if count < 0 or state.count + count > spec.capacity:
        raise ValueError(
            f"count must keep the BinMech within capacity {spec.capacity}, "
            f"got {count} leaves after {state.count}"
        )
    return BinMechState(count=state.count + count, total=state.total + total)


def release_nodes(spec: BinMechSpec, count: int) -> list[Term]:
    """The nodes NPS[index_j] summed by S_k, k = ``count``, set bits high to low (public).

    index_j is k with all bits below j cleared; an empty BinMech uses no node.
    """
    terms: list[Term] = []
    for j in range(count.bit_length() - 1, -1, -1):
        if count >> j & 1:
            terms.append(((*spec.node_prefix, count >> j << j), spec.scale, 1))
    return terms


def release(spec: BinMechSpec, state: BinMechState, noise: NoiseSource) -> TreeRelease:
    """S_k: the exact total plus the noise of the popcount(k) nodes, with its error bar.

    The release's ``t`` is the number of leaves k.
    """
    return noisy_release(state.count, state.total, release_nodes(spec, state.count), noise)


def variance(spec: BinMechSpec, count: int, continuous: bool = False) -> float:
    """Exact noise variance of S_k: popcount(k) * V(eta), V the discrete Laplace variance
    (or the paper's continuous 2 eta^2 with ``continuous``)."""
    var = laplace_variance if continuous else discrete_laplace_variance
    return count.bit_count() * var(spec.scale) if count else 0.0


def std(spec: BinMechSpec, count: int) -> float:
    """Exact standard deviation of the noise of S_k."""
    return noise_std(release_nodes(spec, count))


def nodes_containing(spec: BinMechSpec, leaf: int) -> list[int]:
    """Indices i of the nodes NPS[i] (up to ``capacity``) that contain leaf ``leaf``.

    Property (i) of Alg. 1: at most ``depth`` of them (leaf 1 of T = 8: 1, 2, 4, 8).
    """
    _validate.check_int_ge("leaf", leaf, 1)
    out = []
    for j in range(spec.depth):
        end = -(-leaf >> j) << j  # the level-j dyadic block holding the leaf ends here
        # NPS[end] exists only if its lowest set bit is j (NPS[4] is [1, 4], never [3, 4]).
        if end <= spec.capacity and (end & -end) == 1 << j:
            out.append(end)
    return out
