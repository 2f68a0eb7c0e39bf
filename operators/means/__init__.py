"""Running means of users' values under user-level DP.

* ``continual_mean``: George et al.'s continual mean (Alg. 6, with Alg. 5 as a reference).
* ``whole_user_mean``: a noisy sum over a noisy count, two tree counters (the pipeline's
  ``kind: mean``).

*May import:* ``noise``, ``trees``, ``selection`` and the top-level ``errors``,
``_validate``, ``state_codec``.
"""

from . import continual_mean, whole_user_mean

__all__ = ["continual_mean", "whole_user_mean"]
