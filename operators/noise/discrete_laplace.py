"""Exact discrete Laplace noise, its sources, and its error bars.

Every noisy value dpstream releases is ``exact + Z`` with Z discrete Laplace
(two-sided geometric), P(Z = z) proportional to exp(-|z| / b) over the integers. The
sampler uses only integer and Fraction arithmetic driven by a uniform-integer source,
so its output distribution is exactly the one the privacy proof assumes: no
floating-point Laplace, whose rounding artefacts leak the exact value (Mironov 2012).

A noise source draws the noise of a *node*, the public identity of one noisy quantity.
In production the draw is a pure function of (secret key, node, scale): asking twice,
e.g. after a crash and replay, returns the same value instead of a second independent
sample that an observer could average.

References:
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010. Algorithms 1 and 2.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np

from .._validate import check_int_ge, check_positive, check_probability
from ..errors import InvalidOperatorConfig

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

NodeId = tuple[str | int, ...]
"""Public identity of a node, e.g. ("events", 0, 3, 1, 2) = (statistic, instance,
period, level, index)."""

RandBelow = Callable[[int], int]
"""``rand_below(n)`` returns a uniform integer in [0, n)."""

_ONE = Fraction(1)
_MIN_KEY_BYTES = 16
_DOMAIN_TAG = b"dpstream/noise/discrete-laplace/v1"
_BLOCK_BYTES = 64
# numpy's int64 integers() cannot take a larger bound; beyond it we combine chunks.
_CHUNK_BITS = 62


# ---------------------------------------------------------------------------------------
# Node identities


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(8, "big") + payload


def _int_bytes(value: int) -> bytes:
    return value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True)


def node_bytes(node: NodeId) -> bytes:
    """Canonical, unambiguous encoding of a node identity.

    Each field is a type tag, an 8-byte length and the payload, so that no two distinct
    nodes share an encoding: ("a1",) != ("a", 1) and ("1",) != (1,).

    Example:
        >>> node_bytes(("a1",)) == node_bytes(("a", 1))
        False
        >>> node_bytes(("1",)) == node_bytes((1,))
        False
        >>> node_bytes(("clicks", 3)) == node_bytes(("clicks", 3))
        True

    Args:
        node: tuple of str and int fields.

    Returns:
        The encoding.

    Raises:
        InvalidOperatorConfig: ``node`` is not a tuple of str and int (bool excluded,
            since True == 1 would otherwise alias two different-looking nodes).
    """
    if not isinstance(node, tuple):
        raise InvalidOperatorConfig(f"node must be a tuple, got {node!r}")
    parts = []
    for value in node:
        if isinstance(value, str):
            parts.append(_field(b"s", value.encode("utf-8")))
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(_field(b"i", _int_bytes(value)))
        else:
            raise InvalidOperatorConfig(f"node fields must be str or int, got {value!r}")
    return b"".join(parts)


# ---------------------------------------------------------------------------------------
# Exact sampler


def _check_scale(scale: Fraction) -> Fraction:
    if isinstance(scale, float):
        # Fraction(0.1) is the binary double, not 1/10: convert config values explicitly.
        raise InvalidOperatorConfig(
            f"scale must be a Fraction (see _validate.exact_fraction), got {scale!r}"
        )
    if isinstance(scale, bool) or not isinstance(scale, (int, Fraction)):
        raise InvalidOperatorConfig(f"scale must be a Fraction, got {scale!r}")
    check_positive("scale", scale)
    return Fraction(scale)


def _bernoulli(num: int, den: int, rand_below: RandBelow) -> bool:
    """Bernoulli(num / den) for integers 0 <= num <= den, den > 0."""
    return rand_below(den) < num


def _bernoulli_exp(gamma: Fraction, rand_below: RandBelow) -> bool:
    """Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS 2020, Algorithm 1).

    Args:
        gamma: the exponent, a non-negative Fraction.
        rand_below: uniform integer source.

    Returns:
        True with probability exactly exp(-gamma).
    """
    if gamma <= 1:
        num, den = gamma.numerator, gamma.denominator
        # P(K > k) = gamma^k / k!, so P(K odd) is the alternating series of exp(-gamma).
        k = 1
        while _bernoulli(num, den * k, rand_below):
            k += 1
        return k % 2 == 1
    # exp(-gamma) = exp(-1)^floor(gamma) * exp(-frac(gamma)); the series above needs gamma <= 1.
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp(_ONE, rand_below):
            return False
    return _bernoulli_exp(gamma - whole, rand_below)


def sample_discrete_laplace(scale: Fraction, rand_below: RandBelow) -> int:
    """One exact draw of discrete Laplace noise (CKS 2020, Algorithm 2).

    Args:
        scale: b > 0; the draw Z has P(Z = z) proportional to exp(-|z| / b).
        rand_below: uniform integer source, ``rand_below(n)`` in [0, n).

    Returns:
        The integer Z.

    Raises:
        InvalidOperatorConfig: ``scale`` is not a positive Fraction (or int).
    """
    scale = _check_scale(scale)
    t, s = scale.numerator, scale.denominator
    while True:
        # U + t*V is geometric with ratio exp(-1/t): U its remainder mod t, V its quotient.
        u = rand_below(t)
        if not _bernoulli_exp(Fraction(u, t), rand_below):
            continue
        v = 0
        while _bernoulli_exp(_ONE, rand_below):
            v += 1
        y = (u + t * v) // s
        negative = _bernoulli(1, 2, rand_below)
        if negative and y == 0:
            # Otherwise zero would get both signs' mass.
            continue
        return -y if negative else y


def discrete_laplace_variance(scale: Fraction | float) -> float:
    """Exact variance 2p / (1 - p)^2, p = exp(-1/b), of discrete Laplace with scale b.

    It is below the continuous 2b^2 (by about 1/6 for large b, far more for small b).

    Args:
        scale: b > 0.

    Returns:
        The variance.
    """
    check_positive("scale", scale)
    inv = 1 / float(scale)
    p = math.exp(-inv)
    one_minus_p = -math.expm1(-inv)
    return 2 * p / one_minus_p**2


def laplace_variance(scale: Fraction | float) -> float:
    """Variance 2b^2 of the continuous Laplace distribution, the one papers quote.

    Args:
        scale: b > 0.

    Returns:
        The variance.
    """
    check_positive("scale", scale)
    return 2 * float(scale) ** 2


# ---------------------------------------------------------------------------------------
# Bit sources


class _KeyedStream:
    """Uniform integers derived from (key, node, scale) by SHAKE-256 in counter mode.

    SHAKE-256 over a length-prefixed key is a PRF (the sponge has no length-extension),
    so the stream is indistinguishable from random without the key, and fully
    reproducible with it.
    """

    def __init__(self, key: bytes, node: NodeId, scale: Fraction) -> None:
        self._prefix = hashlib.shake_256(
            _field(b"t", _DOMAIN_TAG)
            + _field(b"k", key)
            + _field(b"n", node_bytes(node))
            + _field(b"i", _int_bytes(scale.numerator))
            + _field(b"i", _int_bytes(scale.denominator))
        )
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


class KeyedNoise:
    """Production source: the noise of a node is a pure function of (key, node, scale).

    The same node and scale always give the same value (replay safety); distinct nodes
    give independent draws. The key never appears in repr, str or error messages.
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
        return sample_discrete_laplace(scale, _KeyedStream(self._key, node, scale).rand_below)

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

    def _rand_below(self, n: int) -> int:
        return _generator_rand_below(self._rng, n)

    def __repr__(self) -> str:
        return f"SeededNoise(seed={self._seed})"


class ZeroNoise:
    """Test source: always 0. NOT private."""

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

    def __repr__(self) -> str:
        return "ZeroNoise()"


class RecordingNoise:
    """Test source: forwards to ``inner`` and records every (node, scale, value)."""

    def __init__(self, inner: NoiseSource) -> None:
        """Wrap a source.

        Args:
            inner: the source that draws the values.
        """
        self.inner = inner
        self.calls: list[tuple[NodeId, Fraction, int]] = []

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

    def __repr__(self) -> str:
        return f"RecordingNoise({self.inner!r})"


# ---------------------------------------------------------------------------------------
# Error bars


def chernoff_interval(scales: Sequence[Fraction], alpha: float = 0.05) -> float:
    """Half-width h with P(|Z| > h) <= alpha for Z a sum of independent discrete Laplace.

    A guaranteed bound, not a normal approximation: the Chernoff bound
    P(|Z| >= h) <= 2 exp(-lambda h) E[exp(lambda Z)] with the exact moment generating
    function of each two-sided geometric, optimised over lambda. It depends on the
    public scales only.

    Args:
        scales: the scales b_i of the summed noises, each > 0 (order is irrelevant).
        alpha: allowed miss probability in (0, 1).

    Returns:
        h, or 0.0 for no scales.

    Raises:
        InvalidOperatorConfig: a scale or ``alpha`` is out of range.
    """
    check_probability("alpha", alpha)
    multiset = tuple(sorted(_check_scale(b) for b in scales))
    return _chernoff_half_width(multiset, float(alpha))


@functools.lru_cache(maxsize=1024)
def _chernoff_half_width(scales: tuple[Fraction, ...], alpha: float) -> float:
    if not scales:
        return 0.0
    # rate a = 1/b = -ln p; the MGF exists for lambda < min a.
    rates = [(1 / float(b), count) for b, count in Counter(scales).items()]
    log_2_over_alpha = math.log(2 / alpha)
    lam_max = min(a for a, _ in rates)

    def log_mgf(lam: float) -> float:
        # ln[(1-p)^2 / ((1-p e^lam)(1-p e^-lam))] through expm1 to avoid cancellation.
        return sum(
            count
            * (
                2 * math.log(-math.expm1(-a))
                - math.log(-math.expm1(lam - a))
                - math.log(-math.expm1(-lam - a))
            )
            for a, count in rates
        )

    def d_log_mgf(lam: float) -> float:
        return sum(
            count * (1 / math.expm1(a - lam) - 1 / math.expm1(a + lam)) for a, count in rates
        )

    def bound(lam: float) -> float:
        # The smallest h with 2 exp(-lam h + K(lam)) <= alpha, valid for EVERY lam.
        return (log_mgf(lam) + log_2_over_alpha) / lam

    # bound() is unimodal: its derivative has the sign of lam K'(lam) - K(lam) - ln(2/alpha),
    # which increases from -ln(2/alpha) at 0 to +inf at lam_max. Bisect on that sign.
    lo, hi = 0.0, lam_max
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * d_log_mgf(mid) - log_mgf(mid) < log_2_over_alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * hi:
            break
    # Any lam gives a valid bound, so bisection error only costs tightness (second order);
    # the factor covers floating-point rounding so the returned h never undercuts the bound.
    return bound((lo + hi) / 2) * (1 + 1e-9)


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
        self._cache: dict[tuple[NodeId, Fraction], int] = {}

    def __repr__(self) -> str:
        return f"CachedNoise({self.inner!r}, maxsize={self.maxsize})"

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        key = (node, scale)
        value = self._cache.pop(key, None)
        if value is None:
            value = self.inner.discrete_laplace(node, scale)
            if len(self._cache) >= self.maxsize:
                del self._cache[next(iter(self._cache))]  # least recently used
        self._cache[key] = value
        return value
