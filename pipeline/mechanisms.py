"""Which operator counts a statistic: config -> (module, spec). Glue only, no DP math.

Every counter module offers ``init(spec)``, ``step(spec, state, weight, noise)`` and a
frozen state class; stage 2 stores the state as JSON through ``state_codec``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any

from dpstream.config.schema import StatisticConfig
from dpstream.operators import expiring_tree, kary_tree, state_codec, tree_counter
from dpstream.operators.noise import NoiseSource
from dpstream.operators.release import TreeRelease


@dataclass(frozen=True)
class Counter:
    """A statistic's continual counter: its operator module, spec and state class."""

    mechanism: str  # the releases' "mechanism" field
    module: ModuleType
    spec: Any
    state_cls: type
    # For expiring mechanisms: the privacy loss of an item d ticks old (spec 004's eps*g(d)).
    privacy_loss: Callable[[int], float] | None = None

    def step(
        self, state_json: dict | None, weight: int, noise: NoiseSource
    ) -> tuple[dict, TreeRelease]:
        state = (
            self.module.init(self.spec)
            if state_json is None
            else state_codec.from_json(self.state_cls, state_json)
        )
        state, release = self.module.step(self.spec, state, weight, noise)
        return state_codec.to_json(state), release


def counter_for(stat: StatisticConfig, sensitivity: int, instance: int = 0) -> Counter:
    """The counter of ``stat`` whose leaves have per-level L1 sensitivity ``sensitivity``."""
    epsilon = Fraction(repr(stat.epsilon))  # the decimal the user wrote
    prefix = (stat.name, instance)
    mechanism, k = stat.mechanism, stat.k
    if mechanism == "auto":
        # Public parameters only: choosing costs no privacy (spec 002 section 3.6).
        mechanism, k = kary_tree.choose_tree(epsilon, sensitivity, stat.horizon_ticks, prefix)
    if mechanism == "binary":
        spec = tree_counter.make_binary_tree(epsilon, sensitivity, prefix)
        return Counter(tree_counter.MECHANISM, tree_counter, spec, tree_counter.BinaryTreeState)
    if mechanism in ("kary", "kary_subtract"):
        spec = kary_tree.make_kary_tree(
            epsilon, sensitivity, prefix, k, subtract=mechanism == "kary_subtract"
        )
        return Counter(kary_tree.mechanism(spec), kary_tree, spec, kary_tree.KaryTreeState)
    if mechanism == "expiring":
        spec = expiring_tree.make_expiring_tree(
            epsilon, sensitivity, prefix, Fraction(repr(stat.lam)), stat.delay
        )
        return Counter(
            expiring_tree.MECHANISM,
            expiring_tree,
            spec,
            expiring_tree.ExpiringTreeState,
            privacy_loss=lambda d: expiring_tree.privacy_loss(spec, d),
        )
    raise ValueError(f"unknown mechanism {mechanism!r}")  # the config schema rules this out


def expiration_curve(counter: Counter, max_age: int = 1 << 20) -> list[dict[str, float]]:
    """Privacy loss by age at ages 1, 2, 4, ..., max_age (empty for non-expiring counters)."""
    if counter.privacy_loss is None:
        return []
    ages = [1 << i for i in range(max_age.bit_length())]
    return [{"age_ticks": d, "epsilon": counter.privacy_loss(d)} for d in ages]
