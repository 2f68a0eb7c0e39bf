"""Fixed-tau truncation of user contributions, Dong-Luo-Yi Alg. 3.

Truncate(D, tau) keeps the first tau units of every user in time order and replaces the
rest by dummies. After it, removing one whole user changes each tree level's node
vector by at most tau in L1, so the tree runs with sensitivity tau (group privacy).

The used count is taken on the ORIGINAL stream (Dong-Luo-Yi Sec. II-A): a user's later
events stay truncated even though they added nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1


@dataclass(frozen=True, slots=True)
class TruncationSpec:
    """Attributes: tau, the number of units one user may contribute in total."""

    tau: int


def make_truncation(tau: int) -> TruncationSpec:
    _validate.check_int_ge("tau", tau, 1)
    return TruncationSpec(tau=tau)


def admit(spec: TruncationSpec, used: int, weight: int = 1) -> int:
    """Units of a ``weight``-unit item kept for a user who has already sent ``used`` units.

    A count item has weight 1; a batched sum item keeps ``clip(tau - used, 0, weight)``
    units, so the item that straddles tau is kept partly (our batched form of
    Dong-Luo-Yi Sec. IV-A, whose unit sub-steps it reproduces).

    Whatever ``used`` and ``weight`` are, the result is in [0, tau]: a negative ``used``
    counts as 0 and a negative weight keeps nothing, so no input lets a user's kept
    units exceed tau (the sensitivity the tree is run with).
    """
    return max(min(spec.tau - max(used, 0), weight), 0)


def admit_many(spec: TruncationSpec, used: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``admit`` of many items at once (int64 arrays of the same shape)."""
    return np.maximum(np.minimum(spec.tau - np.maximum(used, 0), weight), 0)
