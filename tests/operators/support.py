"""Helpers the operator tests share: an exact binomial tail bound, the chi-square survival
function, and the exact output likelihood of tree counters (the privacy sanity checks of
the expiring and round-restart counters). A plain module, so that no test module imports
another."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from types import ModuleType

import numpy as np

from dpstream.operators.noise import NodeId, Term, ZeroNoise


def binomial_upper(n: int, p: float, alpha: float = 1e-6) -> int:
    """The smallest k with P(Bin(n, p) > k) <= alpha (exact sum of the pmf in log space).

    A count of "misses" with miss probability <= p exceeds it with probability <= alpha,
    so asserting ``misses <= binomial_upper(n, p)`` fails a correct mechanism with
    probability <= alpha (and never, given the fixed seed, once it passes).
    """
    if p <= 0:
        return 0
    cumulative = 0.0
    for k in range(n + 1):
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * math.log(p)
            + (n - k) * math.log1p(-p)
        )
        cumulative += math.exp(log_pmf)
        if 1 - cumulative <= alpha:
            return k
    return n


def run(module: ModuleType, spec, weights: Sequence[int], noise) -> tuple[object, list]:
    state, releases = module.init(spec), []
    for w in weights:
        state, rel = module.step(spec, state, w, noise)
        releases.append(rel)
    return state, releases


def values(module: ModuleType, spec, weights: Sequence[int], noise) -> list[int]:
    return [r.value for r in run(module, spec, weights, noise)[1]]


def discrete_laplace_log_pmf(scale: Fraction, support: np.ndarray) -> np.ndarray:
    """ln P(Z = z) of discrete Laplace: ln((1 - p) / (1 + p)) - |z| / b, p = exp(-1/b)."""
    inv = 1 / float(scale)
    return math.log(-math.expm1(-inv)) - math.log1p(math.exp(-inv)) - np.abs(support) * inv


def discrete_laplace_pmf(scale: Fraction, support: np.ndarray) -> np.ndarray:
    return np.exp(discrete_laplace_log_pmf(scale, support))


def _log_convolve(log_h: np.ndarray, grid: np.ndarray, scale: Fraction) -> np.ndarray:
    """ln sum_y pmf(s - y) h(y) for every s on the grid, from ln h, in O(grid) time.

    pmf(s - y) = c exp(-|s - y| / b) splits into y <= s and y > s parts, each a running
    log-sum-exp of ln h(y) +- y / b. Log space because lower-tail outputs put h where
    small scales' pmfs underflow any float.
    """
    inv = 1 / float(scale)
    log_c = math.log(-math.expm1(-inv)) - math.log1p(math.exp(-inv))
    up = grid * inv
    left = np.logaddexp.accumulate(log_h + up)  # y <= s
    right = np.append(np.logaddexp.accumulate((log_h - up)[::-1])[::-1][1:], -np.inf)  # y > s
    return log_c + np.logaddexp(left - up, right + up)


def log_likelihood(observed: Sequence[int], terms_per_step: Sequence[Sequence[Term]]) -> float:
    """ln P(sum of the noises of step t == observed[t-1] for every t), exactly.

    Each release's noise is a sum of independent discrete Laplace node noises, and the
    sets of steps that use a node form a laminar family (dyadic intervals; binary
    mechanism nodes inside a round plus the round's past-total node). So the noise is a
    sum along a root-to-node path of a forest, and the probability of the observed sums
    is an exact sum-product over that forest, one convolution per node (in log space).
    Path sums are kept on the grid [-R, R] with R = max |observed| + 80 * max scale + 10:
    the mass dropped by the truncation is below e^-80 relative, far under the 1e-9
    tolerance of the checks.
    The outputs do NOT determine the node noises (a tree step has more nodes than
    outputs), which is why the latent nodes are summed out rather than read off.
    """
    steps_of: dict[NodeId, set[int]] = {}
    scale_of: dict[NodeId, Fraction] = {}
    for t, terms in enumerate(terms_per_step, start=1):
        if not terms and observed[t - 1] != 0:
            return -math.inf
        for node, scale, sign in terms:
            assert sign in (1, -1)  # discrete Laplace is symmetric: the sign is irrelevant
            steps_of.setdefault(node, set()).add(t)
            assert scale_of.setdefault(node, scale) == scale
    order = sorted(steps_of, key=lambda v: (-len(steps_of[v]), repr(v)))
    parent: dict[NodeId, NodeId | None] = {}
    for idx, v in enumerate(order):
        parent[v] = None
        for w in reversed(order[:idx]):
            if steps_of[v] <= steps_of[w]:
                parent[v] = w  # the smallest superset: its parent in the forest
                break
            assert steps_of[v].isdisjoint(steps_of[w]), "node sets are not laminar"
    deepest = {t: v for v in order for t in steps_of[v]}
    direct: dict[NodeId, list[int]] = {v: [] for v in order}
    for t, v in deepest.items():
        direct[v].append(observed[t - 1])
    if not order:
        return 0.0
    b_max = max(float(s) for s in scale_of.values())
    radius = int(max(abs(n) for n in observed)) + int(80 * b_max) + 10
    grid = np.arange(-radius, radius + 1)
    incoming = {v: np.zeros(grid.size) for v in order}  # log of the children's evidence
    log_total = 0.0
    for v in reversed(order):
        log_h = incoming[v]  # ln h(y): evidence below v given the path sum y through v
        for n in direct[v]:
            log_h = np.where(grid == n, log_h, -np.inf)
        log_message = _log_convolve(log_h, grid, scale_of[v])  # s: path sum above v
        if parent[v] is None:
            log_total += float(log_message[radius])  # no ancestors: s = 0
        else:
            incoming[parent[v]] = incoming[parent[v]] + log_message
    return log_total


def exact_values(module: ModuleType, spec, weights: Sequence[int]) -> list[int]:
    return values(module, spec, weights, ZeroNoise())


def log_likelihood_ratio(
    module: ModuleType, spec, weights: Sequence[int], j: int, delta: int, outputs: Sequence[int]
) -> float:
    """ln P(outputs | weights) - ln P(outputs | weights with x_j += delta), exactly."""
    other = list(weights)
    other[j - 1] += delta
    terms = [module.release_terms(spec, t) for t in range(1, len(weights) + 1)]
    mine = exact_values(module, spec, weights)
    theirs = exact_values(module, spec, other)
    a = log_likelihood([o - e for o, e in zip(outputs, mine, strict=True)], terms)
    b = log_likelihood([o - e for o, e in zip(outputs, theirs, strict=True)], terms)
    return a - b


def tail_outputs(module: ModuleType, spec, weights: Sequence[int], depth: int) -> list[int]:
    """Valid outputs far in the lower tail: every noisy release is exact - depth.

    There each node's density ratio is at its maximum, so the likelihood ratio comes
    close to the cheapest coupling: the adversary's best case.
    """
    exact = exact_values(module, spec, weights)
    return [e - depth if module.release_terms(spec, t) else e for t, e in enumerate(exact, start=1)]


def discrete_laplace_kurtosis_terms(scale: Fraction) -> tuple[float, float]:
    """(variance, fourth cumulant) of discrete Laplace, summed exactly over its support."""
    p = math.exp(-1 / float(scale))
    k = np.arange(1, 4000)
    mass = 2 * (1 - p) / (1 + p) * p**k
    m2, m4 = float(np.sum(mass * k**2)), float(np.sum(mass * k**4))
    return m2, m4 - 3 * m2**2


def sum_kurtosis(scales: Sequence[Fraction]) -> float:
    """Kurtosis E[Y^4] / Var(Y)^2 of a sum of independent discrete Laplace terms."""
    parts = [discrete_laplace_kurtosis_terms(s) for s in scales]
    var = sum(v for v, _ in parts)
    return 3 + sum(c for _, c in parts) / var**2


def regularized_upper_gamma(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a): series below a + 1, Lentz continued fraction above."""
    if x <= 0:
        return 1.0
    log_prefactor = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        denom = a
        while abs(term) > abs(total) * 1e-16:
            denom += 1
            term *= x / denom
            total += term
        return max(0.0, 1 - total * math.exp(log_prefactor))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    frac = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        frac *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_prefactor) * frac


def chi2_sf(x: float, df: int) -> float:
    """Survival function of the chi-square distribution."""
    return regularized_upper_gamma(df / 2, x / 2)
