"""Whole-user private running mean: a noisy sum over a noisy count, two tree counters.

The default ``kind: mean``. Every number it releases is noised or computed from noised
numbers only: unlike George et al.'s continual mean (``continual_mean``, arXiv:2212.09980,
private only when who sent how many samples when is public), it protects a user's whole
contribution, arrivals included, under the same neighbouring relations as the count and
sum kinds.

**Stage 1 (per user): truncation, clipping, a grid.** Each user's first m =
``max_samples`` samples, in stream order, are kept for the whole stream and every later
one is dropped (fixed truncation of user contributions, Dong-Luo-Yi Alg. 3, on the
original stream as in its Sec. II-A; m plays tau). A kept value x is clipped to
[lower, upper] and mapped to q = floor((x - lower) / (upper - lower) R + 1/2) in
{0, ..., R}, R = ``resolution`` (``snapping.clip_to_grid``). The rounding is
deterministic, not randomized: q is a fixed function of x, so a replay or a restart
computes the very same integers (randomized rounding would need its own keyed
randomness), and the noise sees integers only, never floating-point data (Mironov 2012).
Rounding moves a value by at most (upper - lower) / (2R): data error, not noise.
Per tick stage 1 reports two integer sums: C_t, the samples it kept, and S_t, their grid
units (``admit`` for one sample).

**Stage 2: two continual counters.** C_t and S_t are the leaves of two binary tree
counters on the infinite stream (``tree_counter``: Dong-Luo-Yi Alg. 2, after Chan, Shi,
Song), each at epsilon / 2. Removing one user removes at most m kept samples, so every
level of the count tree moves by at most m and every level of the units tree by at most
m R: sensitivities m and m R (group privacy over the truncated contribution, Dong-Luo-Yi
Alg. 3). Under ``any_subset`` neighbours dropping a user's early samples promotes later
ones into the first m, into other ticks, so both double (2 m, 2 m R), as for every
truncated counter (``multiplier``, ``accounting.sensitivity_multiplier``). Basic
composition of the two halves: epsilon.

**Release (post-processing of C~ and S~).** At step t, with C~ and S~ the two trees'
noisy running totals:

* ``samples`` = C~, with its exact noise std and its exact 95% interval (the quantile of
  its noise's exact distribution, ``noise.exact_quantile``);
* ``value`` = lower + (upper - lower) r / R, r = S~ / C~ clamped to [0, R] (a mean of
  values in [lower, upper] lies there), when C~ >= 1; when C~ < 1 there is no estimate
  and ``value`` is None (our choice: a data-independent placeholder would look like an
  estimate);
* ``std`` by the delta method around (S~, C~): Var(S~ / C~) ~ (Var S~ + r^2 Var C~) / C~^2
  with the two trees' exact noise variances (independent noises), scaled by
  (upper - lower) / R. A first-order approximation, good when C~ is large against the
  count's noise std (it ignores the curvature of 1 / C, of relative order
  (std C~ / C~)^2); it is computed from released numbers, so it costs nothing. It is
  capped at (upper - lower) / 2, the largest std of any estimate in [lower, upper]
  (Popoviciu's inequality), which it exceeds only when C~ is small;
* ``interval``: [lo, hi] = the range of s / c over the box of s within S~'s and c within
  C~'s exact 97.5% noise quantiles (clamped as r): with probability at least 0.95 both
  noises are inside their bounds (union bound) and then the exact mean of the kept
  samples is in the interval, a guarantee, not an approximation. It stays conservative
  (the union bound and the box's corners cover more than 95%); only its two quantiles
  are exact. When the box reaches c < 1 the interval is [lower, upper].

The exact mean estimated is that of the kept samples, (lower + (upper - lower) S / (R C))
over all kept samples so far (after clipping and snapping): a user with many samples
weighs at most m, which is the price of a whole-user guarantee.

Privacy:
    epsilon-DP for whole-user neighbours (all events of one user added or removed), and
    for any-subset neighbours with ``any_subset``: the two trees are each epsilon/2-DP for
    their leaf streams' per-level sensitivities above; everything released is
    post-processing of their outputs.

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023: Alg. 2 (binary tree on an infinite stream), Alg. 3 (truncation),
    Sec. II-A (counts on the original stream). T.-H. H. Chan, E. Shi, D. Song. Private and
    continual release of statistics. ACM TISSEC 2011. I. Mironov. On significance of the
    least significant bits for differential privacy. CCS 2012. For contrast: A. J. George,
    L. Ramesh, A. V. Singh, H. Tyagi. Continual Mean Estimation Under User-Level Privacy.
    arXiv:2212.09980, Sec. 2.1 (public arrivals).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import NodeId, NoiseSource, TreeRelease, clip_to_grid, exact_half_width, ratio_bounds
from ..trees import tree_counter

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "whole_user_mean"


@dataclass(frozen=True, slots=True)
class WholeUserMeanSpec:
    """Public parameters of one whole-user mean.

    Attributes:
        epsilon: budget of the whole infinite stream (both counters).
        max_samples: m, the samples kept per user (its first m).
        lower, upper: the value range; values are clipped to it.
        resolution: R, grid units per (upper - lower).
        samples: the count tree (epsilon / 2, sensitivity m, or 2 m under any_subset).
        units: the units tree (epsilon / 2, sensitivity m R, or 2 m R under any_subset).
    """

    epsilon: Fraction
    max_samples: int
    lower: Fraction
    upper: Fraction
    resolution: int
    samples: tree_counter.BinaryTreeSpec
    units: tree_counter.BinaryTreeSpec


@dataclass(frozen=True, slots=True)
class WholeUserMeanState:
    """The two trees' exact states (no noise), field by field: plain data.

    Attributes:
        t: steps taken (both trees take every step).
        samples_alpha, samples_totals: the count tree's ``BinaryTreeState`` alpha and
            period_totals (kept samples).
        units_alpha, units_totals: the units tree's (their grid units).
    """

    t: int = 0
    samples_alpha: tuple[int, ...] = ()
    samples_totals: tuple[int, ...] = ()
    units_alpha: tuple[int, ...] = ()
    units_totals: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class WholeUserMeanRelease:
    """One step's release; every field is noised or computed from noised numbers.

    Attributes:
        t: the step (1-based).
        value: the mean estimate, or None when the noisy count is below 1.
        std: its delta-method std (None with ``value``).
        interval: [lo, hi] holding the kept samples' exact mean with probability >= 0.95.
        samples: the noisy count C~ of kept samples (a TreeRelease: value, std, ci95).
    """

    t: int
    value: float | None
    std: float | None
    interval: list[float]
    samples: TreeRelease


def make_whole_user_mean(
    epsilon: float | Fraction,
    max_samples: int,
    lower: float | Fraction,
    upper: float | Fraction,
    resolution: int,
    node_prefix: NodeId,
    multiplier: int = 1,
) -> WholeUserMeanSpec:
    """Validate the parameters and build a WholeUserMeanSpec.

    Args:
        epsilon: the statistic's epsilon, split in half between the two counters.
        max_samples: m >= 1.
        lower, upper: the value range, lower < upper.
        resolution: R >= 1.
        node_prefix: the statistic's public identity; the counters' nodes sit under
            ``(*node_prefix, "samples")`` and ``(*node_prefix, "units")``.
        multiplier: 2 when neighbours may drop any subset of one user's events (both
            sensitivities double, ``accounting.sensitivity_multiplier``), else 1.

    Raises:
        InvalidOperatorConfig: a parameter out of range; the message names it.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("max_samples", max_samples, 1)
    _validate.check_int_ge("resolution", resolution, 1)
    _validate.check_int_ge("multiplier", multiplier, 1)
    lo = _validate.exact_fraction("lower", lower)
    hi = _validate.exact_fraction("upper", upper)
    if not hi > lo:
        raise _validate.invalid("upper", f"> lower ({lo})", hi)
    count_sens, units_sens = sensitivities(max_samples, resolution, multiplier)
    prefix = tuple(node_prefix)
    return WholeUserMeanSpec(
        epsilon=eps,
        max_samples=max_samples,
        lower=lo,
        upper=hi,
        resolution=resolution,
        samples=tree_counter.make_binary_tree(eps / 2, count_sens, (*prefix, "samples")),
        units=tree_counter.make_binary_tree(eps / 2, units_sens, (*prefix, "units")),
    )


def sensitivities(max_samples: int, resolution: int, multiplier: int = 1) -> tuple[int, int]:
    """Per-level L1 sensitivities (count tree, units tree): (m, m R) times ``multiplier``."""
    return multiplier * max_samples, multiplier * max_samples * resolution


def admit(spec: WholeUserMeanSpec, used: int, x: float | int | Fraction) -> tuple[int, int]:
    """(kept samples, kept grid units) of sample ``x`` from a user who sent ``used`` before.

    (1, q) for one of the user's first m samples, q its clipped and snapped value; (0, 0)
    after that.
    """
    if used >= spec.max_samples:
        return 0, 0
    return 1, clip_to_grid(spec.lower, spec.upper, spec.resolution, x)[0]


def init(spec: WholeUserMeanSpec) -> WholeUserMeanState:
    return WholeUserMeanState()


def step(
    spec: WholeUserMeanSpec,
    state: WholeUserMeanState,
    samples: int,
    units: int,
    noise: NoiseSource,
) -> tuple[WholeUserMeanState, WholeUserMeanRelease]:
    """Advance one public time step with the tick's kept ``samples`` (C_t) and ``units`` (S_t)."""
    count_state, count = tree_counter.step(
        spec.samples, tree_state(state, "samples"), samples, noise
    )
    units_state, total = tree_counter.step(spec.units, tree_state(state, "units"), units, noise)
    new_state = WholeUserMeanState(
        t=count_state.t,
        samples_alpha=count_state.alpha,
        samples_totals=count_state.period_totals,
        units_alpha=units_state.alpha,
        units_totals=units_state.period_totals,
    )
    return new_state, _release(spec, count, total)


def tree_state(state: WholeUserMeanState, tree: str) -> tree_counter.BinaryTreeState:
    """The ``tree_counter`` state of tree "samples" or "units"."""
    return tree_counter.BinaryTreeState(
        t=state.t,
        alpha=getattr(state, f"{tree}_alpha"),
        period_totals=getattr(state, f"{tree}_totals"),
    )


def _release(
    spec: WholeUserMeanSpec, count: TreeRelease, total: TreeRelease
) -> WholeUserMeanRelease:
    span, grid = spec.upper - spec.lower, spec.resolution

    def to_value(r: Fraction | float) -> float:
        return float(spec.lower + span * Fraction(r) / grid)

    t = count.t
    # 97.5% each: both noises are inside their bounds with probability >= 0.95.
    h_count = exact_half_width(_scales(spec.samples, t), 0.025)
    h_units = exact_half_width(_scales(spec.units, t), 0.025)
    box = ratio_bounds(total.value, count.value, h_units, h_count)
    if box is None:
        bounds = [float(spec.lower), float(spec.upper)]
    else:
        bounds = [to_value(min(max(b, 0.0), grid)) for b in box]
    if count.value < 1:
        return WholeUserMeanRelease(t, None, None, bounds, count)
    r = min(max(Fraction(total.value, count.value), Fraction(0)), Fraction(grid))
    std = math.sqrt(total.std**2 + float(r) ** 2 * count.std**2) / count.value
    std = min(float(span) / grid * std, float(span) / 2)
    return WholeUserMeanRelease(t, to_value(r), std, bounds, count)


def _scales(spec: tree_counter.BinaryTreeSpec, t: int) -> list[Fraction]:
    return [scale for _, scale, _ in tree_counter.release_nodes(spec, t)]
