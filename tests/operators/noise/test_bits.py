"""Fair bits from the signs of keyed discrete Laplace draws: the randomness of the
exponential mechanism and of the private median."""

from __future__ import annotations

import pytest

from dpstream.operators.noise import KeyedNoise, RecordingNoise, ZeroNoise
from dpstream.operators.noise import bits as nb

KEY = b"exp-mech-test-key-0123456789abcdef"


def test_bits_are_signs_of_draws_at_numbered_nodes() -> None:
    recorder = RecordingNoise(KeyedNoise(KEY))
    bits = nb.NoiseBits(recorder, ("speed", "cell", 3, "interval"))
    values = [bits.bit() for _ in range(20)]
    nodes = [node for node, _, _ in recorder.calls]
    assert nodes == [("speed", "cell", 3, "interval", j) for j in range(len(nodes))]
    assert all(scale == nb.BIT_SCALE for _, scale, _ in recorder.calls)
    nonzero = [v for _, _, v in recorder.calls if v]
    assert values == [int(v > 0) for v in nonzero]


def test_zero_noise_is_degenerate_after_max_zero_run() -> None:
    recorder = RecordingNoise(ZeroNoise())
    bits = nb.NoiseBits(recorder, ("x",))
    with pytest.raises(nb.DegenerateNoise):
        bits.bit()
    assert len(recorder.calls) == nb.MAX_ZERO_RUN and bits.degenerate
    with pytest.raises(nb.DegenerateNoise):
        bits.bit()
    assert len(recorder.calls) == nb.MAX_ZERO_RUN  # no further draws
