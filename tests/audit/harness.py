"""An empirical privacy audit, in the spirit of StatDP (Ding et al. 2018) and DP-Sniper
(Bichsel et al. 2021).

A mechanism M is run many times on two neighbouring inputs x (with one user) and x'
(without). For an output event E, DP promises P[M(x) in E] <= e^eps P[M(x') in E] (and the
same with x, x' swapped). The audit looks for the event with the largest ratio and bounds
that ratio from below, with a stated confidence:

1. **Samples.** n outputs of M(x) and n of M(x'), each run with fresh noise from a seeded
   source (``operators.noise.SeededNoise``), memoized per node within a run
   (``per_run_noise``) so a node asked twice in one run gives the same value, exactly
   as the keyed production source does; across runs the draws are independent, so a run
   has the output distribution of the keyed mechanism under a uniformly random key.
2. **Features.** An output is the vector of releases r_1..r_T. The features are every
   difference r_b - r_a (0 <= a < b <= T, r_0 = 0): for tree counters these isolate the
   noisy nodes (and node combinations) that a user's events shift.
3. **Event search on one half.** On the first half of each sample set, a greedy search
   builds a box event E = AND_i (s_i * f_i >= c_i), adding the conjunct that most raises a
   conservative score (Wilson bounds: log of the lower bound of P(E|x) over the upper
   bound of P(E|x')), in both orientations (x over x', x' over x).
4. **Estimate on the other half.** The chosen event is counted on the held-out halves, so
   the choice does not bias the estimate: with k_x of m and k_y of m, Clopper-Pearson
   bounds give p_lo <= P(E|x) and q_hi >= P(E|x') each with probability 1 - alpha/2, so

       P[ eps_lo = ln(p_lo / q_hi) > the true ln(P(E|x) / P(E|x')) ] <= alpha,

   and if M is eps-DP then eps_lo <= eps except with probability alpha.

**What it can detect.** With m held-out samples per input and an event of probabilities
p > q, eps_lo is about ln(p/q) - z (sqrt((1-p)/(m p)) + sqrt((1-q)/(m q))), z the
1 - alpha/2 normal quantile (``detectable_gap``). A mechanism whose worst event has loss
eps + gap is caught once gap exceeds that width (plus what the search misses of the worst
event). Seeds are fixed, so each test is deterministic; alpha says how rarely a correct
mechanism would fail over random seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpstream.operators.noise import NodeId, NoiseSource, RecordingNoise, SeededNoise
from tests.noise_doubles import MemoNoise, NodeNoise

# ---------------------------------------------------------------------------------------
# Noise for audit runs


def per_run_noise(seed: int, scale_factor: Fraction = Fraction(1)) -> MemoNoise:
    """Seeded noise, one draw per (node, scale) per run: a keyed source with a fresh key.

    ``new_run()`` forgets the drawn nodes; the underlying generator keeps going, so runs
    are independent and the whole sample is reproducible from the seed. A ``scale_factor``
    of 1/2 gives the deliberately broken mechanism: every node's noise scale halved.
    """
    seeded = SeededNoise(seed)
    return MemoNoise(lambda node, scale: seeded.discrete_laplace(node, scale * scale_factor))


Mechanism = Callable[[NoiseSource], Sequence[int]]
"""One run of a mechanism on a fixed input: noise source in, vector of releases out."""


def sample(mechanism: Mechanism, n: int, seed: int, broken: bool = False) -> np.ndarray:
    """n independent runs (rows) of ``mechanism``; ``broken`` halves every noise scale."""
    noise = per_run_noise(seed, Fraction(1, 2) if broken else Fraction(1))
    rows = []
    for _ in range(n):
        noise.new_run()
        rows.append(mechanism(noise))
    return np.asarray(rows, dtype=np.int64)


@dataclass(frozen=True)
class Linear:
    """A tree counter on a fixed input, as the real code computes it: the release vector is
    ``exact + A @ z`` for the noise z of ``nodes`` (node identity, scale)."""

    exact: np.ndarray
    nodes: list[tuple[NodeId, Fraction]]
    matrix: np.ndarray

    def sample(self, n: int, seed: int, broken: bool = False) -> np.ndarray:
        """n runs: each node's noise drawn once per run by ``SeededNoise`` at its scale
        (halved if ``broken``), then combined exactly as the mechanism combines it."""
        source = SeededNoise(seed)
        factor = Fraction(1, 2) if broken else Fraction(1)
        z = np.array(
            [
                [source.discrete_laplace(node, scale * factor) for node, scale in self.nodes]
                for _ in range(n)
            ],
            dtype=np.int64,
        ).reshape(n, len(self.nodes))
        return self.exact[None, :] + z @ self.matrix.T


def linearize(mechanism: Mechanism, checks: int = 200, seed: int = 0) -> Linear:
    """Read off the nodes each release adds (with their signs) by running the real code
    with probe noise, then check ``exact + A @ z`` against ``checks`` real seeded runs.

    A tree counter's release is ``exact + sum(sign * noise(node))`` over a public set of
    nodes (``operators.release.noisy_release``), so this is exact; the checks make sure.
    """
    probe = RecordingNoise(NodeNoise(0))
    exact = np.asarray(mechanism(probe), dtype=np.int64)
    nodes = list(dict.fromkeys((node, scale) for node, scale, _ in probe.calls))
    matrix = np.zeros((len(exact), len(nodes)), dtype=np.int64)
    for i, key in enumerate(nodes):
        unit = NodeNoise(lambda node, scale, key=key: int((node, scale) == key))
        out = np.asarray(mechanism(unit), dtype=np.int64)
        matrix[:, i] = out - exact
    noise = per_run_noise(seed)
    for _ in range(checks):
        noise.new_run()
        real = np.asarray(mechanism(noise), dtype=np.int64)
        z = np.array([noise.discrete_laplace(node, scale) for node, scale in nodes])
        assert set(noise.drawn) == set(nodes), "the mechanism asked for other nodes"
        assert np.array_equal(real, exact + matrix @ z), "the release is not exact + A z"
    return Linear(exact, nodes, matrix)


def difference_features(outputs: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Every r_b - r_a, 0 <= a < b <= T (r_0 = 0), as columns; and the (a, b) of each."""
    n, t = outputs.shape
    padded = np.concatenate([np.zeros((n, 1), dtype=np.int64), outputs], axis=1)
    pairs = [(a, b) for b in range(1, t + 1) for a in range(b)]
    cols = np.stack([padded[:, b] - padded[:, a] for a, b in pairs], axis=1)
    return cols, pairs


# ---------------------------------------------------------------------------------------
# Binomial confidence bounds


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError("incomplete beta: no convergence")


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def beta_quantile(q: float, a: float, b: float) -> float:
    """x with I_x(a, b) = q, by bisection (the CDF is increasing)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if beta_cdf(mid, a, b) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided 1 - alpha interval for a binomial proportion (alpha/2 per side)."""
    lo = 0.0 if k == 0 else beta_quantile(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else beta_quantile(1 - alpha / 2, k + 1, n - k)
    return lo, hi


def _wilson(k: np.ndarray, n: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return center - half, center + half


def normal_quantile(p: float) -> float:
    """Inverse standard normal CDF by bisection on erf (accurate enough for bounds' widths)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def detectable_gap(p: float, q: float, m: int, alpha: float) -> float:
    """Roughly how far eps_lo falls below the true ln(p/q) with m held-out samples each."""
    z = normal_quantile(1 - alpha / 2)
    return z * (math.sqrt((1 - p) / (m * p)) + math.sqrt((1 - q) / (m * q)))


# ---------------------------------------------------------------------------------------
# Event search and estimate


Conjunct = tuple[int, int, int]  # (feature column, sign +1/-1, threshold): sign * f >= c


def _apply(features: np.ndarray, conjuncts: Sequence[Conjunct]) -> np.ndarray:
    mask = np.ones(len(features), dtype=bool)
    for col, sign, c in conjuncts:
        mask &= sign * features[:, col] >= c
    return mask


def search_event(
    num: np.ndarray, den: np.ndarray, max_conjuncts: int = 4, z: float = 2.0
) -> tuple[list[Conjunct], float]:
    """Greedy box event maximizing ln(wilson_lo P(E|num) / wilson_hi P(E|den)).

    Args:
        num, den: feature matrices (runs x features) of the selection halves.
        max_conjuncts: at most this many conditions.
        z: the Wilson bounds' z; it penalizes events too rare to estimate.

    Returns:
        The conjuncts and their selection score.
    """
    n_num, n_den = len(num), len(den)
    mask_num = np.ones(n_num, dtype=bool)
    mask_den = np.ones(n_den, dtype=bool)
    conjuncts: list[Conjunct] = []
    current = -math.inf
    for _ in range(max_conjuncts):
        best: tuple[float, Conjunct] | None = None
        for col in range(num.shape[1]):
            for sign in (1, -1):
                va = np.sort(sign * num[mask_num, col])
                vb = np.sort(sign * den[mask_den, col])
                cands = np.unique(np.concatenate([va, vb]))
                ka = len(va) - np.searchsorted(va, cands, side="left")
                kb = len(vb) - np.searchsorted(vb, cands, side="left")
                lo_a, _ = _wilson(ka.astype(float), n_num, z)
                _, hi_b = _wilson(kb.astype(float), n_den, z)
                with np.errstate(divide="ignore"):
                    scores = np.log(np.maximum(lo_a, 1e-300)) - np.log(hi_b)
                i = int(np.argmax(scores))
                if best is None or scores[i] > best[0]:
                    best = (float(scores[i]), (col, sign, int(cands[i])))
        assert best is not None
        if best[0] <= current + 1e-9:
            break
        current = best[0]
        conjuncts.append(best[1])
        col, sign, c = best[1]
        mask_num &= sign * num[:, col] >= c
        mask_den &= sign * den[:, col] >= c
    return conjuncts, current


@dataclass(frozen=True)
class AuditResult:
    """The worst event found and its held-out estimate.

    Attributes:
        eps_lo: Clopper-Pearson lower confidence bound (1 - alpha) on the event's loss.
        eps_hat: the point estimate ln(k_num / k_den) on the held-out halves.
        event: human-readable conditions, e.g. "r4-r3 >= 2 & r7-r3 >= 1".
        orientation: "x/x'" (the stream with the user in the numerator) or "x'/x".
        k_num, k_den, m: held-out counts and the held-out sample size per input.
        gap: ``detectable_gap`` for this event's probabilities.
    """

    eps_lo: float
    eps_hat: float
    event: str
    orientation: str
    k_num: int
    k_den: int
    m: int
    gap: float

    def __str__(self) -> str:
        return (
            f"eps_lo={self.eps_lo:.3f} eps_hat={self.eps_hat:.3f} [{self.orientation}] "
            f"{self.event}: {self.k_num}/{self.m} vs {self.k_den}/{self.m} "
            f"(detectable gap ~{self.gap:.3f})"
        )


def audit(
    with_user: np.ndarray,
    without_user: np.ndarray,
    alpha: float = 1e-3,
    max_conjuncts: int = 4,
    z: float = 4.0,
) -> AuditResult:
    """Search an event on the first halves, estimate its loss on the second halves."""
    fx, pairs = difference_features(with_user)
    fy, _ = difference_features(without_user)
    hx, hy = len(fx) // 2, len(fy) // 2
    m = min(len(fx) - hx, len(fy) - hy)
    best = None
    for name, num_sel, den_sel, num_eval, den_eval in (
        ("x/x'", fx[:hx], fy[:hy], fx[hx : hx + m], fy[hy : hy + m]),
        ("x'/x", fy[:hy], fx[:hx], fy[hy : hy + m], fx[hx : hx + m]),
    ):
        conjuncts, score = search_event(num_sel, den_sel, max_conjuncts, z)
        if best is None or score > best[0]:
            best = (score, name, conjuncts, num_eval, den_eval)
    assert best is not None
    _, orientation, conjuncts, num_eval, den_eval = best
    k_num = int(_apply(num_eval, conjuncts).sum())
    k_den = int(_apply(den_eval, conjuncts).sum())
    p_lo, _ = clopper_pearson(k_num, m, alpha)
    _, q_hi = clopper_pearson(k_den, m, alpha)
    eps_lo = math.log(p_lo / q_hi) if p_lo > 0 else -math.inf
    eps_hat = math.log(k_num / k_den) if k_num and k_den else math.inf if k_num else -math.inf
    p, q = max(k_num, 1) / m, max(k_den, 1) / m
    event = " & ".join(
        f"{'' if sign > 0 else '-'}(r{pairs[col][1]}-r{pairs[col][0]}) >= {c}"
        for col, sign, c in conjuncts
    )
    return AuditResult(eps_lo, eps_hat, event, orientation, k_num, k_den, m,
                       detectable_gap(p, q, m, alpha))  # fmt: skip


# ---------------------------------------------------------------------------------------
# Neighbouring streams of user events


Stream = list[list[str]]
"""Per public time step, the user ids of that step's events (one unit each)."""


def without(stream: Stream, user: str) -> Stream:
    """The neighbour: ``user``'s events removed, every other event where it was."""
    return [[u for u in step if u != user] for step in stream]
