"""dpstream's DP mechanisms: pure Python, no Kafka or Faust.

One mechanism per module, each with a frozen Spec built by ``make_<mechanism>``, a frozen
State of plain data, and ``init(spec)`` / ``step(spec, state, x, noise)``. The modules are
grouped by family, one package each (docs/architecture.md says what each may import):

* ``noise``: exact discrete Laplace and Gaussian noise, their sources, fair bits,
  releases and exact error bars, real values on a grid;
* ``trees``: continual counters (binary, k-ary, expiring trees; the square-root
  factorization with Gaussian noise);
* ``user_level``: Dong-Luo-Yi's user-level mechanisms (tracker, truncation, count, sum,
  histogram, k-selection, distinct count, deletions);
* ``selection``: the exponential mechanism and the private median, interval and quantile;
* ``means``: continual and whole-user running means;
* ``cells``: per-cell means, pseudo-users, Clip-User and the per-user cell ledger;
* ``accounting``: the pipeline's privacy statement, and the zCDP helpers.

``errors``, ``state_codec`` and ``_validate`` are shared by all of them. ``baselines`` (the
papers' comparison points, for experiments and tests) is not loaded here.
"""

from . import accounting, cells, means, noise, selection, state_codec, trees, user_level
from .errors import BudgetExceededError, DpStreamError, InvalidOperatorConfig, StateSchemaError
from .noise import (
    CachedNoise,
    KeyedNoise,
    NoiseSource,
    RecordingNoise,
    SeededNoise,
    TreeRelease,
    ZeroNoise,
)

__all__ = [
    "BudgetExceededError",
    "CachedNoise",
    "DpStreamError",
    "InvalidOperatorConfig",
    "KeyedNoise",
    "NoiseSource",
    "RecordingNoise",
    "SeededNoise",
    "StateSchemaError",
    "TreeRelease",
    "ZeroNoise",
    "accounting",
    "cells",
    "means",
    "noise",
    "selection",
    "state_codec",
    "trees",
    "user_level",
]
