"""Private choices among finitely many candidates, sampled exactly from fair noise bits.

* ``exponential_mechanism``: the exponential mechanism (McSherry-Talwar), exact inversion.
* ``private_median``: George et al.'s PrivateMedian (Alg. 7), the continual mean's coarse
  mean.
* ``private_interval``: Rameshwar et al.'s PrivateInterval (Alg. 3) for the Levy mechanism.
* ``private_quantile``: Rameshwar et al.'s private quantile of array means (Sec. III-E).

*May import:* ``noise`` and the top-level ``errors``, ``_validate``.
"""

from . import exponential_mechanism, private_interval, private_median, private_quantile

__all__ = ["exponential_mechanism", "private_interval", "private_median", "private_quantile"]
