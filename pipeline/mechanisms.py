"""Which operator counts a statistic: config -> (module, spec). Glue only, no DP math.

Every counter module offers ``init(spec)``, ``step(spec, state, weight, noise)`` and a
frozen state class; stage 2 stores the state as JSON through ``state_codec``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any

from dpstream.config.schema import StatisticConfig
from dpstream.operators import state_codec, tree_counter
from dpstream.operators.noise import NoiseSource
from dpstream.operators.release import TreeRelease


@dataclass(frozen=True)
class Counter:
    """A statistic's continual counter: its operator module, spec and state class."""

    mechanism: str  # the releases' "mechanism" field
    module: ModuleType
    spec: Any
    state_cls: type

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
    spec = tree_counter.make_binary_tree(epsilon, sensitivity, prefix)
    return Counter(tree_counter.MECHANISM, tree_counter, spec, tree_counter.BinaryTreeState)
