"""Exactly fair random bits from a NoiseSource, for choices made without floating point.

The exponential mechanism (``selection.exponential_mechanism``) and George et al.'s private
median (``selection.private_median``) read their randomness one bit at a time from here:

* **Bits.** Bit j of a choice is the sign of the discrete Laplace draw of node
  ``(*node, j)`` at scale 2^16 (``BIT_SCALE``); a zero draw (probability about 2^-17) is
  skipped. A discrete Laplace is symmetric, so the sign of a non-zero draw is an exactly
  fair bit, and with the keyed production source bit j is a pure function of
  (key, node, j): a replay makes the same choice again, it never re-draws.
* **Noiseless test sources.** ``ZeroNoise`` only ever returns 0. After 16 zero draws in a
  row (``MAX_ZERO_RUN``) the source is declared degenerate (``DegenerateNoise``) and the
  caller falls back to a fixed choice (the sampler's mode, the middle of a uniform range).
  Under a real source that event has probability below 2^-270 per bit.

References:
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010 (exact sampling from rational parameters).
"""

from __future__ import annotations

from fractions import Fraction

from .. import _validate
from .discrete_laplace import NodeId, node_bytes
from .sources import NoiseSource

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

BIT_SCALE = Fraction(1 << 16)
"""Scale of the discrete Laplace draws whose signs are the bits (P(draw = 0) ~ 2^-17)."""

MAX_ZERO_RUN = 16
"""Zero draws in a row after which a source is treated as noiseless (ZeroNoise)."""


class DegenerateNoise(Exception):
    """The noise source returned only zeros: it cannot supply random bits (test double)."""


class NoiseBits:
    """Fair random bits for one choice, bit j from the draw of node ``(*node, j)``."""

    __slots__ = ("_noise", "_node", "_next", "degenerate", "scale", "max_zero_run")

    def __init__(
        self,
        noise: NoiseSource,
        node: NodeId,
        scale: Fraction = BIT_SCALE,
        max_zero_run: int = MAX_ZERO_RUN,
    ) -> None:
        """Bind a noise source to the public identity of one choice.

        Args:
            noise: where the draws come from.
            node: public identity of the choice, e.g. (statistic, cell, slot, "interval").
            scale: the discrete Laplace scale of a bit's draw (P(draw = 0) ~ 1 / (2 scale)).
            max_zero_run: zero draws in a row after which the source is degenerate.
        """
        node_bytes(node)  # validates the identity
        self._noise = noise
        self._node = tuple(node)
        self._next = 0
        self.degenerate = False
        self.scale = scale
        self.max_zero_run = max_zero_run

    @property
    def draws(self) -> int:
        """Number of noise draws made so far (each is one node)."""
        return self._next

    def nonzero(self, scale: Fraction) -> int:
        """The next non-zero draw at ``scale`` (each draw is the next node).

        Raises:
            DegenerateNoise: the source gave ``max_zero_run`` zeros in a row (now or before).
        """
        if self.degenerate:
            raise DegenerateNoise
        for _ in range(self.max_zero_run):
            z = self._noise.discrete_laplace((*self._node, self._next), scale)
            self._next += 1
            if z:
                return z
        self.degenerate = True
        raise DegenerateNoise

    def bit(self) -> int:
        """One exactly fair bit: the sign of a non-zero draw (a discrete Laplace is
        symmetric).

        Returns:
            0 or 1.

        Raises:
            DegenerateNoise: as ``nonzero``.
        """
        return int(self.nonzero(self.scale) > 0)


def bernoulli_exp(gamma: Fraction, bits: NoiseBits) -> bool:
    """True with probability exp(-gamma), gamma >= 0 rational, exactly.

    For Z discrete Laplace with scale s * den, P(|Z| - 1 >= k | Z != 0) = exp(-k / (s den));
    with k = num * s that is exp(-num / den) (s = ``bits.scale``; one non-zero draw).

    Raises:
        DegenerateNoise: as ``NoiseBits.nonzero``.
    """
    if gamma == 0:
        return True
    return abs(bits.nonzero(bits.scale * gamma.denominator)) - 1 >= gamma.numerator * bits.scale


def uniform_below(n: int, bits: NoiseBits) -> int:
    """A uniform integer in [0, n), by rejection on bit_length(n - 1) fair bits.

    Args:
        n: number of outcomes, >= 1.
        bits: the bit source of this choice.

    Returns:
        The integer; (n - 1) // 2 if the source is degenerate (noiseless tests).
    """
    _validate.check_int_ge("n", n, 1)
    width = (n - 1).bit_length()
    try:
        while True:
            value = 0
            for _ in range(width):
                value = (value << 1) | bits.bit()
            if value < n:
                return value
    except DegenerateNoise:
        return (n - 1) // 2
