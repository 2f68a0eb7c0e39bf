"""The noise sources (dpstream.operators.noise.sources): keyed, scoped, seeded, zero,
recording and caching, each drawing discrete Laplace and discrete Gaussian noise."""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    CachedNoise,
    KeyedNoise,
    NoiseSource,
    RecordingNoise,
    ScopedNoise,
    SeededNoise,
    ZeroNoise,
    sources,
)
from tests.operators.support import chi2_sf

KEY = b"super-secret-key-material-0123456789"
OTHER_KEY = b"another-secret-key-material-98765"


def seeded_draws(seed: int, scale: Fraction, count: int) -> list[int]:
    source = SeededNoise(seed)
    return [source.discrete_laplace(("gof",), scale) for _ in range(count)]


def test_keyed_laplace_draws_are_those_of_earlier_releases() -> None:
    """The keyed derivation is unchanged by the Gaussian draw's arrival: replays of
    pipelines released before it re-derive the same noise (values from dpstream at
    f322eb6, before the change)."""
    source = KeyedNoise(b"pinned-key-for-replay-compat-0123")
    nodes = [
        (("events", 0, p, 1, i), Fraction(s, 3))
        for p in range(2)
        for i in range(3)
        for s in (2, 31)
    ]
    assert [source.discrete_laplace(n, b) for n, b in nodes] == [
        0, -24, 0, 3, 1, 10, 0, -7, 0, 21, 0, -24
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------
# KeyedNoise


def test_keyed_noise_is_deterministic_across_instances() -> None:
    first, second = KeyedNoise(KEY), KeyedNoise(KEY)
    cases = [
        (("events", 0, p, 0, i), Fraction(s)) for p in range(5) for i in range(8) for s in (1, 7)
    ]
    values = [first.discrete_laplace(node, scale) for node, scale in cases]
    assert [second.discrete_laplace(node, scale) for node, scale in cases] == values
    assert [first.discrete_laplace(node, scale) for node, scale in cases] == values
    # Determinism of a constant would be worthless.
    assert len(set(values)) > 5


def test_keyed_noise_depends_on_the_key() -> None:
    nodes = [("events", 0, 0, 0, i) for i in range(200)]
    scale = Fraction(10)
    a = [KeyedNoise(KEY).discrete_laplace(n, scale) for n in nodes]
    b = [KeyedNoise(OTHER_KEY).discrete_laplace(n, scale) for n in nodes]
    # Independent draws coincide with probability sum_x P(x)^2 ~ 2.5% at scale 10.
    assert sum(x == y for x, y in zip(a, b, strict=True)) < 40


def test_keyed_noise_derivation_includes_the_scale() -> None:
    source = KeyedNoise(KEY)
    nodes = [("events", 0, 0, 0, i) for i in range(200)]
    # With t/1 scales the sampler reads the stream nearly identically at 10 and 11, so a
    # derivation ignoring the scale would make most of these pairs equal.
    a = [source.discrete_laplace(n, Fraction(10)) for n in nodes]
    b = [source.discrete_laplace(n, Fraction(11)) for n in nodes]
    assert sum(x == y for x, y in zip(a, b, strict=True)) < 40


def test_keyed_stream_words_differ_by_node_scale_and_key() -> None:
    def words(key: bytes, node: tuple, scale: Fraction) -> list[int]:
        stream = sources._KeyedStream(key, node, (scale,))
        return [stream.rand_below(1 << 64) for _ in range(4)]

    base = words(KEY, ("s", 1), Fraction(3))
    assert words(KEY, ("s", 1), Fraction(3)) == base
    assert words(KEY, ("s", 2), Fraction(3)) != base
    assert words(KEY, ("s", 1), Fraction(3, 2)) != base
    assert words(OTHER_KEY, ("s", 1), Fraction(3)) != base


@pytest.mark.parametrize("text", [repr, str])
def test_keyed_noise_repr_hides_the_key(text: Callable[[object], str]) -> None:
    shown = text(KeyedNoise(KEY))
    assert "KeyedNoise" in shown
    for leak in (KEY.hex(), KEY.decode("ascii"), repr(KEY), KEY[:8].decode("ascii")):
        assert leak not in shown


def test_short_key_is_rejected_without_echoing_it() -> None:
    short = b"short-secret"
    with pytest.raises(InvalidOperatorConfig, match="key") as info:
        KeyedNoise(short)
    assert "short-secret" not in str(info.value)
    assert short.hex() not in str(info.value)
    KeyedNoise(b"k" * 16)  # the boundary itself is accepted


def test_text_key_is_rejected_without_echoing_it() -> None:
    with pytest.raises(InvalidOperatorConfig, match="key") as info:
        KeyedNoise("a-text-secret-that-is-long-enough")  # type: ignore[arg-type]
    assert "a-text-secret" not in str(info.value)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000, (1 << 64) + 1])
def test_keyed_stream_rand_below_stays_in_range(n: int) -> None:
    stream = sources._KeyedStream(KEY, ("range", n), (Fraction(1),))
    assert all(0 <= stream.rand_below(n) < n for _ in range(300))


def test_keyed_stream_rand_below_is_unbiased() -> None:
    # n = 3 on 2 bits: a modulo reduction would give 0 half of the time.
    stream = sources._KeyedStream(KEY, ("bias",), (Fraction(1),))
    counts = np.bincount([stream.rand_below(3) for _ in range(30_000)], minlength=3)
    stat = float(((counts - 10_000) ** 2 / 10_000).sum())
    assert chi2_sf(stat, df=2) > 1e-4


# ---------------------------------------------------------------------------------------
# SeededNoise, ZeroNoise, RecordingNoise


def test_seeded_noise_is_reproducible_and_seed_dependent() -> None:
    a = seeded_draws(7, Fraction(5), 100)
    assert seeded_draws(7, Fraction(5), 100) == a
    assert seeded_draws(8, Fraction(5), 100) != a
    assert len(set(a)) > 5


def test_seeded_noise_leaves_global_generators_alone() -> None:
    np_state = np.random.get_state()
    py_state = random.getstate()
    seeded_draws(3, Fraction(4), 200)
    after = np.random.get_state()
    assert random.getstate() == py_state
    assert np_state[0] == after[0] and np_state[2:] == after[2:]
    assert np.array_equal(np_state[1], after[1])


def test_generator_rand_below_beyond_int64() -> None:
    rng = np.random.Generator(np.random.PCG64(11))
    n = 3 << 100
    values = [sources._generator_rand_below(rng, n) for _ in range(3000)]
    assert all(0 <= v < n for v in values)
    # The top "digit" v // 2^100 must be uniform on {0, 1, 2}.
    counts = np.bincount([v >> 100 for v in values], minlength=3)
    stat = float(((counts - 1000) ** 2 / 1000).sum())
    assert chi2_sf(stat, df=2) > 1e-4


def test_zero_noise_is_zero_and_checks_arguments() -> None:
    assert ZeroNoise().discrete_laplace(("a", 1), Fraction(3)) == 0
    with pytest.raises(InvalidOperatorConfig, match="scale"):
        ZeroNoise().discrete_laplace(("a", 1), Fraction(0))


def test_recording_noise_forwards_and_records() -> None:
    recorder = RecordingNoise(SeededNoise(5))
    reference = SeededNoise(5)
    calls = [(("n", i), Fraction(i + 1, 2)) for i in range(20)]
    values = [recorder.discrete_laplace(node, scale) for node, scale in calls]
    assert values == [reference.discrete_laplace(node, scale) for node, scale in calls]
    assert recorder.calls == [(n, s, v) for (n, s), v in zip(calls, values, strict=True)]


@pytest.mark.parametrize(
    "source",
    [
        KeyedNoise(KEY),
        SeededNoise(0),
        ZeroNoise(),
        RecordingNoise(ZeroNoise()),
        ScopedNoise(ZeroNoise(), ("s",)),
        CachedNoise(ZeroNoise()),
    ],
)
def test_sources_satisfy_the_protocol(source: object) -> None:
    assert isinstance(source, NoiseSource)


def test_cached_noise_returns_the_inner_values_and_bounds_its_size():
    inner = RecordingNoise(KeyedNoise(b"c" * 32))
    cached = CachedNoise(inner, maxsize=3)
    nodes = [("s", 0, i) for i in range(5)]
    first = [cached.discrete_laplace(n, Fraction(7)) for n in nodes]
    assert first == [KeyedNoise(b"c" * 32).discrete_laplace(n, Fraction(7)) for n in nodes]
    assert cached.discrete_laplace(nodes[4], Fraction(7)) == first[4]
    assert len(inner.calls) == 5  # served from the cache
    assert cached.discrete_laplace(nodes[0], Fraction(7)) == first[0]
    assert len(inner.calls) == 6  # evicted, drawn again: same value
    assert len(cached._cache) == 3
    assert "c" * 32 not in repr(cached)


# ---------------------------------------------------------------------------------------
# The Gaussian draw in every source


def test_keyed_gaussian_is_deterministic_and_separate_from_laplace() -> None:
    source = KeyedNoise(KEY)
    nodes = [("g", i) for i in range(300)]
    first = [source.discrete_gaussian(n, Fraction(25)) for n in nodes]
    assert [KeyedNoise(KEY).discrete_gaussian(n, Fraction(25)) for n in nodes] == first
    assert len(set(first)) > 10
    other_key = [KeyedNoise(OTHER_KEY).discrete_gaussian(n, Fraction(25)) for n in nodes]
    laplace = [source.discrete_laplace(n, Fraction(25)) for n in nodes]
    # Independent draws at sigma 5 coincide with probability sum_x P(x)^2 ~ 5.6%.
    assert sum(a == b for a, b in zip(first, other_key, strict=True)) < 40
    assert sum(a == b for a, b in zip(first, laplace, strict=True)) < 40


def test_keyed_gaussian_derivation_includes_sigma2_and_center() -> None:
    source = KeyedNoise(KEY)
    nodes = [("g", i) for i in range(300)]
    base = [source.discrete_gaussian(n, Fraction(25)) for n in nodes]
    wider = [source.discrete_gaussian(n, Fraction(26)) for n in nodes]
    shifted = [source.discrete_gaussian(n, Fraction(25), Fraction(3)) - 3 for n in nodes]
    assert sum(a == b for a, b in zip(base, wider, strict=True)) < 40
    assert sum(a == b for a, b in zip(base, shifted, strict=True)) < 40


def test_scoped_gaussian_prefixes_the_scope() -> None:
    inner = RecordingNoise(KeyedNoise(KEY))
    scoped = ScopedNoise(inner, ("app", "stat", "fp", 7))
    value = scoped.discrete_gaussian(("n", 1), Fraction(9), Fraction(1, 2))
    assert inner.gaussian_calls == [(("app", "stat", "fp", 7, "n", 1), 9, Fraction(1, 2), value)]
    assert value == KeyedNoise(KEY).discrete_gaussian(
        ("app", "stat", "fp", 7, "n", 1), Fraction(9), Fraction(1, 2)
    )


def test_seeded_gaussian_is_reproducible() -> None:
    def draws(seed: int) -> list[int]:
        source = SeededNoise(seed)
        return [source.discrete_gaussian(("g",), Fraction(16)) for _ in range(100)]

    assert draws(3) == draws(3) and draws(3) != draws(4) and len(set(draws(3))) > 5


@pytest.mark.parametrize(
    ("center", "expected"),
    [(Fraction(0), 0), (Fraction(7, 3), 2), (Fraction(-5, 2), -2), (Fraction(5, 2), 3)],
)
def test_zero_gaussian_is_the_mode(center: Fraction, expected: int) -> None:
    assert ZeroNoise().discrete_gaussian(("z",), Fraction(4), center) == expected


@pytest.mark.parametrize(
    ("sigma2", "center", "message"),
    [
        (Fraction(0), Fraction(0), "sigma2 must be finite and > 0, got Fraction(0, 1)"),
        (0.5, Fraction(0), "sigma2 must be a Fraction, got 0.5"),
        (Fraction(1), 0.5, "center must be a Fraction, got 0.5"),
        (True, Fraction(0), "sigma2 must be a Fraction, got True"),
    ],
)
def test_every_source_checks_the_gaussian_parameters(sigma2, center, message) -> None:
    for source in (KeyedNoise(KEY), SeededNoise(1), ZeroNoise()):
        with pytest.raises(InvalidOperatorConfig) as info:
            source.discrete_gaussian(("n",), sigma2, center)
        assert str(info.value) == message


def test_cached_gaussian_returns_the_inner_values() -> None:
    inner = RecordingNoise(KeyedNoise(KEY))
    cached = CachedNoise(inner, maxsize=8)
    first = [cached.discrete_gaussian(("c", i), Fraction(9), Fraction(i, 4)) for i in range(4)]
    again = [cached.discrete_gaussian(("c", i), Fraction(9), Fraction(i, 4)) for i in range(4)]
    assert first == again and len(inner.gaussian_calls) == 4
    # Laplace and Gaussian draws of one node are cached apart.
    cached.discrete_laplace(("c", 0), Fraction(9))
    assert len(inner.calls) == 1
    assert cached.discrete_gaussian(("c", 0), Fraction(9), Fraction(0)) == first[0]


def test_recording_noise_records_gaussian_draws() -> None:
    recorder = RecordingNoise(SeededNoise(5))
    reference = SeededNoise(5)
    calls = [(("n", i), Fraction(i + 1), Fraction(i, 3)) for i in range(10)]
    values = [recorder.discrete_gaussian(*call) for call in calls]
    assert values == [reference.discrete_gaussian(*call) for call in calls]
    assert recorder.gaussian_calls == [(*c, v) for c, v in zip(calls, values, strict=True)]
