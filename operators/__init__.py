"""dpstream's DP mechanisms: pure Python, no Kafka or Faust.

One mechanism per module, each with a frozen Spec built by ``make_<mechanism>``, a frozen
State of plain data, and ``init(spec)`` / ``step(spec, state, x, noise)``.
"""

from . import (
    baselines,
    binary_mechanism,
    continual_mean,
    deletions,
    distinct_count,
    expiring_simple,
    expiring_tree,
    k_selection,
    kary_tree,
    naive_mean,
    per_step_mean,
    private_median,
    round_restart,
    snapping,
    state_codec,
    svt,
    tree_counter,
    truncation,
    user_level,
)
from .errors import BudgetExceededError, DpStreamError, InvalidOperatorConfig, StateSchemaError
from .noise import CachedNoise, KeyedNoise, NoiseSource, RecordingNoise, SeededNoise, ZeroNoise
from .release import TreeRelease

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
    "baselines",
    "binary_mechanism",
    "continual_mean",
    "deletions",
    "distinct_count",
    "expiring_simple",
    "expiring_tree",
    "k_selection",
    "kary_tree",
    "naive_mean",
    "per_step_mean",
    "private_median",
    "round_restart",
    "snapping",
    "state_codec",
    "svt",
    "tree_counter",
    "truncation",
    "user_level",
]
