"""Baselines the papers compare against, for experiments/ and tests only.

Nothing in the pipeline imports this package, and ``dpstream.operators`` does not load
it: a deployment runs the mechanisms of the families above it, never these.

* ``user_level``: Dong-Luo-Yi's fixed-tau and advanced-composition baselines.
* ``round_restart``: the round-restart baseline of Andersson et al. (expiration).
* ``expiring_simple``: the simple expiring counter of Andersson et al. (expiration).
* ``naive_mean``, ``per_step_mean``: George et al.'s naive continual means.
"""

from . import expiring_simple, naive_mean, per_step_mean, round_restart, user_level

__all__ = ["expiring_simple", "naive_mean", "per_step_mean", "round_restart", "user_level"]
