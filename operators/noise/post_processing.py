"""Post-processing of a counter's releases that costs no privacy: a value never below what
the statistic can be (a count below 0), and a value that moves at a tick only as far as
that tick's release requires.

A continual counter releases at every tick the unbiased estimate X_t = exact + noise with
its error bar (``release``): its std sigma_t and the exact 95% interval [X_t - h_t,
X_t + h_t]. Its noise changes from tick to tick (another set of tree nodes), so X_t jumps
by about a std at every tick, with or without new events, and early on it is often below
0. What a user is shown, ``settle`` below, is a function of the released X_t, sigma_t,
h_t and the value shown at the tick before, and of public parameters (the floor), never
of the data or of whether events came:

* **the band**: the value shown at t is the value shown at t - 1 moved into
  [X_t - floor(sigma_t), X_t + floor(sigma_t)], that band cut to the interval: it stays
  put while the new release is within one std of it, and moves only as far as the release
  requires (a deadband filter). At quiet ticks it stays where it was unless the noise of
  the release moves by more than a std; it never leaves the interval and never strays
  more than one std from the unbiased estimate (so its error exceeds the estimate's by at
  most a std, under a trend faster than a std per few ticks: docs/design.md, section 5c);
* **the floor**: the shown value and the interval are raised to the least value the
  statistic can take (0 for a count, a sum of values >= 0, a histogram bin, a distinct
  count): ``floored_interval``. The interval still covers what the unraised one covered,
  since the true (truncated) value is never below the floor.

Integers stay integers: X_t is an integer (discrete noise), the band's ends are integers,
so is the value shown.

Privacy:
    Post-processing of released values and public parameters (Dwork-Roth, Prop. 2.1):
    costs no privacy. Nothing is drawn, so nothing is ever re-drawn; the rule reads no
    exact quantity (in particular not whether the tick had events, which is itself
    private), only what was published.

References:
    C. Dwork, A. Roth. The Algorithmic Foundations of Differential Privacy. Foundations and
    Trends in TCS 9(3-4), 2014, Prop. 2.1 (post-processing).
    M. Hay, V. Rastogi, G. Miklau, D. Suciu. Boosting the Accuracy of Differentially
    Private Histograms Through Consistency. PVLDB 3(1), 2010, arXiv:0904.0942 (values
    made consistent with what is known of the truth, here a floor, as post-processing).
    The band rule is ours (docs/design.md, section 5c, with the alternatives considered:
    Honaker's variance-optimal tree estimate, monotone consistency across ticks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shown:
    """What is shown of one release.

    Attributes:
        value: the settled value (an integer).
        interval: the release's interval, raised to the floor; ``value`` lies in it.
    """

    value: int
    interval: tuple[float, float]


def floored_interval(low: float, high: float, floor: int | None) -> tuple[float, float]:
    """[low, high] with both ends raised to ``floor`` (None: unchanged).

    If the true value v satisfies v >= floor and low <= v <= high, then
    max(low, floor) <= v <= max(high, floor): coverage is kept.

    Example:
        >>> floored_interval(-30.0, 12.0, 0)
        (0.0, 12.0)
        >>> floored_interval(-30.0, -2.0, 0)
        (0.0, 0.0)
    """
    if floor is None:
        return (low, high)
    return (max(low, float(floor)), max(high, float(floor)))


def settle(
    previous: int | None,
    value: int,
    band: float,
    interval: tuple[float, float],
    floor: int | None,
) -> Shown:
    """The value shown for a release, from the value shown at the tick before.

    Args:
        previous: the value shown at the tick before (None: the first release).
        value: the release's unbiased estimate X_t (an integer).
        band: how far the shown value may be from X_t: the release's std (0 keeps X_t,
            as with noise that is known to be zero).
        interval: the release's interval [X_t - h_t, X_t + h_t].
        floor: the least value the statistic can take (None: no such bound).

    Returns:
        The shown value: ``previous`` moved into [X_t - floor(band), X_t + floor(band)]
        cut to the interval (X_t itself at the first release), then raised to the floor;
        and the interval raised to the floor, which contains it.

    Privacy:
        A function of released values and public parameters only (module docstring).

    Example:
        >>> settle(None, -7, 5.2, (-17.0, 3.0), 0)
        Shown(value=0, interval=(0.0, 3.0))
        >>> settle(100, 103, 5.2, (93.0, 113.0), 0).value  # within a std: stays
        100
        >>> settle(100, 110, 5.2, (100.0, 120.0), 0).value  # moves to the band's edge
        105
    """
    low, high = interval
    width = math.floor(band)
    lowest = max(value - width, math.ceil(low))
    highest = min(value + width, math.floor(high))
    shown = value if previous is None else min(max(previous, lowest), highest)
    if floor is not None:
        shown = max(shown, floor)
    return Shown(shown, floored_interval(low, high, floor))
