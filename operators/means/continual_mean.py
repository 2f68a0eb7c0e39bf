"""Continual mean under user-level DP: George et al. Alg. 6 (and Alg. 5 as a reference).

At every public tick t the mechanism releases mu^_t, an estimate of the mean mu of i.i.d.
samples in [lower, upper] that users send in any (even adversarial) order, so that the
whole sequence of releases is pure epsilon-DP for user-level neighbours: all samples of
one user may change, the arrival pattern (who sent a sample when) is public (George et al.
Sec. 2.1; docs/papers.md). n and m are declared caps on users and samples per user.

**Algorithm (George et al. Alg. 6).** A user's samples are released by doubling levels:
when its count m_u reaches 2^l (l = 0, 1, 2, ...), it emits the element sigma_l = x_1
(l = 0) or the sum of its samples 2^(l-1)+1 .. 2^l (l >= 1), worth w_l = 1 or 2^(l-1)
samples. Level l's elements go to BinMech[l] (``binary_mechanism``, capacity n). Levels 0
and 1 are raw samples and always active. A level l >= 2 starts inactive and buffers its
raw elements; it activates once enough data exists for PrivateMedian (Alg. 7,
``private_median``) to find mu~_l: its elements are then clipped to
I_l = [2^(l-1) mu~_l - Delta_l, 2^(l-1) mu~_l + Delta_l] (eq. 8), the buffer is flushed
and the level stays active. mu^_t = (sum_l BinMech[l].Sum) / total, total = the number
of samples in the inserted elements. Budget: eps/(2L) per median (levels 2..L) and
eps/(2(L+1)) per BinMech (levels 0..L), L = ceil(log2 m): at most eps in all.

**Corrections applied (docs/papers.md).** total grows by the element's sample count
w_l, never by M(u_t); an activated level leaves Inactive and its buffer is
emptied, and its median is drawn once; the split is eps/(2L) and eps/(2(L+1)) (eqs. (8)-(10));
levels 0 and 1 are never clipped; ceil(k_l) arrays and threshold; samples
beyond m and users beyond n are not used, and are counted; the tree depth is the
exact 1 + floor(log2 n) (the paper writes 1 + log n, equal for n a power of two).

**Grid (exact discrete Laplace, no floating-point noise).** A sample x is clipped to
[lower, upper] (a clipped sample is counted), mapped to y = (x - lower) / (upper - lower)
in [0, 1] and snapped exactly to q = floor(y G + 1/2) grid units, G = ``resolution``
(``snapping``); Bernoulli data with lower = 0, upper = 1 is exact for any G. Elements are
integer unit sums. The clip interval of level l is [c_l - h_l, c_l + h_l] units with
c_l = round(2^(l-1) mu~_l G) and h_l = ceil(Delta_l G + 1/2), so it contains the paper's
I_l and a clipped element moves by at most W_l = 2 h_l units between neighbours. Raw
levels 0 and 1 move by at most G <= W_l; the paper still charges them 2 Delta_l
(eq. 10), kept for fidelity unless ``tight_low_levels``. Node noise of BinMech[l] is
discrete Laplace of the exact rational scale W_l (1 + floor(log2 n)) / eps_bm units, the
paper's eta_l G up to the rounding of h_l (relative excess below 1.5 / (Delta_l G)). The
medians' thresholds, Delta_l and T_l are public floats: rounding them moves utility only.

**Pipeline shape.** The per-user part is separable from the global part:

* Stage 1 (partitioned by user), per user: ``UserState`` (m_u, the running block sum
  since the last power of two, the unit prefix sums of the first min(m_u, 2^(L-1))
  samples for PrivateMedian, the admission rank). Per partition: ``PartitionState``
  (users admitted, D_l = sum_u min(m_u, 2^(l-1)) per level, the tick's pending sums).
  ``admit`` a new user (the first n_p per partition, n_p = ``user_quota``), ``observe``
  each sample, ``absorb`` the effects, and at the tick marker ``close_tick`` returns one
  ``TickMessage``.
* The message (plain ints and tuples; ``state_codec.to_json``): admitted samples and
  their unit sum, new users, over-cap users and samples, per level the element count, the
  exact unit sum, the histogram {units: count} of the elements (levels that may be
  clipped, l >= 2), the increment of complete median arrays floor(D_l / 2^(l-1)), and,
  for the levels that may activate now, the histogram over T_l of the partition's
  complete median arrays. ``merge`` adds messages (``max_count`` takes the max); stage 2
  merges the messages of all partitions for tick t, then calls ``step`` once.
* Stage 2, per statistic: ``MeanState`` (per level the BinMech (k, exact sum), the
  buffer histogram, cumulative median arrays, mu~ and the clip centre; the active levels
  0..a; total). ``step`` activates levels, runs PrivateMedian on the summed histogram,
  flushes buffers, clips and inserts the tick's elements, and releases ``MeanRelease``.

PrivateMedian is the one place stage 2 needs per-user data: it receives only histograms
over T_l (at most ceil(2^(l/2) / 2) counts per level). To build one, stage 1 scans its
partition's users in rank order (``median_histograms``, O(users) per level; the
``users_by_rank`` callable of ``close_tick`` is only called when needed). Which levels
(``median_levels``): with one partition, exactly at the tick its level activates (the
partition knows the global count); with P > 1 partitions, at every tick while the level
may still be inactive (until the partition itself holds K complete arrays, or learns from
a release that the level is active, ``with_known_active``). Arrays are packed per
partition, so activation waits for sum_p floor(D_l^p / 2^(l-1)) >= K_l (the paper's
floor(D_l / 2^(l-1)) >= K_l for P = 1). Stage 2 checks that each activating level's
summed histogram covers exactly that many arrays. The median's randomness is drawn from
the NoiseSource at node ids (*prefix, "median", l, i): a replay re-emits the same mu~.

**Ticks vs arrivals.** The paper releases after every arrival; here after every tick.
Within a tick all arrivals are applied, then the activation rule is checked, then the
tick's elements are inserted (into the now-active levels) or buffered. With one arrival
per tick this is the paper's order of operations exactly. A tick's elements enter a
BinMech as several leaves at once (``binary_mechanism``: any order fixed by the
multiset keeps the sensitivity), so the tree and its noise are the paper's, with k
elements giving popcount(k) nodes.

Privacy:
    epsilon-DP (pure) for user-level neighbours with the same arrival pattern, by basic
    composition: L - 1 medians at eps/(2L) and L + 1 BinMechs at eps/(2(L+1)), each
    BinMech epsilon_bm-DP because a user puts at most one element, moving at most W_l
    units, into level l (after the caps), and at most n elements enter a level. The arrival
    pattern, the totals, the activation times and the counts are public. delta is a
    utility parameter only. ``make_oracle_prior_mean`` (Alg. 5) is eps-DP GIVEN its prior;
    with the true mu as prior it is an experimental reference, not a private mechanism.

References:
    A. George, L. Ramesh, A. V. Singh, H. Tyagi. Continual Mean Estimation Under
    User-Level Privacy. Algorithms 5, 6, 7; eqs. (4), (6)-(10); Thm 3.2, Thm 3.4; Claim C.1;
    our corrections in docs/papers.md.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from .. import _validate
from ..noise import (
    NodeId,
    NoiseSource,
    Term,
    clip_to_grid,
    discrete_laplace_variance,
    exact_half_width,
    node_bytes,
)
from ..selection import private_median as pm
from ..trees import binary_mechanism as bm

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "continual_mean"

Hist = tuple[tuple[int, int], ...]
"""Sparse histogram: ascending (value in grid units, count) pairs, counts > 0."""

DEFAULT_RESOLUTION = 1024
_ALPHA = 0.05


# ---------------------------------------------------------------------------------------
# Spec


@dataclass(frozen=True, slots=True)
class LevelConstants:
    """The paper's real-valued constants of level l (eqs. (8)-(10); Alg. 5: (4), (6), (7)).

    Attributes:
        level: l.
        k: k_l = (32 L / eps) ln(3 L 2^(l/2) / delta) (Alg. 6; 0 for Alg. 5).
        arrays: ceil(k_l), the median's number of arrays (l >= 2 in Alg. 6, else 0).
        threshold: 2^(l-1) ceil(k_l), the activation threshold on D_l (same).
        a: A_l, the block-sum concentration term.
        b: B_l (Alg. 6) or the prior term 2^(l-1) / sqrt(m) of eq. (4) (Alg. 5).
        delta: Delta_l of the clip interval, A_l + B_l.
        eta: the paper's node noise scale eta_l, value units of [0, 1], real log2 n.
    """

    level: int
    k: float
    arrays: int
    threshold: int
    a: float
    b: float
    delta: float
    eta: float


@dataclass(frozen=True, slots=True)
class ContinualMeanSpec:
    """Public parameters of one continual mean (Alg. 6, or Alg. 5 with ``prior``).

    Attributes:
        epsilon: total budget of the whole release sequence.
        delta: utility failure probability (not a DP parameter).
        n: cap on users; m: cap on samples per user (m >= 2).
        lower, upper: declared range [a, b] of a sample.
        resolution: G, grid units per (upper - lower).
        partitions: P, number of stage-1 partitions (user cap split by ``user_quota``).
        node_prefix: public identity of this statistic; prefixes every node id.
        levels: L = ceil(log2 m).
        prior: Alg. 5's known mu~ in [0, 1] (scaled), or None for Alg. 6.
        first_clipped: the lowest clipped level: 2 (Alg. 6) or 1 (Alg. 5, Alg. 4's Pi_l).
        constants: the paper's constants, levels 0..L.
        half_widths: h_l, clip half-width in units (0 for never-clipped levels).
        trees: BinMech[0..L].
        medians: PrivateMedian spec of each level (None for levels 0, 1 and in Alg. 5).
        tight_low_levels: charge raw levels 0 and 1 their true sensitivity G (our option).
    """

    epsilon: Fraction
    delta: float
    n: int
    m: int
    lower: Fraction
    upper: Fraction
    resolution: int
    partitions: int
    node_prefix: NodeId
    levels: int
    prior: Fraction | None
    first_clipped: int
    constants: tuple[LevelConstants, ...]
    half_widths: tuple[int, ...]
    trees: tuple[bm.BinMechSpec, ...]
    medians: tuple[pm.PrivateMedianSpec | None, ...]
    tight_low_levels: bool


def paper_constants(
    epsilon: float | Fraction, delta: float, n: int, m: int
) -> tuple[LevelConstants, ...]:
    """Alg. 6's constants (George et al. Alg. 6, eqs. (8)-(10)), levels 0..L.

    log = log2 throughout (``log m`` in ``ln(2 n log m / delta)`` included), ln = natural.
    """
    eps = float(epsilon)
    levels = _levels(m)
    big_l = levels
    log_n, log_m = math.log2(n), math.log2(m)
    out = []
    for level in range(levels + 1):
        k = 32 * big_l / eps * math.log(3 * big_l * 2 ** (level / 2) / delta)
        a = math.sqrt(2.0 ** (level - 2) * math.log(6 * n * log_m / delta))
        # For an eps so large that 6 L k_l < delta the log is negative: B_l = 0 (utility only).
        b = math.sqrt(2.0**level * max(math.log(6 * big_l * k / delta), 0.0))
        d = a + b
        eta = 4 * (big_l + 1) * (1 + log_n) * d / eps
        arrays = math.ceil(k) if level >= 2 else 0
        threshold = (1 << (level - 1)) * arrays if level >= 2 else 0
        out.append(LevelConstants(level, k, arrays, threshold, a, b, d, eta))
    return tuple(out)


def prior_constants(
    epsilon: float | Fraction, delta: float, n: int, m: int
) -> tuple[LevelConstants, ...]:
    """Alg. 5's constants (George et al. Alg. 5): projection Delta_l of eq. (4)
    (l >= 1; level 0 is never clipped) and noise eta_l of eq. (7), which uses bound (6)."""
    eps = float(epsilon)
    levels = _levels(m)
    log_n, log_m = math.log2(n), math.log2(m)
    out = []
    for level in range(levels + 1):
        half = 2.0 ** (level - 1)
        a = math.sqrt(half / 2 * math.log(2 * n * log_m / delta))
        b = half / math.sqrt(m)
        eta = 2 * (a + math.sqrt(half)) * (1 + log_n) * (levels + 1) / eps
        out.append(LevelConstants(level, 0.0, 0, 0, a, b, a + b, eta))
    return tuple(out)


def make_continual_mean(
    epsilon: float | Fraction,
    delta: float,
    n: int,
    m: int,
    *,
    lower: float | Fraction = 0,
    upper: float | Fraction = 1,
    resolution: int = DEFAULT_RESOLUTION,
    partitions: int = 1,
    node_prefix: NodeId = ("mean", 0),
    tight_low_levels: bool = False,
) -> ContinualMeanSpec:
    """Validate the parameters and build Algorithm 6's spec.

    Args:
        epsilon: total budget > 0; a float is read as the decimal it prints as.
        delta: utility failure probability in (0, 1].
        n: cap on users, >= 1.
        m: cap on samples per user, >= 2 (ln(2n log m / delta) needs log m > 0).
        lower, upper: declared sample range, lower < upper.
        resolution: G >= 1 grid units per (upper - lower).
        partitions: number of stage-1 partitions, >= 1.
        node_prefix: public identity (e.g. (statistic, instance)).
        tight_low_levels: noise levels 0 and 1 for their true sensitivity G (our option).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP, user level (module docstring); ``privacy_budget`` gives the split.
    """
    common = _common(epsilon, delta, n, m, lower, upper, resolution, partitions, node_prefix)
    eps, lo, hi, prefix = common
    levels = _levels(m)
    constants = paper_constants(eps, delta, n, m)
    tree_eps = eps / (2 * (levels + 1))
    median_eps = eps / (2 * levels)
    beta = delta / (3 * levels)
    half_widths, trees, medians = [], [], []
    for c in constants:
        h = math.ceil(c.delta * resolution + 0.5)
        clipped = c.level >= 2
        width = resolution if tight_low_levels and not clipped else 2 * h
        half_widths.append(h if clipped else 0)
        trees.append(_tree(tree_eps, width, n, prefix, c.level, resolution, clipped, 2 * h))
        medians.append(
            pm.make_private_median(
                median_eps, c.level, beta, resolution, (*prefix, "median", c.level)
            )
            if clipped
            else None
        )
    return ContinualMeanSpec(
        epsilon=eps,
        delta=float(delta),
        n=n,
        m=m,
        lower=lo,
        upper=hi,
        resolution=resolution,
        partitions=partitions,
        node_prefix=prefix,
        levels=levels,
        prior=None,
        first_clipped=2,
        constants=constants,
        half_widths=tuple(half_widths),
        trees=tuple(trees),
        medians=tuple(medians),
        tight_low_levels=tight_low_levels,
    )


def make_oracle_prior_mean(
    prior: float | Fraction,
    epsilon: float | Fraction,
    delta: float,
    n: int,
    m: int,
    *,
    lower: float | Fraction = 0,
    upper: float | Fraction = 1,
    resolution: int = DEFAULT_RESOLUTION,
    partitions: int = 1,
    node_prefix: NodeId = ("mean_prior", 0),
) -> ContinualMeanSpec:
    """Algorithm 5 of George et al.: known prior mu~, all levels active from the start.

    Level l >= 1 elements are clipped to 2^(l-1) mu~ +- Delta_l (eq. 4, as in Alg. 4's
    Pi_l); BinMech[l] has eps/(L+1) and noise from the looser bound (6) (eq. 7; the
    projection keeps eq. (4)). Same stage-1 part and messages as Alg. 6 (no medians).

    Args:
        prior: mu~ in [lower, upper] (the experiments pass the true mean: an oracle).
        epsilon, delta, n, m, lower, upper, resolution, partitions, node_prefix: as in
            ``make_continual_mean``.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP given the prior (2 epsilon if the prior is itself epsilon-DP, Thm 3.2).
    """
    eps, lo, hi, prefix = _common(
        epsilon, delta, n, m, lower, upper, resolution, partitions, node_prefix
    )
    mu = _validate.exact_fraction("prior", prior)
    if not lo <= mu <= hi:
        raise _validate.invalid("prior", f"in [{lo}, {hi}]", prior)
    levels = _levels(m)
    constants = prior_constants(eps, delta, n, m)
    tree_eps = eps / (levels + 1)
    half_widths, trees = [], []
    for c in constants:
        clipped = c.level >= 1
        h = math.ceil(c.delta * resolution + 0.5)
        noise_h = math.ceil((c.a + math.sqrt(2.0 ** (c.level - 1))) * resolution + 0.5)
        half_widths.append(h if clipped else 0)
        trees.append(_tree(tree_eps, 2 * noise_h, n, prefix, c.level, resolution, clipped, 2 * h))
    return ContinualMeanSpec(
        epsilon=eps,
        delta=float(delta),
        n=n,
        m=m,
        lower=lo,
        upper=hi,
        resolution=resolution,
        partitions=partitions,
        node_prefix=prefix,
        levels=levels,
        prior=(mu - lo) / (hi - lo),
        first_clipped=1,
        constants=constants,
        half_widths=tuple(half_widths),
        trees=tuple(trees),
        medians=(None,) * (levels + 1),
        tight_low_levels=False,
    )


def _common(
    epsilon: float | Fraction,
    delta: float,
    n: int,
    m: int,
    lower: float | Fraction,
    upper: float | Fraction,
    resolution: int,
    partitions: int,
    node_prefix: NodeId,
) -> tuple[Fraction, Fraction, Fraction, NodeId]:
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    if isinstance(delta, bool) or not isinstance(delta, (int, float, Fraction)):
        raise _validate.invalid("delta", "a number", delta)
    if not 0 < delta <= 1:
        raise _validate.invalid("delta", "in (0, 1]", delta)
    _validate.check_int_ge("n", n, 1)
    _validate.check_int_ge("m", m, 2)
    lo = _validate.exact_fraction("lower", lower)
    hi = _validate.exact_fraction("upper", upper)
    if not lo < hi:
        raise _validate.invalid("upper", f"> lower = {lower!r}", upper)
    _validate.check_int_ge("resolution", resolution, 1)
    _validate.check_int_ge("partitions", partitions, 1)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    return eps, lo, hi, prefix


def _levels(m: int) -> int:
    """L = ceil(log2 m), exactly."""
    return (m - 1).bit_length()


def _tree(
    epsilon: Fraction,
    width: int,
    n: int,
    prefix: NodeId,
    level: int,
    resolution: int,
    clipped: bool,
    clip_width: int,
) -> bm.BinMechSpec:
    # The noise width must cover what an element can move: G raw, 2 h_l clipped.
    moved = clip_width if clipped else resolution
    if width < moved:  # unreachable for the paper's constants; kept as a guard
        raise _validate.invalid(f"noise width of level {level}", f">= {moved}", width)
    return bm.make_binary_mechanism(epsilon, width, n, (*prefix, "level", level))


def privacy_budget(spec: ContinualMeanSpec) -> dict[str, Fraction]:
    """The epsilon split: all medians, all BinMechs, and their sum (<= epsilon)."""
    medians = sum((p.epsilon for p in spec.medians if p is not None), Fraction(0))
    trees = sum((t.epsilon for t in spec.trees), Fraction(0))
    return {"medians": medians, "trees": trees, "total": medians + trees}


def user_quota(spec: ContinualMeanSpec, partition: int) -> int:
    """n_p, the users partition p may admit: n split as evenly as possible over P."""
    _validate.check_int_ge("partition", partition, 0)
    if partition >= spec.partitions:
        raise _validate.invalid("partition", f"< {spec.partitions}", partition)
    base, extra = divmod(spec.n, spec.partitions)
    return base + (1 if partition < extra else 0)


def weight(level: int) -> int:
    """w_l, the number of samples in a level-l element: 1 (l = 0) or 2^(l-1)."""
    return 1 if level == 0 else 1 << (level - 1)


def to_units(spec: ContinualMeanSpec, x: float | int | Fraction) -> tuple[int, bool]:
    """(grid units of x after clipping to [lower, upper], whether it was clipped).

    Exact: the binary double is read as a rational. NaN counts as clipped to ``lower``.
    """
    return clip_to_grid(spec.lower, spec.upper, spec.resolution, x)


# ---------------------------------------------------------------------------------------
# Stage 1: per user and per partition


@dataclass(frozen=True, slots=True)
class UserState:
    """One user's state in stage 1 (plain data).

    Attributes:
        rank: admission order in the partition (the canonical median order); -1 if the
            user came after the partition's user quota and is not used.
        count: m_u, the user's used samples (<= m).
        block: grid units of the samples after the last power-of-two count.
        prefix: running unit sums of the first min(m_u, 2^(L-1)) samples (for
            PrivateMedian; emptied once every level is known active).
        unused: samples of this user that were not used (beyond m, or user beyond n).
    """

    rank: int = -1
    count: int = 0
    block: int = 0
    prefix: tuple[int, ...] = ()
    unused: int = 0


@dataclass(frozen=True, slots=True)
class SampleEffect:
    """What one sample adds to its partition's tick (internal to stage 1).

    Attributes:
        count: the user's m_u after the sample (0 if unused).
        units: the sample's grid units (0 if unused).
        level: level of the element the sample completes, -1 if none.
        element: that element's raw unit sum sigma_l.
        clipped: the value was outside [lower, upper].
        unused: the sample is over a cap.
    """

    count: int
    units: int
    level: int
    element: int
    clipped: bool
    unused: bool


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One stage-1 partition (plain data). Tuples are indexed by level 0..L.

    Attributes:
        partition: p.
        admitted: users admitted so far (their ranks are 0..admitted-1).
        filled: D_l^p = sum over the partition's users of min(m_u, 2^(l-1)) (l >= 2).
        arrays_sent: floor(D_l^p / 2^(l-1)) as of the last closed tick.
        max_count: max_u m_u over the partition (public).
        known_active: highest level known to be active globally (stale is safe).
        clipped: samples outside [lower, upper]. DATA-DEPENDENT: a local metric, never
            put in a message or a release.
        samples, sample_sum, counts, sums, hists, new_users, users_over_cap,
        samples_over_cap: the current tick's pending message (see ``TickMessage``).
    """

    partition: int
    admitted: int
    filled: tuple[int, ...]
    arrays_sent: tuple[int, ...]
    max_count: int
    known_active: int
    clipped: int
    samples: int
    sample_sum: int
    counts: tuple[int, ...]
    sums: tuple[int, ...]
    hists: tuple[Hist, ...]
    new_users: int
    users_over_cap: int
    samples_over_cap: int


@dataclass(frozen=True, slots=True)
class TickMessage:
    """Stage 1 -> stage 2 for one tick: a partition's users aggregated (sums of plain ints).

    Attributes:
        samples: used samples in the tick; sample_sum: their grid units.
        max_count: the partition's max_u m_u (merged by max; public, for B0 and reports).
        new_users: users admitted in the tick; users_over_cap: users refused (beyond n).
        samples_over_cap: samples not used (beyond m, or of a refused user).
        arrays: per level, the increase of floor(D_l^p / 2^(l-1)), complete median arrays.
        counts: per level, the elements created in the tick.
        sums: per level, their exact raw unit sum.
        hists: per level, their values as a sparse histogram (levels >= first_clipped).
        medians: (l, histogram over T_l of the partition's complete arrays) for the levels
            that may activate at this tick.
    """

    samples: int
    sample_sum: int
    max_count: int
    new_users: int
    users_over_cap: int
    samples_over_cap: int
    arrays: tuple[int, ...]
    counts: tuple[int, ...]
    sums: tuple[int, ...]
    hists: tuple[Hist, ...]
    medians: tuple[tuple[int, tuple[int, ...]], ...]


def init_partition(spec: ContinualMeanSpec, partition: int = 0) -> PartitionState:
    """The state of an empty stage-1 partition."""
    user_quota(spec, partition)
    zeros = (0,) * (spec.levels + 1)
    return PartitionState(
        partition=partition,
        admitted=0,
        filled=zeros,
        arrays_sent=zeros,
        max_count=0,
        known_active=spec.levels if spec.prior is not None else 1,
        clipped=0,
        samples=0,
        sample_sum=0,
        counts=zeros,
        sums=zeros,
        hists=((),) * (spec.levels + 1),
        new_users=0,
        users_over_cap=0,
        samples_over_cap=0,
    )


def admit(spec: ContinualMeanSpec, part: PartitionState) -> tuple[PartitionState, UserState]:
    """A user seen for the first time: admitted (next rank) if the partition's quota allows.

    The decision depends on the public arrival order only (the caps n and m: docs/papers.md).
    """
    if part.admitted < user_quota(spec, part.partition):
        part = replace(part, admitted=part.admitted + 1, new_users=part.new_users + 1)
        return part, UserState(rank=part.admitted - 1)
    return replace(part, users_over_cap=part.users_over_cap + 1), UserState(rank=-1)


def prefix_capacity(spec: ContinualMeanSpec, part: PartitionState) -> int:
    """Samples per user to keep for PrivateMedian: 2^(L-1), or 0 once all levels are active."""
    if spec.prior is not None or spec.levels < 2 or part.known_active >= spec.levels:
        return 0
    return 1 << (spec.levels - 1)


def observe(
    spec: ContinualMeanSpec, part: PartitionState, user: UserState, x: float | int | Fraction
) -> tuple[UserState, SampleEffect]:
    """One sample x of ``user`` (per-user keyed state, our streaming form).

    Creates the level-l element when m_u reaches 2^l: x_1 (l = 0) or the block sum of
    samples 2^(l-1)+1 .. 2^l (l >= 1). A sample beyond m, or of a refused user, is not used
    and is counted. Never raises for a data value: out-of-range values are clipped.

    Args:
        spec: the mechanism's parameters.
        part: the user's partition (read only: for the prefix capacity).
        user: the user's state (from ``admit`` for a new user).
        x: the sample.

    Returns:
        The user's new state and the sample's effect, for ``absorb``.
    """
    units, clipped = to_units(spec, x)
    if user.rank < 0 or user.count >= spec.m:
        unused = replace(user, unused=user.unused + 1)
        return unused, SampleEffect(0, 0, -1, 0, clipped, True)
    count = user.count + 1
    if count & (count - 1) == 0:
        level = count.bit_length() - 1
        element = units if level == 0 else user.block + units
        block = 0
    else:
        level, element, block = -1, 0, user.block + units
    prefix = user.prefix
    cap = prefix_capacity(spec, part)
    if count <= cap:
        prefix = (*prefix, (prefix[-1] if prefix else 0) + units)
    elif cap == 0 and prefix:
        prefix = ()
    new_user = UserState(
        rank=user.rank, count=count, block=block, prefix=prefix, unused=user.unused
    )
    return new_user, SampleEffect(count, units, level, element, clipped, False)


def absorb(
    spec: ContinualMeanSpec, part: PartitionState, effects: Iterable[SampleEffect]
) -> PartitionState:
    """Add sample effects to the partition's pending tick message and its counters D_l."""
    filled, counts, sums = list(part.filled), list(part.counts), list(part.sums)
    new_hist: dict[int, dict[int, int]] = {}
    samples, sample_sum, max_count = part.samples, part.sample_sum, part.max_count
    clipped, over = part.clipped, part.samples_over_cap
    levels = spec.levels
    for e in effects:
        clipped += e.clipped
        if e.unused:
            over += 1
            continue
        samples += 1
        sample_sum += e.units
        max_count = max(max_count, e.count)
        # D_l += 1 iff the new count c <= 2^(l-1), i.e. l >= 1 + ceil(log2 c).
        for level in range(max(2, (e.count - 1).bit_length() + 1), levels + 1):
            filled[level] += 1
        if e.level >= 0:
            counts[e.level] += 1
            sums[e.level] += e.element
            if e.level >= spec.first_clipped:
                bucket = new_hist.setdefault(e.level, {})
                bucket[e.element] = bucket.get(e.element, 0) + 1
    hists = list(part.hists)
    for level, bucket in new_hist.items():
        hists[level] = merge_hist(hists[level], tuple(sorted(bucket.items())))
    return replace(
        part,
        filled=tuple(filled),
        counts=tuple(counts),
        sums=tuple(sums),
        hists=tuple(hists),
        samples=samples,
        sample_sum=sample_sum,
        max_count=max_count,
        clipped=clipped,
        samples_over_cap=over,
    )


def with_known_active(part: PartitionState, active: int) -> PartitionState:
    """Record that levels 0..``active`` are active (read from a release; monotone)."""
    return replace(part, known_active=max(part.known_active, active))


def _arrays_now(spec: ContinualMeanSpec, part: PartitionState) -> tuple[int, ...]:
    return tuple(d >> (lv - 1) if lv >= 2 else 0 for lv, d in enumerate(part.filled))


def median_levels(spec: ContinualMeanSpec, part: PartitionState) -> tuple[int, ...]:
    """The levels whose median histogram this partition must send at this tick's close.

    A level l >= 2 not known active, that had fewer than K_l complete arrays at the last
    close (else it was active by then), that has arrays now, and, with one partition,
    reaches K_l now (then it activates at exactly this tick). With P > 1 a partition
    cannot see the others' counts, so it sends whenever the level may activate.
    """
    if spec.prior is not None:
        return ()
    now = _arrays_now(spec, part)
    out = []
    for level in range(max(2, part.known_active + 1), spec.levels + 1):
        median = spec.medians[level]
        assert median is not None
        if part.arrays_sent[level] >= median.arrays or now[level] == 0:
            continue
        if spec.partitions == 1 and now[level] < median.arrays:
            continue
        out.append(level)
    return tuple(out)


def median_histograms(
    spec: ContinualMeanSpec, levels: Sequence[int], users_by_rank: Iterable[UserState]
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Alg. 7's fill for ``levels`` over one partition's admitted users in rank order."""
    if not levels:
        return ()
    users = [(u.count, u.prefix) for u in users_by_rank if u.rank >= 0 and u.count]
    out = []
    for level in levels:
        median = spec.medians[level]
        assert median is not None
        out.append((level, pm.fill(median, users)))
    return tuple(out)


def close_tick(
    spec: ContinualMeanSpec,
    part: PartitionState,
    users_by_rank: Callable[[], Iterable[UserState]],
) -> tuple[PartitionState, TickMessage]:
    """Close the partition's tick: its message, and an empty pending message.

    Args:
        spec: the mechanism's parameters.
        part: the partition's state with the tick's effects absorbed.
        users_by_rank: returns the partition's admitted users in rank order; called only
            when a median histogram is due (``median_levels``).

    Returns:
        The partition's new state and the tick's message.
    """
    levels = median_levels(spec, part)
    medians = median_histograms(spec, levels, users_by_rank()) if levels else ()
    now = _arrays_now(spec, part)
    msg = TickMessage(
        samples=part.samples,
        sample_sum=part.sample_sum,
        max_count=part.max_count,
        new_users=part.new_users,
        users_over_cap=part.users_over_cap,
        samples_over_cap=part.samples_over_cap,
        arrays=tuple(a - b for a, b in zip(now, part.arrays_sent, strict=True)),
        counts=part.counts,
        sums=part.sums,
        hists=part.hists,
        medians=medians,
    )
    zeros = (0,) * (spec.levels + 1)
    part = replace(
        part,
        arrays_sent=now,
        samples=0,
        sample_sum=0,
        counts=zeros,
        sums=zeros,
        hists=((),) * (spec.levels + 1),
        new_users=0,
        users_over_cap=0,
        samples_over_cap=0,
    )
    return part, msg


def empty_message(spec: ContinualMeanSpec) -> TickMessage:
    """The message of a partition with nothing to report (identity of ``merge``)."""
    zeros = (0,) * (spec.levels + 1)
    return TickMessage(0, 0, 0, 0, 0, 0, zeros, zeros, zeros, ((),) * (spec.levels + 1), ())


def merge(a: TickMessage, b: TickMessage) -> TickMessage:
    """Sum two partitions' messages for the same tick (``max_count``: max)."""
    medians = dict(a.medians)
    for level, hist in b.medians:
        old = medians.get(level)
        medians[level] = (
            hist if old is None else tuple(x + y for x, y in zip(old, hist, strict=True))
        )
    return TickMessage(
        samples=a.samples + b.samples,
        sample_sum=a.sample_sum + b.sample_sum,
        max_count=max(a.max_count, b.max_count),
        new_users=a.new_users + b.new_users,
        users_over_cap=a.users_over_cap + b.users_over_cap,
        samples_over_cap=a.samples_over_cap + b.samples_over_cap,
        arrays=_add(a.arrays, b.arrays),
        counts=_add(a.counts, b.counts),
        sums=_add(a.sums, b.sums),
        hists=tuple(merge_hist(x, y) for x, y in zip(a.hists, b.hists, strict=True)),
        medians=tuple(sorted(medians.items())),
    )


def merge_hist(a: Hist, b: Hist) -> Hist:
    """The sum of two sparse histograms."""
    if not a:
        return b
    if not b:
        return a
    out: dict[int, int] = dict(a)
    for value, count in b:
        out[value] = out.get(value, 0) + count
    return tuple(sorted(out.items()))


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------------------------------
# Stage 2: the global part


@dataclass(frozen=True, slots=True)
class MeanState:
    """The global state of one continual mean (plain data). Tuples are indexed by level.

    Attributes:
        tick: ticks stepped.
        total: samples in the inserted elements (the denominator; public).
        active: a, the highest active level (levels 0..a are active; monotone).
        leaves: k_l, elements in BinMech[l].
        sums: exact unit sum of BinMech[l]'s (clipped) elements.
        buffers: withheld raw elements of inactive levels.
        arrays: complete median arrays per level, summed over partitions.
        medians: index of mu~_l in T_l (-1 before activation; -1 in Alg. 5).
        centres: clip centre c_l in units (-1 before activation).
        samples, users, users_over_cap, samples_over_cap, max_count: public counters.
    """

    tick: int
    total: int
    active: int
    leaves: tuple[int, ...]
    sums: tuple[int, ...]
    buffers: tuple[Hist, ...]
    arrays: tuple[int, ...]
    medians: tuple[int, ...]
    centres: tuple[int, ...]
    samples: int
    users: int
    users_over_cap: int
    samples_over_cap: int
    max_count: int


@dataclass(frozen=True, slots=True)
class MeanRelease:
    """The private estimate at one tick, with its error bars (public parameters only).

    Attributes:
        t: the tick (1-based).
        value: mu^_t in [lower, upper] units, NOT clipped (Thm 3.4 is about the raw
            estimate; clamping to the range is free post-processing).
            (lower + upper) / 2 while total = 0.
        total: samples the estimate covers (public).
        std: exact standard deviation of the DP noise in ``value``.
        ci95: the least h with P(|noise| > h) <= 0.05, from the exact distribution of
            the discrete Laplace sum (guaranteed), around the exact estimate of the
            covered samples.
        mean_ci95: half-width around mu: the noise's exact quantile at 0.025, plus
            Hoeffding at 0.025 for the mean of ``total`` i.i.d. samples, plus the snapping
            error 1/(2G) (all in value units); conservative (a union bound). Valid under the
            paper's model when no element was clipped (probability >= 1 - delta there);
            (upper - lower) / 2 while total = 0.
        active: a, the highest active level.
        samples: samples used so far; dropped: samples over the caps so far.
        medians: mu~_l released so far, (level, value in [lower, upper] units).
    """

    t: int
    value: float
    total: int
    std: float
    ci95: float
    mean_ci95: float
    active: int
    samples: int
    dropped: int
    medians: tuple[tuple[int, float], ...]


def init(spec: ContinualMeanSpec) -> MeanState:
    """The global state before the first tick (Alg. 5: every level active, centres set)."""
    size = spec.levels + 1
    if spec.prior is None:
        active, centres = 1, (-1,) * size
    else:
        active = spec.levels
        centres = tuple(
            _round_half_up(weight(lv) * spec.prior * spec.resolution) for lv in range(size)
        )
    return MeanState(
        tick=0,
        total=0,
        active=active,
        leaves=(0,) * size,
        sums=(0,) * size,
        buffers=((),) * size,
        arrays=(0,) * size,
        medians=(-1,) * size,
        centres=centres,
        samples=0,
        users=0,
        users_over_cap=0,
        samples_over_cap=0,
        max_count=0,
    )


def step(
    spec: ContinualMeanSpec, state: MeanState, msg: TickMessage, noise: NoiseSource
) -> tuple[MeanState, MeanRelease]:
    """Advance one public tick with the merged message of all partitions, and release.

    Alg. 6, lines 6-20: activate every inactive level whose median has its K_l arrays
    (PrivateMedian once, flush the buffer clipped to I_l), then insert the tick's elements
    into the active levels (clipped from ``first_clipped`` on) or buffer them.

    Args:
        spec: the mechanism's parameters.
        state: the state after tick t - 1.
        msg: ``merge`` of every partition's message for tick t.
        noise: the noise source (keyed in production).

    Returns:
        The new state and the release for tick t.

    Raises:
        ValueError: an activating level's median histogram does not cover its complete
            arrays (a partition did not send it: a wiring error, not a data condition).

    Privacy:
        See the module docstring; requires ``noise`` to return the same value for a node
        every time it is asked.
    """
    levels = range(spec.levels + 1)
    arrays = _add(state.arrays, msg.arrays)
    leaves, sums = list(state.leaves), list(state.sums)
    buffers, medians, centres = list(state.buffers), list(state.medians), list(state.centres)
    total, active = state.total, state.active
    median_hists = dict(msg.medians)
    # Activation, ascending; monotone in l (George et al. Alg. 6), so stop at the first miss.
    while active < spec.levels:
        level = active + 1
        median = spec.medians[level]
        assert median is not None
        if arrays[level] < median.arrays:
            break
        hist = median_hists.get(level, ())
        if sum(hist) != arrays[level]:
            raise ValueError(
                f"median histogram of level {level} must cover {arrays[level]} arrays, "
                f"got {sum(hist)}: every partition with arrays must send it"
            )
        index = pm.select(median, hist, noise)
        medians[level] = index
        centres[level] = _round_half_up(
            Fraction(weight(level) * spec.resolution) * Fraction(median.midpoints[index])
        )
        count, clipped_sum = _clip_hist(buffers[level], centres[level], spec.half_widths[level])
        leaves[level], sums[level], total = _insert(
            spec, level, leaves[level], sums[level], total, count, clipped_sum
        )
        buffers[level] = ()
        active = level
    for level in levels:
        if not msg.counts[level]:
            continue
        if level > active:
            buffers[level] = merge_hist(buffers[level], msg.hists[level])
            continue
        if level >= spec.first_clipped:
            count, value = _clip_hist(msg.hists[level], centres[level], spec.half_widths[level])
        else:
            count, value = msg.counts[level], msg.sums[level]
        leaves[level], sums[level], total = _insert(
            spec, level, leaves[level], sums[level], total, count, value
        )
    new_state = MeanState(
        tick=state.tick + 1,
        total=total,
        active=active,
        leaves=tuple(leaves),
        sums=tuple(sums),
        buffers=tuple(buffers),
        arrays=arrays,
        medians=tuple(medians),
        centres=tuple(centres),
        samples=state.samples + msg.samples,
        users=state.users + msg.new_users,
        users_over_cap=state.users_over_cap + msg.users_over_cap,
        samples_over_cap=state.samples_over_cap + msg.samples_over_cap,
        max_count=max(state.max_count, msg.max_count),
    )
    return new_state, release(spec, new_state, noise)


def _insert(
    spec: ContinualMeanSpec, level: int, leaves: int, sums: int, total: int, count: int, value: int
) -> tuple[int, int, int]:
    tree = bm.append(spec.trees[level], bm.BinMechState(leaves, sums), count, value)
    return tree.count, tree.total, total + weight(level) * count


def _clip_hist(hist: Hist, centre: int, half_width: int) -> tuple[int, int]:
    """(number of elements, sum of the elements clipped to [centre - h, centre + h])."""
    lo, hi = centre - half_width, centre + half_width
    count = clipped = 0
    for value, n in hist:
        count += n
        clipped += n * min(max(value, lo), hi)
    return count, clipped


def _round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def noise_terms(spec: ContinualMeanSpec, state: MeanState) -> list[Term]:
    """The nodes whose noise the release of ``state`` adds: popcount(k_l) per level (public)."""
    terms: list[Term] = []
    for level, count in enumerate(state.leaves):
        terms.extend(bm.release_nodes(spec.trees[level], count))
    return terms


def release(spec: ContinualMeanSpec, state: MeanState, noise: NoiseSource) -> MeanRelease:
    """mu^_t = (sum_l BinMech[l].Sum) / total, mapped back to [lower, upper], with error bars.

    A pure function of the state and the nodes' noise: asking twice (a replay) re-emits.
    """
    span = spec.upper - spec.lower
    medians = tuple(
        (lv, float(spec.lower + span * Fraction(spec.medians[lv].midpoints[i])))  # type: ignore[union-attr]
        for lv, i in enumerate(state.medians)
        if i >= 0
    )
    dropped = state.samples_over_cap
    if state.total == 0:
        return MeanRelease(
            t=state.tick,
            value=float((spec.lower + spec.upper) / 2),
            total=0,
            std=0.0,
            ci95=0.0,
            mean_ci95=float(span / 2),
            active=state.active,
            samples=state.samples,
            dropped=dropped,
            medians=medians,
        )
    terms = noise_terms(spec, state)
    noisy = sum(state.sums) + sum(noise.discrete_laplace(node, b) for node, b, _ in terms)
    std, ci95, half = _error_bars(scales(spec), tuple(k.bit_count() for k in state.leaves))
    denominator = state.total * spec.resolution
    to_value = float(span) / denominator
    hoeffding = math.sqrt(math.log(2 / (_ALPHA / 2)) / (2 * state.total))
    return MeanRelease(
        t=state.tick,
        value=float(spec.lower + span * Fraction(noisy, denominator)),
        total=state.total,
        std=std * to_value,
        ci95=ci95 * to_value,
        mean_ci95=half * to_value + float(span) * (hoeffding + 1 / (2 * spec.resolution)),
        active=state.active,
        samples=state.samples,
        dropped=dropped,
        medians=medians,
    )


@functools.lru_cache(maxsize=4096)
def _error_bars(
    level_scales: tuple[Fraction, ...], popcounts: tuple[int, ...]
) -> tuple[float, float, float]:
    """(std, exact half-width at 0.05, at 0.025) of the noise, in units. Releases repeat
    the same few popcount patterns, so this is cached."""
    multiset = [b for b, c in zip(level_scales, popcounts, strict=True) for _ in range(c)]
    if not multiset:
        return 0.0, 0.0, 0.0
    std = math.sqrt(
        sum(discrete_laplace_variance(b) * c for b, c in zip(level_scales, popcounts, strict=True))
    )
    return std, exact_half_width(multiset, _ALPHA), exact_half_width(multiset, _ALPHA / 2)


def exact_estimate(spec: ContinualMeanSpec, state: MeanState) -> float | None:
    """The release without noise: the (clipped) mean of the covered samples (tests)."""
    if state.total == 0:
        return None
    span = spec.upper - spec.lower
    return float(spec.lower + span * Fraction(sum(state.sums), state.total * spec.resolution))


# ---------------------------------------------------------------------------------------
# A single-process driver (tests, experiments, ``dpstream replay``-like runs)


@dataclass
class Simulation:
    """Runs both stages in one process: P partitions of users, then the global step.

    Not a frozen operator state: a convenience for tests and experiments. ``partition_of``
    maps a user to its partition (default: ints modulo P, strings by CRC-32 modulo P).
    ``feedback`` tells the partitions the active levels after each tick (as a release
    topic would, with zero delay).
    """

    spec: ContinualMeanSpec
    partition_of: Callable[[Hashable], int] | None = None
    feedback: bool = True

    def __post_init__(self) -> None:
        self.parts = [init_partition(self.spec, p) for p in range(self.spec.partitions)]
        self.users: dict[Hashable, UserState] = {}
        self.ranked: list[list[Hashable]] = [[] for _ in range(self.spec.partitions)]
        self.state = init(self.spec)
        self.messages: list[TickMessage] = []

    def _partition(self, user: Hashable) -> int:
        if self.partition_of is not None:
            return self.partition_of(user)
        if isinstance(user, int):
            return user % self.spec.partitions
        return zlib.crc32(str(user).encode()) % self.spec.partitions

    def tick(
        self, events: Iterable[tuple[Hashable, float | int | Fraction]], noise: NoiseSource
    ) -> MeanRelease:
        """Apply one tick's (user, x) arrivals in order, close the tick, step and release."""
        spec = self.spec
        effects: list[list[SampleEffect]] = [[] for _ in self.parts]
        for user, x in events:
            p = self._partition(user)
            state = self.users.get(user)
            if state is None:
                self.parts[p], state = admit(spec, self.parts[p])
                if state.rank >= 0:
                    self.ranked[p].append(user)
            self.users[user], effect = observe(spec, self.parts[p], state, x)
            effects[p].append(effect)
        msg = empty_message(spec)
        for p, part in enumerate(self.parts):
            part = absorb(spec, part, effects[p])
            part, part_msg = close_tick(spec, part, self._ranked_users(p))
            self.parts[p] = part
            msg = merge(msg, part_msg)
        self.messages.append(msg)
        self.state, rel = step(spec, self.state, msg, noise)
        if self.feedback:
            self.parts = [with_known_active(part, self.state.active) for part in self.parts]
        return rel

    def _ranked_users(self, p: int) -> Callable[[], Iterable[UserState]]:
        return lambda: (self.users[u] for u in self.ranked[p])


def simulate(
    spec: ContinualMeanSpec,
    ticks: Iterable[Iterable[tuple[Hashable, float | int | Fraction]]],
    noise: NoiseSource,
    partition_of: Callable[[Hashable], int] | None = None,
) -> tuple[list[MeanRelease], Simulation]:
    """Run the mechanism over ``ticks`` (each a list of (user, x) arrivals)."""
    sim = Simulation(spec, partition_of)
    releases = [sim.tick(events, noise) for events in ticks]
    return releases, sim


def arrivals(events: Iterable[tuple[Hashable, float | int | Fraction]]) -> list[list]:
    """One tick per arrival: the paper's per-arrival release schedule."""
    return [[event] for event in events]


def scales(spec: ContinualMeanSpec) -> tuple[Fraction, ...]:
    """Node noise scale of BinMech[l] in grid units, levels 0..L."""
    return tuple(t.scale for t in spec.trees)
