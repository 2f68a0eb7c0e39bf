"""Where operators get their noise: the NoiseSource interface and its sources.

A noise source draws the noise of a *node*, the public identity of one noisy quantity,
as exact discrete Laplace (``discrete_laplace``) or exact discrete Gaussian
(``discrete_gaussian``) noise. In production the draw is a pure function of (secret key,
node, the distribution's parameters): asking twice, e.g. after a crash and replay,
returns the same value instead of a second independent sample that an observer could
average. Tests use a seeded, a zero and a recording source; ``CachedNoise`` remembers a
keyed source's recent draws and ``ScopedNoise`` puts a statistic's identity in front of
every node.

References:
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010. Algorithms 1-3.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np

from .._validate import check_int_ge
from ..errors import InvalidOperatorConfig
from .discrete_gaussian import check_gaussian, sample_discrete_gaussian
from .discrete_laplace import (
    NodeId,
    _check_scale,
    _field,
    _int_bytes,
    node_bytes,
    sample_discrete_laplace,
)

_MIN_KEY_BYTES = 16
_LAPLACE_TAG = b"dpstream/noise/discrete-laplace/v1"
_GAUSSIAN_TAG = b"dpstream/noise/discrete-gaussian/v1"
_BLOCK_BYTES = 64
# numpy's int64 integers() cannot take a larger bound; beyond it we combine chunks.
_CHUNK_BITS = 62
_ZERO = Fraction(0)


# ---------------------------------------------------------------------------------------
# Bit sources


class _KeyedStream:
    """Uniform integers derived from (tag, key, node, parameters) by SHAKE-256 in counter
    mode; the parameters are the distribution's (a Laplace scale; a Gaussian's sigma^2
    and centre), each written as numerator and denominator.

    SHAKE-256 over a length-prefixed key is a PRF (the sponge has no length-extension),
    so the stream is indistinguishable from random without the key, and fully
    reproducible with it. The tag separates the two distributions' streams.
    """

    def __init__(
        self, key: bytes, node: NodeId, params: tuple[Fraction, ...], tag: bytes = _LAPLACE_TAG
    ) -> None:
        encoded = _field(b"t", tag) + _field(b"k", key) + _field(b"n", node_bytes(node))
        for value in params:
            encoded += _field(b"i", _int_bytes(value.numerator))
            encoded += _field(b"i", _int_bytes(value.denominator))
        self._prefix = hashlib.shake_256(encoded)
        self._counter = 0
        self._pool = 0
        self._pool_bits = 0

    def _refill(self) -> None:
        block = self._prefix.copy()
        block.update(self._counter.to_bytes(8, "big"))
        self._counter += 1
        self._pool |= int.from_bytes(block.digest(_BLOCK_BYTES), "big") << self._pool_bits
        self._pool_bits += 8 * _BLOCK_BYTES

    def rand_below(self, n: int) -> int:
        """Uniform integer in [0, n) by rejection on the fewest bits (no modulo bias).

        Args:
            n: exclusive upper bound, >= 1.

        Returns:
            The integer.
        """
        check_int_ge("n", n, 1)
        bits = (n - 1).bit_length()
        while True:
            while self._pool_bits < bits:
                self._refill()
            value = self._pool & ((1 << bits) - 1)
            self._pool >>= bits
            self._pool_bits -= bits
            if value < n:
                return value


def _generator_rand_below(rng: np.random.Generator, n: int) -> int:
    """Uniform integer in [0, n) from a local numpy Generator, for any n >= 1."""
    check_int_ge("n", n, 1)
    if n <= 1 << _CHUNK_BITS:
        return int(rng.integers(n))
    bits = (n - 1).bit_length()
    chunks = -(-bits // _CHUNK_BITS)
    while True:
        value = 0
        for _ in range(chunks):
            value = (value << _CHUNK_BITS) | int(rng.integers(1 << _CHUNK_BITS))
        value &= (1 << bits) - 1
        if value < n:
            return value


# ---------------------------------------------------------------------------------------
# Noise sources


@runtime_checkable
class NoiseSource(Protocol):
    """Where operators get their noise from."""

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """Discrete Laplace noise of ``node`` at ``scale``."""
        ...

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """A draw of N_Z(center, sigma2) for ``node`` (the noise plus the centre)."""
        ...


class KeyedNoise:
    """Production source: a node's draw is a pure function of (key, node, parameters).

    The same node and parameters always give the same value (replay safety); distinct
    nodes give independent draws, and so do a node's Laplace and Gaussian draws (their
    streams have different domain tags). The key never appears in repr, str or error
    messages.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        """Keep the secret key.

        Args:
            key: secret bytes, at least 16 of them.

        Raises:
            InvalidOperatorConfig: ``key`` is not bytes or is shorter than 16 bytes.
        """
        if not isinstance(key, (bytes, bytearray)):
            raise InvalidOperatorConfig(f"key must be bytes, got {type(key).__name__}")
        if len(key) < _MIN_KEY_BYTES:
            raise InvalidOperatorConfig(
                f"key must be at least {_MIN_KEY_BYTES} bytes, got {len(key)} bytes"
            )
        self._key = bytes(key)

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """Discrete Laplace noise of ``node`` at ``scale``, the same on every call.

        Args:
            node: public node identity.
            scale: b > 0.

        Returns:
            The noise.
        """
        scale = _check_scale(scale)
        return sample_discrete_laplace(scale, _KeyedStream(self._key, node, (scale,)).rand_below)

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """A draw of N_Z(center, sigma2) for ``node``, the same on every call.

        The bits come from (key, node, sigma2, center) under the Gaussian tag, so a change
        of either parameter draws afresh, as a Laplace scale change does.

        Args:
            node: public node identity.
            sigma2: sigma^2 > 0, exact.
            center: c, exact.

        Returns:
            The integer drawn.
        """
        sigma2, center = check_gaussian(sigma2, center)
        stream = _KeyedStream(self._key, node, (sigma2, center), _GAUSSIAN_TAG)
        return sample_discrete_gaussian(sigma2, stream.rand_below, center)

    def __repr__(self) -> str:
        return "KeyedNoise(key=<redacted>)"


class ScopedNoise:
    """The noise of one statistic: every node is drawn under the statistic's identity.

    A node id says where in a statistic's tree a noise sits, not whose statistic it is;
    the scope (pipeline, statistic, parameter fingerprint, start tick) does. Prefixing it
    makes the draws of two pipelines, two parameter sets or two starts of a statistic
    independent under one key, while a replay or a restart of the same statistic
    re-derives the same values.
    """

    __slots__ = ("_inner", "_scope")

    def __init__(self, inner: NoiseSource, scope: NodeId) -> None:
        """Scope ``inner``.

        Args:
            inner: the source that draws the values.
            scope: the statistic's identity, e.g. (app id, name, fingerprint, start tick).
        """
        node_bytes(scope)
        self._inner = inner
        self._scope = tuple(scope)

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """The inner source's noise of ``scope + node``.

        Args:
            node: the node within the statistic.
            scale: b > 0.

        Returns:
            The noise.
        """
        return self._inner.discrete_laplace((*self._scope, *node), scale)

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """The inner source's Gaussian draw for ``scope + node``.

        Args:
            node: the node within the statistic.
            sigma2: sigma^2 > 0, exact.
            center: c, exact.

        Returns:
            The integer drawn.
        """
        return self._inner.discrete_gaussian((*self._scope, *node), sigma2, center)

    def __repr__(self) -> str:
        return f"ScopedNoise({self._inner!r}, {self._scope!r})"


class SeededNoise:
    """Test source: sequential draws from a local PCG64 generator; the node is ignored."""

    def __init__(self, seed: int) -> None:
        """Seed a private generator (the global numpy and random states are untouched).

        Args:
            seed: integer >= 0.
        """
        check_int_ge("seed", seed, 0)
        self._seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """The next draw at ``scale``.

        Args:
            node: validated, otherwise unused.
            scale: b > 0.

        Returns:
            The noise.
        """
        node_bytes(node)
        return sample_discrete_laplace(scale, self._rand_below)

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """The next draw of N_Z(center, sigma2).

        Args:
            node: validated, otherwise unused.
            sigma2: sigma^2 > 0, exact.
            center: c, exact.

        Returns:
            The integer drawn.
        """
        node_bytes(node)
        return sample_discrete_gaussian(sigma2, self._rand_below, center)

    def _rand_below(self, n: int) -> int:
        return _generator_rand_below(self._rng, n)

    def __repr__(self) -> str:
        return f"SeededNoise(seed={self._seed})"


class ZeroNoise:
    """Test source: no noise. NOT private."""

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """Zero, after the same argument checks as the real sources.

        Args:
            node: public node identity.
            scale: b > 0.

        Returns:
            0.
        """
        node_bytes(node)
        _check_scale(scale)
        return 0

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """The integer nearest the centre (the distribution's mode; 0 for the default
        centre), after the same argument checks as the real sources.

        Args:
            node: public node identity.
            sigma2: sigma^2 > 0, exact.
            center: c, exact.

        Returns:
            floor(center + 1/2).
        """
        node_bytes(node)
        _, center = check_gaussian(sigma2, center)
        return math.floor(center + Fraction(1, 2))

    def __repr__(self) -> str:
        return "ZeroNoise()"


class RecordingNoise:
    """Test source: forwards to ``inner`` and records every draw: (node, scale, value) in
    ``calls``, (node, sigma2, center, value) in ``gaussian_calls``."""

    def __init__(self, inner: NoiseSource) -> None:
        """Wrap a source.

        Args:
            inner: the source that draws the values.
        """
        self.inner = inner
        self.calls: list[tuple[NodeId, Fraction, int]] = []
        self.gaussian_calls: list[tuple[NodeId, Fraction, Fraction, int]] = []

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """The inner source's value, recorded.

        Args:
            node: public node identity.
            scale: b > 0.

        Returns:
            The noise.
        """
        value = self.inner.discrete_laplace(node, scale)
        self.calls.append((node, scale, value))
        return value

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """The inner source's Gaussian draw, recorded.

        Args:
            node: public node identity.
            sigma2: sigma^2 > 0, exact.
            center: c, exact.

        Returns:
            The integer drawn.
        """
        value = self.inner.discrete_gaussian(node, sigma2, center)
        self.gaussian_calls.append((node, sigma2, center, value))
        return value

    def __repr__(self) -> str:
        return f"RecordingNoise({self.inner!r})"


class CachedNoise:
    """Remembers the last ``maxsize`` node draws of a deterministic source.

    A tree release re-reads the noise of every node it uses (O(log t) of them), most of
    which were already drawn at earlier steps. For a keyed source a node's value never
    changes, so caching it is safe and makes the noise work per step amortized O(1).
    Do not wrap a sequential source (SeededNoise): it would repeat values on purpose.
    """

    def __init__(self, inner: NoiseSource, maxsize: int = 4096) -> None:
        self.inner = inner
        self.maxsize = maxsize
        self._cache: dict[tuple[NodeId, tuple[Fraction, ...]], int] = {}

    def __repr__(self) -> str:
        return f"CachedNoise({self.inner!r}, maxsize={self.maxsize})"

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        """The inner source's value, from the cache after the first ask."""
        return self._remember((node, (scale,)), lambda: self.inner.discrete_laplace(node, scale))

    def discrete_gaussian(self, node: NodeId, sigma2: Fraction, center: Fraction = _ZERO) -> int:
        """The inner source's Gaussian draw, from the cache after the first ask."""
        return self._remember(
            (node, (sigma2, center)), lambda: self.inner.discrete_gaussian(node, sigma2, center)
        )

    def _remember(self, key: tuple[NodeId, tuple[Fraction, ...]], draw: Callable[[], int]) -> int:
        value = self._cache.pop(key, None)
        if value is None:
            value = draw()
            if len(self._cache) >= self.maxsize:
                del self._cache[next(iter(self._cache))]  # least recently used
        self._cache[key] = value
        return value
