"""dpstream's DP mechanisms: pure Python, no Kafka or Faust.

One mechanism per module, each with a frozen Spec built by ``make_<mechanism>``, a frozen
State of plain data, and ``init(spec)`` / ``step(spec, state, x, noise)``.
"""

from . import (
    accounting,
    binary_mechanism,
    cell_accountant,
    cell_mean,
    clip_user,
    continual_mean,
    deletions,
    distinct_count,
    expiring_tree,
    exponential_mechanism,
    k_selection,
    kary_tree,
    private_interval,
    private_median,
    private_quantile,
    pseudo_users,
    snapping,
    state_codec,
    svt,
    tree_counter,
    truncation,
    user_level,
    whole_user_mean,
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
    "accounting",
    "binary_mechanism",
    "cell_accountant",
    "cell_mean",
    "clip_user",
    "continual_mean",
    "deletions",
    "distinct_count",
    "expiring_tree",
    "exponential_mechanism",
    "k_selection",
    "kary_tree",
    "private_interval",
    "private_median",
    "private_quantile",
    "pseudo_users",
    "snapping",
    "state_codec",
    "svt",
    "tree_counter",
    "truncation",
    "user_level",
    "whole_user_mean",
]
