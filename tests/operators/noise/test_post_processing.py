"""Post-processing of a counter's releases (operators/noise/post_processing.py): worked
examples, the invariants of every shown value, and on a real binary tree counter with keyed
noise, that the raised interval still covers the exact value, the shown value is never
below 0 and moves less at quiet ticks than the unbiased estimate."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from dpstream.operators.noise import KeyedNoise, Shown, floored_interval, interval, settle
from dpstream.operators.trees import tree_counter


def test_worked_examples():
    # First release: the estimate itself, raised to the floor; the interval likewise.
    assert settle(None, -7, 5.2, (-17.0, 3.0), 0) == Shown(0, (0.0, 3.0))
    assert settle(None, -7, 5.2, (-17.0, 3.0), None) == Shown(-7, (-17.0, 3.0))
    # Within floor(std) = 5 of the new estimate: the shown value stays put.
    assert settle(100, 103, 5.2, (93.0, 113.0), 0) == Shown(100, (93.0, 113.0))
    assert settle(100, 95, 5.2, (85.0, 105.0), 0).value == 100
    # Further: it moves to the band's nearer edge, no further.
    assert settle(100, 110, 5.2, (100.0, 120.0), 0).value == 105
    assert settle(100, 90, 5.2, (80.0, 100.0), 0).value == 95
    # The band is cut to the interval (a band wider than the interval's half-width).
    assert settle(100, 110, 30.0, (104.5, 115.5), 0).value == 105
    # No noise (band 0): the estimate exactly.
    assert settle(100, 110, 0.0, (110.0, 110.0), 0).value == 110
    # An interval wholly below the floor collapses onto it.
    assert floored_interval(-30.0, -2.0, 0) == (0.0, 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_every_shown_value_lies_in_its_interval_and_near_the_estimate(seed):
    rng = random.Random(seed)
    previous: int | None = None
    for _ in range(2000):
        value = rng.randint(-200, 200)
        std = rng.uniform(0.0, 60.0)
        half = std * rng.uniform(1.0, 4.0)
        floor = rng.choice([None, 0, -50])
        low, high = value - half, value + half
        shown = settle(previous, value, std, (low, high), floor)
        lo, hi = shown.interval
        assert isinstance(shown.value, int)
        assert lo <= shown.value <= hi
        if floor is not None:
            assert shown.value >= floor and lo >= floor
            assert abs(shown.value - value) <= math.floor(std) or shown.value == floor
        else:
            assert abs(shown.value - value) <= math.floor(std)
            assert (lo, hi) == (low, high)
        # Coverage: whatever the raised interval leaves out, the unraised one did too, for
        # any true value at or above the floor.
        for true in (value - half - 1, value, value + half, floor):
            if true is not None and (floor is None or true >= floor) and low <= true <= high:
                assert lo <= true <= hi
        previous = shown.value


def _run(seed: int, weights: list[int]) -> list[tuple[int, int, Shown]]:
    """(exact, unbiased, shown) per tick of a binary tree counter (epsilon 1, tau 1) under
    keyed noise, shown as the kinds show it."""
    spec = tree_counter.make_binary_tree(Fraction(1), 1, ("s", 0))
    noise = KeyedNoise(seed.to_bytes(32, "big"))
    state, previous, exact, out = tree_counter.init(spec), None, 0, []
    for w in weights:
        state, rel = tree_counter.step(spec, state, w, noise)
        exact += w
        low, high = interval(rel.value, rel.ci95)
        shown = settle(previous, rel.value, rel.std, (low, high), 0)
        previous = shown.value
        out.append((exact, rel.value, shown))
    return out


def test_on_a_tree_counter_intervals_cover_and_counts_are_never_negative():
    # 40 seeds x 100 ticks of a count that starts at 0 and stays small (an early stream):
    # the raised intervals must still cover the exact count at >= 95% of ticks (each tick's
    # interval covers with probability >= 0.95 exactly; 4000 draws, correlated across the
    # ticks of a seed, so a tolerance of 3 binomial sigmas times 3).
    rng = random.Random(7)
    rows = [
        r for seed in range(1, 41) for r in _run(seed, [rng.choice([0, 0, 1]) for _ in range(100)])
    ]
    covered = [s.interval[0] <= e <= s.interval[1] for e, _, s in rows]
    n = len(rows)
    assert np.mean(covered) >= 0.95 - 9 * math.sqrt(0.05 * 0.95 / n)
    assert all(s.value >= 0 and s.interval[0] >= 0 for _, _, s in rows)
    # The unbiased estimate is below 0 often early on (that is what the floor fixes) ...
    assert np.mean([u < 0 for _, u, _ in rows]) > 0.05
    # ... and the shown value's error is no larger than the estimate's here.
    err = lambda i: math.sqrt(np.mean([(e - (u, s.value)[i]) ** 2 for e, u, s in rows]))  # noqa: E731
    assert err(1) <= err(0)


def test_at_quiet_ticks_the_shown_value_wanders_less_than_the_estimate():
    # 100 events at tick 1, then nothing: the exact count never moves, the estimate's
    # noise does (about a std per tick); the shown value moves only when the new estimate
    # is over a std away, so its mean tick-to-tick move is well below the estimate's.
    moves_unbiased, moves_shown = [], []
    for seed in range(1, 21):
        rows = _run(seed, [100] + [0] * 199)
        for (_, u0, s0), (_, u1, s1) in zip(rows, rows[1:], strict=False):
            moves_unbiased.append(abs(u1 - u0))
            moves_shown.append(abs(s1.value - s0.value))
    assert np.mean(moves_shown) < 0.5 * np.mean(moves_unbiased)
