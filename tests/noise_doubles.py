"""The noise test doubles of dpstream's own tests: every scripted or memoized NoiseSource a
test needs is built from the two classes here.

* ``NodeNoise``: a value per node, from a constant or a function of (node, scale). Scripted
  values (markers, fixed shifts, "+3 on eta, -2 on q") make a release an exact number.
* ``MemoNoise``: the first value of each (node, scale) is remembered and returned on every
  later request, as the keyed production source does; ``MemoNoise.seeded`` is a fast
  random oracle for the statistical tests.
* The recorder is production's ``dpstream.operators.noise.RecordingNoise`` (the tree
  benchmark uses it too); wrap any source in it to see which nodes a mechanism asks for.

They live here, in the test suite, and not in the shipped pytest plugin (dpstream.testing):
users test pipelines end to end with ``ZeroNoise`` and keyed noise, while scripting node
noise only makes sense against the operators' internal node layout, which is ours.
A plain module, so that no test module imports another.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpstream.operators.noise import NodeId

NodeValue = Callable[[NodeId, Fraction], int]
"""The noise of a node at a scale."""


class NodeNoise:
    """Scripted noise: ``value`` for every node, or ``value(node, scale)``. NOT private.

    A constant makes every node's noise that constant; a function computes it from the
    node (e.g. a marker per tree node, or a shift on the nodes a neighbour changes).
    """

    def __init__(self, value: int | NodeValue) -> None:
        self._value = value

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        if isinstance(self._value, int):
            return self._value
        return self._value(node, scale)

    def __repr__(self) -> str:
        return f"NodeNoise({self._value!r})"


class MemoNoise:
    """Remembers the first draw of each (node, scale) of ``inner`` and returns it on every
    later request: a lazily sampled random oracle with the keyed source's semantics.

    ``drawn`` holds the values drawn so far (insertion-ordered); ``new_run()`` forgets them,
    so the next run draws fresh values from ``inner`` (a fresh key, for the audit).
    """

    def __init__(self, inner: NodeNoise | NodeValue) -> None:
        self._inner = inner if isinstance(inner, NodeNoise) else NodeNoise(inner)
        self.drawn: dict[tuple[NodeId, Fraction], int] = {}

    @classmethod
    def seeded(cls, seed: int) -> MemoNoise:
        """A fast random oracle for statistical tests (~10x faster than the exact sampler).

        Draws are G1 - G2 with G geometric of success 1 - exp(-1/b) (numpy, float p):
        P(Z = z) proportional to exp(-|z|/b) up to the float rounding of p.
        """
        return cls(_geometric_differences(seed))

    def new_run(self) -> None:
        self.drawn.clear()

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        key = (node, scale)
        value = self.drawn.get(key)
        if value is None:
            value = self._inner.discrete_laplace(node, scale)
            self.drawn[key] = value
        return value

    def __repr__(self) -> str:
        return f"MemoNoise({self._inner!r})"


def _geometric_differences(seed: int) -> NodeValue:
    """Sequential draws G1 - G2 per scale, generated 4,096 at a time; the node is ignored."""
    rng = np.random.default_rng(seed)
    pools: dict[Fraction, list] = {}  # scale -> [draws, next index]

    def draw(node: NodeId, scale: Fraction) -> int:
        pool = pools.get(scale)
        if pool is None or pool[1] >= len(pool[0]):
            p = -math.expm1(-1 / float(scale))
            pool = [(rng.geometric(p, 4096) - rng.geometric(p, 4096)).tolist(), 0]
            pools[scale] = pool
        value = pool[0][pool[1]]
        pool[1] += 1
        return value

    return draw


def shifted_noise(noise: NodeNoise | MemoNoise, shifts: dict[NodeId, int]) -> NodeNoise:
    """``noise`` plus ``shifts[node]`` on the listed nodes: the coupled noise under which a
    neighbouring input gives the same releases (the coupling arguments of privacy proofs)."""
    return NodeNoise(lambda node, scale: noise.discrete_laplace(node, scale) + shifts.get(node, 0))
