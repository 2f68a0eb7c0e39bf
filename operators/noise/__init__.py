"""Noise primitives every family draws on: exact discrete Laplace and Gaussian noise and
their sources, fair bits, the noisy release with its error bar, and real values on a
public grid.

* ``discrete_laplace``: node identities, the exact sampler, the variances and the
  Chernoff bound.
* ``discrete_gaussian``: the exact discrete Gaussian sampler (any rational centre).
* ``sources``: the NoiseSource interface and the keyed, scoped, seeded, zero, recording
  and caching sources, each drawing either distribution.
* ``exact_quantile``: the exact error bar, the quantile of a sum of discrete Laplace noises.
* ``bits``: exactly fair bits from the signs of keyed draws (the exponential mechanism's
  and the private median's randomness).
* ``release``: a release ``exact + sum of keyed node noises`` with its std and interval.
* ``post_processing``: what is shown of a release, at no privacy cost: raised to the
  least value the statistic can take, and moving at a tick only as far as that tick's
  release requires.
* ``snapping``: real values as integer units of a public grid (no floating-point noise).

*May import:* the top-level ``errors`` and ``_validate`` only: every other family builds
on this one.
"""

from . import (
    bits,
    discrete_gaussian,
    discrete_laplace,
    exact_quantile,
    post_processing,
    release,
    snapping,
    sources,
)
from .bits import BIT_SCALE, MAX_ZERO_RUN, DegenerateNoise, NoiseBits, bernoulli_exp, uniform_below
from .discrete_gaussian import sample_discrete_gaussian
from .discrete_laplace import (
    NodeId,
    RandBelow,
    chernoff_interval,
    discrete_laplace_variance,
    laplace_variance,
    node_bytes,
    sample_discrete_laplace,
)
from .exact_quantile import exact_half_width
from .post_processing import Shown, floored_interval, settle
from .release import Term, TreeRelease, interval, noise_std, noisy_release, ratio_bounds
from .snapping import Grid, clip_to_grid, from_units, make_grid, to_units, unit_sensitivity
from .sources import (
    CachedNoise,
    KeyedNoise,
    NoiseSource,
    RecordingNoise,
    ScopedNoise,
    SeededNoise,
    ZeroNoise,
)

__all__ = [
    "BIT_SCALE",
    "MAX_ZERO_RUN",
    "CachedNoise",
    "DegenerateNoise",
    "Grid",
    "KeyedNoise",
    "NodeId",
    "NoiseBits",
    "NoiseSource",
    "RandBelow",
    "RecordingNoise",
    "ScopedNoise",
    "SeededNoise",
    "Shown",
    "Term",
    "TreeRelease",
    "ZeroNoise",
    "bernoulli_exp",
    "bits",
    "chernoff_interval",
    "clip_to_grid",
    "discrete_gaussian",
    "discrete_laplace",
    "discrete_laplace_variance",
    "exact_half_width",
    "exact_quantile",
    "floored_interval",
    "from_units",
    "interval",
    "laplace_variance",
    "make_grid",
    "node_bytes",
    "noise_std",
    "noisy_release",
    "post_processing",
    "ratio_bounds",
    "release",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "settle",
    "snapping",
    "sources",
    "to_units",
    "uniform_below",
    "unit_sensitivity",
]
